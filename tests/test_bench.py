"""``tpuscope workload --synthetic``: the demo starts a sidecar and shows what it serves; ``tpuscope bench``'s
benchmarks, each a subcommand of its own; and ``tpuscope bench`` without one, still the workload for one release."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tpuscope import catalog, cli, events
from tpuscope.testing import bench as testing_bench
from tpuscope.workload.faults import FaultError, Faults
from tpuscope.workload.summary import RunSummary


def test_the_workload_starts_a_sidecar_and_prints_non_zero_series(short_tmp: Path) -> None:
    out = testing_bench.run(
        "--synthetic",
        timeout=120,
        steps=30,
        step_time=0.005,
        checkpoint_every=10,
        socket=short_tmp / "b.sock",
        listen="127.0.0.1:0",
    )
    assert out.returncode == 0, out.stderr
    assert "deprecated" not in out.stderr, out.stderr
    assert re.search(r"started a sidecar; metrics at http://127\.0\.0\.1:\d+/metrics until the run ends", out.stdout)
    # Each progress line's rate is over the steps since the one before, not an average since the start.
    assert re.search(r"^  step 30/30  [\d.]+ steps/s over the last 3$", out.stdout, re.MULTILINE), out.stdout
    assert "30 sent" not in out.stdout  # events include more than steps
    assert ", 0 dropped" in out.stdout
    series = dict(re.findall(r"^  (tpuscope_\S+) (\S+)$", out.stdout, re.MULTILINE))
    assert float(series[f'{catalog.STEPS.name}{{workload="bench"}}']) == 30
    assert (
        float(series[f'{catalog.CHECKPOINT_DURATION.series("count")}{{operation="save",result="ok",workload="bench"}}'])
        == 3
    )
    assert float(series[f'{catalog.INGEST_EVENTS.name}{{result="accepted"}}']) > 30
    phases = {k: float(v) for k, v in series.items() if k.startswith(catalog.STEP_PHASE_DURATION.series("sum"))}
    assert len(phases) == 4 and all(v > 0 for v in phases.values())
    # The summary's goodput is a share of the booked time, as the sidecar's (and the report's) is.
    booked = {k: float(v) for k, v in series.items() if k.startswith(catalog.GOODPUT.name + "{")}
    productive = booked[f'{catalog.GOODPUT.name}{{category="productive",workload="bench"}}']
    said = re.search(r"^  goodput +([\d.]+)% of", out.stdout, re.MULTILINE)
    assert said and float(said[1]) == pytest.approx(100 * productive / sum(booked.values()), abs=0.5), out.stdout
    assert not (short_tmp / "b.sock").exists(), "the sidecar the workload started was not stopped"


def test_bench_without_a_benchmark_still_runs_the_workload_and_says_its_new_name(short_tmp: Path) -> None:
    flags = [
        "--synthetic",
        "--steps=3",
        "--step-time=0.005",
        f"--socket={short_tmp / 'b.sock'}",
        "--listen=127.0.0.1:0",
    ]
    out = subprocess.run(
        [sys.executable, "-m", "tpuscope", "bench", *flags], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert "deprecated" in out.stderr and "`tpuscope workload`" in out.stderr, out.stderr
    assert re.search(r"^  step 3/3 ", out.stdout, re.MULTILINE), out.stdout


def usage(capsys: pytest.CaptureFixture[str], *arguments: str) -> str:
    """What ``tpuscope ARGUMENTS --help`` prints."""
    with pytest.raises(SystemExit) as exited:
        cli.main([*arguments, "--help"])
    assert exited.value.code == 0
    return capsys.readouterr().out


def test_bench_lists_its_benchmarks_and_each_takes_only_its_own_flags(capsys: pytest.CaptureFixture[str]) -> None:
    listed = usage(capsys, "bench")
    names = ("perf", "overhead", "trace-cost", "scrape-latency", "flood", "soak", "hangs", "rule-cost", "fleet-scale")
    for name in names:
        assert re.search(rf"^    {name}\s", listed, re.MULTILINE), listed
    options = listed.split("\noptions:")[1]
    assert "--steps" not in options and "--inject" not in options  # the workload's flags are `tpuscope workload`'s
    perf = usage(capsys, "bench", "perf")
    assert "--tiny" in perf and "--json" in perf
    assert not {"--seconds", "--minutes", "--trials", "--rules", "--steps"} & set(re.findall(r"--[\w-]+", perf))
    rule_cost = usage(capsys, "bench", "rule-cost")
    assert "--hosts" in rule_cost and "--fleet-hosts" not in rule_cost and "--tiny" not in rule_cost
    workload = usage(capsys, "workload")
    assert "--steps" in workload and "--inject" in workload and "--processes" in workload


def test_an_unknown_fault_is_a_clear_error() -> None:
    out = testing_bench.run("--synthetic", "--inject", "meteor")
    assert out.returncode == 2
    assert "unknown fault 'meteor'; known: slow-io, stall" in out.stderr


def test_scrape_latency_benchmark_runs_every_collector_and_prints_percentiles() -> None:
    out = testing_bench.run("scrape-latency", "--scrapes", "30", timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr  # non-zero when a collector was down
    assert "collectors up: {'libtpu': 1.0, 'nvml': 1.0, 'host': 1.0}" in out.stdout
    assert re.search(r"p50 [\d.]+ ms, p90 [\d.]+ ms, p99 [\d.]+ ms", out.stdout)
    samples = int(re.search(r"exposition: (\d+) samples", out.stdout)[1])  # type: ignore[index]
    assert samples > 500  # 8 devices' runtime metrics and histograms, 8 GPUs, the host, the job


def test_trace_cost_benchmark_prints_both_paths() -> None:
    out = testing_bench.run("trace-cost", "--steps", "2000", timeout=120)
    assert out.returncode == 0, out.stderr
    assert re.search(r"unsampled path: \+-?[\d.]+ us per step", out.stdout), out.stdout
    kept = re.search(r"sampled path: \+[\d.]+ us per step \((\d+) steps kept, (\d+) spans written", out.stdout)
    # Every step of every round kept on the sampled path, and all its spans (the step and 3 phases) written.
    assert kept and int(kept[1]) == 2000 * 5 and int(kept[2]) == 2000 * 5 * 4, out.stdout
    assert "dropping" not in out.stderr, out.stderr


def test_a_bad_profile_period_is_a_clear_error() -> None:
    out = testing_bench.run("--synthetic", "--profile-period", "often")
    assert out.returncode == 2
    assert "--profile-period" in out.stderr and "expected seconds or a duration" in out.stderr, out.stderr


def test_the_run_summary_weighs_the_ok_captures_by_their_steps_and_names_both_splits() -> None:
    summary = RunSummary()
    ms = 1e-3

    def step(n: int, profile: events.DeviceProfile | None = None) -> events.Step:
        return events.Step(workload="w", step=n, duration_s=0.06, compute_s=0.06, profile=profile)

    profiles = [
        events.DeviceProfile("ok", 1, 8, 60 * ms, 30 * ms, 20 * ms, 5 * ms, 10 * ms, 45 * ms, 0.4, 2_000_000),
        events.DeviceProfile("error", capture_s=0.1),
        events.DeviceProfile("ok", 3, 8, 40 * ms, 20 * ms, 10 * ms, 5 * ms, 10 * ms, 25 * ms, 0.5, 2_000_000),
        events.DeviceProfile("busy"),
    ]
    for n in range(20):
        summary.emit(step(n, profiles[n // 5] if n % 5 == 0 else None))
    split = summary.json()["profiled"]
    # Weighted by steps: (60 + 3 * 40) / 4 = 45 ms a step; compute (30 + 60) / 4, exposed (20 + 30) / 4, idle 10.
    assert split["captures"] == 2 and split["steps"] == 4 and split["devices"] == 8
    assert split["step_s"] == pytest.approx(45 * ms)
    assert split["compute"]["seconds"] == pytest.approx(22.5 * ms)
    assert split["exposed_collective"]["seconds"] == pytest.approx(12.5 * ms)
    assert split["idle"]["seconds"] == pytest.approx(10 * ms)
    assert sum(split[p]["share"] for p in ("compute", "exposed_collective", "idle")) == pytest.approx(1)
    assert split["overlap"] == pytest.approx(5 / (12.5 + 5))  # overlapped over all collective time
    assert split["imbalance"] == pytest.approx(30 / 22.5)  # slowest device's compute over the mean
    assert summary.json()["captures"] == {"ok": 2, "busy": 1, "error": 1}
    assert summary.capture_seconds() == pytest.approx(1.0)
    lines = "\n".join(summary.lines())
    assert "(host-timed: the loop's phase timers)" in lines
    assert re.search(r"device trace  2 captures, 4 profiled steps x 8 devices: step 45\.0 ms = compute 22\.5 ms \(50%\)"
                     r" \+ exposed collective 12\.5 ms \(28%\) \+ idle 10\.0 ms \(22%\)", lines), lines  # fmt: skip
    assert re.search(r"captures      2 ok, 1 busy, 1 error; 1\.00 s to start and stop \(", lines), lines


def test_a_run_without_captures_says_so() -> None:
    summary = RunSummary()
    summary.emit(events.Step(workload="w", step=0, duration_s=0.01, compute_s=0.01))
    assert summary.json()["profiled"] is None
    assert any(line.startswith("device trace  no capture reported") for line in summary.lines())


def test_a_fault_can_name_the_worker_it_hits() -> None:
    """``NAME[=VALUE][@WORKER]``: each worker keeps its own faults and knows which any worker of the job has (a
    straggler's program is every process's program)."""
    specs = ["straggler=8@2", "slow-io@1", "recompile=5"]
    straggler = Faults.parse(specs, worker=2, workers=4)
    assert straggler.values == {"straggler": 8.0, "recompile": 5.0}
    assert straggler.anywhere == {"straggler": 8.0, "slow-io": 0.2, "recompile": 5.0}
    peer = Faults.parse(specs, worker=1, workers=4)
    assert peer.values == {"slow-io": 0.2, "recompile": 5.0} and "straggler" in peer.anywhere
    for bad in ("straggler@4", "straggler@x", "crash=1@-1", "straggler@", "slow-io@²"):
        with pytest.raises(FaultError, match="@WORKER must be a worker of the job, 0 to 3"):
            Faults.parse([bad], worker=0, workers=4)
    for alone in ("ckpt-fail@1", "recompile=5@0", "spill@2"):  # a job of one program and one barrier would hang
        with pytest.raises(
            FaultError,
            match="only slow-io, stall, straggler, blip, nan, crash, oom, compile-error, bad-data, hang-input, "
            "hang-spin, skip-collective can hit one worker",
        ):
            Faults.parse([alone], worker=0, workers=4)


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--processes", "2", "--synthetic"], "--processes runs the JAX workload only"),
        (["--processes", "0"], "--processes 0: at least 1"),
        (["--process-id", "1"], "--process-id needs --processes N"),
        (["--processes", "2", "--process-id", "2", "--coordinator", "h:1"], "a job of 2 processes has ids 0 to 1"),
        (["--processes", "2", "--process-id", "1"], "--process-id needs --coordinator HOST:PORT"),
        (["--processes", "2", "--inject", "crash@2"], "@WORKER must be a worker of the job, 0 to 1"),
    ],
)
def test_a_job_of_several_processes_misconfigured_is_said_at_once(flags: list[str], said: str) -> None:
    out = testing_bench.run(*flags, timeout=60)
    assert out.returncode == 2 and said in out.stderr, out.stderr
