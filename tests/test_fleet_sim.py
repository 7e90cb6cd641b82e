"""``tpuscope fleet-sim``: a fleet of sidecars, a real Prometheus running the time-compressed rules, faults.

The rules' time compression is tested on its own first: every duration divided, nothing else touched,
the result valid for promtool. Then a small fleet runs for real (8 hosts of 4 chips, two workloads of
two slices of two hosts, time compressed 30 times: about a minute), and what it reports is checked, and
checked again against Prometheus' own data: reopened after the run, its TSDB must hold a
TpuscopeStraggler alert naming the injected worker and no other, a TpuscopeWorkloadStalled alert for
the stalled workload, one per-workload series per workload, slice and worker on every series, and
phases as lockstep workers show them (the straggler computes longest and waits least).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import require

from tpuscope import catalog, durations
from tpuscope.alerts import rules_file
from tpuscope.conventions import BADPUT_RATIO, COMPUTE_PER_WORKER, STEP_MEAN, STEPS_RATE, AlertName
from tpuscope.fleetsim import rules as fleet_rules
from tpuscope.fleetsim import simulator as fleet
from tpuscope.generator_config import GeneratorConfig
from tpuscope.testing.prometheus import PrometheusServer

pytestmark = pytest.mark.long

K = 10


# --- the time compression --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("duration", "k", "scaled"),
    [
        ("5m", 10, "30s"),
        ("10m", 30, "20s"),
        ("3d", 20, "216m"),
        ("1h30m", 2, "45m"),
        ("15s", 4, "3750ms"),
        ("1d", 1, "1d"),
    ],
)
def test_a_duration_is_divided_to_the_millisecond(duration: str, k: float, scaled: str) -> None:
    assert fleet_rules.scale_duration(duration, k) == scaled
    assert durations.prometheus_ms(scaled) * k == pytest.approx(durations.prometheus_ms(duration), abs=k)


def test_a_duration_under_a_millisecond_or_not_a_duration_is_refused() -> None:
    with pytest.raises(ValueError, match="under a millisecond"):
        fleet_rules.scale_duration("1ms", 10)
    with pytest.raises(ValueError, match="not a Prometheus duration"):
        durations.prometheus_ms("5 minutes")


def test_ranges_subqueries_and_offsets_are_divided_and_nothing_else() -> None:
    # Recording rules' names end in a window too (mean5m, ratio_rate1h): those stay.
    expr = (
        f"avg_over_time({STEP_MEAN}[6h] offset 30m) > 1.3"
        " and max_over_time(x[1h:5m])"
        f' + min_over_time(y{{le="0.5", reason!="preemption"}}[1h:]) + z offset 1h + {BADPUT_RATIO}1h'
        " and s > time() - 3600 and time() - max(t) > 600"  # a window back from now; a threshold (the config's)
    )
    assert fleet_rules.scale_expr(expr, K) == (
        f"avg_over_time({STEP_MEAN}[36m] offset 3m) > 1.3"
        " and max_over_time(x[6m:30s])"
        f' + min_over_time(y{{le="0.5", reason!="preemption"}}[6m:]) + z offset 6m + {BADPUT_RATIO}1h'
        " and s > time() - 360 and time() - max(t) > 600"
    )


def _rules(groups: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each rule by its name (an alert's severity added: burn-rate alerts have two)."""
    return {
        rule.get("record") or f"{rule['alert']}/{rule['labels']['severity']}": rule
        for group in groups
        for rule in group["rules"]
    }


def test_the_compressed_rules_are_the_generated_ones_with_every_duration_divided(tmp_path: Path) -> None:
    config = GeneratorConfig()
    t = config.thresholds
    original = _rules(yaml.safe_load(rules_file(config))["groups"])
    scaled = _rules(fleet_rules.scaled_groups(config, K))
    assert scaled.keys() == original.keys()  # same recording-rule names (rate5m stays rate5m), same alerts
    for name, rule in scaled.items():
        before = original[name]
        ranges = [durations.prometheus_ms(w) for w in _durations(rule["expr"])]
        assert ranges == [durations.prometheus_ms(w) / K for w in _durations(before["expr"])], name
        assert ("for" in rule) == ("for" in before), name
        if "for" in rule:
            assert durations.prometheus_ms(rule["for"]) * K == durations.prometheus_ms(before["for"]), name
    assert scaled[f"{AlertName.STRAGGLER}/warning"]["for"] == "30s"
    assert "[30s]" in scaled[COMPUTE_PER_WORKER]["expr"]
    # Times among the thresholds divided once, in the expression; counts not at all.
    assert f"> {t.stall_seconds / K:g} " in scaled[f"{AlertName.WORKLOAD_STALLED}/critical"]["expr"]
    assert f"> {t.checkpoint_age_seconds / K:g} " in scaled[f"{AlertName.CHECKPOINT_STALE}/critical"]["expr"]
    assert (
        durations.prometheus_ms(scaled[f"{AlertName.CHECKPOINT_MISSING}/warning"]["for"])
        == t.checkpoint_age_seconds / K * 1000
    )
    assert f"> {t.steady_state_compiles:g}" in scaled[f"{AlertName.RECOMPILING}/warning"]["expr"]
    assert f"> {t.straggler_chronic:g}" in scaled[f"{AlertName.STRAGGLER}/warning"]["expr"]

    path = tmp_path / "rules.yaml"
    path.write_text(fleet_rules.scaled_rules_file(config, K))
    check = subprocess.run([require("promtool"), "check", "rules", str(path)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr


def _durations(expr: str) -> list[str]:
    """Every duration in a PromQL expression, found more loosely than the module finds them: any number with a
    unit that is not part of a name (``ratio_rate1h``) or a number (``1.5``)."""
    return re.findall(r"(?<![\w:.])((?:\d+(?:ms|[smhdwy]))+)(?![\w.])", expr)


# --- the fleet's layout and settings -----------------------------------------------------------------------


def _settings(**overrides: Any) -> fleet.Settings:
    values: dict[str, Any] = {
        "hosts": 8,
        "chips": 4,
        "hosts_per_workload": 4,
        "hosts_per_slice": 2,
        "time_scale": 30.0,
        "scrape_interval": 2.0,
        "collector_interval": 5.0,
        "step_seconds": 0.5,
        "straggler_factor": 1.5,
        "seconds": 150.0,
        "seed": 0,
    }
    return fleet.Settings(**{**values, **overrides})


def test_hosts_are_placed_in_workloads_of_slices_with_the_straggler_first_and_the_stall_last() -> None:
    hosts, straggler, stalled = fleet.layout(_settings(seed=3), Path("/s"))
    places = [(h.workload, h.slice, h.worker) for h in hosts]
    assert places == [(f"fleet-0{w}", str(s), str(k)) for w in range(2) for s in range(2) for k in range(2)]
    assert [h.straggler for h in hosts].count(True) == 1 and hosts[straggler].straggler
    assert hosts[straggler].workload == "fleet-00" and stalled == "fleet-01"
    assert len({h.socket for h in hosts}) == 8


@pytest.mark.parametrize(
    ("overrides", "problem"),
    [
        ({"time_scale": 60.0}, "shortest rate window is 5 s"),
        ({"straggler_factor": 1.1}, "above straggler_factor, the boards' straggler bound"),
        ({"hosts": 4}, "at least two workloads"),
        ({"hosts_per_slice": 3}, "multiple of --hosts-per-slice"),
        ({"time_scale": 0.0}, "must be positive"),
        ({"seconds": 30.0}, "too short to see the straggler named"),
    ],
)
def test_settings_that_cannot_show_the_faults_are_refused(overrides: dict[str, Any], problem: str) -> None:
    assert fleet.validate(_settings(), GeneratorConfig()) == ""
    s = _settings(**overrides)
    assert problem in fleet.validate(s, GeneratorConfig())


# --- a fleet, for real -------------------------------------------------------------------------------------


FleetRun = tuple[int, dict[str, Any], Path]


@pytest.fixture(scope="module")
def fleet_run() -> Iterator[FleetRun]:
    """``tpuscope fleet-sim`` at 8 hosts: its exit code, its report and its run directory."""
    require("prometheus")
    workdir = Path(tempfile.mkdtemp(prefix="ts-fleet-test-"))
    flags = ["--hosts", "8", "--chips", "4", "--hosts-per-workload", "4", "--hosts-per-slice", "2"]
    flags += ["--time-scale", "30", "--scrape-interval", "2", "--seconds", "150", "--seed", "5"]
    # Relative paths, from the run's own directory, as a user types them (Prometheus reads its rule_files
    # relative to its configuration file: a relative path passed on as it is would load no rules).
    flags += ["--run-dir", "fleet", "--json", "fleet.json"]
    command = [sys.executable, "-m", "tpuscope", "fleet-sim", *flags]
    run = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=workdir)
    print(run.stdout, run.stderr)
    report = json.loads((workdir / "fleet.json").read_text()) if (workdir / "fleet.json").exists() else {}
    yield run.returncode, report, workdir
    shutil.rmtree(workdir, ignore_errors=True)


@pytest.mark.timeout(360)
def test_a_small_fleet_names_the_straggler_and_the_stalled_workload(fleet_run: FleetRun) -> None:
    returncode, f, workdir = fleet_run
    assert returncode == 0 and f["failed"] == [], f.get("checks")
    assert (f["hosts"], f["chips"], f["workloads"]) == (8, 4, 2)
    assert f["targets"] == f["targets_up"] == 8 and f["scrapes_failed"] == 0

    straggler = f["straggler"]
    injected = straggler["injected"]
    assert straggler["named"] == [injected] and injected["workload"] == "fleet-00"
    # The alert waits until the worker has been the straggler for 60% of the hour's evaluations (36 min / 30), which
    # begins once its peers' wait crosses 5% of their steps, part of a window (10 s) in, and its for: (5m / 30).
    # Prometheus started with the fleet, 12 s before the straggler: the evaluations so far are its history, so the
    # straggler's share of them reaches 60% sooner than an hour's would (a Prometheus that ran before the job's
    # start waits the 36 minutes).
    assert 10 <= straggler["time_to_fire_seconds"] <= 72 + 10 + 10 + 15
    stall = f["stall"]
    assert stall["named"] == ["fleet-01"] and (stall["threshold_seconds"], stall["for_seconds"]) == (20, 10)
    # From its last step, which may have ended a step before the stall began, to an evaluation past 20 s and
    # its for: (5m / 30) after.
    assert 20 + 10 - 1.5 <= stall["time_to_fire_seconds"] <= 20 + 10 + 10
    assert set(f["alerts_fired"]) <= {AlertName.STRAGGLER, AlertName.WORKLOAD_STALLED, AlertName.SYNC_BOUND}

    # The figures: present, and what 8 sidecars of 4 chips scraped every 2 s come to.
    per_target = f["samples_per_scrape_per_target"]
    assert 300 < per_target < 3000
    assert 0.5 < f["ingest_samples_per_second"] / (8 * per_target / 2) < 2  # scrapes, plus the rules' output
    assert 8 * 300 < f["head_series"] < 8 * 3000
    assert 0 < f["scrape_duration_seconds"]["p50"] <= f["scrape_duration_seconds"]["p99"] < 2
    assert set(f["rule_groups"]) == {
        "tpuscope.recording",
        "tpuscope.platform",
        "tpuscope.nodes",
        "tpuscope.slo-slow",
        "tpuscope.alerts",
    }
    assert f["rule_groups_loaded"]
    groups = f["rule_groups"].values()
    assert all(0 < g["last_seconds"] <= g["max_seconds"] < 2 and g["iterations_missed"] == 0 for g in groups)
    assert f["rule_eval_seconds_total"] == pytest.approx(sum(g["last_seconds"] for g in f["rule_groups"].values()))
    assert f["rule_evaluation_seconds"].keys() >= {"0.5", "0.99"} and f["rule_evaluation_failures"] == 0
    assert 8 * 20 < f["resources"]["sidecar_rss_mb_total"] < 8 * 200
    assert f["sidecar_rss_prometheus_mb"] == pytest.approx(f["resources"]["sidecar_rss_mb_total"], rel=0.2)
    assert Path(f["rules_file"]) == (workdir / "fleet" / "tpuscope-rules.yaml").resolve()
    assert Path(f["prometheus_config"]) == (workdir / "fleet" / "prometheus" / "prometheus.yml").resolve()


@pytest.mark.timeout(120)
def test_prometheus_data_of_the_fleet_holds_what_the_report_says(fleet_run: FleetRun, short_tmp: Path) -> None:
    """Reopen the run's TSDB with a fresh Prometheus (no targets, no rules) and ask it directly."""
    _, f, workdir = fleet_run
    assert f, "the fleet-sim run wrote no report"
    shutil.copytree(workdir / "fleet" / "prometheus" / "data", short_tmp / "data")
    start, end = f["started_at"], f["ended_at"]
    at = end - 2  # a moment near the end: the straggler straggles, the stalled workload steps again
    with PrometheusServer(short_tmp, []) as prom:

        def ever(expr: str) -> list[dict[str, str]]:
            return [series["metric"] for series in prom.query_range(expr, start, end, 1)]

        def now(expr: str, *by: str) -> dict[tuple[str, ...], float]:
            """The value of each series at ``at``, by the values of its labels ``by``."""
            return {
                tuple(series["metric"].get(label, "") for label in by): float(series["values"][-1][1])
                for series in prom.query_range(expr, at, at, 1)
            }

        def mean(metric: str, by: str, *matchers: str) -> dict[str, float]:
            """Each worker of fleet-00's mean ``metric`` per step over the last 10 s (one rate window)."""
            selector = ", ".join(('workload="fleet-00"', *matchers))
            per = f"sum by ({by}) (rate({metric}_%s{{{selector}}}[10s]))"
            return {"/".join(k): v for k, v in now(f"{per % 'sum'} / {per % 'count'}", *by.split(", ")).items()}

        named = ever(f'ALERTS{{alertname="{AlertName.STRAGGLER}", alertstate="firing"}}')
        keys = ("workload", "slice", "worker", "instance")
        assert [{k: m[k] for k in keys} for m in named] == [f["straggler"]["injected"]]
        stalled = ever(f'ALERTS{{alertname="{AlertName.WORKLOAD_STALLED}", alertstate="firing"}}')
        assert [m["workload"] for m in stalled] == ["fleet-01"]

        # Every series a sidecar served carries its host's slice and worker, and they match its place.
        assert ever('count({__name__=~"tpuscope_.+"})')
        assert ever('{__name__=~"tpuscope_.+", slice=""}') == []
        assert ever('{__name__=~"tpuscope_.+", worker=""}') == []
        places = now(f"count by (workload, slice, worker) ({catalog.STEPS.name})", "workload", "slice", "worker")
        assert set(places) == {(f"fleet-0{w}", str(s), str(k)) for w in range(2) for s in range(2) for k in range(2)}

        # Per-workload recording rules aggregate across the workers; per-worker ones keep them apart.
        assert set(now(STEPS_RATE, "workload")) == {("fleet-00",), ("fleet-01",)}
        assert len(now(f"{COMPUTE_PER_WORKER}", "instance")) == 8

        # Lockstep: the straggler computes longest and waits least; its peers wait for it in sync.
        phases = catalog.STEP_PHASE_DURATION.name
        compute = mean(phases, "slice, worker", 'phase="compute"')
        sync = mean(phases, "slice, worker", 'phase="sync"')
        straggler = f"{f['straggler']['injected']['slice']}/{f['straggler']['injected']['worker']}"
        assert len(compute) == len(sync) == 4
        assert max(compute, key=compute.__getitem__) == straggler, compute
        assert min(sync, key=sync.__getitem__) == straggler, sync
        assert compute[straggler] / max(v for k, v in compute.items() if k != straggler) > 1.3, compute
        step = mean(catalog.STEP_DURATION.name, "slice, worker")
        assert max(step.values()) / min(step.values()) < 1.1, step  # one step time for every host
