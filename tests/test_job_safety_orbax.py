"""The Orbax wrapper (``mon.orbax(manager)``) leaves Orbax's own figures and logs as they are without it
(issue 52, finding N4, ../shared/repros/job-safety-2/03_orbax_wrapper_hides_wait_from_orbax.py).

It used to wait for the previous save before calling ``manager.save()``, and its watcher thread called the
manager's ``wait_until_finished()``: Orbax then recorded ~0 s of waiting for the previous save (0.001 s against
0.295 s without the wrapper) while the job waited as long, and logged 9 more lines. It now learns that a save is
durable from Orbax's own finalize thread (tracing/orbax_checkpoints.py), and the failures Orbax keeps for the
job's next call are taken where Orbax raises them.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import orbax.checkpoint as ocp
import pytest

try:
    from orbax.checkpoint._src.path import atomicity
except ImportError:  # Orbax before 0.6
    from orbax.checkpoint.path import atomicity

from tpuscope import events
from tpuscope.testing.waiting import WaitTimedOut, wait_for
from tpuscope.tracing import Monitor, Traces, orbax_checkpoints

HOLD_S = 0.2  # how long the job's storage holds each commit (two a step in Orbax 0.12): each save waits for the last
WAIT_EVENTS = ("/jax/checkpoint/write/wait_for_prev_duration_secs", "/jax/orbax/write/blocking_wait_prev_duration_secs")
# Lines Orbax logs or not by timing alone, with or without tpuscope: a wait over 1 s; a step's metadata read before
# its write, which another executor of Orbax's makes (seen once in 11 runs of the job below, under load).
TIMING_LINES = ("Waiting for previous save to complete took", "Metadata file does not exist")

# 8 async saves back to back of 4 MiB, with a plain CheckpointManager or with mon.orbax(CheckpointManager): what
# Orbax recorded of each save's wait for the one before (its jax.monitoring events), what it logged (absl, INFO
# and up, each message with its numbers and the checkpoint directory left out), and what the wrapper reported.
JOB = r"""
import asyncio, collections, json, logging, re, sys, time
mode, directory, hold = sys.argv[1], sys.argv[2], float(sys.argv[3])
import jax, jax.numpy as jnp, orbax.checkpoint as ocp
from absl import logging as absl_logging
try:
    from orbax.checkpoint._src.path import atomicity
except ImportError:  # Orbax before 0.6
    from orbax.checkpoint.path import atomicity

commit = atomicity.on_commit_callback  # storage that takes `hold` seconds to commit: async since Orbax 0.11.6
if asyncio.iscoroutinefunction(commit):
    async def slow_commit(*args, **kwargs):
        await asyncio.sleep(hold)
        await commit(*args, **kwargs)
else:
    def slow_commit(*args, **kwargs):
        time.sleep(hold)
        commit(*args, **kwargs)
atomicity.on_commit_callback = slow_commit

lines = collections.Counter()
VARYING = r"0x[0-9a-f]+|[0-9]+(\.[0-9]+)?(e-?[0-9]+)?|[KMG]iB/s|\b(milli|micro)?seconds?\b"  # numbers, units, ids
class Keep(logging.Handler):
    def emit(self, record):
        message = record.getMessage().replace(directory, "<dir>")
        lines[re.sub(VARYING, "#", message)] += 1
absl_logging.set_verbosity(absl_logging.INFO)
logging.getLogger("absl").addHandler(Keep())
waits = collections.defaultdict(list)
def listen(event, duration, **kwargs):
    if event.endswith(("/wait_for_prev_duration_secs", "/blocking_wait_prev_duration_secs")):
        waits[event].append(duration)
jax.monitoring.register_event_duration_secs_listener(listen)

mngr = ocp.CheckpointManager(directory, options=ocp.CheckpointManagerOptions(max_to_keep=2))
if mode == "wrapped":
    from tpuscope.tracing import Hooks, Monitor, Traces
    class Sink(list):
        emit = list.append
        def close(self):
            pass
    sink = Sink()
    mon = Monitor(
        "ck",
        socket=directory + ".sock",
        sinks=[sink],
        traces=Traces(spans_file=directory + ".spans"),
        hooks=Hooks(profile_period="off"),
    )
    mngr = mon.orbax(mngr)
state = {"w%d" % i: jnp.zeros((1 << 17,), jnp.float32) for i in range(8)}  # 4 MiB
inc = jax.jit(lambda s: jax.tree.map(lambda x: x + 1, s))
in_save = []
for step in range(8):
    state = inc(state)
    jax.block_until_ready(state)
    started = time.perf_counter()
    mngr.save(step, args=ocp.args.StandardSave(state))
    in_save.append(time.perf_counter() - started)
mngr.wait_until_finished()
mngr.close()
reports, blocking = [], []
if mode == "wrapped":
    mon.close()
    reports = [[e.step, e.ok, e.bytes, e.duration_s] for e in sink if type(e).__name__ == "Checkpoint"]
    spans = [json.loads(line) for line in open(directory + ".spans")]
    blocking = [s["attributes"]["tpuscope.checkpoint.blocking_seconds"]
                for s in spans if s["name"] == "checkpoint.save"]
print("RESULT " + json.dumps({"in_save": in_save, "waits": waits, "lines": lines, "reports": reports,
                              "blocking": blocking}), flush=True)
"""


def run_jobs(directory: Path) -> dict[str, dict[str, Any]]:
    """The job, plain and wrapped, side by side: on a loaded machine both meet the same load. Their output goes to
    files: a pipe not read while the other job's is would hold a job that logs more than it takes."""
    jobs = {}
    try:
        for mode in ("plain", "wrapped"):
            (directory / mode).mkdir()
            with (directory / mode / "out").open("w") as out:
                jobs[mode] = subprocess.Popen(
                    [sys.executable, "-c", JOB, mode, str(directory / mode / "ckpt"), str(HOLD_S)],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                )
        results = {}
        for mode, job in jobs.items():
            job.wait(timeout=120)
            output = (directory / mode / "out").read_text()
            result = next((line[7:] for line in output.splitlines() if line.startswith("RESULT ")), None)
            assert job.returncode == 0 and result is not None, (mode, output[-6000:])
            results[mode] = dict(json.loads(result))
        return results
    finally:
        for job in jobs.values():
            if job.poll() is None:
                job.kill()
                job.wait()


def test_orbax_records_and_logs_the_same_with_the_wrapper(short_tmp: Path) -> None:
    """Same job, plain and wrapped, at the same time: Orbax's recorded waits for the previous save (saves 1-7)
    agree within the noise of a loaded machine, each run's share of the job's time in ``save()`` is Orbax's, and
    Orbax logs the same lines, none from tpuscope's threads. The wrapper still reports each save once durable."""
    runs = run_jobs(short_tmp)
    plain, wrapped = runs["plain"], runs["wrapped"]
    # Orbax's records of each save's wait for the one before: wait_for_prev (every save's; since 0.12 every wait
    # on the main thread, a save's first) and, since 0.12, blocking_wait_prev (one a save).
    assert WAIT_EVENTS[0] in plain["waits"] and sorted(wrapped["waits"]) == sorted(plain["waits"]), runs
    for event in plain["waits"]:
        waited = {}
        for name, run in runs.items():
            assert len(run["waits"][event]) >= 8, (name, event, run["waits"])
            orbax, job = sum(run["waits"][event][1:8]), sum(run["in_save"][1:8])
            # Each save waits for the last one's commit, held: clearly non-zero, and most of the job's time in
            # save() (it was 0.001 s of 0.27 s with the wrapper that waited before Orbax's save).
            assert orbax >= 7 * HOLD_S, (name, event, orbax, run["waits"])
            assert orbax >= job / 2, (name, event, orbax, job)
            waited[name] = orbax
        assert 0.6 <= waited["wrapped"] / waited["plain"] <= 1.6, (event, waited)

    plain_lines, wrapped_lines = (
        Counter({line: n for line, n in run["lines"].items() if not line.startswith(TIMING_LINES)})
        for run in (plain, wrapped)
    )
    assert sum(plain_lines.values()) > 100  # Orbax's INFO lines were counted
    assert plain_lines == wrapped_lines, (plain_lines - wrapped_lines, wrapped_lines - plain_lines)
    assert not [line for line in wrapped_lines if "tpuscope" in line]
    waits = sum(n for line, n in wrapped_lines.items() if "wait_until_finished" in line)
    assert waits == sum(n for line, n in plain_lines.items() if "wait_until_finished" in line)  # 18 in 0.12.8

    assert [(step, ok) for step, ok, _, _ in wrapped["reports"]] == [(step, True) for step in range(8)]
    assert all(size > 0 and seconds >= HOLD_S for _, _, size, seconds in wrapped["reports"]), wrapped["reports"]
    assert len(wrapped["blocking"]) == 8
    assert all(0 < b <= r[3] for b, r in zip(wrapped["blocking"], wrapped["reports"], strict=True))


# --- failures Orbax keeps for the job's next call -------------------------------------------------------------------


class Kept(list[events.AnyEvent]):
    """A sink that keeps the Monitor's events."""

    emit = list.append

    def close(self) -> None:
        """Nothing to release."""

    def saves(self) -> list[tuple[int, bool]]:
        return [(e.step, e.ok) for e in self if isinstance(e, events.Checkpoint) and e.operation == "save"]


class HeldStorage:
    """Storage whose next ``failing`` commits of a step (Orbax's, on its own thread) fail, each once ``released``
    is set: a save can be made to fail after the job's next call into Orbax began."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.failing = 0
        self.released = threading.Event()
        self.released.set()
        commit = atomicity.on_commit_callback

        async def held_async(*args: Any, **kwargs: Any) -> None:  # Orbax's since 0.11.6
            while not self.released.is_set():
                await asyncio.sleep(0.01)
            self.maybe_fail()
            await commit(*args, **kwargs)

        def held(*args: Any, **kwargs: Any) -> None:
            self.released.wait(60)
            self.maybe_fail()
            commit(*args, **kwargs)

        monkeypatch.setattr(
            atomicity, "on_commit_callback", held_async if asyncio.iscoroutinefunction(commit) else held
        )

    def maybe_fail(self) -> None:
        if self.failing:
            self.failing -= 1
            raise OSError("injected: the storage refused the commit")

    def release_once_waiting(self, thread: threading.Thread) -> Callable[[], bool]:
        """Release the held commit once ``thread`` waits in Orbax's ``wait_until_finished`` (on a helper thread
        that waits for that condition, 30 s at most, then releases it anyway). Returns a call that joins the
        helper and says whether ``thread`` did wait there."""
        seen: list[bool] = []

        def waiting() -> bool:
            frame = sys._current_frames().get(thread.ident or 0)
            while frame is not None:
                if frame.f_code.co_name == "wait_until_finished" and "orbax" in frame.f_code.co_filename:
                    return True
                frame = frame.f_back
            return False

        def release() -> None:
            try:
                wait_for(waiting, 30, "the job's thread in Orbax's wait_until_finished", interval=0.005)
                seen.append(True)
            except WaitTimedOut:
                seen.append(False)
            finally:
                self.released.set()

        helper = threading.Thread(target=release, daemon=True)
        helper.start()

        def joined() -> bool:
            helper.join()
            return seen == [True]

        return joined


@pytest.fixture
def mon(short_tmp: Path) -> Iterator[tuple[Monitor, Kept]]:
    kept = Kept()
    monitor = Monitor(
        "orbax", socket=short_tmp / "nobody.sock", sinks=[kept], traces=Traces(spans_file=short_tmp / "spans.jsonl")
    )
    yield monitor, kept
    monitor.close()


def state() -> dict[str, Any]:
    return {"w": jnp.arange(4096, dtype=jnp.float32).reshape(64, 64)}


def manager(directory: Path, async_save: bool = True) -> Any:
    options = ocp.CheckpointManagerOptions(max_to_keep=3, enable_async_checkpointing=async_save)
    return ocp.CheckpointManager(directory, options=options)


def test_a_failure_orbax_raises_in_the_next_save_is_taken_and_that_save_made(
    mon: tuple[Monitor, Kept], short_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Step 1's commit fails while the job waits for it in step 2's ``save``, where Orbax raises it: the wrapper
    takes it (step 1's watcher reports it) and saves step 2 in the same call. Orbax forgets step 1, as after its
    own wait raised. A last save that failed is taken by ``close``, which still closes the manager."""
    monitor, kept = mon
    storage = HeldStorage(monkeypatch)
    checkpoints = monitor.orbax(manager(short_tmp / "ckpt"))
    storage.failing, storage.released = 1, threading.Event()
    assert checkpoints.save(1, args=ocp.args.StandardSave(state()))
    waited_in_orbax = storage.release_once_waiting(threading.current_thread())
    assert checkpoints.save(2, args=ocp.args.StandardSave(state()))
    assert waited_in_orbax(), "the job waited for step 1 outside Orbax's save"
    checkpoints.wait_until_finished()
    assert checkpoints.all_steps() == [2]
    storage.failing = 1
    assert checkpoints.save(3, args=ocp.args.StandardSave(state()))
    closed = []
    checkpointer = checkpoints.manager._checkpointer  # what Orbax's close closes after its wait
    monkeypatch.setattr(checkpointer, "close", lambda close=checkpointer.close: closed.append(close()))
    checkpoints.close()
    assert closed == [None]
    assert kept.saves() == [(1, False), (2, True), (3, False)]


def test_a_failure_seen_before_the_next_save_is_taken_without_waiting(
    mon: tuple[Monitor, Kept], short_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Step 1's failure was reported before the job's next ``save``: that save takes it from Orbax first (its
    wait returns at once: the finalize thread has ended), then saves."""
    monitor, kept = mon
    storage = HeldStorage(monkeypatch)
    checkpoints = monitor.orbax(manager(short_tmp / "ckpt"))
    storage.failing = 1
    assert checkpoints.save(1, args=ocp.args.StandardSave(state()))
    wait_for(lambda: kept.saves(), 30, "step 1's report")
    assert checkpoints.save(2, args=ocp.args.StandardSave(state()))
    checkpoints.close()
    assert kept.saves() == [(1, False), (2, True)]
    assert checkpoints.all_steps() == [2]


def test_with_raise_errors_the_failure_is_raised_where_orbax_raises_it(
    mon: tuple[Monitor, Kept], short_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``raise_errors=True``: step 1's failure comes out of step 2's ``save``, as without the wrapper, and step 2
    is not reported (it was not made)."""
    monitor, kept = mon
    storage = HeldStorage(monkeypatch)
    checkpoints = monitor.orbax(manager(short_tmp / "ckpt"), raise_errors=True)
    storage.failing, storage.released = 1, threading.Event()
    assert checkpoints.save(1, args=ocp.args.StandardSave(state()))
    waited_in_orbax = storage.release_once_waiting(threading.current_thread())
    with pytest.raises(OSError, match="injected"):
        checkpoints.save(2, args=ocp.args.StandardSave(state()))
    assert waited_in_orbax(), "the job waited for step 1 outside Orbax's save"
    checkpoints.close()
    wait_for(lambda: kept.saves(), 30, "step 1's report")
    assert kept.saves() == [(1, False)]


def test_a_synchronous_save_is_reported_as_durable_when_it_returns(mon: tuple[Monitor, Kept], short_tmp: Path) -> None:
    """No finalize thread of Orbax's for a synchronous save: durable when ``save`` returned."""
    monitor, kept = mon
    with monitor.orbax(manager(short_tmp / "ckpt", async_save=False)) as checkpoints:
        started = time.perf_counter()
        assert checkpoints.save(4, args=ocp.args.StandardSave(state()))
        returned = time.perf_counter() - started
    (save,) = [e for e in kept if isinstance(e, events.Checkpoint)]
    assert (save.step, save.ok) == (4, True)
    assert save.bytes == orbax_checkpoints.tree_bytes(short_tmp / "ckpt" / "4") > 0
    assert save.duration_s <= returned


# --- the finalize thread, in the shapes Orbax has kept it ------------------------------------------------------------


class FakeFinalizeThread(threading.Thread):
    """Orbax's ``_FinalizeThread`` before 0.6.2: ``join`` hands the failure to the first thread that joins."""

    exception: BaseException | None = None

    def run(self) -> None:
        try:
            super().run()
        except BaseException as e:
            self.exception = e

    def join(self, timeout: float | None = None) -> None:
        super().join(timeout)
        if self.exception:
            exception, self.exception = self.exception, None
            raise exception


def test_the_finalize_thread_is_found_in_each_shape_and_its_failure_known_once_cleared() -> None:
    """Kept in an ``OptionalRef`` (0.11.6 on), a plain attribute (before), or not at all (not Orbax's manager);
    a failure the job's thread joined first (clearing it, before 0.6.2) is still known by its traceback."""

    def fail() -> None:
        raise OSError("injected")

    thread = FakeFinalizeThread(target=fail)
    thread.start()
    ref = type("Ref", (), {"get": lambda self: thread})()
    assert orbax_checkpoints.finalize_thread(type("M", (), {"_finalize_thread": ref})()) is thread
    assert orbax_checkpoints.finalize_thread(type("M", (), {"_finalize_thread": thread})()) is thread
    assert orbax_checkpoints.finalize_thread(type("M", (), {"_finalize_thread": None})()) is None
    assert orbax_checkpoints.finalize_thread(object()) is None
    with pytest.raises(OSError) as raised:
        thread.join()
    assert thread.exception is None  # cleared, as Orbax before 0.6.2 does
    assert orbax_checkpoints._raised_from(raised.value, thread)
    assert not orbax_checkpoints._raised_from(OSError("another"), thread)
