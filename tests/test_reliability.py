"""What no input and no outage can do: stop the ingest loop, lose a count, or crash a job.

- Fuzzing: arbitrary messages over a real connection to a real ingest loop are each
  either accepted or rejected and counted under the reason ``events.decode`` gives,
  and the loop keeps serving; arbitrary valid event sequences never break the
  aggregator or ``/metrics``.
- Restarts: a sidecar SIGKILLed and restarted under a running job; a job that dies
  of an uncaught exception is recorded as a failure.
- Start-up: a sidecar that cannot listen says why and leaves no socket behind.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import typing
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics

from tpuscope import catalog, events
from tpuscope.exporter.aggregator import Aggregator
from tpuscope.exporter.daemon import build_registry
from tpuscope.exporter.exposition import Writer
from tpuscope.exporter.ingest import IngestLoop
from tpuscope.exporter.metrics import register
from tpuscope.exporter.samples import SampleStore
from tpuscope.scrape import Scrape
from tpuscope.testing.waiting import scrape_until, wait_for
from tpuscope.workload.sidecar import SidecarProcess

INGEST = catalog.INGEST_EVENTS.name
INVALID = catalog.INGEST_INVALID_EVENTS.name
STEPS = catalog.STEPS.name
FAILURES = catalog.WORKLOAD_FAILURES.name

# --- strategies: valid events ------------------------------------------------------------------
# A few workloads, so that a sequence's events land on the same ones (out of order, restore
# before save...), and the label limiter's cap is never what a test meets.
workloads = st.sampled_from(["llm", "job-1", "a.b:c/d-e_f", "x" * 64])
labels = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.:/-]{0,20}", fullmatch=True)
seconds = st.floats(min_value=0.0, max_value=7 * 86400.0)
counts = st.integers(min_value=0, max_value=2**63 - 1)
flops = st.floats(min_value=0.0, max_value=1e30)


@st.composite
def steps(draw: st.DrawFn) -> events.Step:
    duration = draw(seconds)
    # Phases are shares of the step, so they add up to no more than it (the schema's rule).
    shares = draw(st.lists(st.floats(0.0, 1.0), min_size=4, max_size=4))
    total = sum(shares) or 1.0
    compute, sync, io, other = (duration * s / total * 0.99 for s in shares)
    return events.Step(
        workload=draw(workloads),
        step=draw(counts),
        duration_s=duration,
        compute_s=compute,
        sync_s=sync,
        io_s=io,
        other_s=other,
        dropped=draw(st.one_of(st.just(0), counts)),
        flops=draw(flops),
        trace_id=draw(st.sampled_from(["", "0123456789abcdef" * 2])),
    )


valid_events: st.SearchStrategy[events.AnyEvent] = st.one_of(
    steps(),
    st.builds(
        events.Compile,
        workload=workloads,
        stage=st.sampled_from(["tracing", "lowering", "backend"]),
        duration_s=seconds,
        function=st.text(max_size=256),
    ),
    st.builds(events.CompileCache, workload=workloads, hit=st.booleans()),
    st.builds(
        events.Checkpoint,
        workload=workloads,
        operation=st.sampled_from(["save", "restore"]),
        duration_s=seconds,
        ok=st.booleans(),
        bytes=counts,
        step=counts,
    ),
    st.builds(
        events.DeviceMemory,
        workload=workloads,
        device=labels,
        accelerator=st.sampled_from(["v5e", "h100"]),
        used_bytes=counts,
        limit_bytes=counts,
        peak_bytes=counts,
        source=st.sampled_from(["workload", "process"]),
    ),
    st.builds(events.ProgramMemory, workload=workloads, program=labels, spill_bytes=counts),
    st.builds(events.Hardware, workload=workloads, accelerator=labels, devices=counts, peak_flops_per_second=flops),
    st.builds(
        events.Lifecycle,
        workload=workloads,
        state=st.sampled_from(["start", "stop", "failure", "restart"]),
        reason=labels,
    ),
    st.builds(
        events.InferenceBatch,
        workload=workloads,
        batch_size=counts,
        queue_depth=counts,
        request_seconds=st.lists(seconds, max_size=20),
    ),
    st.builds(
        events.CompileFailure,
        workload=workloads,
        stage=st.sampled_from(["tracing", "lowering", "backend"]),
        reason=labels,
    ),
    st.builds(events.Recompile, workload=workloads, cause=labels),
    st.builds(events.ModelLoaded, workload=workloads, version=labels),
)

# --- strategies: anything a socket can carry -------------------------------------------------------
# msgpack-able nested structures; lists that start with a real tag get past the tag check into
# field validation.
msgpack_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats()
    | st.text(max_size=80)
    | st.binary(max_size=40),
    lambda children: st.lists(children, max_size=8) | st.dictionaries(st.text(max_size=10), children, max_size=5),
    max_leaves=20,
)
# Every record's tag, and one no record has.
tags = st.sampled_from([*(cls.__struct_config__.tag for cls in typing.get_args(events.AnyEvent)), "nope"])
tagged = st.builds(lambda tag, rest: [tag, *rest], tags, st.lists(msgpack_values, max_size=12))


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    """A valid encoding with a bit flipped, cut short, or with bytes appended."""
    data = bytearray(events.encode(draw(valid_events)))
    how = draw(st.sampled_from(["flip", "truncate", "extend"]))
    if how == "flip":
        bit = draw(st.integers(0, len(data) * 8 - 1))
        data[bit // 8] ^= 1 << (bit % 8)
    elif how == "truncate":
        del data[draw(st.integers(1, len(data) - 1)) :]
    else:
        data += draw(st.binary(min_size=1, max_size=30))
    return bytes(data)


messages = st.one_of(
    st.binary(max_size=300),  # the empty message too: it must not read as the job hanging up
    st.binary(max_size=300).map(lambda b: events.HEADER + b),
    msgpack_values.map(lambda v: events.HEADER + msgspec.msgpack.encode(v)),
    tagged.map(lambda v: events.HEADER + msgspec.msgpack.encode(v)),
    mutated(),
    valid_events.map(events.encode),
    # Around the size limit: the loop reads with MSG_TRUNC, so it must see the real length.
    st.integers(events.MAX_DATAGRAM_BYTES - 2, events.MAX_DATAGRAM_BYTES + 100).map(
        lambda n: events.HEADER + b"\x00" * (n - len(events.HEADER))
    ),
)


def verdict(message: bytes) -> str:
    """What ``events.decode`` says of a message: ``accepted`` or the reason it is rejected."""
    try:
        events.decode(message)
    except events.InvalidEvent as e:
        return e.reason
    return "accepted"


# --- an in-process ingest loop on a real socket ------------------------------------------------------
class Ingest:
    """A real IngestLoop and Aggregator, as ``tpuscope serve`` builds them, read through /metrics' writer."""

    def __init__(self, directory: Path) -> None:
        self.registry = build_registry()
        metrics = register(self.registry)
        store = SampleStore()
        self.registry.register(store)
        self.loop = IngestLoop(directory / "fuzz.sock", 0o600, Aggregator(metrics, store))
        self.writer = Writer(self.registry)

    def scrape(self) -> Scrape:
        return Scrape(self.writer.render(openmetrics=False).decode())

    def counts(self) -> Counter[str]:
        """accepted, invalid and each reject reason, as /metrics says."""
        scrape = self.scrape()
        counts = Counter({r: scrape.present(INGEST, result=r) for r in ("accepted", "invalid")})
        counts.update({reason: scrape.present(INVALID, reason=reason) for reason in events.REJECT_REASONS})
        return counts

    def send_and_settle(self, messages: list[bytes]) -> None:
        """Send the messages on one connection, then a valid step, and wait until that step is counted.

        Messages on one connection are handled in order, so once the sentinel is counted every
        message before it has been handled.
        """
        # Counted afresh each time, so that one lost sentinel fails its own example, not every later one.
        counted = (self.scrape().value(STEPS, workload="sentinel") or 0) + 1  # none before the first sentinel
        sentinel = events.encode(events.Step(workload="sentinel", step=0, duration_s=0.0))
        with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as s:
            s.connect(str(self.loop.path))
            for message in [*messages, sentinel]:
                s.send(message)
            wait_for(
                lambda: (self.scrape().value(STEPS, workload="sentinel") or 0) >= counted,
                10,
                "the sentinel step counted",
            )


@pytest.fixture(scope="module")
def ingest(module_tmp: Path) -> Iterator[Ingest]:
    fuzz = Ingest(module_tmp)
    fuzz.loop.start()
    yield fuzz
    fuzz.loop.stop()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(messages, max_size=25))
def test_any_messages_are_each_accepted_or_counted_by_reason(ingest: Ingest, batch: list[bytes]) -> None:
    before = ingest.counts()
    ingest.send_and_settle(batch)
    counted = ingest.counts() - before  # Counter subtraction drops zeros: only what changed
    expected = Counter(verdict(m) for m in batch)
    expected["accepted"] += 1  # the sentinel
    expected["invalid"] = sum(n for reason, n in expected.items() if reason != "accepted")
    assert counted == +expected  # per reason, as events.decode judged each message
    assert counted["accepted"] + counted["invalid"] == len(batch) + 1
    assert ingest.loop._thread.is_alive()  # and it served the sentinel after whatever came before


def test_a_valid_event_after_the_fuzzing_is_still_counted(ingest: Ingest) -> None:
    """Whatever the fuzzing sent, the loop serves a fresh job afterwards (also when run alone)."""
    ingest.send_and_settle([b"\xff", events.encode(events.CompileCache(workload="after", hit=True))])
    scrape = ingest.scrape()
    assert scrape.present(catalog.COMPILE_CACHE_REQUESTS.name, workload="after", result="hit") >= 1


def test_an_empty_message_is_not_taken_for_a_hang_up(ingest: Ingest) -> None:
    before = ingest.counts()
    ingest.send_and_settle([events.encode(events.CompileCache(workload="empty", hit=True)), b"", b"\xff"])
    counted = ingest.counts() - before
    assert counted["malformed"] == 2


# --- valid sequences through the aggregator ---------------------------------------------------------
@settings(max_examples=100, deadline=None)
@given(st.lists(valid_events, max_size=40))
def test_any_valid_sequence_is_aggregated_and_metrics_still_render(sequence: list[events.AnyEvent]) -> None:
    """Out-of-order steps, restore before save, failure before start, huge values, empty lists."""
    registry = CollectorRegistry(auto_describe=True)
    metrics = register(registry)
    store = SampleStore()
    registry.register(store)
    aggregator = Aggregator(metrics, store)
    for event in sequence:
        aggregator.accept(event)  # must not raise
    writer = Writer(registry)
    rendered = writer.render(openmetrics=False).decode()
    # No NaN of the sidecar's own arithmetic (MFU from an absurd peak: a NaN average would stick for good); a job's
    # reported value is served as it came, NaN included.
    computed = [line for line in rendered.splitlines() if not line.startswith(("#", catalog.TRAINING_VALUE.name))]
    assert not [line for line in computed if line.endswith("NaN")]
    text = Scrape(rendered)  # parses as Prometheus' text format
    families = list(parse_openmetrics(writer.render(openmetrics=True).decode()))  # type: ignore[no-untyped-call]
    assert families
    assert text.value(INGEST, result="accepted") == len(sequence)
    dropped = sum(e.dropped for e in sequence if isinstance(e, events.Step))
    assert text.value(INGEST, result="dropped") == pytest.approx(dropped, rel=1e-9)
    for workload in {e.workload for e in sequence}:
        stepped = sum(1 for e in sequence if isinstance(e, events.Step) and e.workload == workload)
        # Its start or first step creates the series: one that only, say, compiled has none, and counted none.
        assert (text.value(STEPS, workload=workload) or 0) == stepped, workload


# --- restarts and crashes, with real processes -------------------------------------------------------
# A job: a Monitor stepping every few milliseconds until told to stop, printing its counts as it goes.
JOB = textwrap.dedent(
    """
    import json, os, sys, time
    from tpuscope.tracing import Monitor

    socket_path, workload, stop_file = sys.argv[1:4]
    with Monitor(workload, socket=socket_path, traces=False) as mon:
        n = 0
        while not os.path.exists(stop_file):
            with mon.step(n):
                time.sleep(0.003)
            n += 1
            if n % 10 == 0:
                print(json.dumps({"stepped": n, "sent": mon.sent, "dropped": mon.dropped}), flush=True)
    print(json.dumps({"stepped": n, "sent": mon.sent, "dropped": mon.dropped, "done": True}), flush=True)
    """
)


class Job:
    """The job above in a process of its own; ``progress`` is its latest line."""

    def __init__(self, socket_path: Path, workload: str, directory: Path) -> None:
        self.stop_file = directory / f"{workload}.stop"
        self.proc = subprocess.Popen(
            [sys.executable, "-c", JOB, str(socket_path), workload, str(self.stop_file)],
            stdout=subprocess.PIPE,
            text=True,
        )
        self.progress: dict[str, Any] = {"stepped": 0, "sent": 0, "dropped": 0}
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.progress = json.loads(line)

    def finish(self) -> dict[str, Any]:
        self.stop_file.touch()
        assert self.proc.wait(timeout=30) == 0
        self._reader.join(timeout=10)
        assert self.progress.get("done"), self.progress
        return self.progress


def test_a_job_steps_through_a_sidecar_restart_and_reports_its_drops_to_the_new_one(short_tmp: Path) -> None:
    path = short_tmp / "events.sock"
    first = SidecarProcess(path)
    job = Job(path, "through-restart", short_tmp)
    try:
        scrape = scrape_until(first.url, lambda s: (s.value(STEPS, workload="through-restart") or 0) >= 20)
        assert scrape.present(INGEST, result="dropped") == 0  # no drops before the outage
        first.proc.send_signal(signal.SIGKILL)
        first.stop()
        # The job notices (its sends fail), counts the drops and keeps stepping.
        wait_for(lambda: job.progress["dropped"] > 0, 20, "drops while the sidecar is down")
        outage_start = job.progress["stepped"]
        wait_for(
            lambda: job.progress["stepped"] >= outage_start + 100, 20, 'job.progress["stepped"] >= outage_start + 100'
        )
        assert job.proc.poll() is None
        dropped_in_outage = job.progress["dropped"]

        with SidecarProcess(path) as second:  # the same path: it replaces the stale socket
            # The job reconnects by itself; the workload comes back and its steps grow again.
            scrape = scrape_until(second.url, lambda s: (s.value(STEPS, workload="through-restart") or 0) >= 20)
            assert scrape.present(STEPS, workload="through-restart") >= 20
            # The first step it delivers carries the outage's drops.
            assert scrape.present(INGEST, result="dropped") >= dropped_in_outage
            final = job.finish()
            scrape = scrape_until(
                second.url, lambda s: s.value(INGEST, result="dropped") == final["dropped"], timeout=10
            )
            assert final["dropped"] >= dropped_in_outage > 0
            assert scrape.value(INGEST, result="dropped") == final["dropped"]
            # It stopped cleanly: once its connection is gone, no failure is on record.
            processes = catalog.WORKLOAD_PROCESSES.name
            scrape = scrape_until(second.url, lambda s: not s.has(processes, workload="through-restart"), timeout=10)
            assert not scrape.has(processes, workload="through-restart")
            assert not scrape.has(FAILURES, workload="through-restart")
    finally:
        if job.proc.poll() is None:
            job.proc.kill()
        first.stop()


CRASHING_JOB = textwrap.dedent(
    """
    import sys
    from tpuscope.tracing import Monitor

    socket_path, workload, style = sys.argv[1:4]
    if style == "with":
        with Monitor(workload, socket=socket_path, traces=False) as mon:
            with mon.step(0):
                pass
            raise RuntimeError("the training loop failed")
    else:  # the module docstring's style: a Monitor that is never closed by hand
        mon = Monitor(workload, socket=socket_path, traces=False)
        with mon.step(0):
            pass
        raise RuntimeError("the training loop failed")
    """
)


@pytest.mark.parametrize("style", ["with", "plain"])
def test_an_uncaught_exception_is_recorded_as_a_failure(sidecar: SidecarProcess, style: str) -> None:
    """A job killed by an exception says so before it goes (SIGKILL: test_sidecar.py)."""
    workload = f"crash-{style}"
    job = subprocess.run(
        [sys.executable, "-c", CRASHING_JOB, str(sidecar.socket), workload, style],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert job.returncode == 1 and "the training loop failed" in job.stderr
    scrape = scrape_until(sidecar.url, lambda s: s.has(FAILURES, workload=workload))
    assert scrape.value(FAILURES, workload=workload, reason="other") == 1
    # It said goodbye, so the connection's end is not taken for a second failure: the sidecar would have booked
    # one (at once, no metadata server being asked) before the process's series goes with the connection.
    scrape = scrape_until(sidecar.url, lambda s: not s.has(catalog.WORKLOAD_PROCESSES.name, workload=workload))
    assert scrape.value(FAILURES, workload=workload) == 1
    assert scrape.value(STEPS, workload=workload) == 1


def test_a_clean_exit_without_closing_the_monitor_is_not_a_failure(sidecar: SidecarProcess) -> None:
    """The other side of the plain-style check above: exiting normally records a stop, not a failure,
    also after an exception that was only printed (a REPL, IPython or a notebook sets sys.last_type)."""
    job = (
        f"import sys\nfrom tpuscope.tracing import Monitor\n"
        f"mon = Monitor('plain-ok', socket={str(sidecar.socket)!r}, traces=False)\n"
        "sys.last_type = ValueError  # as an interactive shell leaves it after showing a traceback"
    )
    assert subprocess.run([sys.executable, "-c", job], timeout=30).returncode == 0
    scrape = scrape_until(sidecar.url, lambda s: (s.value(INGEST, result="accepted") or 0) >= 2)
    assert scrape.value(INGEST, result="accepted") == 2  # start and stop
    assert not scrape.has(FAILURES, workload="plain-ok")
    assert scrape.present(STEPS, workload="plain-ok") == 0


def test_a_port_in_use_stops_serve_with_a_clear_error_and_no_socket_left(short_tmp: Path) -> None:
    """A sidecar that cannot listen must say why and leave the event socket path as it found it."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        sock_path = short_tmp / "events.sock"
        out = subprocess.run(
            [sys.executable, "-m", "tpuscope", "serve", "--listen", f"127.0.0.1:{port}", "--socket", str(sock_path)],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert out.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}" in out.stderr
    assert "Traceback" not in out.stderr
    assert not sock_path.exists()
