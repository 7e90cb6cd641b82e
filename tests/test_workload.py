"""The JAX benchmark workload, run for real (8 CPU devices) against a real sidecar, with each fault."""

from __future__ import annotations

import itertools
import json
import os
import re
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import PROFILE_PROMPTLY

from tpuscope import catalog, events
from tpuscope.report import from_recording
from tpuscope.report.window import Window
from tpuscope.scrape import Scrape
from tpuscope.testing import bench as testing_bench
from tpuscope.testing.waiting import scrape_until
from tpuscope.thresholds import Thresholds
from tpuscope.tracing import read_records
from tpuscope.workload.sidecar import SidecarProcess

pytestmark = pytest.mark.long

Records = list[tuple[float, events.AnyEvent]]


@dataclass
class Run:
    workload: str
    returncode: int
    output: str
    records: Records

    def of(self, kind: type[events.AnyEvent]) -> list[events.AnyEvent]:
        return [event for _, event in self.records if isinstance(event, kind)]

    @property
    def steps(self) -> list[events.Step]:
        return [e for e in self.of(events.Step) if isinstance(e, events.Step)]


@pytest.fixture(scope="module")
def bench(module_sidecar: SidecarProcess, module_tmp: Path) -> Callable[..., Run]:
    """Run ``tpuscope workload`` (the JAX workload, 8 CPU devices) as its own process against the module's sidecar."""
    # The CPU calibration out of ~; the one test of captures needs them taken promptly on a loaded machine too.
    env = {**os.environ, "XDG_CACHE_HOME": str(module_tmp / "cache"), **PROFILE_PROMPTLY}

    def run(workload: str, *args: str, expect: int = 0, warm: bool = True) -> Run:
        """``warm``: compile from the module's shared persistent cache (the baseline and the recompile
        fault compile cold, as they check what compiling reports), ~6 s of CPU saved a run. Device profiles
        are off unless ``args`` ask for them."""
        if warm and "--compile-cache" not in args:
            args = (*args, "--compile-cache", str(module_tmp / "xla-cache-warm"))
        if "--profile-period" not in args:  # captures cost CPU; the one test of them asks for them
            args = (*args, "--profile-period", "off")
        record = module_tmp / f"{workload}.jsonl"
        record.unlink(missing_ok=True)  # the sink appends: each run gets its own recording
        proc = testing_bench.run(
            *args, timeout=600, env=env, socket=module_sidecar.socket, workload=workload,
            run_dir=module_tmp / workload, record=record,
        )  # fmt: skip
        output = proc.stdout + proc.stderr
        assert proc.returncode == expect, output
        return Run(workload, proc.returncode, output, read_records(record) if record.exists() else [])

    return run


@pytest.fixture(scope="module")
def baseline(bench: Callable[..., Run], module_tmp: Path) -> Run:
    return bench("base", "--steps", "40", "--checkpoint-every", "10", "--compile-cache", str(module_tmp / "xla-cache"))


def scrape(sidecar: SidecarProcess, run: Run) -> Scrape:
    """The sidecar's metrics once it has every event the run sent."""
    # A workload whose first step has not arrived has no series yet: none of its steps counted.
    steps = len(run.steps)
    return scrape_until(sidecar.url, lambda s: (s.value(catalog.STEPS.name, workload=run.workload) or 0) >= steps, 10)


def phase_shares(steps: list[events.Step]) -> dict[str, float]:
    total = sum(s.duration_s for s in steps)
    return {phase: sum(dict(s.phase_seconds())[phase] for s in steps) / total for phase in events.PHASES}


def test_phases_add_up_to_the_step_time_and_measure_real_work(baseline: Run, module_sidecar: SidecarProcess) -> None:
    metrics = scrape(module_sidecar, baseline)
    w = {"workload": baseline.workload}
    steps = metrics.present(catalog.STEP_DURATION.series("sum"), **w)
    phases = {p: metrics.present(catalog.STEP_PHASE_DURATION.series("sum"), phase=p, **w) for p in events.PHASES}
    assert metrics.value(catalog.STEPS.name, **w) == 40
    assert abs(sum(phases.values()) / steps - 1) < 0.05, phases
    # The measured phases hold the step: little is left to "other", and the all-reduce is its own phase.
    assert phases["other"] / steps < 0.15, phases
    assert phases["compute"] / steps > 0.5 and phases["sync"] > 0, phases


def test_compiles_come_with_the_first_step_only(baseline: Run) -> None:
    order = [(e.step if isinstance(e, events.Step) else None, e) for _, e in baseline.records]
    first_step = next(i for i, (n, _) in enumerate(order) if n is not None)
    before = [e for _, e in order[:first_step] if isinstance(e, events.Compile)]
    assert {"grads", "all_reduce", "apply"} <= {e.function for e in before if e.stage == "backend"}
    assert {e.stage for e in before} == {"tracing", "lowering", "backend"}
    # In the steady state nothing compiles, except Orbax's own copies during the very first save.
    last_step = -1
    for n, event in order[first_step:]:
        if n is not None:
            last_step = n
        elif isinstance(event, events.Compile):
            assert last_step == 9, f"compile of {event.function} after step {last_step}"
            assert event.function not in ("grads", "all_reduce", "apply")


def test_a_rerun_hits_the_persistent_compile_cache(
    baseline: Run, bench: Callable[..., Run], module_tmp: Path, module_sidecar: SidecarProcess
) -> None:
    assert not any(e.hit for e in baseline.of(events.CompileCache) if isinstance(e, events.CompileCache))
    rerun = bench("cached", "--steps", "5", "--compile-cache", str(module_tmp / "xla-cache"))
    hits = [e for e in rerun.of(events.CompileCache) if isinstance(e, events.CompileCache) and e.hit]
    assert len(hits) >= 3
    metrics = scrape(module_sidecar, rerun)
    assert metrics.value(catalog.COMPILE_CACHE_REQUESTS.name, workload="cached", result="hit") == len(hits)


def test_checkpoints_are_saved_with_their_size(baseline: Run, module_sidecar: SidecarProcess) -> None:
    saves = [e for e in baseline.of(events.Checkpoint) if isinstance(e, events.Checkpoint)]
    assert [c.step for c in saves] == [9, 19, 29, 39]
    assert all(c.ok and c.bytes > 100_000 and c.operation == "save" for c in saves)
    metrics = scrape(module_sidecar, baseline)
    assert metrics.value(catalog.CHECKPOINT_BYTES.name, workload="base", operation="save") == sum(
        c.bytes for c in saves
    )
    assert metrics.present(catalog.CHECKPOINT_LAST_SUCCESS.name, workload="base") > time.time() - 600


def test_mfu_and_goodput_are_reported(baseline: Run, module_sidecar: SidecarProcess) -> None:
    metrics = scrape(module_sidecar, baseline)
    assert 0 < metrics.present(catalog.MFU.name, workload="base") <= 1
    flops = sum(s.flops for s in baseline.steps)
    assert flops > 0 and metrics.value(catalog.MODEL_FLOPS.name, workload="base") == pytest.approx(flops)
    goodput = {c: metrics.present(catalog.GOODPUT.name, workload="base", category=c) for c in ("productive", "compile")}
    assert goodput["productive"] > 0 and goodput["compile"] > 0
    wall = baseline.records[-1][0] - baseline.records[0][0]
    total = sum(s.value for s in metrics.find(catalog.GOODPUT.name, workload="base"))
    assert total <= wall * 1.05, "the categories must not count any second twice"
    assert "goodput" in baseline.output and "MFU" in baseline.output


def test_a_crash_then_a_rerun_resumes_from_the_checkpoint_and_counts_lost_work(
    bench: Callable[..., Run], module_sidecar: SidecarProcess
) -> None:
    args = ("--steps", "30", "--checkpoint-every", "10", "--inject", "crash=25")
    crashed = bench("crashy", *args, expect=3)
    assert crashed.steps[-1].step == 24
    assert "run the same command again to resume" in crashed.output
    resumed = bench("crashy", *args)
    assert resumed.steps[0].step == 20, "the rerun starts after the checkpoint of step 19"
    assert resumed.steps[-1].step == 29
    metrics = scrape(module_sidecar, resumed)
    w = {"workload": "crashy"}
    assert metrics.present(catalog.GOODPUT.name, category="lost", **w) > 0
    assert metrics.value(catalog.WORKLOAD_FAILURES.name, reason="other", **w) == 1
    assert metrics.value(catalog.WORKLOAD_RESTARTS.name, reason="resumed", **w) == 1
    assert metrics.value(catalog.CHECKPOINT_DURATION.series("count"), operation="restore", result="ok", **w) == 1


def test_slow_io_moves_the_io_share(baseline: Run, bench: Callable[..., Run]) -> None:
    # One reader thread prefetches while the devices compute, so a step waits for about
    # (read - compute) of each read. Reads of eight steps' time make that about 7/8 of a step
    # here, and still more than half of one if this machine's load triples the compute time
    # meanwhile (the multi-host tests beside it can: reads of four steps' time left 18 % in a
    # fresh-clone CI): a fixed read time would measure this machine's speed instead of the fault.
    read_s = 8 * statistics.median(s.duration_s for s in baseline.steps[1:])
    slow = bench("slow-io", "--steps", "12", "--checkpoint-every", "0", "--inject", f"slow-io={read_s:.3f}")
    normal = phase_shares(baseline.steps[1:])["io"]
    assert normal < 0.1
    assert phase_shares(slow.steps[1:])["io"] > max(0.2, 4 * normal)


def test_a_stall_stops_the_steps(bench: Callable[..., Run]) -> None:
    stalled = bench("stall", "--steps", "10", "--checkpoint-every", "0", "--inject", "stall=3")
    times = [t for t, e in stalled.records if isinstance(e, events.Step)]
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert max(gaps) >= 3.0 and sorted(gaps)[-2] < 1.0, gaps


def test_a_straggler_computes_slower(bench: Callable[..., Run]) -> None:
    """From a third of the run on, against its own steps before (a baseline run at another time saw another load
    on the machine). The fault stretches the gradient program 8 times, not the update beside it in the compute
    phase: far more than the bound, which a stretch of 3 (about 2 times the phase) missed in fresh-clone CI runs
    beside the suite's other JAX jobs on 2 cores."""
    slow = bench("straggler", "--steps", "15", "--checkpoint-every", "0", "--inject", "straggler=8")
    before = [s.compute_s for s in slow.steps[1:5]]  # step 0 compiles; the straggler from step 5
    after = [s.compute_s for s in slow.steps[5:]]
    assert statistics.median(after) > 1.5 * statistics.median(before), (before, after)


def test_recompile_compiles_in_the_steady_state(bench: Callable[..., Run]) -> None:
    run = bench("recompile", "--steps", "16", "--checkpoint-every", "0", "--inject", "recompile=4", warm=False)
    step_of_compile = []
    last_step = -1
    for _, event in run.records:
        if isinstance(event, events.Step):
            last_step = event.step
        elif isinstance(event, events.Compile) and event.stage == "backend" and event.function == "grads":
            step_of_compile.append(last_step)
    assert step_of_compile == [-1, 3, 7, 11], "a new shape (and compile) every 4 steps"


def test_failing_checkpoints_are_reported_and_survived(
    bench: Callable[..., Run], module_sidecar: SidecarProcess
) -> None:
    run = bench("ckpt-fail", "--steps", "10", "--checkpoint-every", "5", "--inject", "ckpt-fail")
    saves = [e for e in run.of(events.Checkpoint) if isinstance(e, events.Checkpoint)]
    assert [c.ok for c in saves] == [False, False]
    metrics = scrape(module_sidecar, run)
    w = {"workload": "ckpt-fail"}
    assert metrics.value(catalog.CHECKPOINT_DURATION.series("count"), result="error", **w) == 2
    assert not metrics.has(catalog.CHECKPOINT_LAST_SUCCESS.name, **w)


def test_spill_on_the_cpu_says_why_it_cannot_be_injected(bench: Callable[..., Run]) -> None:
    run = bench("spill", "--steps", "2", "--inject", "spill", expect=2)
    assert "host memory" in run.output


def test_fused_mode_reports_the_program_as_compute_and_the_device_trace_splits_it(
    bench: Callable[..., Run], module_tmp: Path
) -> None:
    # A short period: captures from step 32 on, so that a short run has some (a job's default is 10 minutes). The
    # sidecar's answer comes a second or more after a capture of 8 steps, from a parser at the lowest CPU priority,
    # which a loaded machine (the suite's other workers) starves for seconds: the run's 500 steps leave it room (at
    # 200 and captures of 8 steps, a fresh-clone CI saw no answer before the last step; at 120 and a 1 s period,
    # with captures of 5, neither).
    run = bench("fused", "--steps", "500", "--checkpoint-every", "0", "--fused", "--profile-period", "0.3s")
    shares = phase_shares(run.steps[1:])
    assert shares["sync"] == 0 and shares["compute"] > 0.6, shares  # host-timed: the collectives are inside compute
    assert all(s.flops > 0 for s in run.steps)
    # The device trace splits the same program: the all-reduce's time shows, and the parts make up the step.
    profiles = [s.profile for s in run.steps if s.profile is not None and s.profile.result == "ok"]
    assert profiles, [s.profile for s in run.steps if s.profile is not None]
    for p in profiles:
        # Every window between two annotations is measured: 5, and at least 4 should the trace lack one.
        assert p.devices == 8 and p.steps >= 4 and p.capture_s > 0 and p.trace_bytes > 0, p
        assert abs(p.compute_s + p.exposed_collective_s + p.idle_s - p.step_s) <= 0.05 * p.step_s, p
    summary = json.loads((module_tmp / "fused" / "summary.json").read_text())
    split = summary["profiled"]
    assert split["captures"] == len(profiles) and split["devices"] == 8, split
    parts = {part: split[part]["seconds"] for part in ("compute", "exposed_collective", "idle")}
    assert parts["exposed_collective"] > 0 and parts["compute"] > 0, split
    assert abs(sum(parts.values()) / split["step_s"] - 1) <= 0.05, split
    assert summary["captures"]["ok"] == len(profiles) and summary["capture_s"] > 0, summary
    assert summary["host_phases"]["sync"]["seconds"] == 0
    # The printed summary names each split for what it is.
    assert re.search(r"^  phase shares  compute \d+%, sync 0%.*\(host-timed", run.output, re.MULTILINE), run.output
    assert re.search(r"^  device trace  \d+ captures, .* exposed collective [\d.]+ ms", run.output, re.MULTILINE)
    captures = (
        r"^  captures      \d+ ok, \d+ busy, \d+ error; [\d.]+ s to start and stop \([\d.]+% of [\d.]+ s wall\), "
    )
    assert re.search(captures + r"[\d.]+ s of the sidecar's to parse", run.output, re.M), run.output


def test_the_overhead_benchmark_runs_and_reports_both_measurements(bench: Callable[..., Run]) -> None:
    """Not a timing test: it checks the benchmark runs at a tiny size and prints well-formed figures."""
    run = bench("overhead", "overhead", "--steps", "45")  # `tpuscope bench overhead`
    assert re.search(r"Monitor overhead: 20 steps on and 20 off, interleaved in blocks of 10", run.output)
    figures = re.search(r"instrumentation itself\s+([\d.]+) us per step \(([\d.]+)% of a step", run.output)
    assert figures and float(figures[1]) > 0, run.output
    assert re.search(r"A/B difference\s+[+-]\d+ us \([+-][\d.]+%\) \+- \d+ us", run.output), run.output
    probe_steps = [e for e in run.steps if e.workload != "overhead"]
    assert not probe_steps and len(run.steps) == 20, "the probe's empty steps stay out of the workload"


def test_async_checkpoints_report_when_durable(bench: Callable[..., Run], module_sidecar: SidecarProcess) -> None:
    run = bench("async", "--steps", "10", "--checkpoint-every", "5", "--async-checkpoint")
    saves = [e for e in run.of(events.Checkpoint) if isinstance(e, events.Checkpoint)]
    assert [(c.step, c.ok) for c in saves] == [(4, True), (9, True)]
    assert all(c.bytes > 100_000 for c in saves)
    metrics = scrape(module_sidecar, run)
    assert metrics.present(catalog.GOODPUT.name, workload="async", category="lost") == 0
    # Only what held the loop is checkpoint time: the rest of each save overlapped steps, booked themselves.
    blocked = sum(c.blocking_s or 0 for c in saves)
    assert 0 < blocked < sum(c.duration_s for c in saves)
    checkpointing = metrics.present(catalog.GOODPUT.name, workload="async", category="checkpoint")
    assert checkpointing <= blocked + 1e-6


def test_a_marked_eval_is_booked_as_its_own_badput_and_the_categories_still_add_up(
    bench: Callable[..., Run], module_sidecar: SidecarProcess, module_tmp: Path
) -> None:
    """--eval-every: an eval of 4 batches after every 5 steps, marked ``mon.badput("eval")``. The sidecar, the run's
    summary and the report of its recording book it as ``eval``, as long as the job measured it, and the categories
    add up to the wall time. The last eval (after the last step) rides on the stop."""
    run = bench("evals", "--steps", "20", "--checkpoint-every", "10", "--eval-every", "5", "--eval-batches", "4")
    carried = [b for e in run.of(events.Step) + run.of(events.Lifecycle) for b in e.badput]  # type: ignore[attr-defined]
    assert [b.name for b in carried] == ["eval"] * 4 and not any(b.in_step for b in carried)
    assert run.of(events.Lifecycle)[-1].badput  # type: ignore[attr-defined]
    marked = sum(b.seconds for b in carried)
    metrics = scrape_until(
        module_sidecar.url,
        lambda s: (
            s.has(catalog.STEPS.name, workload="evals") and not s.has(catalog.WORKLOAD_PROCESSES.name, workload="evals")
        ),
    )
    booked = {s.labels["category"]: s.value for s in metrics.find(catalog.GOODPUT.name, workload="evals")}
    print(f"evals: marked {marked:.3f} s; booked {booked}")
    assert booked["eval"] == pytest.approx(marked, rel=1e-6)
    assert sum(booked.values()) == pytest.approx(metrics.value(catalog.GOODPUT_WALL.name, workload="evals"), rel=0.01)
    summary = json.loads((module_tmp / "evals" / "summary.json").read_text())["goodput_s"]
    assert summary["eval"] == pytest.approx(marked, rel=1e-6)
    assert "eval" in run.output.split("goodput", 1)[1]  # the summary's goodput line names it
    report = from_recording.build(module_tmp / "evals.jsonl", "evals", Window(), Thresholds())
    reported = {series.name: series.values[-1] for series in report.goodput}
    assert reported["eval"] == pytest.approx(marked, rel=1e-6)
    assert sum(reported.values()) == pytest.approx(run.records[-1][0] - run.records[0][0], rel=1e-6)


def test_one_workload_on_a_sidecar_is_within_the_per_host_series_budget(
    baseline: Run, module_sidecar: SidecarProcess
) -> None:
    """The series a host serves for the bench's default run (its workload's, and the sidecar's own), against
    the budget docs/fleet.md states; `tpuscope bench fleet-scale` checks a fused run with profiles and 8 TPU chips."""
    metrics = scrape(module_sidecar, baseline)
    mine = [s for s in metrics.samples if s.labels.get("workload") in (None, baseline.workload)]
    assert len(mine) > 100, len(mine)  # a scrape that read nothing would pass the budget
    assert len(mine) <= catalog.HOST_SERIES_BUDGET, len(mine)
