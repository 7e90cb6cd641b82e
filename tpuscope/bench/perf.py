"""``tpuscope bench perf``: what tpuscope costs, side by side with its peers, against its targets.

Prints a table and writes JSON. Every figure is measured here, on this machine, in
one run: the job's cost per event and per step (the Monitor on and off, interleaved,
on the JAX workload), and of reporting the loss every step (``s.loss`` on and off, the
Monitor on in both, interleaved the same way), the device-profile captures' cost and the step annotation's,
the sidecar's ingest throughput on one core, its scrape latency at 1k, 10k and 50k
series, its memory and CPU idle and busy; and, for scale, a bare prometheus_client
``Histogram.observe``, one OpenTelemetry span per step, a bare ``send`` of the step's
event bytes, and Debian's node_exporter scraped on the same machine.

Machines differ about threefold in raw speed, so a per-step or per-series target is a
ratio to a peer measured in the same run (a :class:`Figure` with ``ours`` and ``peer``):
the instrumented step against one OpenTelemetry span and against the bare send (the
floor: the bytes have to cross the socket), a scrape's cost per series against
node_exporter's. The absolute figures are printed beside each ratio.
"""

from __future__ import annotations

import argparse
import functools
import json
import multiprocessing
import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil

from tpuscope import catalog, events
from tpuscope.bench.machine import machine
from tpuscope.bench.timing import (
    ab_test,
    best_alternated,
    best_seconds_per_call,
    direct_cost,
    paced_seconds_per_call,
    scrape_once,
)
from tpuscope.scrape import Scrape
from tpuscope.stats import percentile
from tpuscope.testing.prometheus import free_port
from tpuscope.tracing import Hooks, Monitor, Traces
from tpuscope.tracing.profile_sampler import CAPTURED_STEPS, COST_BUDGET, DEFAULT_PERIOD
from tpuscope.workload.sidecar import SidecarProcess

DEFAULT_JSON = Path("run/perf.json")


@dataclass(frozen=True)
class Size:
    emits: int = 20_000  # events timed one by one
    ab_steps: int = 405  # JAX steps per A/B run (5 warm-up, then blocks of 10 on and off)
    ingest_seconds: float = 5.0
    paced_rate: int = 90_000  # events/s that must all arrive (below the 100k target)
    series: tuple[int, ...] = (1_000, 10_000, 50_000)
    judged_series: int = 10_000  # the size whose scrape is judged against node_exporter's
    scrapes: int = 200
    settle_seconds: float = 10.0  # idle and busy windows for CPU and memory
    annotations: int = 20_000  # step annotations timed, with no profiler session and during one
    capture_steps: int = 300  # fused JAX steps with captures every few dozen steps: four captures or so


FULL = Size()
TINY = Size(
    emits=300,
    ab_steps=25,
    ingest_seconds=0.5,
    paced_rate=2_000,
    series=(300,),
    judged_series=300,
    scrapes=5,
    settle_seconds=0.5,
    annotations=500,
    # K is chosen after 20 steps (16, 32, or 64 on a loaded machine): a capture by step 69 that spans 8 steps (more
    # where its session starts late), answered by the sidecar a second or more (30 to 100 steps on a loaded
    # machine) later.
    capture_steps=320,
)
# The capture run's period, in steps of the split workload (the fused one is a little faster). K, the steps
# between captures, is chosen after the Monitor's 20th step from the warm steps' time: 16 or 32. Each capture
# costs more than COST_BUDGET of so short a period, so K doubles after each: captures at 32, then 64, 128 and
# 256, or so.
CAPTURE_PERIOD_STEPS = 24


@dataclass
class Figure:
    """One figure; a ratio to a peer (unit "x") also carries both absolute figures, ``ours`` and ``peer``."""

    name: str
    value: float | None
    unit: str
    target: str = ""  # "<= 10", ">= 100000": empty when there is none
    note: str = ""
    ours: float | None = None  # a ratio's numerator and denominator, in ``absolute_unit``
    peer: float | None = None
    absolute_unit: str = ""

    @property
    def met(self) -> bool | None:
        if not self.target or self.value is None:
            return None
        op, bound = self.target.split()
        return self.value <= float(bound) if op == "<=" else self.value >= float(bound)


@dataclass
class Report:
    machine: dict[str, Any]
    figures: list[Figure] = field(default_factory=list)

    def add(self, *figures: Figure) -> None:
        self.figures += figures
        for f in figures:
            print(line(f), flush=True)

    def json(self) -> dict[str, Any]:
        return {"machine": self.machine, "figures": [{**asdict(f), "met": f.met} for f in self.figures]}


def ratio(name: str, ours: float | None, peer: float | None, unit: str, target: str = "", note: str = "") -> Figure:
    """``ours`` / ``peer`` as a figure (both in ``unit``); None when either is missing."""
    value = ours / peer if ours is not None and peer else None
    return Figure(name, value, "x", target, note, ours, peer, unit)


def figure_text(value: float) -> str:
    return f"{value:,.{0 if abs(value) >= 100 else 2}f}"


def line(f: Figure) -> str:
    value = "n/a" if f.value is None else figure_text(f.value)
    verdict = "" if f.met is None else ("met" if f.met else "MISSED")
    target = f"target {f.target} {verdict}" if f.target else ""
    note = f.note
    if f.absolute_unit:
        absolute = " / ".join("n/a" if v is None else f"{figure_text(v)} {f.absolute_unit}" for v in (f.ours, f.peer))
        note = f"{absolute}{'; ' + note if note else ''}"
    return f"  {f.name:<50} {value:>10} {f.unit:<9} {target:<22} {note}".rstrip()


# --- the job side --------------------------------------------------------------------------------------
def timed_calls(call: Callable[[int], None], n: int, pause_every: int = 2000) -> list[float]:
    """Microseconds of each of ``n`` calls; a pause every ``pause_every`` lets a sidecar drain."""
    result = []
    for i in range(n):
        start = time.perf_counter_ns()
        call(i)
        result.append((time.perf_counter_ns() - start) / 1000)
        if i % pause_every == pause_every - 1:
            time.sleep(0.05)
    return result


def job_side(report: Report, size: Size, sidecar: SidecarProcess, workdir: Path) -> None:
    from prometheus_client import CollectorRegistry, Histogram

    with Monitor("perf-emit", socket=sidecar.socket, traces=False) as mon:

        def emit(i: int) -> None:
            with mon.step(i):
                pass

        ours = timed_calls(emit, size.emits)
        dropped = mon.dropped
    child = Histogram("perf_step_seconds", "A bare histogram.", ["workload"], registry=CollectorRegistry()).labels("w")
    bare = timed_calls(lambda i: child.observe(0.1), size.emits)
    with otel_tracer(size.emits) as tracer:
        spans = timed_calls(lambda i: tracer.start_span("step").end(), size.emits)
    report.add(
        Figure("emit one step event, p50", percentile(ours, 0.5), "us", note=f"{dropped} dropped"),
        Figure("emit one step event, p99", percentile(ours, 0.99), "us"),
        Figure("  peer: prometheus_client Histogram.observe, p50", percentile(bare, 0.5), "us"),
        Figure("  peer: prometheus_client Histogram.observe, p99", percentile(bare, 0.99), "us"),
        Figure("  peer: one OpenTelemetry span per step, p50", percentile(spans, 0.5), "us"),
        Figure("  peer: one OpenTelemetry span per step, p99", percentile(spans, 0.99), "us"),
    )
    step, instrumented, datagram = per_step(report, size, sidecar, workdir)
    calls = max(200, size.emits // 4)  # as many as the instrumented step was timed over, the same way
    with otel_tracer(3 * calls) as tracer:  # three rounds
        span = paced_seconds_per_call(lambda i: tracer.start_span("step").end(), calls)
    floor, would_block = bare_send(datagram, calls, sidecar)
    least = least_step(calls, sidecar)
    report.add(
        Figure(
            "  peer: the least such a step costs in Python",
            least * 1e6,
            "us",
            note="four with-blocks reading the clock, one step event made, encoded and sent, timed as ours",
        ),
        ratio(
            "instrumented step / one OpenTelemetry span",
            instrumented * 1e6,
            span * 1e6,
            "us",
            "<= 0.5",
            "a step with three phases and its event, against a span started and ended (batch processor)",
        ),
        ratio(
            "instrumented step / the least such a step costs in Python",
            instrumented * 1e6,
            least * 1e6,
            "us",
            note="what tpuscope's Python adds to the API's shape (no target: read beside the bare send's)",
        ),
        ratio(
            "instrumented step / a bare send of its event",
            instrumented * 1e6,
            floor * 1e6,
            "us",
            "<= 2",
            f"the same {len(datagram)} bytes on the same SOCK_SEQPACKET socket to the same sidecar"
            + (f" ({would_block:,} sends found the buffer full)" if would_block else ""),
        ),
    )
    loss_cost(report, size, sidecar, workdir)
    hang_watch_cost(report, size, sidecar)
    annotation_cost(report, size, workdir)
    capture_cost(report, size, sidecar, workdir, step)


class TrainingValuesSeen:
    """A sink counting the steps' losses read (carried by the step events, and by the last one at the close) and
    the values the job says went unread."""

    read = 0
    unread = 0

    def emit(self, event: events.AnyEvent) -> None:
        if isinstance(event, events.Step | events.TrainingValues):
            self.read += sum(v.loss is not None for v in event.values)
            self.unread += event.unread

    def close(self) -> None:
        pass


def loss_cost(report: Report, size: Size, sidecar: SidecarProcess, workdir: Path) -> None:
    """What reporting the loss every step (``s.loss``) costs a real job: the default JAX workload with the
    Monitor on throughout, its loss and per-device values given to ``s.loss`` or not (the workload's
    ``report_loss``), in blocks interleaved as the Monitor's own A/B's; and ``s.loss`` timed directly on empty
    steps, of a number and of a ready JAX array as the workload's, against the same steps without it."""
    from tpuscope.workload.training import Workload, WorkloadOptions, ensure_cpu_devices

    ensure_cpu_devices(8)  # as per_step's workload (before jax is first imported, where this runs alone)
    import jax
    import numpy as np

    from tpuscope.workload.model import AXIS, SHARDED

    seen, block = TrainingValuesSeen(), 10
    # As a job's Monitor: spans sampled 1 in 100, device profiles at the default period (none inside so short a run).
    with Monitor(
        "perf-loss",
        socket=sidecar.socket,
        traces=Traces(spans_file=workdir / "spans-loss.jsonl"),
        sinks=[seen],
        hooks=Hooks(profile_period=DEFAULT_PERIOD),
    ) as monitor:
        options = WorkloadOptions(steps=size.ab_steps, checkpoint_every=0, run_dir=workdir / "run-loss")
        with Workload(options, monitor, log=lambda _: None) as workload:

            def report_loss(on: bool) -> None:
                workload.report_loss = on

            ab = ab_test(workload, size.ab_steps, block, switch=report_loss)
            devices = workload.devices
    # A value as the workload's: one element per device, each on its own (the per-device losses).
    mesh = jax.sharding.Mesh(np.array(devices), (AXIS,))
    array = jax.device_put(np.ones(len(devices), np.float32), jax.sharding.NamedSharding(mesh, SHARDED))
    array.block_until_ready()
    calls = max(200, size.emits // 4)
    with Monitor("perf-loss-probe", socket=sidecar.socket, traces=False, hooks=Hooks(profile_period="off")) as probe:
        best = best_alternated(
            {
                given: functools.partial(direct_cost, probe, steps=calls, loss=loss)
                for given, loss in (("none", None), ("number", 1.0), ("array", array))
            }
        )
    report.add(
        ratio(
            "JAX step, loss reported / not, p50",
            ab.step_on * 1e3,
            ab.step_off * 1e3,
            "ms",
            "<= 1.02",
            f"the Monitor on in both; s.loss(loss, local=...) every step or not, in blocks of {block} interleaved; "
            f"{seen.read} steps' losses read, {seen.unread} unread",
        ),
        Figure(
            "  A/B loss reported - not",
            ab.difference * 1e6,
            "us",
            note=f"+- {ab.margin * 1e6:.0f} us over {ab.pairs} block pairs: the machine's noise",
        ),
        Figure(
            "  s.loss per step, a number",
            (best["number"] - best["none"]) * 1e6,
            "us",
            note="an empty step with s.loss(1.0) less one without: the call, and the value read and sent",
        ),
        Figure(
            f"  s.loss per step, a ready JAX array over {len(devices)} devices",
            (best["array"] - best["none"]) * 1e6,
            "us",
            note="as above, of an array already computed, as the workload's per-device losses (its step gives two: "
            "loss and local)",
        ),
    )


def hang_watch_cost(report: Report, size: Size, sidecar: SidecarProcess) -> None:
    """What keeping the position for the sidecar's hang verdict adds to a step (its stores into the mapped
    record): the empty instrumented step with the hang watch on and off, side by side, alternated, best of each."""
    calls = max(200, size.emits // 4)
    with (
        Monitor(
            "perf-hang-on", socket=sidecar.socket, traces=False, hooks=Hooks(profile_period="off", hang_watch=True)
        ) as on,
        Monitor(
            "perf-hang-off", socket=sidecar.socket, traces=False, hooks=Hooks(profile_period="off", hang_watch=False)
        ) as off,
    ):
        best = best_alternated(
            {True: lambda: direct_cost(on, steps=calls), False: lambda: direct_cost(off, steps=calls)}
        )
    report.add(
        ratio(
            "instrumented step, hang watch on / off",
            best[True] * 1e6,
            best[False] * 1e6,
            "us",
            note="a step of three phases and its event; on: the position stored into the mapped record at each "
            "boundary (17 stores of a double)",
        ),
        Figure("  hang watch's cost per step", (best[True] - best[False]) * 1e6, "us", "<= 0.5"),
    )


class _Clocked:
    """A with-block that reads the clock as it begins and ends, and does nothing else."""

    __slots__ = ("began",)

    def __enter__(self) -> _Clocked:
        self.began = time.perf_counter()
        return self

    def __exit__(self, kind: object, value: object, tb: object) -> None:
        time.perf_counter()


def least_step(calls: int, sidecar: SidecarProcess) -> float:
    """Seconds per step of the least this API can cost in Python (a step and three phases as with-blocks that
    read the clock, one event made, encoded and sent to the same sidecar), timed as the Monitor's step is: what
    is left of ours above it is what tpuscope's Python does beyond the API's shape."""
    block = _Clocked()
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as sock:
        sock.connect(str(sidecar.socket))
        sock.setblocking(False)

        def step(i: int) -> None:
            with block:
                with block:
                    pass
                with block:
                    pass
                with block:
                    pass
            event = events.Step("perf-least", i + 1, 1e-3, 1e-4, 1e-4, 1e-4, 1e-4)
            try:  # noqa: SIM105 - not contextlib.suppress: its with-block would be timed too
                sock.send(events.encode(event), socket.MSG_NOSIGNAL)
            except BlockingIOError:
                pass

        return paced_seconds_per_call(step, calls)


class LastStep:
    """A sink keeping the last step event: the bytes a bare send is compared with."""

    step: events.Step | None = None

    def emit(self, event: events.AnyEvent) -> None:
        if isinstance(event, events.Step):
            self.step = event

    def close(self) -> None:
        pass


def per_step(report: Report, size: Size, sidecar: SidecarProcess, workdir: Path) -> tuple[float, float, bytes]:
    """The Monitor on the default JAX workload, on and off, interleaved; tracing unsampled, then sampled.

    Returns the JAX step's seconds (Monitor off, p50), the instrumentation's seconds per step with spans
    unsampled (what 99 steps in 100 pay) and the bytes of one of its step events."""
    from tpuscope.workload.training import Workload, WorkloadOptions, ensure_cpu_devices

    ensure_cpu_devices(8)
    os.environ.setdefault("OTEL_BSP_MAX_QUEUE_SIZE", str(4 * 4 * size.emits))  # every kept step's spans: none dropped
    results = []
    for label, every in (("spans unsampled", 10**9), ("spans sampled", 1)):
        spans = workdir / f"spans-{every}.jsonl"
        last = LastStep()
        # Device profiles at a job's default period: their per-step cost is part of the step's, and no capture
        # falls inside so short a run.
        with Monitor(
            "perf-step",
            socket=sidecar.socket,
            traces=Traces(spans_file=spans, sample_every=every),
            sinks=[last],
            hooks=Hooks(profile_period=DEFAULT_PERIOD),
        ) as monitor:
            options = WorkloadOptions(steps=size.ab_steps, checkpoint_every=0, run_dir=workdir / f"run-{every}")
            with Workload(options, monitor, log=lambda _: None) as workload:
                ab = ab_test(workload, size.ab_steps)
            direct = direct_cost(monitor, steps=max(200, size.emits // 4))
            profiler = monitor._profiler  # a benchmark may look inside: no capture may fall inside the measurement
            captured = sum(profiler.captures.values()) if profiler is not None else 0
        assert last.step is not None
        results.append((ab.step_off, direct, events.encode(last.step)))
        share = direct / ab.step_off * 100
        report.add(
            Figure(f"JAX step, Monitor off, p50 [{label}]", ab.step_off * 1e3, "ms"),
            Figure(
                f"  A/B on - off [{label}]",
                ab.difference * 1e6,
                "us",
                note=f"+- {ab.margin * 1e6:.0f} us over {ab.pairs} block pairs: the machine's noise",
            ),
            Figure(
                f"  instrumentation per step [{label}]",
                direct * 1e6,
                "us",
                note=f"{captured} device-profile captures fell inside the measurement" if captured else "",
            ),
            Figure(f"  instrumentation share of a step [{label}]", share, "%", "<= 0.5" if every > 1 else ""),
        )
    return results[0]


@contextmanager
def otel_tracer(spans: int) -> Iterator[Any]:
    """An OpenTelemetry tracer with a batch processor whose queue holds ``spans`` (an exporter that discards them);
    its provider is shut down after."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    class Discard(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(Discard(), max_queue_size=max(2 * spans, 4096)))
    try:
        yield provider.get_tracer("perf")
    finally:
        provider.shutdown()


def bare_send(datagram: bytes, calls: int, sidecar: SidecarProcess) -> tuple[float, int]:
    """Seconds per ``send`` of ``datagram`` as the Monitor's socket sends it (non-blocking, to the same sidecar,
    which must wake for it as for the Monitor's), and how many sends found the buffer full (dropped, as the
    Monitor would)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as sock:
        sock.connect(str(sidecar.socket))
        sock.setblocking(False)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)  # as the Monitor's sink asks
        full = [0]

        def send(i: int) -> None:
            try:
                sock.send(datagram, socket.MSG_NOSIGNAL)
            except BlockingIOError:
                full[0] += 1

        return paced_seconds_per_call(send, calls), full[0]


def annotation_cost(report: Report, size: Size, workdir: Path) -> None:
    """What the step annotation a capture puts on each traced step costs: no profiler session, and inside one
    (the Monitor's options: no Python tracer)."""
    import jax

    annotate = jax.profiler.StepTraceAnnotation

    def annotations() -> None:
        for n in range(size.annotations):
            with annotate(events.STEP_ANNOTATION, step_num=n):
                pass

    idle = best_seconds_per_call(annotations, size.annotations)
    options = jax.profiler.ProfileOptions()
    options.python_tracer_level = 0
    jax.profiler.start_trace(str(workdir / "annotation-trace"), profiler_options=options)
    try:
        tracing = best_seconds_per_call(annotations, size.annotations)
    finally:
        jax.profiler.stop_trace()  # type: ignore[no-untyped-call]
    report.add(
        Figure("step annotation, no profiler session", idle * 1e6, "us", note="outside a capture no step enters one"),
        Figure(
            "step annotation, during a capture",
            tracing * 1e6,
            "us",
            note=f"on each of the {CAPTURED_STEPS} steps a capture annotates",
        ),
    )


def capture_cost(report: Report, size: Size, sidecar: SidecarProcess, workdir: Path, split_step: float) -> None:
    """Real captures on the fused JAX workload (a production job's step): what one costs the job (``capture_s``:
    starting and stopping the trace on the profiler's thread), what its parse costs the sidecar (``parse_s``: a
    child process at the lowest priority), the job's share of the wall time between two captures at the default
    period, and the training steps' p50 during and right after each capture (from the session's start to the
    sidecar's answer) against the steps outside them, all in the same run."""
    from tpuscope.workload.training import Workload, WorkloadOptions

    profiles, steps = ProfileSink(), StepTimes()
    period = CAPTURE_PERIOD_STEPS * split_step
    with Monitor(
        "perf-capture", socket=sidecar.socket, traces=False, sinks=[profiles, steps], hooks=Hooks(profile_period=period)
    ) as monitor:
        options = WorkloadOptions(
            steps=size.capture_steps, fused=True, checkpoint_every=0, run_dir=workdir / "run-capture"
        )
        with Workload(options, monitor, log=lambda _: None) as workload:
            # The first steps compile: left out of the step time the profiler chooses its K from.
            workload.run(instrumented=iter([False] * 5 + [True] * size.capture_steps))
        profiler = monitor._profiler  # a benchmark may look inside: the profiler thread's history
        history = list(profiler.history) if profiler is not None else []
    ok = [p for p in profiles.profiles if p.result == "ok"]
    counts = ", ".join(f"{sum(p.result == r for p in profiles.profiles)} {r}" for r in events.PROFILE_RESULTS)
    costs, parses = [p.capture_s for p in ok], [p.parse_s for p in ok]
    mean = sum(costs) / len(costs) if costs else None
    detail = f"; max {max(costs):.3f} s, {sum(p.trace_bytes for p in ok) / len(ok) / 1e6:.1f} MB of trace" if ok else ""
    # Each capture's window: its session's start to the sidecar's answer; the stop alone, where the job serializes it.
    windows = [(began, ended) for what, began, ended in history if what in ("session", "stop", "handoff")]
    stops = [(began, ended) for what, began, ended in history if what == "stop"]
    # The parts of a window, apart: the session recording (the CPU backend traces each of its ops on the host's
    # own cores), the stop, and the hand-over until the sidecar's answer (the parse, in the sidecar's process).
    recording = [(began, ended) for what, began, ended in history if what == "session"]
    handing = [(began, ended) for what, began, ended in history if what == "handoff"]
    warm = steps.times[10:]  # the first steps compile and warm up: neither side's
    around = [ended - began for began, ended in warm if overlaps((began, ended), windows)]
    stopping = [ended - began for began, ended in warm if overlaps((began, ended), stops)]
    traced = [e - b for b, e in warm if overlaps((b, e), recording) and not overlaps((b, e), stops)]
    waiting = [e - b for b, e in warm if overlaps((b, e), handing) and not overlaps((b, e), stops)]
    outside = [ended - began for began, ended in warm if not overlaps((began, ended), windows)]

    def p50_ms(times: list[float]) -> float | None:
        return percentile(times, 0.5) * 1e3 if times else None

    report.add(
        Figure(
            "device-profile capture: the job's start and stop, mean",
            mean,
            "s",
            note=f"{counts} captures of the fused workload{detail}; on the profiler's thread, no parse",
        ),
        Figure(
            "  the sidecar's parse of a capture, mean",
            sum(parses) / len(parses) if parses else None,
            "s",
            note="a child process of the sidecar at its --profile-parser-nice (19 by default), started per trace"
            + (f"; max {max(parses):.2f} s" if parses else ""),
        ),
        Figure(
            "  capture cost share of wall time, default period",
            None if mean is None else mean / DEFAULT_PERIOD * 100,
            "%",
            f"<= {COST_BUDGET * 100:g}",
            f"the job's, one capture each {DEFAULT_PERIOD / 60:g} min of steps, off the training thread",
        ),
        ratio(
            "steps during and after a capture / the others, p50",
            p50_ms(around),
            p50_ms(outside),
            "ms",
            "<= 1.05",
            f"{len(around)} steps from a session's start to the sidecar's answer, {len(outside)} outside any",
        ),
        ratio(
            "  steps overlapping the trace's stop / the others, p50",
            p50_ms(stopping),
            p50_ms(outside),
            "ms",
            note=f"{len(stopping)} steps beside the job's stop (serializing the trace, without the GIL)",
        ),
        ratio(
            "  steps while the session records / the others, p50",
            p50_ms(traced),
            p50_ms(outside),
            "ms",
            note=f"{len(traced)} steps traced (on the CPU backend each op is traced on the cores that run it)",
        ),
        ratio(
            "  steps while the sidecar parses / the others, p50",
            p50_ms(waiting),
            p50_ms(outside),
            "ms",
            note=f"{len(waiting)} steps from the hand-over to the sidecar's answer (the parse left the job)",
        ),
    )


def overlaps(span: tuple[float, float], intervals: list[tuple[float, float]]) -> bool:
    return any(span[0] < ended and began < span[1] for began, ended in intervals)


class StepTimes:
    """A sink keeping each step's (start, end) in ``time.perf_counter`` seconds: its event is emitted as it ends."""

    def __init__(self) -> None:
        self.times: list[tuple[float, float]] = []

    def emit(self, event: events.AnyEvent) -> None:
        if isinstance(event, events.Step):
            ended = time.perf_counter()
            self.times.append((ended - event.duration_s, ended))

    def close(self) -> None:
        pass


class ProfileSink:
    """A sink keeping every device profile the steps carry."""

    def __init__(self) -> None:
        self.profiles: list[events.DeviceProfile] = []

    def emit(self, event: events.AnyEvent) -> None:
        if isinstance(event, events.Step) and event.profile is not None:
            self.profiles.append(event.profile)

    def close(self) -> None:
        pass


# --- the sidecar ----------------------------------------------------------------------------------------
def blast(path: str, seconds: float, rate: float, results: Any) -> None:
    """A job sending step events as fast as it can (``rate`` 0) or at ``rate`` per second."""
    os.sched_setaffinity(0, set(range(1, os.cpu_count() or 2)) or {0})
    with Monitor(f"perf-ingest-{os.getpid()}", socket=path, traces=False) as mon:
        sent, start = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - start) < seconds:
            if rate and sent > elapsed * rate:
                time.sleep(0.0005)
                continue
            for i in range(100):
                with mon.step(sent + i):
                    pass
            sent += 100
        dropped = mon.dropped
    results.put((sent, dropped))


def start_jobs(path: str, seconds: float, rate: float, count: int) -> Callable[[], list[tuple[int, int]]]:
    """Start ``count`` job processes running :func:`blast`; the function returned waits for them and
    gives each one's (events sent, events it dropped)."""
    spawn = multiprocessing.get_context("spawn")
    results: Any = spawn.Queue()
    jobs = [spawn.Process(target=blast, args=(path, seconds, rate, results)) for _ in range(count)]
    for job in jobs:
        job.start()

    def finish() -> list[tuple[int, int]]:
        sent_dropped = [results.get(timeout=120) for _ in jobs]
        for job in jobs:
            job.join()
        return sent_dropped

    return finish


def ingest_counts(url: str) -> tuple[float, float, float]:
    scrape = Scrape.fetch(url)
    name = catalog.INGEST_EVENTS.name
    # The sidecar creates every result's series at start: one missing is a bug, not a zero.
    return (
        scrape.present(name, result=catalog.ACCEPTED),
        scrape.present(name, result=catalog.INVALID),
        scrape.present(name, result=catalog.DROPPED),
    )


def sidecar_side(report: Report, size: Size, workdir: Path) -> None:
    # The host collector on (it runs on every host), every 5 s as by default.
    with SidecarProcess(workdir / "ingest.sock", "127.0.0.1:0", "--collectors=host") as sidecar:
        os.sched_setaffinity(sidecar.proc.pid, {0})  # one core: the figure the target is about
        process = psutil.Process(sidecar.proc.pid)
        idle_cpu, idle_rss = usage(process, size.settle_seconds)
        # Steady load before the floods below, whose allocations the allocator keeps for a while.
        busy_cpu, busy_rss = usage(process, size.settle_seconds, str(sidecar.socket), rate=1000)
        report.add(
            Figure("sidecar RSS, idle", idle_rss, "MB", "<= 80"),
            Figure("sidecar CPU, idle", idle_cpu, "% core", "<= 1"),
            Figure("sidecar RSS, 1,000 steps/s", busy_rss, "MB", "<= 80"),
            Figure("sidecar CPU, 1,000 steps/s", busy_cpu, "% core"),
        )
        for label, rate, senders in (("flat out", 0, 2), (f"paced at {size.paced_rate:,}/s", size.paced_rate, 1)):
            before = ingest_counts(sidecar.url)
            sent_dropped = start_jobs(str(sidecar.socket), size.ingest_seconds, rate, senders)()
            time.sleep(1)
            after = ingest_counts(sidecar.url)
            accepted, invalid, _ = (b - a for a, b in zip(before, after, strict=True))
            accepted -= 2 * senders  # each job's lifecycle start and stop
            sent = sum(s for s, _ in sent_dropped)
            dropped = sum(d for _, d in sent_dropped)
            if rate:
                report.add(
                    Figure(
                        f"ingest {label}: events lost",
                        sent - accepted,
                        "events",
                        "<= 0",
                        f"{sent:,} sent, {accepted:,.0f} accepted, {invalid:.0f} invalid",
                    )
                )
            else:
                report.add(
                    Figure(
                        "ingest on one core, step events",
                        accepted / size.ingest_seconds,
                        "events/s",
                        ">= 100000",
                        f"{dropped:,} dropped by the jobs (counted), {invalid:.0f} invalid",
                    )
                )
        report.add(
            Figure(
                "sidecar RSS after the floods",
                process.memory_info().rss / 2**20,
                "MB",
                "<= 80",
                "three workloads of a million steps each, none checkpointed",
            )
        )


def usage(process: psutil.Process, seconds: float, path: str = "", rate: int = 0) -> tuple[float, float]:
    """The process' CPU (% of one core) over ``seconds`` (with a job sending at ``rate`` when given), and RSS."""
    finish = start_jobs(path, seconds, rate, 1) if path else None
    if finish:
        time.sleep(min(1.0, seconds))  # the job's start-up is not the sidecar's cost
    before, start = process.cpu_times(), time.perf_counter()
    time.sleep(seconds)
    after, elapsed = process.cpu_times(), time.perf_counter() - start
    if finish:
        finish()
    cpu = max(0.0, after.user + after.system - before.user - before.system) / elapsed * 100
    return cpu, process.memory_info().rss / 2**20


# --- scrapes ------------------------------------------------------------------------------------------
def series_count(url: str) -> int:
    with urllib.request.urlopen(url, timeout=30) as response:
        return sum(1 for raw in response.read().splitlines() if raw and not raw.startswith(b"#"))


def scrape_latencies(url: str, scrapes: int) -> list[float]:
    scrape_once(url)  # the first scrape warms the collectors' caches
    return [scrape_once(url)[0] * 1e3 for _ in range(scrapes)]


def scrape_side(report: Report, size: Size, workdir: Path) -> None:
    judged: tuple[int, float] | None = None  # series, p50 (ms) of the size judged against node_exporter
    # Thousands of workloads on one sidecar: past the cap on a label's values (100 by default) they would fold into
    # one _overflow workload, and the series would stop growing near 10,000.
    with SidecarProcess(
        workdir / "scrape.sock", "127.0.0.1:0", "--collectors=none", "--max-label-values=100000"
    ) as sidecar:
        base = series_count(sidecar.url)
        fill_more(sidecar.socket, 0, 1)
        time.sleep(0.2)
        per_workload = series_count(sidecar.url) - base
        filled = 1
        for target in size.series:
            wanted = max(1, (target - base) // per_workload)
            fill_more(sidecar.socket, filled, wanted)
            filled = max(filled, wanted)
            time.sleep(0.5)
            count = series_count(sidecar.url)
            timings = scrape_latencies(sidecar.url, size.scrapes)
            report.add(
                Figure(f"scrape p50 at {count:,} series", percentile(timings, 0.5), "ms"),
                Figure(f"scrape p99 at {count:,} series", percentile(timings, 0.99), "ms"),
            )
            if target == size.judged_series:
                judged = (count, percentile(timings, 0.5))
    peer = node_exporter(report, size)
    if judged is not None:
        ours = judged[1] / judged[0] * 1e3
        report.add(
            ratio(
                "scrape per series / node_exporter's",
                ours,
                None if peer is None else peer[1] / peer[0] * 1e3,
                "us",
                "<= 0.1",
                f"p50 over {judged[0]:,} series"
                + (f", against node_exporter's over {peer[0]:,}" if peer else ": node_exporter not installed"),
            )
        )


def fill_more(path: Path, have: int, want: int) -> None:
    """Steps of workloads ``have`` to ``want`` - 1, one event each, over one connection (as many jobs would)."""
    if want > have:
        with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as s:
            s.connect(str(path))
            for w in range(have, want):
                event = events.Step(workload=f"w{w}", step=1, duration_s=0.1, compute_s=0.05, io_s=0.01)
                s.send(events.encode(event))
                if w % 200 == 199:
                    time.sleep(0.01)


def node_exporter(report: Report, size: Size) -> tuple[int, float] | None:
    """node_exporter scraped as ours are; its series and p50 (ms), None when it is not installed."""
    binary = shutil.which("prometheus-node-exporter")
    if binary is None:
        report.add(Figure("  peer: node_exporter scrape p99", None, "ms", note="not installed (make system-deps)"))
        return None
    port = free_port()
    with running([binary, f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"]):
        url = f"http://127.0.0.1:{port}/metrics"
        deadline = time.monotonic() + 20
        while True:
            try:
                count = series_count(url)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        timings = scrape_latencies(url, size.scrapes)
    report.add(
        Figure(f"  peer: node_exporter scrape p50 ({count:,} series)", percentile(timings, 0.5), "ms"),
        Figure(f"  peer: node_exporter scrape p99 ({count:,} series)", percentile(timings, 0.99), "ms"),
    )
    return count, percentile(timings, 0.5)


@contextmanager
def running(command: list[str]) -> Iterator[subprocess.Popen[bytes]]:
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield process
    finally:
        process.terminate()
        process.wait(10)


# --- the whole run -------------------------------------------------------------------------------------
def run(args: argparse.Namespace) -> int:
    tiny: bool = args.tiny
    json_path: Path = args.json or DEFAULT_JSON
    size = TINY if tiny else FULL
    report = Report(machine())
    print(f"tpuscope bench perf ({'tiny' if tiny else 'full'} size) on {report.machine}", flush=True)
    with tempfile.TemporaryDirectory(prefix="ts-perf-") as tmp:
        workdir = Path(tmp)
        print("The job:", flush=True)
        with SidecarProcess(workdir / "job.sock", "127.0.0.1:0", "--collectors=none") as sidecar:
            job_side(report, size, sidecar, workdir)
        print("The sidecar:", flush=True)
        sidecar_side(report, size, workdir)
        print("Scrapes:", flush=True)
        scrape_side(report, size, workdir)
    print("Ratios to the peers measured in this run (the headline; the absolute figures beside):", flush=True)
    for f in report.figures:
        if f.absolute_unit:
            print(line(f))
    missed = [f.name for f in report.figures if f.met is False]
    print(
        f"{len(report.figures)} figures, {sum(f.met is True for f in report.figures)} targets met, "
        f"{len(missed)} missed{': ' + '; '.join(missed) if missed else ''}"
    )
    text = json.dumps(report.json(), indent=2)
    print(text)
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(text + "\n")
    print(f"JSON: {json_path}")
    return 0
