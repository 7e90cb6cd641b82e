"""``tpuscope serve`` as a process: ingest health, bad datagrams, the socket's safety, shutdown."""

from __future__ import annotations

import math
import os
import random
import signal
import socket
import stat
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import msgspec
import pytest
from conftest import sockets, variation
from prometheus_client import CollectorRegistry

from tpuscope import catalog, conventions, events
from tpuscope.exporter.aggregator import Aggregator
from tpuscope.exporter.exposition import Writer
from tpuscope.exporter.metrics import register
from tpuscope.exporter.samples import SampleStore
from tpuscope.scrape import Scrape
from tpuscope.testing.waiting import scrape_until, wait_for
from tpuscope.tracing import Hooks, Monitor
from tpuscope.workload.sidecar import SidecarProcess

INGEST = catalog.INGEST_EVENTS.name
INVALID = catalog.INGEST_INVALID_EVENTS.name
PROCESSES = catalog.WORKLOAD_PROCESSES.name


def send(path: Path, *messages: bytes) -> None:
    """What a job does, byte for byte: one message per event on a connection of its own."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as s:
        s.connect(str(path))
        for message in messages:
            s.send(message)


def accepted(sidecar: SidecarProcess) -> int:
    """How many job connections the sidecar holds: its sockets at the event socket's path, less the listener.
    (It asks for the kernel's stamps on each in the same breath as it accepts it.)"""
    held = sockets(sidecar.proc.pid, "unix")
    return sum(str(c.laddr) == str(sidecar.socket) for c in held) - 1


def test_an_event_read_late_is_filed_at_the_time_it_was_sent(sidecar: SidecarProcess) -> None:
    """The sidecar reads its jobs' connections on a timer; here it is stopped for 1.5 s after a step is sent, and
    still files the step (the last-step timestamp, what TpuscopeWorkloadStalled counts from) at the kernel's
    stamp of the send, not at the time it read it."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as job:
        job.connect(str(sidecar.socket))
        wait_for(lambda: accepted(sidecar) == 1, 20, "the sidecar's accept of the job's connection")
        os.kill(sidecar.proc.pid, signal.SIGSTOP)
        try:
            before = time.time()
            job.send(events.encode(events.Step(workload="late", step=1, duration_s=0.1, compute_s=0.1)))
            sent = time.time()
            time.sleep(1.5)  # the sidecar stopped: the lateness under test
        finally:
            os.kill(sidecar.proc.pid, signal.SIGCONT)
        scrape = scrape_until(sidecar.url, lambda s: (s.value(catalog.LAST_STEP.name, workload="late") or 0) > 0)
    # The kernel's stamp is in whole microseconds: it may read up to one below the clock read before the send.
    assert before - 1e-6 <= scrape.present(catalog.LAST_STEP.name, workload="late") <= sent


def test_bad_datagrams_are_counted_by_reason_and_the_daemon_keeps_serving(sidecar: SidecarProcess) -> None:
    step = events.encode(events.Step(workload="ok", step=1, duration_s=0.1, compute_s=0.1))
    bad = {
        "malformed": b"\x00\xffnot an event",
        "truncated": step[:-5],
        "oversized": events.HEADER + b"\x00" * (events.MAX_DATAGRAM_BYTES * 4),
        "unknown_version": b"TS\x02" + step[3:],
        "invalid_field": events.HEADER + b"\x93\xa4step\xa2ok\xff",  # step -1
    }
    send(sidecar.socket, *bad.values())
    send(sidecar.socket, step)

    # Both connections read, in either order: a loaded sidecar may read the second first.
    def both(s: Scrape) -> bool:
        return (s.value(INGEST, result="accepted") or 0) >= 1 and (s.value(INGEST, result="invalid") or 0) >= len(bad)

    scrape = scrape_until(sidecar.url, both)
    for reason in bad:
        assert scrape.value(INVALID, reason=reason) == 1, reason
    assert scrape.value(INGEST, result="invalid") == len(bad)
    assert scrape.value(INGEST, result="accepted") == 1
    assert scrape.value(catalog.STEPS.name, workload="ok") == 1
    assert sidecar.proc.poll() is None
    with urllib.request.urlopen(sidecar.url.replace("/metrics", "/healthz")) as r:
        assert r.read() == b"ok\n"


def test_every_event_kind_lands_in_its_metric(sidecar: SidecarProcess) -> None:
    with Monitor("kinds", socket=sidecar.socket) as mon:
        with mon.step(0) as s, s.phase("compute"):
            time.sleep(0.001)
        mon.compile("backend", 2.5, function="train_step")
        mon.compile_cache(hit=True)
        mon.compile_cache(hit=False)
        with mon.checkpoint("save", step=0) as ckpt:
            ckpt.bytes = 1234
        mon.device_memory("0", "v5e", used_bytes=100, limit_bytes=1000, peak_bytes=200)
        mon.program_memory("train_step", spill_bytes=64)
        mon.lifecycle("restart", reason="preemption")
        mon.lifecycle("failure", reason="crash")
        mon.inference_batch(4, queue_depth=2, request_seconds=[0.01, 0.02, 0.03])
        mon.recompile("input_types")
        mon.model_loaded("v1")
        loaded = time.time()
        mon.model_loaded("v2")  # a new model replaces the old: one series, the age of the one served now
    expected_events = mon.sent
    scrape = scrape_until(sidecar.url, lambda s: (s.value(INGEST, result="accepted") or 0) >= expected_events)
    w = {"workload": "kinds"}
    assert scrape.value(catalog.STEP_DURATION.series("count"), **w) == 1
    assert scrape.value(catalog.COMPILE_DURATION.series("sum"), stage="backend", **w) == 2.5
    assert scrape.value(catalog.COMPILE_CACHE_REQUESTS.name, result="hit", **w) == 1
    assert scrape.value(catalog.COMPILE_CACHE_REQUESTS.name, result="miss", **w) == 1
    assert scrape.value(catalog.CHECKPOINT_BYTES.name, operation="save", **w) == 1234
    assert scrape.value(catalog.CHECKPOINT_DURATION.series("count"), result="ok", **w) == 1
    assert scrape.value(catalog.CHECKPOINT_LAST_SUCCESS.name, **w) == pytest.approx(time.time(), abs=60)
    device = {"device": "0", "accelerator": "v5e", "source": "workload"}
    assert scrape.value(catalog.DEVICE_MEMORY_USED.name, **device) == 100
    assert scrape.value(catalog.DEVICE_MEMORY_LIMIT.name, **device) == 1000
    assert scrape.value(catalog.DEVICE_MEMORY_PEAK.name, **device) == 200
    assert scrape.value(catalog.MEMORY_SPILL.name, program="train_step", **w) == 64
    assert scrape.value(catalog.WORKLOAD_RESTARTS.name, reason="preemption", **w) == 1
    assert scrape.value(catalog.WORKLOAD_FAILURES.name, reason="crash", **w) == 1
    assert scrape.value(catalog.INFERENCE_BATCH_SIZE.series("sum"), **w) == 4
    assert scrape.value(catalog.INFERENCE_QUEUE_DEPTH.name, **w) == 2
    assert scrape.value(catalog.INFERENCE_REQUEST_DURATION.series("count"), **w) == 3
    assert scrape.value(catalog.BUILD_INFO.name) == 1
    assert scrape.value(catalog.RECOMPILES.name, cause="input_types", **w) == 1
    [model] = scrape.find(catalog.MODEL_LOADED.name, **w)
    assert model.labels["version"] == "v2" and loaded <= model.value <= time.time()


def test_a_checkpoint_or_compile_ending_is_progress_as_a_step_is(sidecar: SidecarProcess) -> None:
    """TpuscopeWorkloadStalled counts from the last progress: a long save or compile after the last step is none."""
    w = {"workload": "progress"}
    last_step, progress = catalog.LAST_STEP.name, catalog.LAST_PROGRESS.name
    with Monitor("progress", socket=sidecar.socket) as mon:
        started = scrape_until(sidecar.url, lambda s: (s.value(progress, **w) or 0) > 0)
        assert started.present(progress, **w) == started.present(last_step, **w)  # the start is progress
        time.sleep(0.05)  # each event below must be stamped later than the last: only time does that
        with mon.step(0):
            pass
        stepped = scrape_until(sidecar.url, lambda s: (s.value(last_step, **w) or 0) > started.present(last_step, **w))
        assert stepped.present(progress, **w) == stepped.present(last_step, **w)
        time.sleep(0.05)
        mon.compile("backend", 30.0, function="train_step")
        compiled = scrape_until(sidecar.url, lambda s: (s.value(progress, **w) or 0) > stepped.present(progress, **w))
        time.sleep(0.05)
        with pytest.raises(OSError), mon.checkpoint("save", step=1):  # a failed save too: the job goes on
            raise OSError("disk full")
        saved = scrape_until(sidecar.url, lambda s: (s.value(progress, **w) or 0) > compiled.present(progress, **w))
    assert saved.value(progress, **w) == pytest.approx(time.time(), abs=60)
    assert saved.present(last_step, **w) == stepped.present(last_step, **w)  # neither is a step


def test_openmetrics_is_served_when_asked_for(sidecar: SidecarProcess) -> None:
    request = urllib.request.Request(sidecar.url, headers={"Accept": "application/openmetrics-text; version=1.0.0"})
    with urllib.request.urlopen(request) as r:
        assert r.headers["Content-Type"].startswith("application/openmetrics-text")
        body = r.read().decode()
    assert body.endswith("# EOF\n")
    assert f"# UNIT {catalog.STEP_DURATION.name} seconds" in body


def test_socket_is_private_and_sigterm_removes_it(short_tmp: Path) -> None:
    path = short_tmp / "events.sock"
    sidecar = SidecarProcess(path)
    assert stat.S_ISSOCK(os.lstat(path).st_mode)
    assert stat.S_IMODE(os.lstat(path).st_mode) == 0o600
    assert sidecar.stop() == 0, sidecar.log()  # -9: it did not stop within 20 s of SIGTERM
    assert not path.exists()
    with SidecarProcess(path, "127.0.0.1:0", "--socket-mode", "0660"):
        assert stat.S_IMODE(os.lstat(path).st_mode) == 0o660


def serve_fails(path: Path) -> str:
    """Run ``tpuscope serve`` expecting it to refuse to start; return its error output."""
    proc = subprocess.run(
        [sys.executable, "-m", "tpuscope", "serve", "--listen", "127.0.0.1:0", "--socket", str(path)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 1, proc.stderr
    return proc.stderr


def test_serve_refuses_to_replace_a_file(short_tmp: Path) -> None:
    path = short_tmp / "precious.txt"
    path.write_text("data")
    assert "not a socket; refusing to replace it" in serve_fails(path)
    assert path.read_text() == "data"


def test_serve_never_follows_a_symlink(short_tmp: Path) -> None:
    target = short_tmp / "target.txt"
    target.write_text("data")
    link = short_tmp / "link.sock"
    link.symlink_to(target)
    assert "not a socket" in serve_fails(link)
    assert link.is_symlink() and target.read_text() == "data"


def test_serve_refuses_a_live_socket_and_replaces_a_stale_one(short_tmp: Path) -> None:
    path = short_tmp / "events.sock"
    with SidecarProcess(path):
        assert "already receiving" in serve_fails(path)
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    stale.bind(str(path))
    stale.close()  # the file stays, nobody listens: what a killed sidecar leaves behind
    assert path.exists()
    with SidecarProcess(path) as sidecar:
        assert Scrape.fetch(sidecar.url).has(catalog.BUILD_INFO.name)


def test_sidecar_survives_a_job_restart(sidecar: SidecarProcess) -> None:
    for run in range(2):
        with Monitor("restarts", socket=sidecar.socket) as mon, mon.step(run):
            pass
    scrape = scrape_until(sidecar.url, lambda s: s.value(catalog.STEPS.name, workload="restarts") == 2)
    assert scrape.present(INGEST, result="invalid") == 0


def test_sigkill_leaves_a_socket_the_next_sidecar_reclaims(short_tmp: Path) -> None:
    path = short_tmp / "events.sock"
    first = SidecarProcess(path)
    first.proc.send_signal(signal.SIGKILL)
    first.stop()
    assert path.exists()
    with SidecarProcess(path), Monitor("after-kill", socket=path) as mon, mon.step(0):
        pass
    assert mon.sent == 3 and mon.dropped == 0


def test_a_killed_job_is_recorded_as_a_failure(sidecar: SidecarProcess) -> None:
    """SIGKILL leaves no chance to say goodbye; the sidecar sees the connection drop."""
    job = (
        "import os, signal, time\n"
        "from tpuscope.tracing import Monitor\n"
        f"mon = Monitor('killed', socket={str(sidecar.socket)!r})\n"
        "with mon.step(0): pass\n"
        "time.sleep(0.2)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    assert subprocess.run([sys.executable, "-c", job], timeout=30).returncode == -signal.SIGKILL
    scrape = scrape_until(
        sidecar.url, lambda s: s.has(catalog.WORKLOAD_FAILURES.name, workload="killed", reason="vanished")
    )
    assert scrape.value(catalog.STEPS.name, workload="killed") == 1
    # A job that closes its Monitor is not a failure.
    with Monitor("clean", socket=sidecar.socket) as mon, mon.step(0):
        pass
    scrape_until(sidecar.url, lambda s: s.value(catalog.STEPS.name, workload="clean") == 1)
    # Its start made it a process: the series goes once the sidecar has handled the connection's end (a vanishing
    # would be booked before, where no metadata server is asked).
    scrape = scrape_until(sidecar.url, lambda s: not s.has(PROCESSES, workload="clean"))
    assert not scrape.has(catalog.WORKLOAD_FAILURES.name, workload="clean")


def test_connected_processes_per_workload_come_and_go(sidecar: SidecarProcess) -> None:
    """While a workload's processes are connected it has a series; it goes with the last of them."""
    processes = catalog.WORKLOAD_PROCESSES.name

    first, second = Monitor("pair", socket=sidecar.socket), Monitor("pair", socket=sidecar.socket)
    scrape_until(sidecar.url, lambda s: s.value(processes, workload="pair") == 2)
    first.close()
    scrape_until(sidecar.url, lambda s: s.value(processes, workload="pair") == 1)
    second.close()
    gone = scrape_until(sidecar.url, lambda s: not s.has(processes, workload="pair"))
    assert gone.has(INGEST, result="accepted")  # the sidecar serves on: only the workload's series went


def test_out_of_file_descriptors_a_connection_is_refused_counted_and_the_ingest_goes_on(short_tmp: Path) -> None:
    """EMFILE on accept() must not end the ingest thread: once descriptors are free again, jobs are heard."""
    with SidecarProcess(short_tmp / "fd.sock", "127.0.0.1:0", "--collectors=none") as sidecar:
        in_use = len(os.listdir(f"/proc/{sidecar.proc.pid}/fd"))
        limit = in_use + 4
        subprocess.run(["prlimit", f"--pid={sidecar.proc.pid}", f"--nofile={limit}:"], check=True)
        jobs = []
        for _ in range(12):  # more connections than the sidecar has descriptors left
            job = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            job.connect(str(sidecar.socket))
            jobs.append(job)
        # Out of descriptors, the sidecar serves no scrape either: its log says when it ran out.
        wait_for(lambda: "cannot accept a job's connection" in sidecar.log(), 20, "EMFILE", detail=sidecar.log)
        for job in jobs:
            job.close()
        subprocess.run(["prlimit", f"--pid={sidecar.proc.pid}", "--nofile=1024:"], check=True)
        with Monitor("after-emfile", socket=sidecar.socket, traces=False, hooks=Hooks(jax_compiles=False)) as mon:
            for n in range(3):
                with mon.step(n):
                    pass
        w = {"workload": "after-emfile"}
        scrape = scrape_until(sidecar.url, lambda s: s.value(catalog.STEPS.name, **w) == 3)
        assert scrape.value(catalog.STEPS.name, **w) == 3, sidecar.log()
        assert scrape.present(catalog.INGEST_CONNECTION_ERRORS.name, reason="accept") > 0
        with urllib.request.urlopen(sidecar.url.replace("/metrics", "/healthz"), timeout=5) as r:
            assert r.status == 200
        assert "cannot accept a job's connection" in sidecar.log()


# --- device profiles (issue 22) ---------------------------------------------------------------
PROFILED = events.DeviceProfile(
    "ok",
    steps=4,
    devices=4,
    step_s=1.0,
    compute_s=0.6,
    exposed_collective_s=0.3,
    overlapped_collective_s=0.1,
    idle_s=0.1,
    slowest_compute_s=0.66,
    capture_s=2.5,
    trace_bytes=1000,
    period_s=900.0,
)


# The one label a device-profile series has besides workload, slice and worker, if any.
PROFILE_LABELS = (catalog.Label.PART, catalog.Label.RESULT, catalog.Label.CLASSIFIED_BY)


def profile_series(scrape: Scrape, workload: str) -> dict[tuple[str, str], float]:
    """The workload's device-profile samples by name and the one label besides workload, slice and worker."""
    profile = {m.name for m in catalog.CATALOG if m.group == catalog.PROFILE_GROUP}
    return {
        (sample.name, next((sample.labels[k] for k in PROFILE_LABELS if k in sample.labels), "")): sample.value
        for sample in scrape.samples
        if sample.name in profile and sample.labels.get("workload") == workload
    }


def test_a_step_with_a_profile_sets_the_profile_series(sidecar: SidecarProcess) -> None:
    step = events.Step(workload="prof", step=1, duration_s=1.0, compute_s=1.0, profile=PROFILED)
    send(sidecar.socket, events.encode(step))
    scrape = scrape_until(sidecar.url, lambda s: s.value(catalog.STEPS.name, workload="prof") == 1)
    got = profile_series(scrape, "prof")
    received = got.pop((catalog.PROFILE_LAST_CAPTURE.name, ""))
    assert received == pytest.approx(time.time(), abs=60)
    # A parser too old to send the steps one by one: its 4 steps each equal to its means, with no spread.
    assert got == pytest.approx(
        {
            (catalog.PROFILE_CAPTURES.name, "ok"): 1,
            (catalog.PROFILE_CAPTURE_SECONDS.name, ""): 2.5,
            (catalog.PROFILE_CAPTURE_BYTES.name, ""): 1000,
            (catalog.PROFILE_STEP.name, ""): 1.0,
            (catalog.PROFILE_STEPS.name, ""): 4,
            (catalog.PROFILE_TIME.name, "compute"): 0.6,
            (catalog.PROFILE_TIME.name, "exposed_collective"): 0.3,
            (catalog.PROFILE_TIME.name, "idle"): 0.1,
            **{(catalog.PROFILE_TIME_STDDEV.name, part): 0.0 for part in catalog.PROFILE_PARTS},
            (catalog.PROFILE_OVERLAP.name, ""): 0.25,  # 0.1 of 0.4 collective seconds hidden
            (catalog.PROFILE_IMBALANCE.name, ""): 1.1,
            (catalog.PROFILE_PERIOD.name, ""): 900.0,
            **{(catalog.PROFILE_OPS.name, by): 0 for by in catalog.PROFILE_OP_CLASSIFIERS},
        }
    )
    assert scrape.value(catalog.STEP_DURATION.series("count"), workload="prof") == 1  # the step counts as ever
    # The next capture, its steps one by one: the gauges are the mean over the 6 steps of both, and serve the
    # spread of each part from step to step.
    steps = (PROFILED_STEP, msgspec.structs.replace(PROFILED_STEP, exposed_collective_s=0.1, idle_s=0.3))
    second = msgspec.structs.replace(PROFILED, steps=2, per_step=steps, ops_by_category=40, ops_by_name=2)
    send(sidecar.socket, events.encode(msgspec.structs.replace(step, step=2, profile=second)))
    scrape = scrape_until(sidecar.url, lambda s: s.value(catalog.STEPS.name, workload="prof") == 2)
    exposed = [0.3] * 4 + [0.3, 0.1]
    assert scrape.value(catalog.PROFILE_STEPS.name, workload="prof") == 6
    mean = {
        "compute": 0.6,
        "exposed_collective": statistics.fmean(exposed),
        "idle": 1.0 - 0.6 - statistics.fmean(exposed),
    }
    spread = {"compute": 0.0, "exposed_collective": statistics.pstdev(exposed), "idle": statistics.pstdev(exposed)}
    for part in catalog.PROFILE_PARTS:
        assert scrape.value(catalog.PROFILE_TIME.name, workload="prof", part=part) == pytest.approx(mean[part])
        assert scrape.value(catalog.PROFILE_TIME_STDDEV.name, workload="prof", part=part) == pytest.approx(spread[part])
    assert scrape.value(catalog.PROFILE_OPS.name, workload="prof", classified_by="name") == 2
    # A workload whose captures saw no collective at all: no overlap to speak of.
    alone = msgspec.structs.replace(PROFILED, exposed_collective_s=0.0, overlapped_collective_s=0.0, idle_s=0.4)
    send(sidecar.socket, events.encode(msgspec.structs.replace(step, workload="solo", profile=alone)))
    scrape = scrape_until(sidecar.url, lambda s: s.value(catalog.STEPS.name, workload="solo") == 1)
    assert not scrape.has(catalog.PROFILE_OVERLAP.name, workload="solo")
    assert scrape.value(catalog.PROFILE_TIME.name, workload="solo", part="idle") == 0.4


# --- the mean of the last captures (issue 36), in process: the test sets the clock -----------------------------
PROFILED_STEP = events.ProfiledStep(1.0, 0.6, 0.3, 0.1, 0.1, 0.66)
PERIOD = 600.0  # seconds between two captures


def profiled_aggregator() -> tuple[CollectorRegistry, Aggregator]:
    registry, store = CollectorRegistry(), SampleStore()
    registry.register(store)
    return registry, Aggregator(register(registry), store)


def capture(exposed: tuple[float, ...], compute: float = 0.5) -> events.DeviceProfile:
    """A capture of 1-second steps whose exposed collective time is ``exposed``, one value a step (the rest idle)."""
    steps = tuple(events.ProfiledStep(1.0, compute, e, 0.1, 1.0 - compute - e, compute) for e in exposed)
    return events.DeviceProfile("ok", steps=len(steps), devices=1, period_s=PERIOD, per_step=steps)


def served(registry: CollectorRegistry) -> Scrape:
    return Scrape(Writer(registry).render(openmetrics=False).decode())


def send_capture(aggregator: Aggregator, workload: str, at: float, profile: events.DeviceProfile) -> None:
    aggregator.accept(events.Step(workload=workload, step=1, duration_s=1.0, compute_s=1.0, profile=profile), at=at)


def test_the_gauges_are_the_mean_of_the_last_three_fresh_captures() -> None:
    registry, aggregator = profiled_aggregator()
    exposed = (0.1, 0.2, 0.3, 0.4)
    for index, seconds in enumerate(exposed):  # one capture a period, each of 2 steps of the same wait
        send_capture(aggregator, "w", index * PERIOD, capture((seconds, seconds)))
    scrape = served(registry)
    kept = exposed[-catalog.PROFILE_MEAN_CAPTURES :]  # the first capture fell out of the window
    assert scrape.value(catalog.PROFILE_STEPS.name, workload="w") == 2 * catalog.PROFILE_MEAN_CAPTURES
    assert scrape.value(catalog.PROFILE_TIME.name, workload="w", part="exposed_collective") == pytest.approx(
        statistics.fmean(kept)
    )
    assert scrape.value(catalog.PROFILE_TIME_STDDEV.name, workload="w", part="exposed_collective") == pytest.approx(
        statistics.pstdev(kept)
    )
    # After a pause longer than the rules' freshness (3 periods), the next capture is averaged alone: a mean
    # must not carry a capture the rules would no longer count.
    later = (len(exposed) - 1) * PERIOD + conventions.PROFILE_FRESH_PERIODS * PERIOD + 1
    send_capture(aggregator, "w", later, capture((0.05, 0.15)))
    scrape = served(registry)
    assert scrape.value(catalog.PROFILE_STEPS.name, workload="w") == 2
    assert scrape.value(catalog.PROFILE_TIME.name, workload="w", part="exposed_collective") == pytest.approx(0.1)
    assert scrape.value(catalog.PROFILE_TIME_STDDEV.name, workload="w", part="exposed_collective") == pytest.approx(
        0.05
    )


def test_the_alert_series_over_three_captures_varies_less_than_one_captures_two_steps() -> None:
    """Issue 36: one step's exposed collective time varies by half or more from the next, and a capture of a job
    older than the issue measures 2 steps (tests/test_profiles.py shows the same on a real job's captures of 5).
    What TpuscopeSyncBound reads, the exposed collective share of the step, from a run of 60 captures: its
    variation from capture to capture when the sidecar served the latest capture alone, and now that it serves
    the mean of the last 3."""
    rng = random.Random(36)
    registry, aggregator = profiled_aggregator()
    # Exposed collective seconds a step: a mean of 0.2 s in 1-second steps, a coefficient of variation near 0.7.
    steps = [[min(0.45, rng.lognormvariate(math.log(0.17), 0.6)) for _ in range(2)] for _ in range(60)]
    latest_alone, served_mean = [], []
    for index, exposed in enumerate(steps):
        send_capture(aggregator, "w", index * PERIOD, capture(tuple(exposed)))
        scrape = served(registry)
        share = scrape.present(catalog.PROFILE_TIME.name, workload="w", part="exposed_collective") / scrape.present(
            catalog.PROFILE_STEP.name, workload="w"
        )
        served_mean.append(share)
        latest_alone.append(statistics.fmean(exposed))  # 1-second steps: the share is the seconds
    every_step = [seconds for capture_steps in steps for seconds in capture_steps]
    alone, mean = (s[catalog.PROFILE_MEAN_CAPTURES - 1 :] for s in (latest_alone, served_mean))  # the window full
    step_cv, alone_cv, mean_cv = (variation(s) for s in (every_step, alone, mean))
    print(
        f"\nexposed collective, step to step: CV {step_cv:.0%} over {len(every_step)} steps"
        f"\nalert series, the latest capture alone: CV {alone_cv:.0%}, {min(alone):.3f} to {max(alone):.3f}"
        f"\nalert series, the mean of the last {catalog.PROFILE_MEAN_CAPTURES} captures: CV {mean_cv:.0%}, "
        f"{min(mean):.3f} to {max(mean):.3f}"
    )
    assert step_cv >= 0.5, "the run must be as noisy as the issue's"
    assert mean_cv < alone_cv
    assert mean_cv < 0.75 * alone_cv, "3 captures of 2 steps: about 1/sqrt(3) of one capture's variation"


def test_a_busy_or_failed_capture_is_only_counted(sidecar: SidecarProcess) -> None:
    """It measured nothing: its attempt and its cost are counted, but no gauge of a measure is set, so the rules
    never read its zeros as a profile. It still says the job's period (the last one known: a job older than the
    field says 0, unknown), by which the rules judge the age of the last capture that measured."""
    attempts: tuple[tuple[int, events.ProfileResult, float, float], ...] = (
        (1, "busy", 0.0, 1200.0),
        (2, "error", 0.5, 2400.0),
        (3, "error", 0.25, 0.0),
    )
    # On one connection, as one job sends them: the last period known is the last sent. (Each on a connection of its
    # own, a loaded sidecar may read the second before the first: a fresh-clone run served 1200.)
    steps = [
        events.Step(
            workload="unprof", step=step, duration_s=1.0, profile=events.DeviceProfile(result, capture_s=c, period_s=p)
        )
        for step, result, c, p in attempts
    ]
    send(sidecar.socket, *map(events.encode, steps))
    scrape = scrape_until(sidecar.url, lambda s: s.value(catalog.STEPS.name, workload="unprof") == 3)
    assert profile_series(scrape, "unprof") == {
        (catalog.PROFILE_CAPTURES.name, "busy"): 1,
        (catalog.PROFILE_CAPTURES.name, "error"): 2,
        (catalog.PROFILE_CAPTURE_SECONDS.name, ""): 0.75,
        (catalog.PROFILE_CAPTURE_BYTES.name, ""): 0,
        (catalog.PROFILE_PERIOD.name, ""): 2400.0,
    }


def test_the_period_goes_with_an_expired_workload(short_tmp: Path) -> None:
    """A finished job's period must not outlive its other profile series: the rules would judge a later job of the
    same name by it."""
    path = short_tmp / "s.sock"
    with SidecarProcess(path, "127.0.0.1:0", "--workload-expiry", "2s", "--collectors=none") as sidecar:
        step = events.Step(workload="ended", step=1, duration_s=1.0, compute_s=1.0, profile=PROFILED)
        send(path, events.encode(step))
        scrape = scrape_until(sidecar.url, lambda s: s.has(catalog.PROFILE_PERIOD.name, workload="ended"))
        assert scrape.value(catalog.PROFILE_PERIOD.name, workload="ended") == 900.0
        scrape = scrape_until(sidecar.url, lambda s: not profile_series(s, "ended"), timeout=30)
        assert not scrape.has(catalog.PROFILE_PERIOD.name, workload="ended")
        assert scrape.value(catalog.WORKLOADS_EXPIRED.name) == 1
