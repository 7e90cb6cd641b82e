"""The in-job Monitor never blocks and never raises, and counts what it could not deliver."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import pytest
from recorder import Recorder

from tpuscope import catalog, events
from tpuscope.testing.waiting import scrape_until
from tpuscope.tracing import Hooks, Monitor, Traces, sinks
from tpuscope.workload.sidecar import SidecarProcess


def step_until_delivered(monitor: Monitor, first: int) -> None:
    """Step from ``first`` until an event reaches the sidecar: the Monitor retries about once a second."""
    n = first
    while monitor.sent == 0:
        assert n < 1000, "the Monitor never reached the sidecar"
        with monitor.step(n):
            time.sleep(0.01)
        n += 1


def test_100k_steps_without_a_sidecar_never_raise_and_report_drops(
    short_tmp: Path, caplog: pytest.LogCaptureFixture
) -> None:
    monitor = Monitor("no-sidecar", socket=short_tmp / "nobody.sock")
    for n in range(100_000):
        with monitor.step(n) as step:
            with step.phase("io"):
                pass
            with step.phase("compute"):
                pass
    monitor.close()
    assert monitor.sent == 0
    assert monitor.dropped == 100_000 + 2  # the steps, start and stop
    assert "100002 of 100002 events were not delivered" in caplog.text


def test_a_full_socket_buffer_drops_instead_of_blocking(short_tmp: Path) -> None:
    """A sidecar that stops reading must not stall the job: sends fail at once and are counted."""
    path = short_tmp / "stuck.sock"
    stuck = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    stuck.bind(str(path))
    stuck.listen(1)  # connections queue, nobody accepts or reads
    monitor = Monitor("stuck", socket=path)
    done = threading.Event()

    def loop() -> None:
        for n in range(20_000):
            with monitor.step(n):
                pass
        done.set()

    threading.Thread(target=loop, daemon=True).start()
    assert done.wait(60), "the step loop blocked on a full socket"
    assert monitor.sent > 0 and monitor.dropped > 0
    assert monitor.sent + monitor.dropped == 20_000 + 1
    monitor.close()
    stuck.close()


def test_drops_are_reported_to_the_sidecar_with_the_next_step(short_tmp: Path) -> None:
    path = short_tmp / "late.sock"
    monitor = Monitor("late", socket=path)  # the start event is dropped: nobody listens yet
    for n in range(10):
        with monitor.step(n):
            pass
    assert monitor.dropped == 11
    with SidecarProcess(path) as sidecar:
        step_until_delivered(monitor, first=10)
        dropped = monitor.dropped
        name = catalog.INGEST_EVENTS.name
        scrape = scrape_until(sidecar.url, lambda s: s.present(name, result="accepted") >= 1, 5)
        assert scrape.value(name, result="dropped") == dropped
        assert scrape.value(catalog.STEPS.name, workload="late") == 1
        monitor.close()


def test_phases_add_up_and_other_takes_the_rest() -> None:
    recorder = Recorder()
    monitor = Monitor("phases", socket="/nonexistent/x.sock", sinks=[recorder])
    with monitor.step(3) as step:
        with step.phase("io"):
            time.sleep(0.02)
        with step.phase("compute"):
            time.sleep(0.03)
        time.sleep(0.01)
    monitor.close()
    (step_event,) = [e for e in recorder.events if isinstance(e, events.Step)]
    assert step_event.step == 3
    assert step_event.io_s >= 0.02 and step_event.compute_s >= 0.03 and step_event.sync_s == 0
    assert step_event.other_s >= 0.01
    total = step_event.io_s + step_event.compute_s + step_event.sync_s + step_event.other_s
    assert total == pytest.approx(step_event.duration_s, rel=1e-9)
    assert [e.state for e in recorder.events if isinstance(e, events.Lifecycle)] == ["start", "stop"]


def test_a_phase_run_twice_adds_up_and_one_begun_inside_another_is_timed_apart() -> None:
    """A step reuses one phase timer for phases that follow each other; a phase begun inside another (misuse:
    phases must not nest) gets a timer of its own instead of corrupting the outer one's. (Nested phases count
    twice, so a long one makes the step invalid, counted and dropped; this empty one stays within the slack.)"""
    recorder = Recorder()
    monitor = Monitor("phases", socket="/nonexistent/x.sock", sinks=[recorder], traces=False)
    io_took = 0.0  # the phases' times as the test sees them from outside: the most the Monitor can count
    with monitor.step(1) as step:
        for _ in range(2):
            began = time.perf_counter()
            with step.phase("io"):
                time.sleep(0.01)
            io_took += time.perf_counter() - began
        with step.phase("compute"):
            time.sleep(0.01)
            began = time.perf_counter()
            with step.phase("sync"):
                pass
            sync_took = time.perf_counter() - began
    monitor.close()
    (event,) = [e for e in recorder.events if isinstance(e, events.Step)]
    assert 0.02 <= event.io_s <= io_took
    assert event.compute_s >= 0.01 and 0 < event.sync_s <= sync_took  # the outer holds the inner too


def test_a_step_and_a_checkpoint_carry_the_compiles_reported_while_they_ran() -> None:
    recorder = Recorder()
    monitor = Monitor(
        "compiles", socket="/nonexistent/x.sock", sinks=[recorder], traces=False, hooks=Hooks(jax_compiles=False)
    )
    monitor.compile("backend", 4.0, "before_the_loop")
    with monitor.step(0):
        monitor.compile("backend", 0.001, "first_call")
        time.sleep(0.002)
    with monitor.step(1):
        pass
    with monitor.checkpoint("save", step=1):
        monitor.compile("backend", 0.001, "orbax_copy")
        time.sleep(0.002)
    monitor.close()
    steps = [e for e in recorder.events if isinstance(e, events.Step)]
    assert [s.compile_s for s in steps] == [pytest.approx(0.001), 0.0]
    (save,) = [e for e in recorder.events if isinstance(e, events.Checkpoint)]
    assert save.compile_s == pytest.approx(0.001)


def test_misuse_warns_or_counts_but_never_raises() -> None:
    recorder = Recorder()
    with pytest.warns(UserWarning, match="reported as"):
        monitor = Monitor("my job!", socket="/nonexistent/x.sock", sinks=[recorder])
    assert monitor.workload == "my_job_"
    with pytest.warns(UserWarning, match="unknown phase"), monitor.step(1) as step, step.phase("forward"):
        pass
    monitor.compile("backend", -1.0)  # nonsense the sidecar will reject and count
    monitor.device_memory("tpu 0", "v5e", used_bytes=-5)
    dropped_before_close = monitor.dropped
    with monitor.checkpoint("save", step=1):
        pass
    with pytest.raises(OSError), monitor.checkpoint("save", step=2):
        raise OSError("disk full")  # the job's own error propagates; the checkpoint is recorded as failed
    monitor.close()
    checkpoints = [e for e in recorder.events if isinstance(e, events.Checkpoint)]
    assert [c.ok for c in checkpoints] == [True, False]
    nonsense = [e for e in recorder.events if isinstance(e, (events.Compile, events.DeviceMemory))]
    assert len(nonsense) == 2
    for event in nonsense:  # what the sidecar does with them: reject, with a reason
        with pytest.raises(events.InvalidEvent, match="invalid_field"):
            events.decode(events.encode(event))
    assert dropped_before_close == 4  # no sidecar: start, the step, and the two reports


def test_a_former_keyword_works_for_one_more_release_and_says_what_replaces_it(short_tmp: Path) -> None:
    """A Monitor made with the keywords it took before Traces and Hooks is the Monitor they make, and each
    keyword is a DeprecationWarning at the caller's line that names its field; the new form warns of nothing."""
    spans = short_tmp / "spans.jsonl"
    with pytest.warns(DeprecationWarning) as said:
        former = Monitor("former", socket="/nonexistent/x.sock", spans_file=spans, sample_every=7, close_at_exit=False)
    former.close()
    assert [str(w.message) for w in said] == [
        "tpuscope: Monitor(spans_file=...) is deprecated and goes in the next release; "
        "use Monitor(traces=Traces(spans_file=...))",
        "tpuscope: Monitor(sample_every=...) is deprecated and goes in the next release; "
        "use Monitor(traces=Traces(sample_every=...))",
        "tpuscope: Monitor(close_at_exit=...) is deprecated and goes in the next release; "
        "use Monitor(hooks=Hooks(close_at_exit=...))",
    ]
    assert {w.filename for w in said} == {__file__}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        current = Monitor(
            "current",
            socket="/nonexistent/x.sock",
            traces=Traces(spans_file=spans, sample_every=7),
            hooks=Hooks(close_at_exit=False),
        )
    current.close()
    for monitor in (former, current):
        assert monitor.spans is not None and monitor.spans.sampler.every == 7
        assert monitor._close_at_exit_on is False
    with pytest.raises(TypeError, match="jax_compile"):
        Monitor("typo", socket="/nonexistent/x.sock", jax_compile=False)  # type: ignore[call-arg]


def test_an_exception_leaving_the_monitor_records_a_failure() -> None:
    recorder = Recorder()
    with pytest.raises(RuntimeError), Monitor("crashy", socket="/nonexistent/x.sock", sinks=[recorder]):
        raise RuntimeError("boom")
    last = recorder.events[-1]
    assert isinstance(last, events.Lifecycle) and last.state == "failure"


def test_the_first_lost_event_is_said_at_once_then_reminded_then_the_recovery(
    short_tmp: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job pointed at the wrong socket hears it on its first event, not from one line at exit."""
    monkeypatch.setattr(sinks, "REMIND_SECONDS", 0.3)
    path = short_tmp / "late.sock"
    monitor = Monitor("told", socket=path)  # its start event is the first loss
    said = [r.getMessage() for r in caplog.records if "tpuscope: events" in r.getMessage()]
    assert said == [
        f"tpuscope: events are not reaching the sidecar (no sidecar at {path}: No such file or "
        "directory); the job goes on, counting them, and this is said again every 0.3 s while it lasts"
    ]
    for n in range(50):  # within the reminder's period: nothing more is said
        with monitor.step(n):
            pass
    assert sum("not reaching" in r.getMessage() or "still no" in r.getMessage() for r in caplog.records) == 1
    time.sleep(sinks.REMIND_SECONDS)  # past the reminder's period, begun before the steps: only time shows it
    with monitor.step(50):
        pass
    reminders = [r.getMessage() for r in caplog.records if "still no events" in r.getMessage()]
    assert len(reminders) == 1 and "52 lost so far" in reminders[0], reminders
    with SidecarProcess(path):
        step_until_delivered(monitor, first=51)
        assert f"tpuscope: events reach the sidecar at {path} again ({monitor.dropped} lost in all)" in caplog.text
        monitor.close()


def test_a_sidecar_falling_behind_now_and_then_is_said_once_not_at_each_flap(
    short_tmp: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Three times the sidecar's buffer fills (losses) and drains (a recovery): a loss and its recovery are said
    once, not three pairs of lines (a flood job said a pair every few milliseconds)."""
    path = short_tmp / "slow.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as server:
        server.bind(str(path))
        server.listen(1)
        sink = sinks.SocketSink(path)
        event = events.Lifecycle(workload="flaps", state="start")
        sink.emit(event)
        connection, _ = server.accept()
        connection.setblocking(False)
        with connection:
            for flap in range(3):
                while sink.dropped == flap:  # until the buffer is full: one loss
                    sink.emit(event)
                while True:  # the sidecar catches up
                    try:
                        connection.recv(65536)
                    except BlockingIOError:
                        break
                sent = sink.sent
                sink.emit(event)
                assert sink.sent == sent + 1  # the recovery
            sink.close()
    said = [r.getMessage() for r in caplog.records if "tpuscope: events" in r.getMessage()]
    assert len(said) == 2 and "not reaching" in said[0] and "(1 lost in all)" in said[1], said
    assert sink.dropped == 3


def test_numpy_and_jax_numbers_are_sent_as_the_numbers_they_hold(sidecar: SidecarProcess) -> None:
    """A JAX step counter (``state.step``), np.int64 steps, np.float32 FLOPs: what int() and float() accept
    reaches the sidecar, as the plain numbers would."""
    import jax.numpy as jnp
    import numpy as np

    monitor = Monitor("numpy", socket=sidecar.socket, traces=False, hooks=Hooks(jax_compiles=False))
    for n in (np.int64(0), jnp.array(1), jnp.int32(2)):
        with monitor.step(n) as s:  # type: ignore[arg-type]
            s.flops = np.float32(1e6)  # type: ignore[assignment]
    with monitor.checkpoint("save", step=np.int64(2)) as c:  # type: ignore[arg-type]
        c.bytes = np.int64(4096)  # type: ignore[assignment]
    monitor.compile("backend", np.float64(0.5))  # type: ignore[arg-type]
    assert (monitor.sent, monitor.dropped) == (6, 0), monitor._sidecar.last_error
    monitor.close()
    w = {"workload": "numpy"}
    # The compile is the last event sent: once it is in, so is everything before it.
    scrape = scrape_until(
        sidecar.url, lambda s: s.value(catalog.COMPILE_DURATION.series("count"), stage="backend", **w) == 1
    )
    assert scrape.value(catalog.STEPS.name, **w) == 3
    assert scrape.value(catalog.CHECKPOINT_BYTES.name, operation="save", **w) == 4096
    assert scrape.value(catalog.COMPILE_DURATION.series("sum"), stage="backend", **w) == 0.5


def test_a_value_that_is_no_number_is_a_counted_drop_said_once(
    sidecar: SidecarProcess, caplog: pytest.LogCaptureFixture
) -> None:
    import numpy as np

    recorder = Recorder()
    monitor = Monitor("odd", socket=sidecar.socket, sinks=[recorder], traces=False, hooks=Hooks(jax_compiles=False))
    with monitor.step(np.arange(3)):  # type: ignore[arg-type]  # an array is no step number
        pass
    with monitor.step(1) as s:
        s.flops = "many"  # type: ignore[assignment]
    with monitor.checkpoint("save", step=np.arange(2)):  # type: ignore[arg-type]
        pass
    assert (monitor.sent, monitor.dropped) == (1, 3)  # the start event; the two steps and the checkpoint
    assert not recorder.events[1:], recorder.events
    said = [r.getMessage() for r in caplog.records if "invalid" in r.getMessage()]
    assert len(said) == 1 and "invalid Step" in said[0], said
    with monitor.step(2):
        pass
    monitor.close()
    assert monitor.sent == 3 and [e.step for e in recorder.events if isinstance(e, events.Step)] == [2]


def test_a_sidecar_that_does_not_accept_never_blocks_the_monitor(short_tmp: Path) -> None:
    """A stopped sidecar (SIGSTOP, a debugger) with its listen backlog full: a blocking connect would wait
    for ever, in ``Monitor()`` and in any step that reconnects."""
    path = short_tmp / "full.sock"
    stopped = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    stopped.bind(str(path))
    stopped.listen(0)
    queued = []
    for _ in range(8):  # fill the backlog: later connects would wait for an accept()
        waiting = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        waiting.setblocking(False)
        try:
            waiting.connect(str(path))
        except BlockingIOError:
            waiting.close()
            break
        queued.append(waiting)
    done = threading.Event()

    def job() -> None:
        monitor = Monitor("blocked", socket=path, traces=False)
        for n in range(3):
            with monitor.step(n):
                pass
        monitor.close()
        done.set()

    threading.Thread(target=job, daemon=True).start()
    assert done.wait(10), "Monitor() or a step waited on the sidecar's connect"
    for waiting in queued:
        waiting.close()
    stopped.close()


FORKING_JOB = """
import os, signal, sys, time
from tpuscope.tracing import Hooks, Monitor

mon = Monitor("forky", socket=sys.argv[1], traces=False, hooks=Hooks(jax_compiles=False))
with mon.step(0):
    pass
if (ended := os.fork()) == 0:  # a worker that ends normally: the atexit hooks it inherited run
    sys.exit(0)
os.waitpid(ended, 0)
if (lingering := os.fork()) == 0:  # a data-loader worker that outlives its parent
    time.sleep(60)
    os._exit(0)
print(lingering, flush=True)
with mon.step(1):
    pass
time.sleep(0.5)
os.kill(os.getpid(), signal.SIGKILL)  # the job is killed: no stop event
"""


def test_a_forked_child_never_speaks_for_its_parent_nor_hides_its_death(sidecar: SidecarProcess) -> None:
    job = subprocess.Popen(
        [sys.executable, "-c", FORKING_JOB, str(sidecar.socket)], stdout=subprocess.PIPE, text=True
    )  # not run(): the lingering worker holds the output pipe open
    assert job.stdout is not None
    lingering = int(job.stdout.readline())
    try:
        assert job.wait(30) == -signal.SIGKILL
        w = {"workload": "forky"}
        scrape = scrape_until(
            sidecar.url, lambda s: (s.value(catalog.WORKLOAD_FAILURES.name, reason="vanished", **w) or 0) >= 1
        )
        assert os.path.exists(f"/proc/{lingering}"), "the worker was to outlive its parent"
        assert scrape.value(catalog.STEPS.name, **w) == 2
        # The parent's death is seen while its worker lives, and the ended worker's exit was no clean stop.
        assert scrape.value(catalog.WORKLOAD_FAILURES.name, reason="vanished", **w) == 1
    finally:
        os.kill(lingering, signal.SIGKILL)


OUT_OF_DESCRIPTORS_JOB = """
import os, resource, sys
from tpuscope.tracing import Hooks, Monitor

_, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) - 1, hard))  # listdir held one
mon = Monitor("no-fds", socket=sys.argv[1], traces=False, hooks=Hooks(jax_compiles=False))
for n in range(3):
    with mon.step(n):
        pass
print(mon.sent, mon.dropped, mon._sidecar.last_error)
"""


def test_out_of_file_descriptors_each_event_is_a_counted_drop(sidecar: SidecarProcess) -> None:
    run = subprocess.run(
        [sys.executable, "-c", OUT_OF_DESCRIPTORS_JOB, str(sidecar.socket)], capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0, run.stderr
    sent, dropped, why = run.stdout.split(maxsplit=2)
    assert (int(sent), int(dropped)) == (0, 4), run.stdout  # the start event and three steps
    assert "cannot open a socket" in why


def test_a_badput_block_is_timed_less_its_compiles_and_saves_and_the_next_step_or_the_stop_carries_it() -> None:
    recorder = Recorder()
    monitor = Monitor(
        "marked", socket="/nonexistent/x.sock", sinks=[recorder], traces=False, hooks=Hooks(jax_compiles=False)
    )
    with monitor.step(0):
        pass
    began = time.perf_counter()
    with monitor.badput("eval"):
        time.sleep(0.01)
        monitor.compile("backend", 0.01, "eval_step")  # booked as compile: not the eval's too
        with monitor.checkpoint("save", step=0):  # booked as checkpoint
            time.sleep(0.02)
        time.sleep(0.03)
    eval_took = time.perf_counter() - began
    with monitor.step(1), monitor.badput("sdc_check"):
        time.sleep(0.01)
    with monitor.step(2):
        pass
    with monitor.badput("eval"), monitor.badput("eval_inner"):  # the inner block is the outer one's time
        time.sleep(0.01)
    monitor.close()
    steps = [e for e in recorder.events if isinstance(e, events.Step)]
    assert [s.badput for s in steps[::2]] == [(), ()]
    (marked_eval, checked) = steps[1].badput
    assert (marked_eval.name, marked_eval.in_step, checked.name, checked.in_step) == ("eval", False, "sdc_check", True)
    save = next(e for e in recorder.events if isinstance(e, events.Checkpoint))
    assert 0.03 <= marked_eval.seconds <= eval_took - save.duration_s - 0.01  # less what the save and compile took
    assert 0.01 <= checked.seconds <= steps[1].duration_s
    stop = recorder.events[-1]
    assert isinstance(stop, events.Lifecycle) and stop.state == "stop"
    assert [(b.name, b.in_step) for b in stop.badput] == [("eval", False)] and stop.badput[0].seconds >= 0.01
    for event in (steps[1], stop):  # what the sidecar reads
        assert events.decode(events.encode(event)) == event


def test_a_badput_block_around_steps_books_only_its_time_between_them_and_each_thread_its_own() -> None:
    """A block that holds steps (a warm-up marked as such) is its time less theirs: the steps book themselves. A block
    on another thread is its own, not the inner one of a block open on the loop's thread."""
    recorder = Recorder()
    monitor = Monitor(
        "around", socket="/nonexistent/x.sock", sinks=[recorder], traces=False, hooks=Hooks(jax_compiles=False)
    )
    began = time.perf_counter()
    with monitor.badput("warmup"):
        for number in range(2):
            with monitor.step(number):
                time.sleep(0.05)
        time.sleep(0.01)
    took = time.perf_counter() - began

    def elsewhere() -> None:
        with monitor.badput("sdc_check"):
            time.sleep(0.01)

    with monitor.badput("eval"):
        thread = threading.Thread(target=elsewhere)
        thread.start()
        thread.join()
    monitor.close()
    steps = [e for e in recorder.events if isinstance(e, events.Step)]
    stepped = sum(step.duration_s for step in steps)
    stop = recorder.events[-1]
    assert isinstance(stop, events.Lifecycle)
    marked = {b.name: b.seconds for b in stop.badput}
    assert set(marked) == {"warmup", "eval", "sdc_check"}
    assert 0.01 <= marked["warmup"] <= took - stepped + 1e-6
    assert marked["sdc_check"] >= 0.01 and marked["eval"] >= marked["sdc_check"]


def test_a_badput_name_is_checked_at_once_and_names_past_the_bound_fold_into_custom_said_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from tpuscope import goodput

    recorder = Recorder()
    monitor = Monitor(
        "names", socket="/nonexistent/x.sock", sinks=[recorder], traces=False, hooks=Hooks(jax_compiles=False)
    )
    for wrong in ("Eval", "eval loop", "", "productive", "straggler", "custom", "x" * 33):
        with pytest.raises(ValueError, match=r"Monitor\.badput"):
            monitor.badput(wrong)
    names = [f"check_{i}" for i in range(goodput.MAX_CUSTOM_BADPUT + 2)]
    with caplog.at_level("WARNING", logger="tpuscope"):
        for name in [*names, *names]:
            with monitor.badput(name):
                pass
    monitor.close()
    said = [r.getMessage() for r in caplog.records if "custom badput" in r.getMessage()]
    assert len(said) == 1 and repr(names[goodput.MAX_CUSTOM_BADPUT]) in said[0], said
    (stop,) = [e for e in recorder.events if isinstance(e, events.Lifecycle) and e.state == "stop"]
    assert [b.name for b in stop.badput] == [*names[: goodput.MAX_CUSTOM_BADPUT], goodput.CUSTOM_BADPUT]
