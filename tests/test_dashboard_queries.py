"""The dashboards' counts and ratios on a multi-host fleet whose right answers are known.

A real Prometheus reads a TSDB that ``promtool tsdb create-blocks-from openmetrics`` wrote from series as
the sidecars of such a fleet serve them (and as tpuscope's recording rules record them), and the panels'
queries, taken from the dashboards as Grafana gets them, run against it at one instant:

- ``train``, a job of 4 hosts (slice 0, workers 0..3), failed and restarted once: its 4 sidecars, each with
  the failure, went away with their pods, and 4 new sidecars (new instances) each report the restart. Every
  host reports the same compiles: a recompile before the failure, the compile after the restart, and the
  same checkpoint saves (each process saves its part): one before the failure, one after the restart.
- ``tune``, 2 hosts of another accelerator (another peak), started within the range.
- Both run at 50% MFU; each sidecar reports its own host's FLOPs and peak, as the job's Monitor sends them.
- ``train`` lost half a day's goodput 10 days ago and a whole day 35 days ago; ``serve``'s latency SLO
  missed by 3% of requests for a day 10 days ago: the error budgets cover the SLO's 30 days, not the
  dashboard's hour, nor anything older.
"""

from __future__ import annotations

import math
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import pytest
import yaml
from conftest import require
from test_dashboards import ALL, BOARDS, panel_titled, substitute

from tpuscope import catalog as c
from tpuscope import conventions, durations
from tpuscope.dashboards import promql
from tpuscope.prometheus_api import PrometheusAPI
from tpuscope.promql import SIDECAR_START, le
from tpuscope.testing.prometheus import ServerProcess
from tpuscope.thresholds import DEFAULT

SCRAPE = 10  # seconds between a target's samples
RANGE = 3600  # the dashboard's time range: the last hour
HOUR, DAY = 3600, 86_400
V5E, V6E = 197e12, 918e12  # a chip's peak FLOP/s (tracing.jax_costs.PEAK_TFLOPS)
CHIPS = 4  # per host
MFU = 0.5

# Prometheus ends a gone target's series at once (staleness markers); a backfilled TSDB has none, so the
# lookback that would otherwise show a gone series for 5 more minutes is cut to just over one scrape.
LOOKBACK = "15s"


class Fleet:
    """Series as OpenMetrics text: ``name{labels} value timestamp`` lines, times relative to the evaluation."""

    def __init__(self, at: int) -> None:
        self.at = at
        self.families: dict[str, list[str]] = {}

    def series(
        self,
        name: str,
        labels: dict[str, str],
        start: int,
        end: int,
        value: Callable[[int], float],
        every: int = SCRAPE,
    ) -> None:
        """Samples ``every`` seconds from ``start`` to ``end`` (relative, inclusive); ``value`` of the time."""
        text = ",".join(f'{k}="{v}"' for k, v in labels.items())
        self.families.setdefault(name, []).extend(
            f"{name}{{{text}}} {value(t):g} {self.at + t}" for t in range(start, end + 1, every)
        )

    def sidecar(self, instance: str, slice_: str, worker: str, start: int, end: int) -> dict[str, str]:
        """A sidecar scraped from ``start`` to ``end``; the labels its series carry."""
        target = {"job": "tpuscope", "instance": instance}
        self.series("up", target, start, end, lambda t: 1)
        host = {**target, "slice": slice_, "worker": worker}
        self.series(SIDECAR_START, host, start, end, lambda t: self.at + start)
        return host

    def counter(self, metric: str, labels: dict[str, str], start: int, end: int, steps: Mapping[int, float]) -> None:
        """A counter whose value is ``steps``' latest at or before each sample (its first key is its birth)."""
        self.series(metric, labels, min(steps), end, lambda t: steps[max(k for k in steps if k <= t)])

    def openmetrics(self) -> str:
        return "".join(line + "\n" for lines in self.families.values() for line in lines) + "# EOF\n"


def fleet(at: int) -> Fleet:
    f = Fleet(at)
    train, tune = {"workload": "train"}, {"workload": "tune"}
    for worker in range(4):
        # The first pods: up two hours ago, the failure at -31 min, gone at -30 min.
        first = f.sidecar(f"train-{worker}-a:9478", "0", str(worker), -2 * HOUR, -1800)
        # The pods after the restart: new sidecars, new instances, the same slice and worker.
        second = f.sidecar(f"train-{worker}-b:9478", "0", str(worker), -1680, 0)
        f.counter(c.WORKLOAD_FAILURES.name, {**first, **train, "reason": "crash"}, -1860, -1800, {-1860: 1})
        f.counter(c.WORKLOAD_RESTARTS.name, {**second, **train, "reason": "crash"}, -1680, 0, {-1680: 1})
        for host, start, end in ((first, -2 * HOUR, -1800), (second, -1680, 0)):
            # Every host compiles the same program at its start, 20 s (2 s of it tracing); the first pods
            # recompile it at -50 min, 10 s (1 s of it tracing).
            for stage, seconds in (("backend", 20.0), ("tracing", 2.0)):
                labels = {**host, **train, "stage": stage}
                count, total = {start: 1.0}, {start: seconds}
                if host is first:
                    count[-3000], total[-3000] = 2, seconds * 1.5
                f.counter(c.COMPILE_DURATION.series("count"), labels, start, end, count)
                f.counter(c.COMPILE_DURATION.series("sum"), labels, start, end, total)
            save = {**host, **train, "operation": "save", "result": "ok"}
            saved = -2400 if host is first else start + 600  # both within the dashboard's hour
            f.counter(c.CHECKPOINT_DURATION.series("count"), save, saved, end, {saved: 1})
            running(f, {**host, **train}, "v5e", CHIPS * V5E, start, end)
    for worker in range(2):
        host = f.sidecar(f"tune-{worker}:9478", "0", str(worker), -2400, 0)
        running(f, {**host, **tune}, "v6e", CHIPS * V6E, -2400, 0)
    # A serving workload, every request of the last two hours within the objective.
    serve = {**f.sidecar("serve-0:9478", "0", "0", -2 * HOUR, 0), "workload": "serve"}
    within = {**serve, "le": le(DEFAULT.inference_latency_seconds)}
    for name, labels in (
        (c.INFERENCE_REQUEST_DURATION.series("bucket"), within),
        (c.INFERENCE_REQUEST_DURATION.series("count"), serve),
    ):
        f.series(name, labels, -2 * HOUR, 0, lambda t: 10 * (t + 2 * HOUR))
    recorded(f)
    return f


def running(f: Fleet, labels: dict[str, str], accelerator: str, peak: float, start: int, end: int) -> None:
    """A host of a workload stepping at MFU from ``start``: its peak, its FLOPs, its goodput."""
    f.series(c.PEAK_FLOPS.name, {**labels, "accelerator": accelerator}, start, end, lambda t: peak)
    f.series(c.MODEL_FLOPS.name, labels, start, end, lambda t: MFU * peak * (t - start))
    f.series(c.GOODPUT.name, {**labels, "category": "productive"}, start, end, lambda t: t - start)


def recorded(f: Fleet) -> None:
    """The recording rules' 5-minute rates over 40 days, one sample every 5 minutes."""

    def bad_on(day: float, normal: float, bad: float) -> Callable[[int], float]:
        return lambda t: bad if -day * DAY <= t < (-day + 1) * DAY else normal

    def every_5m(name: str, labels: dict[str, str], value: Callable[[int], float]) -> None:
        f.series(name, labels, -40 * DAY, 0, value, every=300)

    def productive(t: int) -> float:  # 4 hosts' seconds a second, half of it lost 10 days ago, all 35 days ago
        return bad_on(35, bad_on(10, 4, 2)(t), 0)(t)

    rate = conventions.GOODPUT_RATE
    every_5m(rate, {"workload": "train", "category": "productive"}, productive)
    every_5m(rate, {"workload": "train", "category": "lost"}, lambda t: 4 - productive(t))
    every_5m(conventions.REQUESTS_RATE, {"workload": "serve"}, lambda t: 10)
    every_5m(conventions.REQUESTS_FAST_RATE, {"workload": "serve"}, lambda t: bad_on(35, bad_on(10, 10, 9.7)(t), 0)(t))


@pytest.fixture(scope="module")
def prometheus(module_tmp: Path) -> Iterator[tuple[PrometheusAPI, int]]:
    """A Prometheus over the fleet's TSDB, and the instant to evaluate at (the TSDB ends there, an hour ago)."""
    at = (int(time.time()) // HOUR - 1) * HOUR
    source = module_tmp / "fleet.om"
    source.write_text(fleet(at).openmetrics())
    data = module_tmp / "data"
    # A few blocks for the 40 days, not one per 2 hours (the default): Prometheus starts at once.
    backfill = [require("promtool"), "tsdb", "create-blocks-from", "openmetrics", "--max-block-duration=1000h", "-q"]
    run = subprocess.run([*backfill, str(source), str(data)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    config = module_tmp / "prometheus.yml"
    config.write_text(yaml.safe_dump({"global": {"scrape_interval": f"{SCRAPE}s"}}))
    flags = [
        f"--config.file={config}",
        f"--storage.tsdb.path={data}",
        "--storage.tsdb.retention.time=100d",  # the blocks go back 40 days
        f"--query.lookback-delta={LOOKBACK}",
    ]
    require("prometheus")
    with ServerProcess("prometheus", "prometheus", flags, module_tmp) as server:
        yield PrometheusAPI(server.url, timeout=30), at


def values(
    prometheus: tuple[PrometheusAPI, int],
    board: str,
    title: str,
    ref: str = "A",
    interval: int = RANGE,
    workload: str = ALL,
    by: tuple[str, ...] = (),
) -> dict[tuple[str, ...], float]:
    """The panel's target ``ref`` as Grafana runs it over the last hour, at its last point: each series'
    ``by`` labels -> its value. ``interval``: Grafana's ``$__interval`` (a time series panel's point; an
    hour here, so one point holds the whole story)."""
    api, at = prometheus
    (target,) = [t for t in panel_titled(BOARDS[board], title)["targets"] if t["refId"] == ref]
    variables = {name: ALL for name in (promql.SLICE, promql.WORKER, promql.ACCELERATOR, promql.JOB)}
    expr = substitute(target["expr"], {**variables, promql.WORKLOAD: workload}, RANGE, interval)
    result = api.query(expr, at=at)
    return {tuple(r["metric"].get(label, "") for label in by): float(r["value"][1]) for r in result}


UID = conventions.DashboardUID
FLEET, ONCALL, JOB, SERVING = str(UID.FLEET), str(UID.ONCALL), str(UID.JOB), str(UID.SERVING)
TRAIN_CRASH = ("train", "crash")  # a failing workload's series: its workload and reason labels


def test_a_restart_of_a_4_host_job_counts_once(prometheus: tuple[PrometheusAPI, int]) -> None:
    """4 new sidecars each report the restart: 1, not 4."""
    by = ("workload", "reason")
    assert values(prometheus, FLEET, "Restarts, by workload and reason", by=by) == {TRAIN_CRASH: 1}
    assert values(prometheus, ONCALL, "Failures and restarts in the last hour", "B", by=by) == {TRAIN_CRASH: 1}


def test_a_failure_of_a_4_host_job_counts_once(prometheus: tuple[PrometheusAPI, int]) -> None:
    """4 sidecars, gone since, each reported the failure: 1, not 4, nor 0."""
    by = ("workload", "reason")
    assert values(prometheus, FLEET, "Failures over the range") == {(): 1}
    assert values(prometheus, FLEET, "Failures, by workload and reason", by=by) == {TRAIN_CRASH: 1}
    assert values(prometheus, ONCALL, "Failures and restarts in the last hour", "A", by=by) == {TRAIN_CRASH: 1}


def test_compiles_every_host_reports_count_once(prometheus: tuple[PrometheusAPI, int]) -> None:
    """The recompile seen by the first pods (gone since) and the compile after the restart: 2, not 8."""
    assert values(prometheus, JOB, "Compiles", workload="train", by=("workload",)) == {("train",): 2}
    seconds = values(prometheus, JOB, "Compile time by stage", workload="train", by=("stage",))
    assert seconds == {("backend",): 10 + 20, ("tracing",): 1 + 2}


def test_a_checkpoint_every_host_saves_a_part_of_counts_once(prometheus: tuple[PrometheusAPI, int]) -> None:
    """The save of the first pods (gone since) and the save after the restart: 2, not 8."""
    by = ("workload", "operation", "result")
    saves = values(prometheus, JOB, "Checkpoints, by result", workload="train", by=by)
    assert saves == {("train", "save", "ok"): 2}


def test_fleet_mfu_of_two_workloads_at_half_their_peaks_is_half(prometheus: tuple[PrometheusAPI, int]) -> None:
    """``train`` ran 58 of the 60 minutes (down between its pods), ``tune`` the last 40, on chips of other
    peaks: each did half its peak while it ran, so the fleet did half of what its chips could. (A panel
    interval of 10 s, as Grafana gives a stat over an hour; the lookback and the rate's extrapolation
    make about 1% of difference.)"""
    ((_, mfu),) = values(prometheus, FLEET, "Model FLOPs utilization", interval=SCRAPE).items()
    assert mfu == pytest.approx(MFU, abs=0.01)


def test_error_budgets_cover_the_slo_period(prometheus: tuple[PrometheusAPI, int]) -> None:
    """All good in the dashboard's hour, yet 10 days ago ``train`` lost half of a day (1/60 of the 30 days
    against a 10% budget: 1/6 of it spent) and ``serve`` was slow for 3% of a day's requests (0.1% of the
    period against 1%: 1/10 spent). The bad day 35 days ago is older than the period."""
    period = durations.parse(conventions.SLO_PERIOD) / DAY
    goodput_budget = 1 - DEFAULT.goodput_objective
    budget = values(prometheus, FLEET, "Goodput objective: error budget left", by=("workload",))
    assert budget == {("train",): pytest.approx(1 - (0.5 / period) / goodput_budget, rel=1e-3)}
    latency_budget = 1 - DEFAULT.inference_latency_objective
    ((_, left),) = values(prometheus, SERVING, "Latency error budget left").items()
    assert left == pytest.approx(1 - (0.03 / period) / latency_budget, rel=1e-3)
    assert not math.isclose(left, 1)


def test_the_budget_panels_say_their_period() -> None:
    for board, title in ((FLEET, "Goodput objective: error budget left"), (SERVING, "Latency error budget left")):
        assert f"last {conventions.SLO_PERIOD}" in panel_titled(BOARDS[board], title)["description"], title
