"""``tpuscope bench rule-cost``: what each rule group costs Prometheus, in samples read and seconds, on a fleet's TSDB.

Rules files are compared on the same data: TSDBs that ``promtool tsdb create-blocks-from openmetrics`` writes
of a fleet of hosts in workloads of 16 workers, each host's sidecar serving every catalogue series the rules
read, and the recorded series those rules read, as far back as any rule reads each (its range and offset, or
the lookback). Nothing is typed twice: which series get history, and how far back, come from the rules files'
selectors.

The recorded history needs the labels each rule gives its series, and a rewrite may aggregate differently: so
before the backfill each file's rules run once in a real Prometheus that scrapes the fleet live (a *probe*),
and the series they record, with their values, are what the backfill carries back over the history. Each file
gets a TSDB of the same sidecar series, the series its own rules record, and those that only another file
records (the union): not another file's series of a name it records too, which may carry other labels (both
label sets at once would double a rule's reads and break its one-to-one matches). (``promtool tsdb
create-blocks-from rules`` could record the history, but it evaluates each rule alone, so a rule reading
another's output, or its own past, gets nothing.)

Two measures, on copies of each file's TSDB (hard links: the blocks are never written to):

- *evaluation*: a Prometheus loads one rules file and evaluates it every ``--interval`` on the backfilled
  history, the sidecars' series carrying on live past its end (the fleet's ``/metrics``, served from here,
  scraped every ``--scrape-interval``); each group's ``evaluationTime`` from ``/api/v1/rules``, best of a few
  evaluations after a warm-up one. The evaluations happen at "now", a few minutes after the history's end:
  a short window (10 min) then reads a little less recorded history than it would in a fleet.
- *queries*: a Prometheus without rules runs every rule's expression at the history's end through the query
  API with ``stats=all``: samples read (``totalQueryableSamples``) and evaluation seconds, best of 3. The
  same instant and data for every file: the samples read are exact.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import math
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from tpuscope import catalog, durations, goodput
from tpuscope.bench.fleet_series import (
    WORKERS_PER_WORKLOAD,
    Feed,
    Host,
    Series,
    Timing,
    backfill,
    exposition,
    fleet,
    label_text,
    prometheus_on,
    recorded_series,
    write_series,
)
from tpuscope.bench.machine import machine
from tpuscope.bench.rule_files import Reads, RulesFile, instant, load_rules, paced, wait_for_round
from tpuscope.bench.verdict import table
from tpuscope.catalog import Kind, Label, Metric
from tpuscope.prometheus_api import PrometheusAPI, PrometheusError
from tpuscope.promql import SIDECAR_START, le
from tpuscope.testing.prometheus import PrometheusServer
from tpuscope.testing.waiting import wait_for

DEFAULT_JSON = Path("run/rule-cost.json")
DEFAULT_RULES = Path("deploy/prometheus/tpuscope-rules.yaml")
DEVICES_PER_HOST = 8
# Group evaluations timed after the warm-up one (its queries are the first to touch the blocks' pages), best of.
EVALUATIONS = 3
QUERY_ROUNDS = 3
TOP_RULES = 10
# The probe only needs each rule to have run on a couple of scrapes: it scrapes and evaluates at this pace.
PROBE_INTERVAL = "2s"
PROBE_ROUNDS = 15
QUERY_TIMEOUT_SECONDS = 300.0
# The value a label gets where no rule names one (beside those the rules name).
OTHER = "other"
# A healthy fleet's hosts serve none of these: each appears only once a workload ended or went down.
ABSENT_WHILE_RUNNING = (catalog.WORKLOAD_END_TIME, catalog.WORKLOAD_DOWN_SINCE)
# What a series counts that a steady fleet does not do, in its name or a label's value: fail, err, restart,
# compile (a job compiles as it starts), spill memory, throttle clocks, overflow labels, lose events.
UNSTEADY = ("fail", "error", "restart", "compile", "spill", "throttl", "overflow", "invalid", "dropped")
BADPUT_WEIGHT = 0.01  # of a productive category's share of the wall time
# Gauges holding the time something started: the fleet's start, not the time of asking.
START_TIMES = (catalog.WORKLOAD_START_TIME.name, SIDECAR_START)
SCRAPE_HEALTH = "up"  # Prometheus' own series of each target, read by the rules: every host's is 1
HISTOGRAM_SUFFIXES = ("bucket", "sum", "count")


# --- The sidecars' series --------------------------------------------------------------------------------


def family(name: str) -> tuple[Metric, str] | None:
    """The catalogue metric a series name belongs to, and its histogram suffix ("" for none)."""
    for metric in catalog.CATALOG:
        if name == metric.name:
            return metric, ""
        if metric.kind is Kind.HISTOGRAM:
            for suffix in HISTOGRAM_SUFFIXES:
                if name == metric.series(suffix):
                    return metric, suffix
    return None


def sidecar_series(hosts: list[Host], reads: Reads, timing: Timing) -> tuple[list[Series], list[str]]:
    """Every host's series of each name the rules read that a sidecar serves (or its scrape makes), and the
    other names read (the recorded ones among them: the probe finds those)."""
    out: list[Series] = []
    unserved: list[str] = []
    for name in sorted(reads.reach):
        since = timing.since(reads.reach[name], timing.scrape)
        base = Series(name, "", since, timing.scrape, origin=timing.origin)
        if name == SCRAPE_HEALTH:
            out += [replace(base, labels=label_text(h.target), level=1.0) for h in hosts]
        elif name == SIDECAR_START:
            out += [replace(base, labels=label_text(h.labels), level=timing.origin) for h in hosts]
        elif (found := family(name)) is not None:
            metric, suffix = found
            if metric not in ABSENT_WHILE_RUNNING:
                out += [s for h in hosts for s in metric_series(base, metric, suffix, h, reads)]
        else:
            unserved.append(name)
    return out, unserved


def metric_series(base: Series, metric: Metric, suffix: str, host: Host, reads: Reads) -> Iterator[Series]:
    """One host's series of a catalogue metric: every combination of its labels' values. A counter grows by
    1 a second shared among its combinations by :func:`weight` (goodput's categories then add up to the wall
    clock), a histogram's buckets hold shares of it (:func:`below`); a gauge is the time for a timestamp, else a
    steady level."""
    choices = [label_values(metric, label, host, reads) for label in metric.labels]
    combinations: list[dict[str, str]] = [
        dict(zip(metric.labels, values, strict=True)) for values in itertools.product(*choices)
    ]
    weights = [weight(metric, combination) for combination in combinations]
    bounds = [*map(le, metric.buckets), "+Inf"] if suffix == "bucket" else [""]
    for combination, share in zip(combinations, weights, strict=True):
        for index, bound in enumerate(bounds):
            labels: dict[str, str] = {**host.labels, **combination}
            if bound:
                labels["le"] = bound
            text = label_text(labels)
            if suffix or metric.kind is Kind.COUNTER:
                yield replace(base, labels=text, slope=share / (sum(weights) or 1) * below(index, len(bounds)))
            elif metric.name in START_TIMES:
                yield replace(base, labels=text, level=base.origin)
            else:
                yield replace(base, labels=text, level=gauge_level(metric) * bool(share), clock=timestamp(metric))


def below(index: int, bounds: int) -> float:
    """The share of a histogram's observations within its ``index``th of ``bounds`` bounds: half within the
    first, and half of the rest within each next (a latency objective at any bound but the first few holds)."""
    return 1.0 if index == bounds - 1 else 1 - 0.5 ** (index + 1)


def weight(metric: Metric, labels: dict[str, str]) -> float:
    """A steady fleet's: what it does not do stays at 0 (no alert fires for every host at once), badput is a
    sliver of the wall time, anything else shares alike."""
    if any(word in text for text in (metric.name, *labels.values()) for word in UNSTEADY):
        return 0.0
    return BADPUT_WEIGHT if labels.get(Label.CATEGORY) in goodput.PROMPT_BADPUT else 1.0


def label_values(metric: Metric, label: Label, host: Host, reads: Reads) -> list[str]:
    if label is Label.WORKLOAD:
        return [host.workload]
    if label is Label.DEVICE:
        return [str(device) for device in range(DEVICES_PER_HOST)]
    if label is Label.CATEGORY:
        return list(goodput.CATEGORIES)
    names = [metric.name] + [metric.series(s) for s in HISTOGRAM_SUFFIXES if metric.kind is Kind.HISTOGRAM]
    named = {OTHER}
    for name in names:
        named |= reads.values.get((name, label), set())
    return sorted(named)


def timestamp(metric: Metric) -> bool:
    return metric.name.endswith("_timestamp_seconds")


def gauge_level(metric: Metric) -> float:
    """A steady gauge: a ratio half way, a limit twice what is used, anything else 1."""
    if metric.name.endswith("_ratio"):
        return 0.5
    return 2.0 if any(word in metric.name for word in ("_limit_", "_max_", "_total_")) else 1.0


# --- The probe of what each file records ------------------------------------------------------------------


def probe(rules: RulesFile, records: set[str], feed: Feed, workdir: Path) -> list[dict[str, Any]]:
    """The series ``records`` (names) that ``rules`` record on the live fleet, once their number has settled:
    each as the query API answers (``metric``, ``value``)."""
    if not records:
        return []
    pattern = "|".join(sorted(records))
    counts = f'count by (__name__) ({{__name__=~"{pattern}"}})'
    before = feed.scrapes
    with PrometheusServer(
        workdir, [feed.address], PROBE_INTERVAL, rule_files=[rules.path], scrape={"honor_labels": True}
    ) as prometheus:
        timeout = 20 * durations.parse(PROBE_INTERVAL) + 60
        wait_for(lambda: feed.scrapes >= before + 2, timeout, "two scrapes of the fleet")
        previous: list[tuple[str, str]] = []
        for round_ in range(PROBE_ROUNDS):
            wait_for_round(prometheus.api, timeout)
            now = sorted((r["metric"]["__name__"], r["value"][1]) for r in prometheus.query(counts))
            if round_ and now == previous:
                return prometheus.query(f'{{__name__=~"{pattern}"}}')
            previous = now
    raise PrometheusError(f"the series recorded by {rules.path} did not settle in {PROBE_ROUNDS} evaluations")


# --- The measures -----------------------------------------------------------------------------------------


@dataclass
class RuleCost:
    group: str
    name: str
    samples: int | None = None  # None: the query failed
    query_seconds: float = math.inf
    eval_seconds: float = math.inf
    error: str = ""


@dataclass
class FileCost:
    label: str
    path: str
    rules: list[RuleCost]
    group_eval_seconds: dict[str, float] = field(default_factory=dict)
    # Alerts pending or firing at the end of the evaluations, by name: each costs its group a series written
    # every time, so a fleet where many fire costs more than a quiet one.
    alerts: dict[str, int] = field(default_factory=dict)
    tsdb: dict[str, float] = field(default_factory=dict)  # its series, samples, and the seconds to write them


def evaluate(rules: RulesFile, cost: FileCost, tsdb: Path, feed: Feed, timing: Timing, workdir: Path) -> None:
    """Each group's and rule's evaluation seconds in a Prometheus evaluating ``rules`` on the TSDB, best of
    ``EVALUATIONS`` after a warm-up one, counting only evaluations after the fleet's first live scrape."""
    flags = prometheus_on(tsdb, workdir)
    before = feed.scrapes
    scrape = {"honor_labels": True, "scrape_interval": durations.prometheus(int(timing.scrape * 1000))}
    interval = durations.prometheus(int(timing.interval * 1000))
    with PrometheusServer(workdir, [feed.address], interval, rule_files=[rules.path], scrape=scrape, flags=flags) as p:
        timeout = (EVALUATIONS + 3) * timing.interval + timing.scrape + 120
        wait_for(lambda: feed.scrapes > before, timeout, "a scrape of the fleet")
        timed = evaluations(p.api, rules.groups, feed.scraped_at(before), timeout)
        cost.alerts = {a["metric"]["alertname"]: int(a["value"][1]) for a in p.query("count by (alertname) (ALERTS)")}
    for group, group_times in timed.items():
        measured = group_times[1:]  # the first warms up
        cost.group_eval_seconds[group] = min(times[0] for times in measured)
        for index, rule in enumerate(r for r in cost.rules if r.group == group):
            rule.eval_seconds = min(times[1 + index] for times in measured)


def evaluations(api: PrometheusAPI, groups: list[str], after: float, timeout: float) -> dict[str, list[list[float]]]:
    """Each group's first ``EVALUATIONS`` + 1 evaluations that began ``after``, in order, as ``/api/v1/rules``
    reports them: the group's seconds, then each of its rules'."""
    seen: dict[str, dict[float, list[float]]] = {group: {} for group in groups}

    def enough() -> bool:
        for group in api.get("rules")["groups"]:
            if (began := instant(group["lastEvaluation"])) > after:
                times = [group["evaluationTime"], *(rule["evaluationTime"] for rule in group["rules"])]
                seen[group["name"]].setdefault(began, times)
        return all(len(evaluated) > EVALUATIONS for evaluated in seen.values())

    wait_for(enough, timeout, f"{EVALUATIONS + 1} evaluations of every group")
    return {group: [evaluated[t] for t in sorted(evaluated)][: EVALUATIONS + 1] for group, evaluated in seen.items()}


def query(rules: RulesFile, cost: FileCost, tsdb: Path, at: float, workdir: Path) -> None:
    """Every rule's expression at ``at``: samples read, and seconds, best of ``QUERY_ROUNDS`` rounds."""
    flags = prometheus_on(tsdb, workdir)
    with PrometheusServer(workdir, [], flags=flags) as prometheus:
        api = PrometheusAPI(prometheus.url, timeout=QUERY_TIMEOUT_SECONDS)
        for _ in range(QUERY_ROUNDS):
            for rule, measured in zip(rules.rules, cost.rules, strict=True):
                try:
                    stats = api.get("query", {"query": rule.expr, "time": at, "stats": "all"})["stats"]
                except PrometheusError as e:
                    measured.error = str(e)
                    continue
                measured.samples = int(stats["samples"]["totalQueryableSamples"])
                measured.query_seconds = min(measured.query_seconds, float(stats["timings"]["evalTotalTime"]))


# --- The report -------------------------------------------------------------------------------------------


@dataclass
class GroupCost:
    file: str
    group: str
    rules: int
    samples: int
    query_seconds: float
    eval_seconds: float
    ratios: dict[str, float | None] = field(default_factory=dict)  # against the first file's group of that name


ALL_GROUPS = "(all groups)"


def group_costs(costs: list[FileCost]) -> list[GroupCost]:
    rows: list[GroupCost] = []
    for cost in costs:
        groups = list(dict.fromkeys(r.group for r in cost.rules))
        for group in [*groups, ALL_GROUPS]:
            rules = [r for r in cost.rules if group in (r.group, ALL_GROUPS)]
            evals = [cost.group_eval_seconds.get(g, math.nan) for g in groups if group in (g, ALL_GROUPS)]
            rows.append(
                GroupCost(
                    cost.label,
                    group,
                    len(rules),
                    sum(r.samples or 0 for r in rules),
                    sum(r.query_seconds for r in rules if r.samples is not None),
                    sum(evals),
                )
            )
    baseline = {row.group: row for row in rows if row.file == costs[0].label}
    for row in rows:
        if row.file != costs[0].label and (before := baseline.get(row.group)):
            row.ratios = {
                "samples": ratio(row.samples, before.samples),
                "query_seconds": ratio(row.query_seconds, before.query_seconds),
                "eval_seconds": ratio(row.eval_seconds, before.eval_seconds),
            }
    return rows


def ratio(after: float, before: float) -> float | None:
    return after / before if before and math.isfinite(before) and math.isfinite(after) else None


def times(value: float | None) -> str:
    return "" if value is None else f"x{value:.2f}"


def report_lines(groups: list[GroupCost], costs: list[FileCost]) -> list[str]:
    header = ["file", "group", "rules", "samples read", "query s", "eval s", "samples", "query", "eval"]
    rows = [header] + [
        [
            g.file,
            g.group,
            str(g.rules),
            f"{g.samples:,}",
            f"{g.query_seconds:.3f}",
            f"{g.eval_seconds:.3f}",
            times(g.ratios.get("samples")),
            times(g.ratios.get("query_seconds")),
            times(g.ratios.get("eval_seconds")),
        ]
        for g in groups
    ]
    lines = [f"Per group, per evaluation (the ratios: against {costs[0].label}'s group of that name):"]
    lines += [f"  {cost.label}: {cost.path}; alerts pending or firing: {alert_counts(cost)}" for cost in costs]
    lines += ["  " + line for line in table(rows, right={2, 3, 4, 5, 6, 7, 8})]
    top = sorted(((c.label, r) for c in costs for r in c.rules), key=lambda x: -(x[1].samples or 0))[:TOP_RULES]
    rows = [["file", "group", "rule", "samples read", "query s", "eval s"]] + [
        [label, r.group, r.name, f"{r.samples or 0:,}", f"{r.query_seconds:.3f}", f"{r.eval_seconds:.3f}"]
        for label, r in top
    ]
    lines += ["", f"The {TOP_RULES} rules that read the most samples:"]
    lines += ["  " + line for line in table(rows, right={3, 4, 5})]
    failed = [f"  {c.label} {r.group} {r.name}: {r.error}" for c in costs for r in c.rules if r.samples is None]
    return lines + (["", "Queries that failed:", *failed] if failed else [])


def finite(value: Any) -> Any:
    """``value`` with every infinite or NaN float (a figure not measured) as None: JSON has neither."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [finite(v) for v in value]
    return value


def alert_counts(cost: FileCost) -> str:
    return ", ".join(f"{name} {count}" for name, count in sorted(cost.alerts.items())) or "none"


def measure(
    files: list[RulesFile], sidecars: list[Series], recorded: set[str], reads: Reads, timing: Timing
) -> list[FileCost]:
    """Probe, backfill, evaluate and query each file, in scratch directories removed afterwards."""
    costs = [FileCost(f.label, str(f.path), [RuleCost(r.group, r.name) for r in f.rules]) for f in files]
    with tempfile.TemporaryDirectory(prefix="ts-rule-cost-") as tmp:
        work = Path(tmp)
        files = [paced(f, work / "paced") for f in files]
        feed = Feed(lambda _, t: exposition(sidecars, t))
        try:
            found = {f.label: probe(f, recorded & f.records, feed, work / f"probe-{f.label}") for f in files}
            if empty := sorted(recorded - {r["metric"]["__name__"] for results in found.values() for r in results}):
                print(f"  recorded by no rule on this fleet (no history): {', '.join(empty)}")
            tsdbs = [
                backfill(
                    [functools.partial(write_series, sidecars + file_records(f, found, reads, timing), timing.end)],
                    work / f.label,
                )
                for f in files
            ]
            for f, cost, tsdb in zip(files, costs, tsdbs, strict=True):
                cost.tsdb = {"series": tsdb.series, "samples": tsdb.samples, "seconds": round(tsdb.seconds, 1)}
                print(f"  {f.label}: a TSDB of {tsdb.series:,} series, {tsdb.samples:,} samples ({tsdb.seconds:.0f} s)")
                evaluate(f, cost, tsdb.path, feed, timing, work / f.label / "evaluate")
        finally:
            feed.close()
        for f, cost, tsdb in zip(files, costs, tsdbs, strict=True):
            query(f, cost, tsdb.path, timing.end, work / f.label / "query")
    return costs


def file_records(
    rules: RulesFile, found: dict[str, list[dict[str, Any]]], reads: Reads, timing: Timing
) -> list[Series]:
    """The recorded series of ``rules``' TSDB: what its own rules recorded in the probe, and what only other
    files record (the union). Not another file's series of a name ``rules`` records too: a rewrite may keep
    a name and change its labels, and both label sets at once would double a rule's reads and break its
    one-to-one matches."""
    others = [
        result
        for label, results in found.items()
        if label != rules.label
        for result in results
        if result["metric"]["__name__"] not in rules.records
    ]
    return recorded_series([*found[rules.label], *others], timing, reads.reach.__getitem__)


def run(args: argparse.Namespace) -> int:
    files = [load_rules(spec) for spec in (args.rules or [str(DEFAULT_RULES)])]
    if len({f.label for f in files}) < len(files):
        raise SystemExit("rule-cost: two rules files have the same label; name them NAME=FILE")
    reads = Reads.of(files)
    timing = Timing(
        end=float(int(time.time())),
        days=args.days,
        scrape=durations.parse(args.scrape_interval),
        interval=durations.parse(args.interval),
    )
    hosts = fleet(args.hosts)
    sidecars, others = sidecar_series(hosts, reads, timing)
    print(
        f"rule-cost: {len(hosts)} hosts ({math.ceil(len(hosts) / WORKERS_PER_WORKLOAD)} workloads of up to "
        f"{WORKERS_PER_WORKLOAD} workers, {DEVICES_PER_HOST} devices a host), {args.days:g} d of history; sidecars "
        f"scraped every {timing.scrape:g} s, rules evaluated every {timing.interval:g} s"
    )
    recorded = set().union(*(f.records for f in files)) & set(reads.reach)
    if unserved := [name for name in others if name not in recorded]:
        print(f"  read by a rule, served by no sidecar nor recorded (left out): {', '.join(unserved)}")
    costs = measure(files, sidecars, recorded, reads, timing)
    groups = group_costs(costs)
    print("\n".join(["", *report_lines(groups, costs)]))
    figures = {
        "machine": machine(),
        "settings": {**{k: v for k, v in asdict(timing).items() if k != "end"}, "hosts": len(hosts)},
        "unserved": unserved,
        "groups": [asdict(g) for g in groups],
        "files": [asdict(c) for c in costs],
    }
    json_path: Path = args.json or DEFAULT_JSON
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(finite(figures), indent=2) + "\n")
    print(f"JSON: {json_path}")
    return 0
