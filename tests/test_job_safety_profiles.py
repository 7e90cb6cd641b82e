"""First, do no harm: device-profile captures are bounded and cooperative, and the parse leaves the job (issue 34;
repros 02, 03, 04, 09 and 10 of the job-safety review).

Each test runs the repro's job on 8 CPU devices in a subprocess of its own, with and without tpuscope (or its
captures), against a real sidecar that parses the captures, and compares: a long eval between steps no longer runs
under the profiler (the capture is discarded after its deadline, host memory stays put); JAX's PGLE and a user's
``start_trace``/``stop_trace``, however imported, work as without tpuscope; two Monitors share the process's one
profiler without a failed capture; and the steps around a capture's stop and parse run about as fast as the others.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tpuscope import catalog, events
from tpuscope.scrape import Scrape
from tpuscope.testing.waiting import wait_for
from tpuscope.tracing.profile_sampler import DEADLINE_FLOOR
from tpuscope.workload.sidecar import SidecarProcess

pytestmark = pytest.mark.long

# Opens every job: 8 CPU devices, and a loop's result printed as the last line of JSON.
PRELUDE = r"""
import json, os, sys, tempfile, time
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
import numpy as np, jax, jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
"""


def run(code: str, *args: str, timeout: float = 300) -> dict[str, Any]:
    """Run a job; the JSON object its last line prints (it must exit 0)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    out = subprocess.run(
        [sys.executable, "-c", PRELUDE + code, *args], capture_output=True, text=True, timeout=timeout, env=env
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    result["log"] = out.stderr
    return result


# --- 02: a capture that an eval interrupts ---------------------------------------------------------------
EVAL_JOB = r"""
import logging, psutil
logging.basicConfig(level=logging.INFO)
from tpuscope.tracing import Hooks, Monitor
mode, socket_path, eval_s = sys.argv[1], sys.argv[2], float(sys.argv[3])
profiles = []
class Profiles:  # a sink keeping the profiles the steps carry
    def emit(self, event):
        if getattr(event, "profile", None) is not None:
            profiles.append({f: getattr(event.profile, f) for f in event.profile.__struct_fields__})
    def close(self):
        pass
mon = Monitor(
    "eval",
    socket=socket_path,
    sinks=[Profiles()],
    traces=False,
    hooks=Hooks(profile_period="0.3s" if mode == "on" else "off"),
)
mesh = Mesh(np.array(jax.devices()), ("d",))
x = jax.device_put(jnp.ones((8 * 32, 128)), NamedSharding(mesh, P("d")))
w = jnp.ones((128, 128)) * 0.01

@jax.jit
def train_step(x, w):
    for _ in range(4):
        x = jnp.tanh(x @ w)
    return x, x.sum()

@jax.jit
def eval_step(x, w):
    for _ in range(8):
        x = jnp.sin(x @ w)
    return x.sum()

float(eval_step(x, w))  # compiled before the loop: the eval's memory is the profiler's, not the compiler's
proc = psutil.Process()
evaluated = None
began = time.monotonic()
for n in range(100000):
    with mon.step(n):
        x, loss = train_step(x, w)
        float(loss)
    prof = mon._profiler  # a test may look inside: is one of our sessions running?
    capture = prof._capture if prof is not None else None
    running = capture is not None and capture.session is not None
    if evaluated is None and (running if mode == "on" else n == 129):
        # The eval, right after a step traced by a capture (every ms a capture spent in it is in the trace).
        before = proc.memory_info().rss
        later = None  # the memory 2 s into the eval: past a capture's deadline
        eval_began, calls = time.perf_counter(), 0
        while time.perf_counter() - eval_began < eval_s:
            float(eval_step(x, w))
            calls += 1
            if later is None and time.perf_counter() - eval_began > 2.0:
                later = proc.memory_info().rss
        evaluated, after = n, proc.memory_info().rss
    done = prof is None or sum(prof.captures.values()) >= 1
    if evaluated is not None and n > evaluated + 20 and done or time.monotonic() - began > 200:
        break
mon.close()
sessions = [(b, e) for what, b, e in getattr(prof, "history", ()) if what == "session"]
print(json.dumps({
    "evaluated": evaluated, "calls": calls,
    "growth_mib": (after - before) / 2**20, "growth_after_2s_mib": (after - later) / 2**20,
    "captures": prof.captures if prof else None, "profiles": profiles,
    # how long the eval ran under the profiler: from its start to the end of the session it began in
    "under_profiler_s": max((e - eval_began for b, e in sessions if b <= eval_began <= e), default=None),
}))
"""


def test_a_long_eval_between_steps_does_not_run_under_the_profiler(module_sidecar: SidecarProcess) -> None:
    """Repro 02: an eval of 8 s starts right after a step a capture traced. Before, the capture stayed open through
    the whole eval (+0.9 GiB of host memory in 15 s; a 5 s "step" reported ok); now the job's leaving its step loop
    ends the capture after its deadline, discarded (counted as error): past it, memory grows as without captures."""
    eval_s = 8.0
    off = run(EVAL_JOB, "off", str(module_sidecar.socket), str(eval_s))
    on = run(EVAL_JOB, "on", str(module_sidecar.socket), str(eval_s))
    print(
        f"eval of {eval_s:g} s: memory +{off['growth_mib']:.0f} MiB without captures, +{on['growth_mib']:.0f} MiB "
        f"with (of which +{on['growth_after_2s_mib']:.0f} MiB after its first 2 s; {off['calls']} and {on['calls']} "
        f"calls); under the profiler for {on['under_profiler_s']} s; captures {on['captures']}"
    )
    assert on["evaluated"] is not None, "a capture ran right before the eval"
    # The profiler buffers every op of the eval (tens to hundreds of MiB a second here) for as long as it runs: now
    # only until the capture's deadline, well inside the eval's first 2 s.
    assert on["growth_after_2s_mib"] < off["growth_after_2s_mib"] + 32, (on, off)
    assert not [p for p in on["profiles"] if p["result"] == "ok" and p["step_s"] > 0.5], "no eval read as a step"
    assert on["captures"]["error"] >= 1, "the interrupted capture was discarded, and counted"
    assert "a device-profile capture was discarded: no step began or ended" in on["log"]
    # The session ended within its deadline (a floor of DEADLINE_FLOOR for these ms steps), plus the load's delays.
    assert on["under_profiler_s"] is not None and on["under_profiler_s"] < DEADLINE_FLOOR + 1.0, on


# --- 03: JAX's PGLE ----------------------------------------------------------------------------------------
PGLE_JOB = r"""
import contextlib, warnings
jax.config.update("jax_enable_pgle", True)
mode, socket_path = sys.argv[1], sys.argv[2]
monitored = mode == "monitor"
if monitored:
    from tpuscope.tracing import Hooks, Monitor
    # K: the floor, 16 steps
    mon = Monitor("pgle", socket=socket_path, traces=False, hooks=Hooks(profile_period="0.02s"))

@jax.jit
def train_step(x):
    for _ in range(4):
        x = jnp.tanh(x @ x.T) @ x
    return x

x = jnp.ones((256, 256)) / 256
calls = raised = 0
first = None
for n in range(200):
    with (mon.step(n) if monitored else contextlib.nullcontext()):
        x = train_step(x).block_until_ready()
        if n >= 30 and n % 3 == 0:  # a new compiled function now and then (an eval step, a new shape)
            calls += 1
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # on a CPU PGLE's own trace is always empty: it warns
                    jax.jit(lambda y, k=n: (y * 2 + k).sum())(x).block_until_ready()
            except Exception as e:
                raised += 1
                first = first or f"step {n}: {type(e).__name__}: {str(e)[:80]}"
captures = mon._profiler.captures if monitored and mon._profiler else None
if monitored:
    mon.close()
print(json.dumps({"calls": calls, "raised": raised, "first": first, "captures": captures}))
"""


def test_with_pgle_on_no_jitted_call_raises(module_sidecar: SidecarProcess) -> None:
    """Repro 03: PGLE profiles the first runs of every new compiled function with a session that raises if another
    runs. Before, 5 of 57 such calls raised during captures; now no capture is taken while PGLE is on (counted busy,
    said once), and none raises, as without tpuscope."""
    plain = run(PGLE_JOB, "plain", str(module_sidecar.socket))
    monitored = run(PGLE_JOB, "monitor", str(module_sidecar.socket))
    print(
        f"without tpuscope: {plain['raised']} of {plain['calls']} raised; "
        f"with: {monitored['raised']} raised, captures {monitored['captures']}"
    )
    assert plain["raised"] == 0 and plain["calls"] > 0
    assert monitored["raised"] == 0, monitored["first"]
    assert monitored["captures"]["busy"] >= 1 and monitored["captures"]["ok"] == 0, monitored["captures"]
    assert monitored["captures"]["error"] == 0, monitored["captures"]


# --- 04: the user's own traces ------------------------------------------------------------------------------
USER_TRACE_JOB = r"""
from jax.profiler import start_trace, stop_trace  # the user's module imports them by name, before tpuscope exists
import contextlib, glob
from jax.profiler import ProfileData
mode, socket_path = sys.argv[1], sys.argv[2]
monitored = mode == "monitor"
if monitored:
    from tpuscope.tracing import Hooks, Monitor
    mon = Monitor("prof", socket=socket_path, traces=False, hooks=Hooks(profile_period="0.05s"))  # K: 32 steps or so

@jax.jit
def train_step(x):
    for _ in range(4):
        x = jnp.tanh(x @ x.T) @ x
    return x

def ours_ended():  # sessions of ours started and stopped (their parse, in the sidecar at the lowest priority, aside)
    return sum(what == "stop" for what, *_ in mon._profiler.history) if monitored and mon._profiler else 0

def ours_running():
    prof = mon._profiler if monitored else None  # a test may look inside: is a session of ours running?
    capture = prof._capture if prof is not None else None
    return capture is not None and capture.session is not None

def annotations(directory):  # tpuscope's step annotations in a trace of the user's
    found = 0
    for path in glob.glob(os.path.join(directory, "**", "*.xplane.pb"), recursive=True):
        for plane in ProfileData.from_file(path).planes:
            for line in plane.lines:
                found += sum(event.name == "train" for event in line.events)
    return found

x = jnp.ones((256, 256)) / 256
tmp = tempfile.mkdtemp()
outcomes, during = [], 0
for n in range(900):
    # 300 steps, and on a loaded machine more (up to 900) until a session of ours ran between the traces
    if n >= 300 and (not monitored or ours_ended() >= 1):
        break
    with (mon.step(n) if monitored else contextlib.nullcontext()):
        x = train_step(x).block_until_ready()
    # The user traces 2 steps (their mon.step inside) every 23 steps (a capture spans 8, and its session may start a
    # few steps late on a loaded machine: room for one between), and a few times right as a capture runs.
    if n >= 30 and (n % 23 == 0 or (ours_running() and during < 3)):
        during += ours_running()
        d = os.path.join(tmp, str(n))
        try:
            start_trace(d)
            for _ in range(2):
                x = train_step(x).block_until_ready()
            stop_trace()
            ok = bool(glob.glob(os.path.join(d, "**", "*.xplane.pb"), recursive=True))
            outcomes.append([n, "written" if ok else "EMPTY", annotations(d)])
        except Exception as e:
            outcomes.append([n, f"{type(e).__name__}: {str(e)[:70]}", 0])
try:
    with jax.profiler.trace(os.path.join(tmp, "final")):  # the public context manager, at the end
        x = train_step(x).block_until_ready()
    final = "ok"
except Exception as e:
    final = f"{type(e).__name__}: {str(e)[:80]}"
captures = mon._profiler.captures if monitored and mon._profiler else None
sessions = ours_ended()
if monitored:
    mon.close()
print(json.dumps({"outcomes": outcomes, "final": final, "captures": captures, "during": during, "sessions": sessions}))
"""


def test_a_users_traces_work_however_start_trace_was_imported(module_sidecar: SidecarProcess) -> None:
    """Repro 04: the user imported ``start_trace``/``stop_trace`` by name before tpuscope existed. Before, a trace
    that overlapped a capture raised ALREADY_EXISTS, and every later one (and ``jax.profiler.trace()``) raised
    "Profile has already been started"; now each is written, as without tpuscope: the capture gives way."""
    plain = run(USER_TRACE_JOB, "plain", str(module_sidecar.socket))
    monitored = run(USER_TRACE_JOB, "monitor", str(module_sidecar.socket))
    failed = [o for o in monitored["outcomes"] if o[1] != "written"]
    print(
        f"user traces: {len(plain['outcomes'])} without tpuscope, {len(monitored['outcomes'])} with "
        f"({len(failed)} failed, {monitored['during']} started as a capture ran); captures {monitored['captures']}, "
        f"sessions of ours {monitored['sessions']}"
    )
    assert plain["final"] == "ok" and all(o[1] == "written" for o in plain["outcomes"])
    assert not failed, failed
    assert monitored["final"] == "ok"
    assert monitored["during"] >= 1, "a trace started while a capture ran"
    assert monitored["captures"]["busy"] >= 1 and monitored["captures"]["error"] == 0, monitored["captures"]
    # Captures went on between the user's traces: a session of ours started and stopped. Not that the sidecar parsed
    # it: its parser yields the CPU to everything else, and beside busy processes it may not finish in the job's life.
    assert monitored["sessions"] >= 1, "captures went on between the user's traces"


STEPS_IN_USER_TRACE_JOB = r"""
from jax.profiler import start_trace, stop_trace, ProfileData
import glob
from tpuscope.tracing import Hooks, Monitor
socket_path = sys.argv[1]
mon = Monitor("prof", socket=socket_path, traces=False, hooks=Hooks(profile_period="0.01s"))  # K: 8 steps or so

@jax.jit
def train_step(x):
    return jnp.tanh(x @ x.T) @ x

x = jnp.ones((128, 128)) / 128
tmp = tempfile.mkdtemp()
# K is chosen after 20 steps. Step on until a capture of ours has been answered (the sidecar's parser runs at the
# lowest CPU priority, seconds late on a loaded host): one still in flight when the user starts tracing would
# hold the profiler's thread, and no capture would be asked for during the user's trace.
n, began = 0, time.monotonic()
while n < 60 or (mon._profiler.captures["ok"] < 1 and time.monotonic() - began < 120):
    with mon.step(n):
        x = train_step(x).block_until_ready()
    n += 1
start_trace(tmp)  # the user traces 200 of their steps at least: captures are asked for, and skipped
# Stepping on until one is counted: the profiler's thread, at the lowest CPU priority, may find a capture asked for
# during the trace only seconds later on a loaded host (one found after the Monitor's close is not counted).
first, began = n, time.monotonic()
while n < first + 200 or (mon._profiler.captures["busy"] < 1 and time.monotonic() - began < 120):
    with mon.step(n):
        x = train_step(x).block_until_ready()
    n += 1
stop_trace()
found = 0
for path in glob.glob(os.path.join(tmp, "**", "*.xplane.pb"), recursive=True):
    for plane in ProfileData.from_file(path).planes:
        for line in plane.lines:
            found += sum(event.name == "train" for event in line.events)
profiler = mon._profiler
mon.close()  # its profiler's thread done: a capture asked for during the user's trace is counted by now
captures = dict(profiler.captures)
print(json.dumps({"annotations": found, "captures": captures}))
"""


def test_nothing_is_written_into_a_users_trace(module_sidecar: SidecarProcess) -> None:
    """Captures asked for while the user traces are skipped (busy), and their steps are not annotated: the user's
    trace holds no step marker of ours."""
    job = run(STEPS_IN_USER_TRACE_JOB, str(module_sidecar.socket))
    print(job["captures"], f"{job['annotations']} step annotations of ours in the user's trace")
    assert job["captures"]["busy"] >= 1, "captures were asked for while the user traced"
    assert job["annotations"] == 0


# --- 09: two Monitors in one process ------------------------------------------------------------------------
TWO_MONITORS_JOB = r"""
import contextlib, logging
logging.basicConfig(level=logging.INFO)
from tpuscope.tracing import Hooks, Monitor
two, socket_path = sys.argv[1] == "two", sys.argv[2]
if two:  # a trainer library that instruments itself, made first (at its import)
    lib = Monitor("llm-lib", socket=socket_path, traces=False, hooks=Hooks(profile_period="0.05s"))
user = Monitor("llm", socket=socket_path, traces=False, hooks=Hooks(profile_period="0.05s"))

@jax.jit
def step(x):
    for _ in range(3):
        x = jnp.tanh(x @ x.T) @ x
    return x

def captured(monitor):  # the captures the monitor's profiler finished (a test may look inside)
    return sum(monitor._profiler.captures.values()) if monitor is not None and monitor._profiler else 0

x = jnp.ones((256, 256)) / 256
holder = lib if two else user
for n in range(3000):
    with user.step(n), (lib.step(n) if two else contextlib.nullcontext()):
        x = step(x).block_until_ready()
    if captured(holder) >= 3:
        break
held = {"user": user._profiler is not None, "lib": two and lib._profiler is not None}
captures = {"user": dict(user._profiler.captures) if user._profiler else None}
if two:
    captures["lib"] = dict(lib._profiler.captures)
    lib.close()  # the library is done: the user's Monitor may take the process's profiler now
    for n in range(n + 1, n + 3000):
        with user.step(n):
            x = step(x).block_until_ready()
        if captured(user) >= 1:
            break
    captures["user_after"] = dict(user._profiler.captures) if user._profiler else None
user.close()
print(json.dumps({"held": held, "captures": captures}))
"""


def test_two_monitors_share_the_one_profiler_without_failed_captures(module_sidecar: SidecarProcess) -> None:
    """Repro 09: before, each Monitor captured on its own and 2 of 5 captures failed with ALREADY_EXISTS; now the
    first Monitor holds the process's profiler, the second takes no captures (said once), and none fails; once the
    first closes, the second takes the profiler over."""
    one = run(TWO_MONITORS_JOB, "one", str(module_sidecar.socket))
    two = run(TWO_MONITORS_JOB, "two", str(module_sidecar.socket))
    print(f"one Monitor: {one['captures']}; two: held {two['held']}, {two['captures']}")
    assert one["captures"]["user"]["ok"] >= 1 and one["captures"]["user"]["error"] == 0
    assert two["held"] == {"user": False, "lib": True}, "the first Monitor holds it"
    assert two["captures"]["lib"]["ok"] >= 1 and two["captures"]["lib"]["error"] == 0, two["captures"]
    assert two["log"].count("takes none") == 1, "the second Monitor is told once"
    after = two["captures"]["user_after"]
    assert after is not None and after["ok"] >= 1 and after["error"] == 0, "the profiler passed on, and works"


# --- 10: what a capture costs the steps around it -------------------------------------------------------------
STALL_JOB = r"""
from tpuscope.tracing import Hooks, Monitor
from tpuscope.tracing import profile_sampler as profiles
socket_path, period, captures_wanted, max_steps = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
profiles.COST_BUDGET = 1.0  # only so that K does not widen: several captures in a short run
mon = Monitor("stall", socket=socket_path, traces=False, hooks=Hooks(profile_period=period))
mesh = Mesh(np.array(jax.devices()), ("d",))
rep, shard = NamedSharding(mesh, P()), NamedSharding(mesh, P("d"))
key = jax.random.PRNGKey(0)
params = [jax.device_put(jax.random.normal(key, (256, 256)) * 0.05, rep) for _ in range(16)]
batch = jax.device_put(jax.random.normal(key, (8 * 64, 256)), shard)

@jax.jit
def train_step(params, x):
    def loss(ps):
        h = x
        for w in ps:
            h = jnp.tanh(h @ w)
        return (h ** 2).mean()
    l, g = jax.value_and_grad(loss)(params)
    return [w - 0.01 * gw for w, gw in zip(params, g)], l

steps, parse_s, carried = [], [], []  # carried: the answers that came back on a step, whatever their result
class Profiles:
    def emit(self, event):
        if getattr(event, "profile", None) is not None:
            carried.append(event.profile.result)
            if event.profile.result == "ok":
                parse_s.append(event.profile.parse_s)
    def close(self):
        pass
mon.sinks += (Profiles(),)
began = time.monotonic()
for n in range(max_steps):
    t = time.perf_counter()
    with mon.step(n):
        params, l = train_step(params, batch)
        float(l)
    steps.append((t, time.perf_counter()))
    # An answer is counted when it arrives and carried by the next step's event: step on until it was.
    if mon._profiler is not None and len(carried) >= captures_wanted or time.monotonic() - began > 180:
        break
history = list(mon._profiler.history) if mon._profiler else []
captures = dict(mon._profiler.captures) if mon._profiler else None
mon.close()
print(json.dumps({"steps": steps[30:], "history": history, "captures": captures, "parse_s": parse_s}))
"""


def overlaps(step: list[float], intervals: list[tuple[float, float]]) -> bool:
    return any(step[0] < end and begin < step[1] for begin, end in intervals)


def test_the_steps_around_a_capture_run_about_as_fast_as_the_others(sidecar: SidecarProcess) -> None:
    """Repro 10: before, the steps that overlapped a capture's stop and parse (on the job's thread, in Python)
    had a p50 33-39 % above the run's other steps. Now the job only stops the trace and hands it over, and the
    sidecar parses it in a child process at the lowest priority. On this loaded 2-core machine the bound is
    generous; ``tpuscope bench perf`` measures it against its 5 % target.

    The sidecar and the job keep their default priorities (the parser and the profiler's thread at nice 19), which
    are what this is about: the module's sidecar parses at nice 0, and its parse then took a core from the job's
    steps (p50 27 % above the others on an idle machine, 35 % on a loaded one). At nice 19 a loaded machine's
    parse takes seconds, and the job steps on until its captures are answered: two of them, not four."""
    job = run(STALL_JOB, str(sidecar.socket), "2s", "2", "5000")
    off = run(STALL_JOB, str(sidecar.socket), "off", "0", str(len(job["steps"]) + 30))
    stops = [(b, e) for what, b, e in job["history"] if what in ("stop", "handoff")]
    sessions = [(b, e) for what, b, e in job["history"] if what == "session"]
    assert stops and job["parse_s"] and all(s > 0 for s in job["parse_s"]), "the sidecar parsed the captures"
    after = [e - b for b, e in job["steps"] if overlaps([b, e], stops)]
    normal = [e - b for b, e in job["steps"] if not overlaps([b, e], stops + sessions)]
    p50 = {name: statistics.median(xs) * 1e3 for name, xs in (("after", after), ("normal", normal))}
    p50["off"] = statistics.median(e - b for b, e in off["steps"]) * 1e3
    print(
        f"p50 ms: steps overlapping a capture's stop and hand-off {p50['after']:.1f} ({len(after)}), the others "
        f"{p50['normal']:.1f} ({len(normal)}), captures off {p50['off']:.1f}; captures {job['captures']}, the "
        f"sidecar's parses {[round(s, 2) for s in job['parse_s']]} s"
    )
    assert job["captures"]["ok"] >= 2 and job["captures"]["error"] == 0, job["captures"]
    assert p50["after"] < 1.25 * p50["normal"], p50


# --- the sidecar's side -------------------------------------------------------------------------------------
def parses(sidecar: SidecarProcess, result: str) -> float:
    return Scrape.fetch(sidecar.url).present(catalog.PROFILE_PARSES.name, result=result)


def write_trace(spool: Path, stem: str, data: bytes) -> Path:
    path = spool / (stem + events.PROFILE_TRACE_SUFFIX)
    partial = path.with_name(path.name + events.PROFILE_PARTIAL_SUFFIX)
    partial.write_bytes(data)
    partial.rename(path)
    return path


def test_the_sidecar_answers_each_trace_drops_the_superseded_and_refuses_the_oversized(short_tmp: Path) -> None:
    """A spool left by a sidecar that died, holding two traces of one job, a trace over the size cap (sparse: no
    disk used) and garbage of another job: the new sidecar takes it over, answers each (the older of the two as
    dropped), deletes every trace, counts each outcome, and removes the spool as it stops."""

    socket = short_tmp / "ev.sock"
    spool = events.profile_spool(socket)
    spool.mkdir(mode=0o700)
    write_trace(spool, "11-0000000a-1", b"older")
    write_trace(spool, "11-0000000a-2", b"newer, also not a trace")
    with open(spool / f"12-0000000b-1{events.PROFILE_TRACE_SUFFIX}", "wb") as big:
        big.truncate(events.PROFILE_MAX_BYTES + 1)
    stale = spool / f"13-0000000c-1{events.PROFILE_ANSWER_SUFFIX}"
    stale.write_text("an answer nobody read")
    os.utime(stale, (0, 0))
    with SidecarProcess(socket, "127.0.0.1:0", "--collectors=none") as sidecar:
        answers = [spool / f"{stem}{events.PROFILE_ANSWER_SUFFIX}" for stem in ("11-0000000a-1", "11-0000000a-2")]
        big_answer = spool / f"12-0000000b-1{events.PROFILE_ANSWER_SUFFIX}"
        wait_for(
            lambda: all(a.exists() for a in [*answers, big_answer]),
            60,
            "answer to every trace",
            detail=lambda: list(spool.iterdir()),
        )
        for answer in [*answers, big_answer]:
            import msgspec

            assert msgspec.json.decode(answer.read_bytes(), type=events.DeviceProfile).result == "error"
        assert not list(spool.glob(f"*{events.PROFILE_TRACE_SUFFIX}")), "every trace deleted"
        wait_for(lambda: not stale.exists(), 30, "removal of the stale answer")
        assert parses(sidecar, "dropped") == 1 and parses(sidecar, "too_large") == 1
        assert parses(sidecar, "error") == 1 and parses(sidecar, "ok") == 0
        assert (spool.stat().st_mode & 0o777) == 0o700, "only the socket's owner may write, as to the socket"
    assert not spool.exists(), "a stopped sidecar offers no service"


def test_the_spool_admits_whom_the_socket_admits(short_tmp: Path) -> None:
    socket = short_tmp / "ev.sock"
    with SidecarProcess(socket, "127.0.0.1:0", "--collectors=none", "--socket-mode=0660"):
        mode = events.profile_spool(socket).stat().st_mode & 0o777
    assert mode == 0o730, oct(mode)  # the group may create and remove files, not list them


JOB_OF_AN_OLDER_SIDECAR = r"""
import logging
import time
logging.basicConfig(level=logging.INFO)
from tpuscope.tracing import Hooks, Monitor
mon = Monitor("old", socket=sys.argv[1], traces=False, hooks=Hooks(profile_period="0.01s"))  # K: 8 steps or so
f = jax.jit(lambda x: jnp.tanh(x @ x.T))
x = jnp.ones((128, 128))
# 200 steps, and on until the profiler's thread (at nice 19, late on a loaded machine) has looked for the spool.
deadline, n = time.monotonic() + 60, 0
while n < 200 or ("spool" not in mon._profiler._said and time.monotonic() < deadline):
    with mon.step(n):
        f(x).block_until_ready()
    n += 1
captures = dict(mon._profiler.captures)
mon.close()
print(json.dumps({"captures": captures}))
"""


def test_without_a_sidecar_that_parses_the_job_takes_no_captures(short_tmp: Path) -> None:
    """A sidecar that offers no parsing (one older than the service, or one that could not make its spool: here a
    file stands at its path) makes no spool: the job takes no capture, parses nothing itself, and says so once."""
    socket = short_tmp / "ev.sock"
    stranger = events.profile_spool(socket)
    stranger.write_text("not a spool")
    proc = subprocess.Popen(
        [sys.executable, "-m", "tpuscope", "serve", "--listen", "127.0.0.1:0", "--socket", str(socket)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert "tpuscope serve: metrics at" in proc.stdout.readline()
        assert not events.profile_spool(socket).is_dir()
        job = run(JOB_OF_AN_OLDER_SIDECAR, str(socket))
    finally:
        proc.terminate()
        _, log = proc.communicate(timeout=30)
    assert "exists and is not a directory): jobs take no captures" in log, log
    assert stranger.read_text() == "not a spool"  # left alone
    assert job["captures"] == dict.fromkeys(events.PROFILE_RESULTS, 0)
    assert job["log"].count("no device-profile captures while the sidecar") == 1, job["log"][-2000:]
