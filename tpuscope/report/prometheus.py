"""A report from Prometheus: one workload's series over a window, summed over all its workers.

The charts are range queries at one point per ``resolution`` seconds (never
finer than the scrape interval), rates over Grafana's ``$__rate_interval`` (four
scrapes, or a point and a scrape); counters of rare events (compiles,
checkpoints, failures) are read with :func:`tpuscope.promql.grown`, so the first
one of a kind counts. The alerts are Prometheus' own ``ALERTS`` series: those of
the workload, and those of the hosts it ran on. The device profiles are gauges that
hold each worker's latest capture: each capture is read once, at the first point
after it arrived (a capture's gauges change together with its timestamp's). Where
the workload's TPU cores sat while it stalled comes from tpuscope's recording rules
(the runtime's series carry no workload label; the rules give them the host's). Where its
processes were stuck comes from the sidecars' stuck positions, compared at each point as
the rules compare them (:func:`tpuscope.positions.elsewhere`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Hashable
from typing import Any

from tpuscope import catalog as c
from tpuscope import durations, events, positions
from tpuscope.conventions import CORE_ELSEWHERE, CORE_LOCATION, OUR_ALERTS, RUN_MEMORY
from tpuscope.goodput import CATEGORIES
from tpuscope.prometheus_api import PrometheusAPI, PrometheusError
from tpuscope.promql import each_worker_once, grown, series
from tpuscope.report.model import (
    QUANTILES,
    Incident,
    Mark,
    Profile,
    Report,
    ReportError,
    Series,
    StalledCores,
    StuckPosition,
    Totals,
)
from tpuscope.report.unbooked import Worker
from tpuscope.report.window import Window
from tpuscope.thresholds import Thresholds

DEFAULT_SCRAPE_INTERVAL = 15.0  # Prometheus' and Grafana's own default, when the targets do not say


def build(url: str, workload: str, window: Window, thresholds: Thresholds) -> Report:
    try:
        return _Reader(PrometheusAPI(url), workload, window, thresholds).report()
    except PrometheusError as e:
        raise ReportError(str(e)) from None


class _Reader:
    def __init__(self, api: PrometheusAPI, workload: str, window: Window, thresholds: Thresholds) -> None:
        self.api, self.workload, self.thresholds = api, workload, thresholds
        start, end, resolution = window.resolve()
        # Whole seconds, so the points' times Prometheus returns are the grid's exactly.
        self.start, self.end = float(math.floor(start)), float(math.ceil(end))
        self.w = f"workload={json.dumps(workload)}"
        known = api.label_values(str(c.Label.WORKLOAD), series(c.STEPS), self.start, self.end)
        if workload not in known:
            seen = ", ".join(sorted(known)) or "none"
            raise ReportError(
                f"Prometheus at {api.url} has no steps of workload {workload!r} between "
                f"{window.describe(self.start, self.end)}; workloads it has then: {seen}"
            )
        scrape = self._scrape_interval()
        self.step = float(math.ceil(max(resolution, scrape)))
        self.rate = f"{math.ceil(max(self.step + scrape, 4 * scrape))}s"
        self.interval = f"{self.step:.0f}s"
        self.whole = f"{math.ceil(self.end - self.start)}s"

    def report(self) -> Report:
        return Report(
            workload=self.workload,
            source=f"Prometheus at {self.api.url}",
            start=self.start,
            end=self.end,
            resolution=self.step,
            step_time=self.step_time(),
            phases=self.phases(),
            goodput=self.goodput(),
            compiles=self.marks(c.COMPILE_DURATION, "stage"),
            checkpoints=self.marks(c.CHECKPOINT_DURATION, "operation"),
            incidents=self.alerts(),
            incidents_note="The tpuscope alerts that fired in the window, for this workload and for the hosts it "
            "ran on, as Prometheus evaluated them (its ALERTS series).",
            totals=self.totals(),
            thresholds=self.thresholds,
            profile=self.profile(),
            stalled_cores=self.stalled_cores(),
            stuck_positions=self.stuck_positions(),
        )

    # --- the charts ---------------------------------------------------------------------------------
    def step_time(self) -> list[Series]:
        buckets = series(c.STEP_DURATION, self.w, suffix="bucket")
        return [
            self.line(f"p{q * 100:g}", f"histogram_quantile({q}, sum by (le) (rate({buckets}[{self.rate}])))")
            for q in QUANTILES
        ]

    def phases(self) -> list[Series]:
        """Mean seconds per step in each phase: every worker's phase seconds over every worker's steps."""
        phase_seconds = f"sum by (phase) (rate({series(c.STEP_PHASE_DURATION, self.w, suffix='sum')}[{self.rate}]))"
        steps = f"sum (rate({series(c.STEP_DURATION, self.w, suffix='count')}[{self.rate}]))"
        by_phase = self.lines(f"{phase_seconds} / ignoring (phase) group_left {steps}", "phase")
        return [by_phase.get(phase, Series(phase)) for phase in events.PHASES]

    def goodput(self) -> list[Series]:
        """Wall seconds booked to each category since the window's start, summed over the workers, and the
        time no sidecar booked (a pod gone with its sidecar) as downtime.

        From each counter's own samples, so a sidecar's restart (its counters start again from 0) loses
        nothing, and a counter born in the window counts from 0. A counter with no sample at a point
        (not born yet, or its sidecar gone) adds what it had booked by then."""
        grid = self.grid()
        booked = {category: [0.0] * len(grid) for category in CATEGORIES}
        for result in self.range(series(c.GOODPUT, self.w)):
            # The fixed categories, then the custom badput ones (Monitor.badput) the sidecars served.
            category = booked.setdefault(result["metric"][c.Label.CATEGORY], [0.0] * len(grid))
            _cumulate(result["values"], grid, category, self.start)
        for worker in self.workers().values():
            for i, seconds in enumerate(worker.unbooked(grid, self.start, durations.parse(RUN_MEMORY))):
                booked["downtime"][i] += seconds
        return [Series(category, grid, values) for category, values in booked.items()]

    def workers(self) -> dict[tuple[str, str], Worker]:
        """Each worker's start, the stretch each of its sidecars served, its processes, and its clean end."""
        workers: dict[tuple[str, str], Worker] = {}
        starts: dict[tuple[str, ...], float] = {}
        for result in self.range(series(c.WORKLOAD_START_TIME, self.w)):
            labels = result["metric"]
            seen = min(float(v) for _, v in result["values"])
            starts[_sidecar(labels)] = seen
            worker = workers.setdefault(_worker(labels), Worker())
            worker.first_start = min(worker.first_start, seen)
        # The samples' own times, not the points': a point holds the last sample for a while after its sidecar went.
        for result in self.range(f"timestamp({series(c.GOODPUT_WALL, self.w)})"):
            sampled = [float(v) for _, v in result["values"]]
            served_from = min(starts.get(_sidecar(result["metric"]), sampled[0]), sampled[0])
            workers.setdefault(_worker(result["metric"]), Worker()).covers.append((served_from, max(sampled)))
        for result in self.range(series(c.WORKLOAD_PROCESSES, self.w)):
            if (each := workers.get(_worker(result["metric"]))) is not None:
                each.processes = max(each.processes, max(float(v) for _, v in result["values"]))
        # Ended when its end time was still served as a sidecar last served it: not if it started again since.
        ends = {
            _sidecar(r["metric"]): float(r["values"][-1][1]) for r in self.range(series(c.WORKLOAD_END_TIME, self.w))
        }
        for result in self.range(f"timestamp({series(c.WORKLOAD_END_TIME, self.w)})"):
            each = workers.get(_worker(result["metric"]))
            if each is not None and each.covers and float(result["values"][-1][1]) >= each.last_served:
                each.ended = ends.get(_sidecar(result["metric"]))
        return workers

    def marks(self, histogram: c.Metric, kind: str) -> list[Mark]:
        """Each interval in which some of ``histogram``'s events ended: how many, and their mean seconds."""
        by = f"{kind}, result" if c.Label.RESULT in histogram.labels else kind
        count = self.range(f"sum by ({by}) {grown(series(histogram, self.w, suffix='count'), self.interval)} > 0")
        total = self.range(f"sum by ({by}) {grown(series(histogram, self.w, suffix='sum'), self.interval)}")
        seconds = {(_key(r["metric"]), float(t)): float(v) for r in total for t, v in r["values"]}
        marks = []
        for result in count:
            labels = result["metric"]
            for t, n in result["values"]:
                total_seconds = seconds.get((_key(labels), float(t)), 0.0)
                ok = labels.get(c.Label.RESULT, "ok") == "ok"
                count_here = round(float(n))
                marks.append(Mark(float(t), labels[kind], total_seconds / max(count_here, 1), ok, count_here))
        return sorted(marks, key=lambda mark: mark.time)

    def alerts(self) -> list[Incident]:
        """Tpuscope alerts firing in the window: the workload's, and those with no workload label of the hosts
        it ran on (a collector down, the sidecar down) or of no host at all (no sidecar scraped)."""
        instances = set(self.api.label_values("instance", series(c.STEPS, self.w), self.start, self.end))
        incidents = []
        for result in self.range(f'ALERTS{{alertstate="firing", alertname=~"{OUR_ALERTS}"}}'):
            labels = {k: v for k, v in result["metric"].items() if k not in ("__name__", "alertstate")}
            if labels.get(c.Label.WORKLOAD, self.workload) != self.workload:
                continue  # another workload's
            if c.Label.WORKLOAD not in labels and labels.get("instance", "") not in instances | {""}:
                continue  # another host's
            name, severity = labels.pop("alertname"), labels.pop("severity", "")
            times = [float(t) for t, _ in result["values"]]
            begun = times[0]
            for before, after in zip(times, [*times[1:], math.inf], strict=True):  # a gap ends one firing
                if after - before > self.step * 1.5:
                    incidents.append(Incident(name, severity, begun, before, labels))
                    begun = after
        return sorted(incidents, key=lambda incident: incident.start)

    # --- the summary ----------------------------------------------------------------------------------
    def totals(self) -> Totals:
        grew = self.grew_in_window
        steps = self.instant(f"max (sum by (job, instance) {grew(c.STEPS)})")
        buckets = f"sum by (le) {grew(c.STEP_DURATION, suffix='bucket')}"
        quantiles = {q: self.instant(f"histogram_quantile({q}, {buckets})") for q in QUANTILES}
        phases = self.by(f"sum by (phase) {grew(c.STEP_PHASE_DURATION, suffix='sum')}", "phase")
        cache = self.by(f"sum by (result) {grew(c.COMPILE_CACHE_REQUESTS)}", "result")
        once = "max by ({label}) (sum by ({label}, job, instance) {grew})"  # every worker reports a restart
        return Totals(
            step_count=steps or 0.0,
            step_quantiles={q: v for q, v in quantiles.items() if v is not None and not math.isnan(v)},
            phase_seconds={phase: phases.get(phase, 0.0) for phase in events.PHASES},
            cache={hit: cache[result] for hit, result in ((True, "hit"), (False, "miss")) if result in cache},
            failures=self.by(once.format(label="reason", grew=grew(c.WORKLOAD_FAILURES)), "reason"),
            restarts=self.by(once.format(label="reason", grew=grew(c.WORKLOAD_RESTARTS)), "reason"),
            mfu=self.instant(f"avg (avg_over_time({series(c.MFU, self.w)}[{self.whole}]))"),
        )

    def profile(self) -> Profile | None:
        """The mean of the device-profile captures that arrived in the window, each worker's own, and what
        they cost; None when the workload sampled none."""
        grew = self.grew_in_window
        results = self.by(f"sum by (result) {grew(c.PROFILE_CAPTURES)}", "result")
        if not any(results.values()):
            return None
        host = ("job", "instance", str(c.Label.SLICE), str(c.Label.WORKER))

        def by_host(metric: c.Metric, label: str = "") -> dict[tuple[str, ...], dict[float, float]]:
            """Each worker's samples of a gauge (and of each ``label`` value: the worker key ends with it)."""
            found: dict[tuple[str, ...], dict[float, float]] = {}
            for r in self.range(series(metric, self.w)):
                key = tuple(r["metric"].get(name, "") for name in (*host, label) if name)
                found[key] = {float(t): float(v) for t, v in r["values"] if not math.isnan(float(v))}
            return found

        step, parts = by_host(c.PROFILE_STEP), by_host(c.PROFILE_TIME, str(c.Label.PART))
        overlap, imbalance = by_host(c.PROFILE_OVERLAP), by_host(c.PROFILE_IMBALANCE)
        samples: list[tuple[float, tuple[str, ...], float]] = []  # (arrived, worker, the first point after)
        for worker, received in by_host(c.PROFILE_LAST_CAPTURE).items():
            seen: set[float] = set()
            for t, arrived in sorted(received.items()):
                if arrived >= self.start and arrived not in seen and t in step.get(worker, {}):
                    seen.add(arrived)
                    samples.append((arrived, worker, t))

        def mean(gauge: dict[tuple[str, ...], dict[float, float]], suffix: tuple[str, ...] = ()) -> float | None:
            values = [v for _, w, t in samples if (v := gauge.get(w + suffix, {}).get(t)) is not None]
            return sum(values) / len(values) if values else None

        profile = Profile(
            captures=len(samples),
            busy=round(results.get("busy", 0.0)),
            errors=round(results.get("error", 0.0)),
            step_seconds=mean(step) or 0.0,
            part_seconds={part: mean(parts, (part,)) or 0.0 for part in c.PROFILE_PARTS},
            overlap=mean(overlap),
            imbalance=mean(imbalance),
            capture_seconds=self.instant(each_worker_once(grew(c.PROFILE_CAPTURE_SECONDS))) or 0.0,
            latest=max((arrived for arrived, _, _ in samples), default=None),
        )
        trace_bytes = self.instant(f"sum {grew(c.PROFILE_CAPTURE_BYTES)}")
        if trace_bytes and results.get("ok"):
            profile.trace_bytes = trace_bytes / results["ok"]
        return profile

    def stalled_cores(self) -> list[StalledCores]:
        """Each worker's TPU cores at each program and HLO location while the workload stalled in the window, the
        longest they stayed, and whether that was elsewhere than most of its peers'; the longest stays first."""
        longest = f"max_over_time({CORE_LOCATION}{{{self.w}}}[{self.whole}])"
        elsewhere = f"max_over_time({CORE_ELSEWHERE}{{{self.w}}}[{self.whole}])"
        odd = {_located(r["metric"]) for r in self.api.query(elsewhere, at=self.end)}
        cores = [
            StalledCores(*_located(r["metric"]), seconds=float(r["value"][1]), elsewhere=_located(r["metric"]) in odd)
            for r in self.api.query(longest, at=self.end)
        ]
        return sorted(cores, key=lambda core: (not core.elsewhere, -core.seconds, core.slice, core.worker))

    def stuck_positions(self) -> list[StuckPosition]:
        """Each position a worker's process was served stuck at in the window, from when to when, and whether it
        was elsewhere than most of the stuck ones' at some point; those elsewhere first, then the earliest."""
        seen: dict[tuple[str, str, str, str, str, str], list[float]] = {}
        at: dict[float, dict[Hashable, tuple[str, str]]] = {}  # each point: the positions stuck then
        for result in self.range(series(c.STUCK_POSITION, self.w)):
            key = _stuck(result["metric"])
            for t, _ in result["values"]:
                seen.setdefault(key, []).append(float(t))
                at.setdefault(float(t), {})[key] = (key[3], key[4])
        odd = {key for places in at.values() for key in positions.elsewhere(places)}
        stuck = [StuckPosition(*key, min(times), max(times), key in odd) for key, times in seen.items()]
        return sorted(stuck, key=lambda p: (not p.elsewhere, p.first, p.slice, p.worker))

    # --- queries ----------------------------------------------------------------------------------------
    def grew_in_window(self, counter: c.Metric, suffix: str = "") -> str:
        """How much each of the workload's ``counter`` series grew in the window, a first event counted."""
        return grown(series(counter, self.w, suffix=suffix), self.whole)

    def grid(self) -> list[float]:
        """The times of a range query's points."""
        count = int((self.end - self.start) // self.step)
        return [self.start + i * self.step for i in range(count + 1)]

    def range(self, expr: str) -> list[dict[str, Any]]:
        return self.api.query_range(expr, self.start, self.end, self.step)

    def line(self, name: str, expr: str) -> Series:
        """The one series ``expr`` yields (empty when it yields none)."""
        results = self.range(expr)
        return _series(name, results[0]["values"] if results else [])

    def lines(self, expr: str, label: str) -> dict[str, Series]:
        """Each series ``expr`` yields, named by its ``label``."""
        return {r["metric"][label]: _series(r["metric"][label], r["values"]) for r in self.range(expr)}

    def instant(self, expr: str) -> float | None:
        result = self.api.query(expr, at=self.end)
        return float(result[0]["value"][1]) if result else None

    def by(self, expr: str, label: str) -> dict[str, float]:
        return {r["metric"].get(label, ""): float(r["value"][1]) for r in self.api.query(expr, at=self.end)}

    def _scrape_interval(self) -> float:
        """The longest scrape interval of the Prometheus jobs that scrape this workload's sidecars."""
        jobs = set(self.api.label_values("job", series(c.STEPS, self.w), self.start, self.end))
        targets = self.api.get("targets", {"state": "active"})["activeTargets"]
        intervals = [
            durations.prometheus_ms(t["scrapeInterval"]) / 1000
            for t in targets
            if t.get("labels", {}).get("job") in jobs and t.get("scrapeInterval")
        ]
        return max(intervals, default=DEFAULT_SCRAPE_INTERVAL)


def _key(labels: dict[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(labels.items()))


def _cumulate(values: list[list[Any]], grid: list[float], line: list[float], start: float) -> None:
    """Add to ``line`` what one counter grew by each point of ``grid``: across its resets, from 0 if it was born
    in the window, holding its last value where it has no sample."""
    points = [(float(t), float(v)) for t, v in values]
    grown_so_far, previous = 0.0, 0.0 if points[0][0] > start else points[0][1]
    by_time = {}
    for t, value in points:
        grown_so_far += value - previous if value >= previous else value
        previous = value
        by_time[t] = grown_so_far
    last = 0.0
    for i, t in enumerate(grid):
        last = by_time.get(t, last)
        line[i] += last


def _sidecar(labels: dict[str, str]) -> tuple[str, ...]:
    return tuple(labels.get(name, "") for name in ("job", "instance", c.Label.SLICE, c.Label.WORKER))


def _located(labels: dict[str, str]) -> tuple[str, str, str, str, str]:
    """A worker's cores at one place: slice, worker, instance, fingerprint, HLO location."""
    names = (c.Label.SLICE, c.Label.WORKER, "instance", c.Label.FINGERPRINT, c.Label.HLO_LOCATION)
    slice_, worker, instance, fingerprint, hlo_location = (labels.get(name, "") for name in names)
    return slice_, worker, instance, fingerprint, hlo_location


def _stuck(labels: dict[str, str]) -> tuple[str, str, str, str, str, str]:
    """A process stuck at one place: slice, worker, instance, step, phase, top frames."""
    names = (c.Label.SLICE, c.Label.WORKER, "instance", c.Label.STEP, c.Label.PHASE, c.Label.FRAMES)
    slice_, worker, instance, step, phase, frames = (labels.get(name, "") for name in names)
    return slice_, worker, instance, step, phase, frames


def _worker(labels: dict[str, str]) -> tuple[str, str]:
    return labels.get(c.Label.SLICE, ""), labels.get(c.Label.WORKER, "")


def _series(name: str, values: list[list[Any]]) -> Series:
    """A range query's ``[time, "value"]`` pairs as a chart's line, the undefined points (NaN) left out."""
    line = Series(name)
    for t, v in values:
        if not math.isnan(float(v)):
            line.add(float(t), float(v))
    return line
