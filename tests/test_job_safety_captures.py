"""First, do no harm, round 2 (issue 52; ../shared/repros/job-safety-2/, findings N1, N2, N5 and N6): a capture's end
never aborts a finished job, never holds the job's GIL, and never keeps a user's profiler waiting on more than the
native profiler's own release of our session.

Each test runs the repro's job (steps of many small jitted dispatches over 8 CPU devices: a capture of them is a big
trace, whose stop takes a second or more) in subprocesses with and without tpuscope, against a real sidecar that
parses the captures, and compares.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

from tpuscope.workload.sidecar import SidecarProcess

pytestmark = pytest.mark.long

# Opens every job: 8 CPU devices, steps of OPS jitted dispatches, and `mon` a Monitor capturing at once (or None).
PRELUDE = r"""
import json, os, sys, time, threading
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
import numpy as np, jax, jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
mode, ops = sys.argv[1], int(sys.argv[2])
mesh = Mesh(np.array(jax.devices()), ("d",))
x = jax.device_put(jnp.ones((8, 16)), NamedSharding(mesh, P("d")))
f = jax.jit(lambda x: x * 1.0001)
mon = None
if mode == "tpuscope":
    from tpuscope.tracing import Hooks, Monitor
    mon = Monitor("captures", hooks=Hooks(profile_period="1ms"), traces=False)
def step():
    global x
    for _ in range(ops):
        x = f(x)
    x.block_until_ready()
def steps_until(ended, plain_steps):
    # Step until `ended(capture)` holds of a capture of ours, or, without tpuscope, as many steps.
    for n in range(200):
        if mon is not None:
            with mon.step(n):
                step()
            capture = mon._profiler._capture if mon._profiler is not None else None
            if capture is not None and ended(capture):
                return capture
        else:
            step()
            if n + 1 == plain_steps:
                return None
    raise SystemExit("no capture")
"""


def run(code: str, mode: str, ops: int, sidecar: SidecarProcess) -> dict[str, Any]:
    """Run a job to its end; the JSON object its last line prints, its exit status and everything it wrote."""
    env = {**os.environ, "TPUSCOPE_SOCKET": str(sidecar.socket), "PYTHONFAULTHANDLER": "1"}
    out = subprocess.run(
        [sys.executable, "-c", PRELUDE + code, mode, str(ops)], capture_output=True, text=True, timeout=300, env=env
    )
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    result: dict[str, Any] = json.loads(lines[-1]) if lines else {}
    result["rc"], result["output"] = out.returncode, out.stdout + out.stderr
    return result


# --- N1, N6: a job that ends as a capture ends ----------------------------------------------------------------------
END_JOB = r"""
import atexit
steps_until(lambda capture: capture.done.is_set(), 30)  # the step that completes a capture is the run's last
said = {}
if mon is not None:
    t = time.perf_counter()
    mon.close()
    said["close_s"] = time.perf_counter() - t
    said["after_close"] = [(t.name, t.daemon) for t in threading.enumerate() if t.name.startswith("tpuscope")]
def at_exit():
    # After the interpreter waited for its threads, before it finalizes: what of ours is still alive, and where.
    frames = sys._current_frames()
    said["at_exit"] = [(t.name, t.daemon, frames[t.ident].f_code.co_name) for t in threading.enumerate()
                       if t.name.startswith("tpuscope") and t.ident in frames]
    print(json.dumps(said), flush=True)
atexit.register(at_exit)
"""


def test_n1_a_job_that_ends_as_a_capture_ends_exits_cleanly_and_close_returns_at_once(
    module_sidecar: SidecarProcess,
) -> None:
    """N1/N6: the capture's stop was on a daemon thread when close() gave up on it after 5 s; if it returned while
    the interpreter finalized, the thread's taking the GIL back killed it through a C++ frame that may not unwind:
    SIGABRT, "FATAL: exception not rethrown", after the job had finished. Now the stop runs on a thread the
    interpreter waits for, and close() returns at once."""
    plain = run(END_JOB, "plain", 300, module_sidecar)
    assert plain["rc"] == 0, plain["output"][-3000:]
    runs = [run(END_JOB, "tpuscope", 300, module_sidecar) for _ in range(3)]
    closes = [round(r.get("close_s", -1), 3) for r in runs]
    print(f"close() took {closes} s; left {[r.get('after_close') for r in runs]}")
    for r in runs:
        assert r["rc"] == 0 and "terminate called" not in r["output"] and "not rethrown" not in r["output"], r["output"]
        assert r["close_s"] < 1.0, r
        # What is left of ours once the interpreter has waited for its threads: only the daemon that waits in Python.
        assert all(daemon and where in ("wait", "get") for _, daemon, where in r["at_exit"]), r["at_exit"]
    # The stop was still under way as close() returned (the case that aborted), on a thread the interpreter waits for.
    stops = [daemon for r in runs for name, daemon in r["after_close"] if name == "tpuscope-profile-stop"]
    assert stops and not any(stops), [r["after_close"] for r in runs]


# --- N2: a user's start_trace while a capture is being stopped -------------------------------------------------------
USER_TRACE_JOB = r"""
import glob, tempfile
capture = steps_until(lambda capture: capture.stop is not None, 30)  # ours is being stopped
directory = tempfile.mkdtemp()
t = time.perf_counter()
jax.profiler.start_trace(directory)
waited = time.perf_counter() - t
step()
jax.profiler.stop_trace()
said = {"waited_s": waited, "written": bool(glob.glob(os.path.join(directory, "**", "*.xplane.pb"), recursive=True))}
if capture is not None:
    capture.stop.done.wait()
    said["our_stop_s"] = capture.stop.ended - capture.stop.began
    mon.close()
print(json.dumps(said), flush=True)
"""


def test_n2_a_users_start_trace_waits_only_for_the_native_release_of_a_capture_being_stopped(
    module_sidecar: SidecarProcess,
) -> None:
    """N2: the user's start_trace waited for the lock our nice-19 thread held through the whole stop and hand-over.
    The native profiler refuses a second session until ours is collected (a session made before is dead: its
    stop_trace raises ALREADY_EXISTS), so the user's call waits for that, and no more: no lock of ours, no write."""
    plain = run(USER_TRACE_JOB, "plain", 300, module_sidecar)
    ours = run(USER_TRACE_JOB, "tpuscope", 300, module_sidecar)
    print(
        f"start_trace returned after {plain['waited_s']:.3f} s without tpuscope, {ours['waited_s']:.3f} s with, "
        f"during a stop of ours that took {ours['our_stop_s']:.3f} s"
    )
    for r in (plain, ours):
        assert r["rc"] == 0 and r["written"], r["output"][-3000:]
    assert ours["waited_s"] <= ours["our_stop_s"] + 0.05, ours


# --- N5: a capture that expires while the job runs pure Python -------------------------------------------------------
EVAL_JOB = r"""
steps_until(lambda capture: capture.session is not None and capture.begun >= 2, 30)  # a capture under way
t0 = last = time.perf_counter(); worst = 0.0
while time.perf_counter() - t0 < 3.0:  # the eval: pure Python, past the capture's deadline
    sum(i * i for i in range(300))
    now = time.perf_counter(); worst = max(worst, now - last); last = now
said = {"longest_gap_s": worst}
if mon is not None:
    waited = time.monotonic()  # for the expired capture to be counted: once its stop, at the lowest priority, is done
    while not sum(mon._profiler.captures.values()) and time.monotonic() - waited < 120:
        time.sleep(0.05)
    said["captures"] = mon._profiler.captures
    mon.close()
print(json.dumps(said), flush=True)
"""


def test_n5_a_capture_that_expires_never_holds_the_jobs_gil(module_sidecar: SidecarProcess) -> None:
    """N5: an expiring capture ended by dropping its session unstopped, whose C++ destructor collects the whole trace
    holding the GIL: every Python thread of the job stopped for 0.4 s. Now it is stopped, without the GIL."""
    plain = run(EVAL_JOB, "plain", 300, module_sidecar)
    ours = run(EVAL_JOB, "tpuscope", 300, module_sidecar)
    gaps = f"{plain['longest_gap_s']:.4f} s without tpuscope, {ours['longest_gap_s']:.4f} s with"
    print(f"the eval's longest gap: {gaps}")
    assert plain["rc"] == 0 and ours["rc"] == 0, ours["output"][-3000:]
    assert ours["captures"]["error"] == 1, "the capture expired in the eval"
    # Under 50 ms, or within what this machine's load does to the same loop without tpuscope (the destructor held the
    # GIL for 0.4 s, and a stop on a starved thread would record on: either fails this by far). Not 10 ms: beside the
    # rest of the suite on 2 cores, the scheduler alone left a 12 ms gap once where the plain run's was 4 ms.
    assert ours["longest_gap_s"] < max(0.050, 3 * plain["longest_gap_s"]), (plain, ours)
