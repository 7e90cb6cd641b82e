"""First, do no harm: the job's signals are the job's (issue 34; repros 01, 05 and 07 of the job-safety review).

Each test runs the repro's job with and without tpuscope, each in a subprocess of its own, and compares. A
default Monitor installs no SIGTERM handler, so the job ends as it would without tpuscope: at once in a device
call, a forked worker at ``terminate()``, an Orbax loop's own flag handler untouched. The opt-in handler
(``Hooks(sigterm=True)``) only notes the signal and the job leaves at its next step: Orbax's ``finally``
wait blocks as it should, a final save takes as long as it needs, and the run ends booked a preemption. With
``sigterm_grace``, a job that never gets back to a step (a hung device call) is ended by the watchdog after
its grace, its preemption sent first.
"""

from __future__ import annotations

import json
import os
import queue
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import TracebackType

import pytest

from tpuscope import events
from tpuscope.gce_metadata import METADATA_HOST_ENV
from tpuscope.tracing import read_records
from tpuscope.tracing.preemption import BEFORE_KILL_SECONDS, SIGTERM_EXIT

pytestmark = pytest.mark.long

GONE = -signal.SIGTERM  # a process that SIGTERM's default action ended, as subprocess reports it
# What the load of the machine may add to an end that should come at once (2 cores, shared).
LOAD_MARGIN_S = 1.0


class Job:
    """A job in a subprocess of its own, its output read as it comes (a line awaited with a timeout)."""

    def __init__(self, code: str, *args: str) -> None:
        env = {k: v for k, v in os.environ.items() if k != METADATA_HOST_ENV}  # no metadata server: preemption
        env.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
        self.process = subprocess.Popen(
            [sys.executable, "-c", code, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
        )
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._output: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self._output.append(line)
            self._lines.put(line)
        self._lines.put(None)

    def wait_for(self, text: str, timeout: float = 240) -> None:
        deadline = time.monotonic() + timeout
        while True:
            line = self._lines.get(timeout=max(0.0, deadline - time.monotonic()))
            assert line is not None, f"the job ended before {text!r}:\n{self.output[-3000:]}"
            if line.strip() == text:
                return

    def sigterm(self, timeout: float) -> tuple[float, int | None]:
        """Send SIGTERM, as a scheduler does; (seconds until the process ended, its return code), or (inf, None)
        when it still ran ``timeout`` seconds later."""
        sent = time.monotonic()
        self.process.send_signal(signal.SIGTERM)
        try:
            rc = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            return float("inf"), None
        return time.monotonic() - sent, rc

    @property
    def output(self) -> str:
        self._reader.join(10)
        return "".join(self._output)

    def report(self) -> dict[str, object]:
        """The JSON the job printed after ``REPORT``."""
        found = [line[7:] for line in self.output.splitlines() if line.startswith("REPORT ")]
        assert found, self.output[-3000:]
        report: dict[str, object] = json.loads(found[-1])
        return report

    def __enter__(self) -> Job:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()


def lifecycle(record: Path) -> list[tuple[str, str]]:
    return [(e.state, e.reason) for _, e in read_records(record) if isinstance(e, events.Lifecycle)]


# --- repro 01: a SIGTERM while the main thread waits in native code ------------------------------------------
DEVICE_CALL_JOB = r"""
import sys, time
import jax, jax.numpy as jnp
mode, hang, record = sys.argv[1], float(sys.argv[2]), sys.argv[3]
if mode != "plain":
    from tpuscope.tracing import Hooks, Monitor, RecordSink
    opt_in = {"sigterm": True, "sigterm_grace": float(sys.argv[4])} if mode == "grace" else {}
    mon = Monitor(
        "hang",
        socket=record + ".sock",
        sinks=[RecordSink(record)],
        traces=False,
        hooks=Hooks(profile_period="off", **opt_in),
    )

@jax.jit
def spin(x, n):  # a device program that does not come back for a while (a hung collective, a long step)
    return jax.lax.while_loop(lambda c: c[0] < n, lambda c: (c[0] + 1, jnp.sin(c[1])), (0, x))[1]

x = jnp.ones(16)
spin(x, 1).block_until_ready()
t = time.perf_counter(); spin(x, 10**6).block_until_ready(); per = (time.perf_counter() - t) / 10**6
n = int(hang / per) if hang > 0 else 2**31 - 1  # 0: as good as for ever (a hung collective)
print("ready", flush=True)
spin(x, n).block_until_ready()
print("device call returned", flush=True)
"""


def test_01_a_sigterm_in_a_device_call_ends_the_job_as_without_tpuscope(short_tmp: Path) -> None:
    """Repro 01: the default Monitor's Python handler (run only between bytecodes) held a SIGTERM sent 1 s into
    a 20 s device call until the call returned: the job ended 24-29 s later, against 0.0 s without tpuscope.
    Now no handler: the same end, by the signal, at once."""
    ends: dict[str, tuple[float, int | None]] = {}
    for mode in ("plain", "monitor"):
        with Job(DEVICE_CALL_JOB, mode, "5", str(short_tmp / f"{mode}.jsonl")) as job:
            job.wait_for("ready")
            time.sleep(1.0)  # into the 5 s device call
            ends[mode] = job.sigterm(timeout=60)
            assert "device call returned" not in job.output, job.output[-3000:]
    (plain_s, plain_rc), (monitor_s, monitor_rc) = ends["plain"], ends["monitor"]
    assert plain_rc == monitor_rc == GONE, ends
    assert monitor_s <= plain_s + LOAD_MARGIN_S, ends
    assert lifecycle(short_tmp / "monitor.jsonl") == [("start", "none")]  # nothing booked: the sidecar books it


FORKED_WORKER_JOB = r"""
import hashlib, json, multiprocessing as mp, os, sys, tempfile, time

def worker(q, rounds):
    q.put("busy")
    hashlib.pbkdf2_hmac("sha256", b"batch", b"salt", rounds)  # one long native call: a batch decoded in C

if __name__ == "__main__":
    mode = sys.argv[1]
    if mode != "plain":
        from tpuscope.tracing import Hooks, Monitor
        opt_in = {"sigterm": True} if mode == "opt-in" else {}
        mon = Monitor(
            "fork",
            socket=os.path.join(tempfile.mkdtemp(), "none.sock"),
            traces=False,
            hooks=Hooks(profile_period="off", **opt_in),
        )
    t = time.perf_counter(); hashlib.pbkdf2_hmac("sha256", b"batch", b"salt", 200_000)
    rounds = int(6.0 / ((time.perf_counter() - t) / 200_000))  # a 6 s call
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=worker, args=(q, rounds))
    p.start(); q.get(); time.sleep(0.5)  # the worker is inside its native call
    t = time.perf_counter(); p.terminate(); p.join(120)
    print("REPORT " + json.dumps({"terminate_s": time.perf_counter() - t, "exitcode": p.exitcode}), flush=True)
"""


def test_01_a_forked_worker_ends_at_terminate_as_without_tpuscope() -> None:
    """Repro 01: a worker forked from a job with the Monitor inherited its Python handler, and ``terminate()``
    waited for the worker's native work to end (2.9-4.7 s against 0.01 s). Now the default installs nothing,
    and the opt-in handler is the job's own disposition again in a forked child (os.register_at_fork)."""
    ended: dict[str, dict[str, object]] = {}
    for mode in ("plain", "monitor", "opt-in"):
        with Job(FORKED_WORKER_JOB, mode) as job:
            assert job.process.wait(180) == 0, job.output[-3000:]
            ended[mode] = job.report()
    assert {mode: report["exitcode"] for mode, report in ended.items()} == dict.fromkeys(ended, GONE), ended
    plain = float(ended["plain"]["terminate_s"])  # type: ignore[arg-type]
    for mode in ("monitor", "opt-in"):
        assert float(ended[mode]["terminate_s"]) <= plain + LOAD_MARGIN_S, ended  # type: ignore[arg-type]


def test_01_the_opt_in_watchdog_ends_a_hung_job_after_its_grace_its_preemption_sent_first(short_tmp: Path) -> None:
    """Repro 01's hung device call (a collective whose peer died), with the opt-in handler and a grace: the
    watchdog is armed as the signal lands (the wakeup fd, read by a thread of its own), not when the main
    thread gets back to bytecode (never, here), and ends the job with SIGTERM's default action after its
    grace, once the Monitor has sent the preemption (repro 07: the run was booked vanished)."""
    grace = 5.0  # the shortest the Monitor takes (MIN_SIGTERM_GRACE)
    record = short_tmp / "events.jsonl"
    with Job(DEVICE_CALL_JOB, "grace", "0", str(record), str(grace)) as job:
        job.wait_for("ready")
        time.sleep(1.0)  # into the device call that never returns
        took, rc = job.sigterm(timeout=grace + 60)
    assert rc == GONE, (took, rc, job.output[-3000:])
    assert grace <= took <= grace + BEFORE_KILL_SECONDS + 3 * LOAD_MARGIN_S, took
    assert lifecycle(record) == [("start", "none"), ("failure", "preemption")], job.output[-3000:]


# --- repro 05: a SIGTERM during Orbax's async saves ----------------------------------------------------------
ORBAX_JOB = r"""
import contextlib, json, signal, sys, threading, time
mode, directory = sys.argv[1], sys.argv[2]
import jax, jax.numpy as jnp
import orbax.checkpoint as ocp

stop = False
if mode.startswith("flag"):  # the job's own handler, as JAX's and Orbax's preemption examples have it
    def on_term(signum, frame):
        global stop
        stop = True
    signal.signal(signal.SIGTERM, on_term)
step_cm = lambda n: contextlib.nullcontext()
if mode != "flag" and mode != "plain":
    from tpuscope.tracing import Hooks, Monitor
    opt_in = {"sigterm": True} if mode == "opt-in" else {}
    mon = Monitor(
        "ck", socket=directory + ".sock", traces=False, hooks=Hooks(profile_period="off", jax_compiles=False, **opt_in)
    )
    step_cm = mon.step
mngr = ocp.CheckpointManager(directory, options=ocp.CheckpointManagerOptions(max_to_keep=3))
state = {"w%d" % i: jnp.zeros((1 << 20,), jnp.float32) for i in range(8)}  # 32 MiB
inc = jax.jit(lambda s: jax.tree.map(lambda x: x + 1, s))
last = entered = stepped = None
print("ready", flush=True)
try:
    for step in range(1, 100000):
        entered = step
        with step_cm(step):
            state = inc(state)
        stepped = step
        mngr.save(step, args=ocp.args.StandardSave(state))
        last = step
        if stop:
            break
finally:
    t = time.perf_counter()
    mngr.wait_until_finished()
    waited = time.perf_counter() - t
    busy = [th.name for th in threading.enumerate() if th.name in ("save_finalize", "async_save")]
    print("REPORT " + json.dumps({"last_save": last, "entered": entered, "stepped": stepped,
                                  "finally_wait_s": round(waited, 3), "orbax_threads_left": busy}), flush=True)
    mngr.close()
"""
# What went wrong in the repro's trials, as the job's output says it.
ORBAX_ERRORS = (
    "cannot schedule new futures after",
    "Event loop is closed",
    "Save Finalize thread (save_finalize) failed",
    "Fatal Python error",
)


def orbax_trial(mode: str, delay: float, directory: Path) -> dict[str, object]:
    """One trial of the repro: SIGTERM ``delay`` seconds into a loop that saves every step; what the job said,
    how it ended, and the steps committed on disk."""
    with Job(ORBAX_JOB, mode, str(directory)) as job:
        job.wait_for("ready")
        time.sleep(delay)  # how far into the loop the signal lands: the duration under test
        _, rc = job.sigterm(timeout=120)
        output = job.output
    report = job.report() if rc != GONE else {}
    # Orbax commits a step by renaming its temporary directory to the step's number.
    on_disk = sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit()) if directory.exists() else []
    return {
        "rc": rc,
        **report,
        "durable": report.get("last_save") in on_disk,
        "errors": [error for error in ORBAX_ERRORS if error in output],
    }


def test_05_a_sigterm_during_orbax_saves_ends_the_job_as_without_tpuscope(short_tmp: Path) -> None:
    """Repro 05: the default Monitor raised Preempted wherever the main thread was, mostly inside Thread.join()
    in Orbax's save: the ``finally`` wait returned in 0.000 s with the save still running, then "Save Finalize
    thread failed", an abort, or "cannot schedule new futures" (6 of 8 trials). Now a job with its own flag
    handler ends exactly as it does without the Monitor: rc 0, the wait blocks until the last save is durable,
    no Orbax thread left; and a job without one dies of the signal, as it would without tpuscope."""
    rng = random.Random(5)
    for trial in range(3):
        delay = rng.uniform(1.0, 3.0)
        runs = {mode: orbax_trial(mode, delay, short_tmp / f"{mode}-{trial}") for mode in ("flag", "flag+monitor")}
        for mode, run in runs.items():
            assert run["rc"] == 0, (mode, run)
            assert run["orbax_threads_left"] == [] and run["durable"] and run["errors"] == [], (mode, run)
            assert run["last_save"] == run["stepped"] == run["entered"], (mode, run)  # left after its last save
    plain, monitor = (orbax_trial(mode, rng.uniform(1.0, 3.0), short_tmp / mode) for mode in ("plain", "monitor"))
    assert plain["rc"] == monitor["rc"] == GONE, (plain, monitor)


def test_05_the_opt_in_handler_leaves_orbax_saves_at_the_next_step(short_tmp: Path) -> None:
    """Repro 05 with the opt-in handler: the SIGTERM only sets a flag, the job leaves as its next step begins
    (after its last save was started), its ``finally`` wait blocks until that save is durable, and it exits
    143, in every trial."""
    rng = random.Random(5)
    for trial in range(3):
        run = orbax_trial("opt-in", rng.uniform(1.0, 3.0), short_tmp / f"opt-in-{trial}")
        assert run["rc"] == SIGTERM_EXIT, run
        assert run["orbax_threads_left"] == [] and run["durable"] and run["errors"] == [], run
        entered, stepped = int(run["entered"]), int(run["stepped"])  # type: ignore[call-overload]
        assert run["last_save"] == stepped == entered - 1, run  # Preempted as step `entered` began, no sooner


# --- repro 07: a final checkpoint after the SIGTERM ---------------------------------------------------------
FINAL_SAVE_JOB = r"""
import contextlib, os, sys, time
mode, record, out = sys.argv[1], sys.argv[2], sys.argv[3]
step = lambda n: contextlib.nullcontext()
class Preempted(BaseException):  # without tpuscope nothing raises it
    pass
if mode != "plain":
    from tpuscope.tracing import Hooks, Monitor, Preempted, RecordSink
    opt_in = {"sigterm": True} if mode == "opt-in" else {}
    mon = Monitor(
        "final-save",
        socket=record + ".sock",
        sinks=[RecordSink(record)],
        traces=False,
        hooks=Hooks(profile_period="off", jax_compiles=False, **opt_in),
    )
    step = mon.step

def save_checkpoint():  # a last checkpoint: 6 shards of 0.5 s
    for shard in range(6):
        time.sleep(0.5)
        with open(os.path.join(out, f"shard-{shard}"), "w") as f:
            f.write("x")
    open(os.path.join(out, "COMMITTED"), "w").close()

try:
    print("ready", flush=True)
    for n in range(10**9):
        with step(n):
            time.sleep(0.05)
except Preempted:
    print("preempted: saving the last checkpoint", flush=True)
    save_checkpoint()
    print("saved", flush=True)
    raise
finally:
    if mode != "plain":
        mon.close()
"""


def test_07_a_final_save_after_the_sigterm_completes_and_the_run_is_a_preemption(short_tmp: Path) -> None:
    """Repro 07: the fixed 10 s watchdog killed a 15 s final save at 9 of 15 shards, and the run was booked
    vanished. Now no watchdog unless asked for: with the opt-in handler the last save takes what it takes and
    the run ends as a preemption (exit 143); with the default Monitor the job dies of the signal as it does
    without tpuscope, and books nothing itself."""
    ended: dict[str, tuple[int | None, int, bool, list[tuple[str, str]]]] = {}
    for mode in ("plain", "monitor", "opt-in"):
        record, out = short_tmp / f"{mode}.jsonl", short_tmp / f"{mode}-checkpoint"
        out.mkdir()
        with Job(FINAL_SAVE_JOB, mode, str(record), str(out)) as job:
            job.wait_for("ready")
            time.sleep(0.5)  # some steps into the loop: when the signal lands is the duration under test
            _, rc = job.sigterm(timeout=60)
        shards = len([f for f in out.iterdir() if f.name.startswith("shard-")])
        ended[mode] = (rc, shards, (out / "COMMITTED").exists(), lifecycle(record) if record.exists() else [])
    assert ended["plain"] == (GONE, 0, False, []), ended
    assert ended["monitor"] == (GONE, 0, False, [("start", "none")]), ended
    assert ended["opt-in"] == (SIGTERM_EXIT, 6, True, [("start", "none"), ("failure", "preemption")]), ended


ASYNCIO_JOB = r"""
import asyncio, hashlib, os, signal, sys
from tpuscope.tracing import Hooks, Monitor, RecordSink
record = sys.argv[1]

async def main():
    loop = asyncio.get_running_loop()
    heard = loop.create_future()
    loop.add_signal_handler(signal.SIGUSR1, heard.set_result, "SIGUSR1")  # asyncio's wakeup fd, set first
    mon = Monitor(
        "async",
        socket=record + ".sock",
        sinks=[RecordSink(record)],
        traces=False,
        hooks=Hooks(profile_period="off", jax_compiles=False, sigterm=True, sigterm_grace=5.0),
    )
    os.kill(os.getpid(), signal.SIGUSR1)
    print("asyncio heard", await asyncio.wait_for(heard, 60), flush=True)
    os.kill(os.getpid(), signal.SIGTERM)
    hashlib.pbkdf2_hmac("sha256", b"batch", b"salt", 10**9)  # minutes in C: no bytecode, no Python handler
    print("the native call returned", flush=True)

asyncio.run(main())
"""


def test_the_watchdog_shares_the_wakeup_fd_asyncio_holds(short_tmp: Path) -> None:
    """asyncio learns of its signals from the wakeup fd the watchdog needs: the watchdog takes it and passes on
    every byte, so the loop's own signal handler still runs, and the watchdog is still armed as the SIGTERM
    lands, while the main thread is in a native call."""
    record = short_tmp / "events.jsonl"
    with Job(ASYNCIO_JOB, str(record)) as job:
        job.wait_for("asyncio heard SIGUSR1", timeout=60)
        rc = job.process.wait(120)
    assert rc == GONE and "returned" not in job.output, job.output[-3000:]
    assert lifecycle(record) == [("start", "none"), ("failure", "preemption")]
