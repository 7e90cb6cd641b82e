"""First, do no harm: the hang watch (issue 54; tracing/hooks.py HANG_WATCH) runs, stops and profiles a real job as
without it.

The same JAX job (a small jitted step loop on the CPU, a Monitor against a real sidecar) runs with
``TPUSCOPE_HANG_WATCH=0`` and ``=1``, alternated, each in a subprocess of its own, ending by ``mon.close()`` and by
the interpreter's exit alone (the Monitor's close at exit), and the runs are compared: the same losses, bit for
bit; the step time within the machine's noise; the same time from the last step to the process's end, no thread
of ours left once the Monitor is closed, no record left beside the sidecar's socket; and the job's own
``jax.profiler.trace`` of a few steps written alike.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tpuscope import positions
from tpuscope.tracing import hooks
from tpuscope.workload.sidecar import SidecarProcess

STEPS = 300
TRACED = 5  # the steps the job's own trace covers, after the others

JOB = r"""
import atexit, glob, json, os, statistics, sys, threading, time
socket_path, trace_dir, ending = sys.argv[1:4]
STEPS, TRACED = int(sys.argv[4]), int(sys.argv[5])
said = {}

def ours():
    return sorted(t.name for t in threading.enumerate() if t.name.startswith("tpuscope"))

def at_exit():  # registered before the Monitor: run after its close at exit, as the interpreter's last words
    said["at_exit"] = ours()
    said["exit_handlers_s"] = time.perf_counter() - said.pop("exiting")
    print(json.dumps(said), flush=True)

atexit.register(at_exit)
import jax, jax.numpy as jnp
from jax.profiler import ProfileData
from tpuscope.tracing import Hooks, Monitor

mon = Monitor("hang-safety", socket=socket_path, traces=False, hooks=Hooks(profile_period="off"))

@jax.jit
def train_step(w, x):
    for _ in range(6):
        w = jnp.tanh(w @ x) * 0.5 + w * 0.5
    return w, (w ** 2).mean()

w, x = jnp.ones((192, 192)) * 0.01, jnp.ones((192, 192)) * 0.02
losses, seconds = [], []
for n in range(STEPS):
    began = time.perf_counter()
    with mon.step(n) as s:
        with s.phase("compute"):
            w, loss = train_step(w, x)
            losses.append(float(loss))
    seconds.append(time.perf_counter() - began)
with jax.profiler.trace(trace_dir):  # the job's own profile of a few steps
    for n in range(STEPS, STEPS + TRACED):
        with mon.step(n):
            w, loss = train_step(w, x)
            losses.append(float(loss))
said["losses"] = losses
said["p50_ms"] = statistics.median(seconds[20:]) * 1e3  # past the compile and the first warm steps
said["watching"] = getattr(mon._whereabouts, "_map", None) is not None  # its record mapped: the sidecar reads it
said["running"] = ours()
files = sorted(glob.glob(os.path.join(trace_dir, "**", "*"), recursive=True))
said["trace_files"] = sorted(os.path.basename(f).split(".", 1)[1] for f in files if os.path.isfile(f))
said["xplane_bytes"] = sum(os.path.getsize(f) for f in files if f.endswith(".xplane.pb"))
said["planes"], said["step_events"] = [], 0
for path in (f for f in files if f.endswith(".xplane.pb")):
    for plane in ProfileData.from_file(path).planes:
        said["planes"].append(plane.name)
        said["step_events"] += sum(e.name == "PjitFunction(train_step)" for line in plane.lines for e in line.events)
said["last_step_at"] = time.time()  # the job's work done (the test's look at its trace too)
atexit.register(lambda: said.update(exiting=time.perf_counter()))  # registered last: the first to run at exit
if ending == "close":
    t = time.perf_counter()
    mon.close()
    said["close_s"] = time.perf_counter() - t
    said["after_close"] = ours()
"""


def run(sidecar: SidecarProcess, directory: Path, watch: bool, ending: str) -> dict[str, Any]:
    """Run the job to its end with the hang watch on or off; what it said, its exit status and when it ended."""
    env = {**os.environ, hooks.HANG_WATCH.env: "1" if watch else "0", "OMP_NUM_THREADS": "1"}
    trace = directory / f"trace-{'on' if watch else 'off'}-{ending}-{time.monotonic_ns()}"
    done = subprocess.run(
        [sys.executable, "-c", JOB, str(sidecar.socket), str(trace), ending, str(STEPS), str(TRACED)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    ended = time.time()
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert done.returncode == 0 and lines, done.stdout[-2000:] + done.stderr[-4000:]
    said: dict[str, Any] = json.loads(lines[-1])
    said["rc"], said["stderr"] = done.returncode, done.stderr
    said["last_step_to_exit_s"] = ended - said["last_step_at"]
    return said


Runs = dict[tuple[bool, str], list[dict[str, Any]]]  # (hang watch on, how it ends): its runs


@pytest.fixture(scope="module")
def runs(module_sidecar: SidecarProcess, module_tmp: Path) -> Runs:
    """Each way, twice, alternated: the machine's load falls on both alike."""
    done: Runs = {}
    for _ in range(2):
        for ending in ("close", "exit"):
            for watch in (False, True):
                done.setdefault((watch, ending), []).append(run(module_sidecar, module_tmp, watch, ending))
    return done


def split(runs: Runs) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The runs with the hang watch, and those without."""
    return [r for (w, _), rs in runs.items() if w for r in rs], [r for (w, _), rs in runs.items() if not w for r in rs]


def test_it_runs_as_without_the_hang_watch(runs: Runs) -> None:
    """The same results, bit for bit, and the same step time within the machine's noise: a step costs the watch a
    few stores to memory (a system call or a lock per step would show here)."""
    on, off = split(runs)
    # It was on where asked, its record read by the real sidecar, and off where not.
    assert all(r["watching"] and r["running"] == ["tpuscope-position"] for r in on), [r["running"] for r in on]
    assert not any(r["watching"] or r["running"] for r in off), [r["running"] for r in off]
    assert all(r["losses"] == off[0]["losses"] for r in on + off)
    p50 = {"on": min(r["p50_ms"] for r in on), "off": min(r["p50_ms"] for r in off)}
    print(f"step p50, best of {len(on)} runs each (ms): {p50}")
    assert p50["on"] <= 1.25 * p50["off"] + 0.05, p50


def test_it_stops_as_without_the_hang_watch(runs: Runs, module_sidecar: SidecarProcess) -> None:
    """At once, as without it: the Monitor's close stops the thread (nothing of ours is left), and at the
    interpreter's exit, the job's close or the Monitor's own at exit, nothing of ours is alive or waited for."""
    on, off = split(runs)
    measures = {
        "close": ("close_s", "last_step_to_exit_s"),  # the job's close, and from its last step to its end
        "exit": ("exit_handlers_s", "last_step_to_exit_s"),  # the interpreter's exit handlers (the Monitor's close)
    }
    seen = {
        f"{'with' if w else 'without'}, {e}": {m: [round(r[m], 3) for r in rs] for m in measures[e]}
        for (w, e), rs in runs.items()
    }
    print(f"seconds: {seen}")
    for r in on + off:
        assert r["rc"] == 0 and "Traceback" not in r["stderr"], r["stderr"][-3000:]
        assert r["at_exit"] == [], r["at_exit"]
    for r in runs[(True, "close")] + runs[(False, "close")]:
        assert r["after_close"] == [], r["after_close"]
    # The thread's join in close waits 1 s at most: a thread that did not wake would show by as much, in every
    # run with it. Beside a loaded machine's noise: the fastest with it against the slowest without.
    for ending, measured in measures.items():
        for measure in measured:
            with_watch = min(r[measure] for r in runs[(True, ending)])
            without = max(r[measure] for r in runs[(False, ending)])
            assert with_watch < without + 0.5, (ending, measure, seen)
    # Every record (and stacks file) beside the sidecar's socket went with its job.
    assert list(positions.directory(module_sidecar.socket).iterdir()) == []


def test_it_profiles_as_without_the_hang_watch(runs: Runs) -> None:
    """The job's own ``jax.profiler.trace`` of a few steps is written alike, each traced step in it."""
    on, off = split(runs)
    for r in on + off:
        assert r["trace_files"] == off[0]["trace_files"] == ["trace.json.gz", "xplane.pb"], r["trace_files"]
        assert r["xplane_bytes"] > 0 and r["planes"] == off[0]["planes"], r["planes"]
        assert r["step_events"] == off[0]["step_events"] >= TRACED, r["step_events"]
