"""examples/train.py, run as a user runs it against a real sidecar, and what it relies on: the Orbax hook,
``Monitor.flops_of`` and compile watching that starts by itself."""

from __future__ import annotations

import asyncio
import difflib
import json
import logging
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from orbax.checkpoint._src.path import atomicity

from tpuscope import catalog, events
from tpuscope.scrape import Scrape
from tpuscope.testing.waiting import scrape_until
from tpuscope.tracing import Hooks, Monitor, OrbaxCheckpoints, Traces, orbax_checkpoints
from tpuscope.workload.sidecar import SidecarProcess

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE, PLAIN = ROOT / "examples" / "train.py", ROOT / "examples" / "train_plain.py"
MAX_ADDED_LINES = 6


class Kept(list[events.AnyEvent]):
    """A sink (``emit``, ``close``) that keeps the Monitor's events in order, to look them up by kind."""

    emit = list.append

    def close(self) -> None:
        """Nothing to release."""

    def of(self, kind: type[events.AnyEvent]) -> list[Any]:
        return [e for e in self if isinstance(e, kind)]


def example_env(directory: Path, **variables: str) -> dict[str, str]:
    """The environment of a user's run: one CPU device (not the 8 that conftest gives this process), the
    CPU's peak measured into ``directory`` rather than ~/.cache."""
    env = {**os.environ, "XDG_CACHE_HOME": str(directory / "cache"), **variables}
    env["XLA_FLAGS"] = re.sub(r"--xla_force_host_platform_device_count=\d+", "", env.get("XLA_FLAGS", "")).strip()
    return env


# --- the example ---------------------------------------------------------------------------------------------------


def test_the_example_reports_steps_phases_compiles_checkpoints_mfu_and_its_loss(
    sidecar: SidecarProcess, short_tmp: Path
) -> None:
    """docs/instrument.md's command with fewer steps: TRAIN_STEPS=30 CHECKPOINT_EVERY=10 python examples/train.py."""
    env = example_env(
        short_tmp,
        TPUSCOPE_SOCKET=str(sidecar.socket),
        TRAIN_STEPS="30",
        CHECKPOINT_EVERY="10",
        CHECKPOINT_DIR=str(short_tmp / "checkpoints"),
    )
    run = subprocess.run(
        [sys.executable, "examples/train.py"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "step 30: loss" in run.stdout
    w = {"workload": "mlp"}
    saves = catalog.CHECKPOINT_DURATION.series("count")
    metrics = scrape_until(sidecar.url, lambda s: (s.value(saves, operation="save", **w) or 0) >= 3)
    print("\n".join(line for line in metrics.text.splitlines() if 'workload="mlp"' in line and "_bucket" not in line))

    assert metrics.value(catalog.STEPS.name, **w) == 30
    phase_sum, phase_count = (catalog.STEP_PHASE_DURATION.series(s) for s in ("sum", "count"))
    assert metrics.present(phase_sum, phase="compute", **w) > 0
    # The loss of every step, read without a wait of tpuscope's: a finite one, no NaN, none dropped unread.
    loss = metrics.value(catalog.TRAINING_VALUE.name, value="loss", **w)
    assert loss is not None and 0 < loss < 3, loss  # cross-entropy over 10 classes starts near log(10)
    assert metrics.value(catalog.TRAINING_NONFINITE.name, value="loss", **w) == 0
    assert metrics.value(catalog.TRAINING_VALUES_UNREAD.name, **w) == 0
    # One program does the whole step, so no collective runs apart from it: sync is reported, at 0 (README).
    assert metrics.value(phase_count, phase="sync", **w) == 30
    assert metrics.present(catalog.COMPILE_DURATION.series("sum"), stage="backend", **w) > 0
    # Async saves (the example's), each reported once durable, with the bytes on disk.
    assert metrics.value(saves, operation="save", result="ok", **w) == 3
    assert not metrics.has(saves, result="error", **w)
    assert metrics.present(catalog.CHECKPOINT_BYTES.name, operation="save", **w) > 0
    assert metrics.present(catalog.MFU.name, **w) > 0


def test_the_example_adds_at_most_six_lines_of_code_to_the_plain_loop() -> None:
    """Lines only re-indented (the loop's body, now inside the step) are not added lines, nor blank ones (the
    formatter separates the tpuscope import from the third-party ones with one)."""

    def code(path: Path) -> list[str]:
        return [line.strip() for line in path.read_text().splitlines() if line.strip()]

    plain, instrumented = code(PLAIN), code(EXAMPLE)
    assert not any(re.match(r"(from|import) tpuscope", line) for line in plain), "the plain loop uses tpuscope"
    added = [line[2:] for line in difflib.ndiff(plain, instrumented) if line.startswith("+ ")]
    removed = [line[2:] for line in difflib.ndiff(plain, instrumented) if line.startswith("- ")]
    assert len(added) <= MAX_ADDED_LINES, "\n".join(added)
    assert len(removed) <= 1, removed  # the CheckpointManager's line, now wrapped by mon.orbax


def test_the_docs_show_the_example_as_it_is() -> None:
    """The README shows the example's loop (its main function) as it is; docs/instrument.md the whole file."""
    example = EXAMPLE.read_text()
    loop = example[example.index("def main() -> None:") : example.index("\n\nif __name__")]
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Instrument a training loop") : readme.index("## Run it on a cluster")]
    assert f"```python\n{loop}```" in section
    assert "TRAIN_STEPS=" in section and "python examples/train.py" in section
    guide = (ROOT / "docs" / "instrument.md").read_text()
    assert f"```python\n{example}```" in guide[guide.index("## The loop") : guide.index("## Traces")]


def test_the_plain_loop_runs_and_resumes(short_tmp: Path) -> None:
    env = example_env(short_tmp, TRAIN_STEPS="4", CHECKPOINT_EVERY="2", CHECKPOINT_DIR=str(short_tmp / "ckpt"))
    for steps in ("4", "6"):  # the second run resumes from the checkpoint of step 3
        run = subprocess.run(
            [sys.executable, str(PLAIN)], env={**env, "TRAIN_STEPS": steps}, capture_output=True, text=True, timeout=120
        )
        assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.splitlines()[0].startswith("step 6: loss"), run.stdout
    assert sorted(p.name for p in (short_tmp / "ckpt").iterdir()) == ["3", "5"]


# --- the Orbax hook ------------------------------------------------------------------------------------------------


class Job(NamedTuple):
    mon: Monitor
    kept: Kept
    tmp: Path  # for checkpoints, and the spans in spans.jsonl


@pytest.fixture
def job(short_tmp: Path) -> Iterator[Job]:
    kept = Kept()
    mon = Monitor(
        "orbax", socket=short_tmp / "nobody.sock", sinks=[kept], traces=Traces(spans_file=short_tmp / "spans.jsonl")
    )
    yield Job(mon, kept, short_tmp)
    mon.close()


def state() -> dict[str, jax.Array]:
    return {"w": jnp.arange(4096, dtype=jnp.float32).reshape(64, 64), "b": jnp.ones(64)}


def manager(directory: Path, async_save: bool = True) -> Any:
    options = ocp.CheckpointManagerOptions(max_to_keep=3, enable_async_checkpointing=async_save)
    return ocp.CheckpointManager(directory, options=options)


HELD_S = 0.5  # how long the storage below holds a commit


def test_an_async_save_is_reported_once_durable_with_its_bytes_and_what_it_blocked(
    job: Job, monkeypatch: pytest.MonkeyPatch
) -> None:
    mon, kept, tmp = job
    commit = atomicity.on_commit_callback
    durable = threading.Event()  # storage that commits a step only when the test says so
    backstop = threading.Timer(30, durable.set)  # a save that waited for it would otherwise hang the test

    async def held_commit(*args: Any, **kwargs: Any) -> None:
        while not durable.is_set():
            await asyncio.sleep(0.01)
        await commit(*args, **kwargs)

    monkeypatch.setattr(atomicity, "on_commit_callback", held_commit)
    checkpoints = mon.orbax(manager(tmp / "ckpt"))
    backstop.start()
    try:
        started = time.perf_counter()
        assert checkpoints.save(7, args=ocp.args.StandardSave(state()))
        returned_after = time.perf_counter() - started
        assert not durable.is_set(), "the save blocked the job until durable"
        assert not kept.of(events.Checkpoint), "reported before it was durable"
        time.sleep(HELD_S)  # the storage holds the commit this long: the duration under test
    finally:  # a save left running would outlive this test's directory
        durable.set()
        backstop.cancel()
        checkpoints.close()
    mon.close()
    (save,) = kept.of(events.Checkpoint)
    assert (save.operation, save.step, save.ok) == ("save", 7, True)
    assert save.duration_s >= HELD_S
    assert save.bytes == orbax_checkpoints.tree_bytes(checkpoints.directory / "7") > 0
    spans = [json.loads(line) for line in (tmp / "spans.jsonl").read_text().splitlines()]
    (span,) = [s for s in spans if s["name"] == "checkpoint.save"]
    blocking = span["attributes"]["tpuscope.checkpoint.blocking_seconds"]
    assert 0 < blocking <= returned_after
    (child,) = [s for s in spans if s["name"] == "blocking"]
    assert child["parentSpanId"] == span["spanId"]
    assert child["startTimeUnixNano"] == span["startTimeUnixNano"]


class FailingStorage:
    """Orbax's commit of a step (the last stage of a save, on its own thread for an async save) fails while
    ``failing`` is set, as on storage that went away."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.failing = False
        commit = atomicity.on_commit_callback

        async def maybe_fail(*args: Any, **kwargs: Any) -> None:
            if self.failing:
                raise OSError("injected: the storage refused the commit")
            await commit(*args, **kwargs)

        monkeypatch.setattr(atomicity, "on_commit_callback", maybe_fail)


def test_a_failed_save_is_reported_and_the_job_goes_on(
    job: Job, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    mon, kept, tmp = job
    storage = FailingStorage(monkeypatch)
    checkpoints = mon.orbax(manager(tmp / "ckpt"))
    assert checkpoints.save(1, args=ocp.args.StandardSave(state()))
    checkpoints.wait_until_finished()
    storage.failing = True
    checkpoints.save(2, args=ocp.args.StandardSave(state()))  # fails on Orbax's thread, after save() returned
    checkpoints.wait_until_finished()  # where Orbax raises that failure; the hook reported it instead
    storage.failing = False
    assert checkpoints.save(3, args=ocp.args.StandardSave(state())), "the job goes on checkpointing"
    checkpoints.close()
    # A synchronous save fails in save() itself: reported, and False as for a save not made.
    sync = mon.orbax(manager(tmp / "sync", async_save=False))
    storage.failing = True
    assert sync.save(4, args=ocp.args.StandardSave(state())) is False
    sync.close()
    assert [(c.step, c.ok) for c in kept.of(events.Checkpoint)] == [(1, True), (2, False), (3, True), (4, False)]
    said = [r.getMessage() for r in caplog.records if r.name == "tpuscope" and "failed" in r.getMessage()]
    assert len(said) == 2 and "step 2 failed" in said[0] and "step 4 failed" in said[1], said


def test_with_raise_errors_a_failed_save_is_reported_and_raised(job: Job, monkeypatch: pytest.MonkeyPatch) -> None:
    mon, kept, tmp = job
    FailingStorage(monkeypatch).failing = True
    checkpoints = mon.orbax(manager(tmp / "ckpt", async_save=False), raise_errors=True)
    with pytest.raises(OSError, match="injected"):
        checkpoints.save(1, args=ocp.args.StandardSave(state()))
    assert [(c.step, c.ok) for c in kept.of(events.Checkpoint)] == [(1, False)]


def test_a_restore_is_reported_and_a_failed_one_raised(job: Job) -> None:
    mon, kept, tmp = job
    with mon.orbax(manager(tmp / "ckpt")) as checkpoints:
        for step in (10, 20):
            checkpoints.save(step, args=ocp.args.StandardSave(state()))
        checkpoints.wait_until_finished()
        restored = checkpoints.restore(None, args=ocp.args.StandardRestore(state()))  # the latest
        assert np.array_equal(restored["w"], state()["w"])
        with pytest.raises(FileNotFoundError):
            checkpoints.restore(99, args=ocp.args.StandardRestore(state()))
    restores = [c for c in kept.of(events.Checkpoint) if c.operation == "restore"]
    assert [(c.step, c.ok) for c in restores] == [(20, True), (99, False)]
    assert restores[0].bytes == orbax_checkpoints.tree_bytes(checkpoints.directory / "20") > 0


def test_a_failure_of_the_hook_itself_is_counted_said_once_and_never_raised(
    job: Job, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    mon, kept, tmp = job

    def broken(path: Any) -> int:
        raise RuntimeError("a bug in tpuscope")

    monkeypatch.setattr(orbax_checkpoints, "tree_bytes", broken)
    checkpoints: OrbaxCheckpoints = mon.orbax(manager(tmp / "ckpt"))
    for step in (1, 2):
        assert checkpoints.save(step, args=ocp.args.StandardSave(state()))
    checkpoints.close()
    assert [(c.step, c.ok, c.bytes) for c in kept.of(events.Checkpoint)] == [(1, True, 0), (2, True, 0)]
    assert checkpoints.errors == 2
    said = [r for r in caplog.records if "a bug in tpuscope" in r.getMessage() and r.levelno >= logging.WARNING]
    assert len(said) == 1


# --- FLOPs and hardware for MFU --------------------------------------------------------------------------------------


@jax.jit
def matmul(a: jax.Array, b: jax.Array) -> jax.Array:
    return a @ b


def test_flops_of_reads_the_compiled_step_and_reports_its_devices_once(
    short_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(short_tmp / "cache"))  # the CPU's peak is measured here, once
    kept = Kept()
    a, b = jnp.ones((64, 128)), jnp.ones((128, 32))
    with Monitor("flops", socket=short_tmp / "x.sock", sinks=[kept], traces=False) as mon:
        flops = mon.flops_of(matmul, a, b)
        assert flops == pytest.approx(2 * 64 * 128 * 32, rel=0.05)
        assert mon.flops_of(matmul, a, b) == flops
        with mon.step(0):
            matmul(a, b).block_until_ready()
        with mon.step(1) as s:
            s.flops = 5.0  # a step that knows better
    assert [s.flops for s in kept.of(events.Step)] == [flops, 5.0]
    (hardware,) = kept.of(events.Hardware)
    assert (hardware.accelerator, hardware.devices) == ("cpu", 1) and hardware.peak_flops_per_second > 0
    # The step compiled once, in flops_of; measuring the CPU's peak compiled a matmul too, which is not the job's.
    assert {e.function for e in kept.of(events.Compile)} == {"matmul"}
    assert [e.stage for e in kept.of(events.Compile)] == ["tracing", "lowering", "backend"]


def test_flops_of_a_sharded_step_counts_every_device_of_this_process(short_tmp: Path) -> None:
    kept = Kept()
    mesh = Mesh(np.array(jax.devices()[:2]), ("data",))
    a = jax.device_put(jnp.ones((64, 128)), NamedSharding(mesh, PartitionSpec("data")))  # type: ignore[no-untyped-call]
    with Monitor("sharded", socket=short_tmp / "x.sock", sinks=[kept], traces=False) as mon:
        mon.hardware("cpu", 2, 1e9)  # given: flops_of leaves it
        flops = mon.flops_of(matmul, a, jnp.ones((128, 32)))
    assert flops == pytest.approx(2 * 64 * 128 * 32, rel=0.05), "one device's share, times the 2 devices"
    assert len(kept.of(events.Hardware)) == 1


def test_flops_of_something_it_cannot_read_is_no_mfu_and_no_error(
    short_tmp: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with Monitor("noflops", socket=short_tmp / "x.sock", traces=False) as mon:
        assert mon.flops_of(lambda x: x @ x, jnp.ones((4, 4))) == 0.0  # not jitted: no compiled program
        assert mon.flops_of(matmul, jnp.ones((4, 4)), jnp.ones((5, 4))) == 0.0  # shapes that do not fit
        assert mon.step_flops == 0.0
    assert caplog.text.count("so no MFU") == 2


# --- compile watching ------------------------------------------------------------------------------------------------


def test_compiles_are_watched_by_themselves_once_however_often_asked(short_tmp: Path) -> None:
    kept = Kept()
    with Monitor("compiles", socket=short_tmp / "x.sock", sinks=[kept], traces=False) as mon:
        mon.watch_jax_compiles()  # jax is imported here: the Monitor watches already, and this changes nothing
        jax.jit(lambda x: x * 3 + 1)(jnp.arange(5)).block_until_ready()
    stages = [e.stage for e in kept.of(events.Compile) if e.function == "<lambda>"]
    assert stages == ["tracing", "lowering", "backend"]
    quiet = Kept()
    with Monitor("quiet", socket=short_tmp / "x.sock", sinks=[quiet], traces=False, hooks=Hooks(jax_compiles=False)):
        jax.jit(lambda x: x * 5 - 1)(jnp.arange(5)).block_until_ready()
    assert not quiet.of(events.Compile)


def test_a_job_without_jax_does_not_load_it_and_one_that_imports_it_later_is_watched(short_tmp: Path) -> None:
    record = short_tmp / "events.jsonl"
    script = f"""
import sys
from tpuscope.tracing import Monitor, RecordSink
mon = Monitor("late", socket={str(short_tmp / "x.sock")!r}, sinks=[RecordSink({str(record)!r})], traces=False)
with mon.step(0):
    pass
assert "jax" not in sys.modules, "the Monitor loaded jax"
import jax
with mon.step(1):
    jax.jit(lambda x: x + 1)(1).block_until_ready()
mon.close()
"""
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    compiles = [e for _, e in events.read_records(record) if isinstance(e, events.Compile)]
    assert [e.stage for e in compiles] == ["tracing", "lowering", "backend"]


def test_the_sidecar_serves_a_failed_save_of_the_hook(
    sidecar: SidecarProcess, short_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The failure reaches /metrics as the checkpoint alerts read it: result="error"."""
    FailingStorage(monkeypatch).failing = True
    with (
        Monitor("hooked", socket=sidecar.socket, traces=False) as mon,
        mon.orbax(manager(short_tmp / "ckpt")) as checkpoints,
    ):
        checkpoints.save(5, args=ocp.args.StandardSave(state()))
    count = catalog.CHECKPOINT_DURATION.series("count")
    metrics: Scrape = scrape_until(sidecar.url, lambda s: s.has(count, workload="hooked"))
    assert metrics.value(count, workload="hooked", operation="save", result="error") == 1
