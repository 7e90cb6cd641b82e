"""``tpuscope bench fleet-scale``: the rules, the boards and the storage behind them at a fleet's size.

One sidecar's real series set (:data:`SNAPSHOT`, a scrape of a real ``tpuscope workload`` run: fused, with device
profiles, 8 devices and the fake libtpu; ``--record-series`` records it again) is replicated across N hosts in workloads
of 16 workers, each host with its scrape's target labels (``job``, ``instance``, ``namespace``, ``jobset``,
``pod``, ``node``, ``controller_kind``, ``controller``) and its ``slice`` and ``worker``; beside it on every host,
the peer's: what a real node_exporter (Debian's, started here) serves. Beside the hosts, the cluster's exporters,
one target each (:mod:`tpuscope.bench.kube_state`): kube-state-metrics, serving the fleet's namespaces, Jobs (one a
slice), pods (one a host) and TPU nodes (one a host, and idle node pools besides), and Kueue, serving its
ClusterQueues' admissions. Some hosts misbehave (:func:`variations`): a straggler, a crash and its restart, a
preemption that leaves a gap (its pods gone and its Jobs suspended in kube-state-metrics' series, its workload
pending in Kueue's).

For each N, one Prometheus runs on one TSDB:

- *history*, backfilled by promtool: each series as far back as a rule of either file reads it (its range and
  offset, or the lookback), or ``--board-hours`` for a series a dashboard reads; and the recorded series the
  rules read back, at the values a probe of the same fleet gave them (as ``bench rule-cost`` does);
- *the present*: every host's whole series set, ours and the peer's, and the cluster exporters' whole sets, served
  live from here and scraped every 15 s, one target a host as Kubernetes would list them, so the head holds what a
  fleet's would;
- *the rules*: ours and the peer's (``--peer-rules``: node-exporter-mixin's, rendered), every group each 30 s
  unless it has an interval of its own, as the generated ClusterRules say.

Measured: each group's evaluation seconds (Prometheus' own ``/api/v1/rules``) against its interval, the series
each recording rule writes, the head's series and Prometheus' memory, whether the cluster's series join with the
sidecars' (:data:`CLUSTER_JOINS`), and each dashboard's queries as Grafana sends them over 6 h and 24 h (where the
history holds that much): latency p50 and p95, and the samples they touch (``stats=all``). The budgets
(:class:`Budgets`) are checked at the largest N, every group of ours (a new one too) against its interval; the run
exits 1 when one is missed.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TextIO

import yaml
from prometheus_client.parser import text_string_to_metric_families

from tpuscope import catalog, durations
from tpuscope.alerts import nodes
from tpuscope.bench import fleet_series, kube_state, rule_files
from tpuscope.bench.kube_state import KSM_JOB, KUEUE_JOB
from tpuscope.bench.verdict import Check, check_lines, table, write_report
from tpuscope.catalog import Label
from tpuscope.conventions import GKE_TOPOLOGY
from tpuscope.exporter.exposition import number
from tpuscope.kubernetes import CONTROLLER_KIND, CONTROLLER_NAME
from tpuscope.prometheus_api import PrometheusAPI, PrometheusError
from tpuscope.promql import SIDECAR_START
from tpuscope.testing import grafana
from tpuscope.testing.prometheus import PrometheusServer, free_port
from tpuscope.testing.waiting import wait_for
from tpuscope.thresholds import Thresholds

SNAPSHOT = Path(__file__).with_name("sidecar-series.prom")
SNAPSHOT_HEADER = "# tpuscope fleet-scale snapshot: uptime_seconds="
DASHBOARDS = Path("deploy/grafana")
DEFAULT_RULES = Path("deploy/prometheus/tpuscope-rules.yaml")
DEFAULT_JSON = Path("run/fleet-scale.json")
SCRAPE_SECONDS = 15  # deploy/prometheus/prometheus.yml's
EVALUATION_SECONDS = 30  # the generated ClusterRules' interval, and prometheus.yml's
RANGES_HOURS = (6, 24)  # the board ranges measured, where the history holds them
MAX_DATA_POINTS = 1000  # a wide Grafana panel's; it sets a range query's step
EVALUATIONS = 4  # of each group once every target has been scraped; the first one warms up
QUERY_ROUNDS = 2  # each board query runs this often; its latency is the last round's (warm caches)
QUERY_TIMEOUT_SECONDS = 120.0
# The probe scrapes and evaluates at this pace, until the recorded series settle: every 2 s, or every 2 s a hundred
# hosts, so that this process serves every host's series (those the rules read) in time.
PROBE_SECONDS_PER_100_HOSTS = 2
RECORDED_DAYS = 3.0
PART_SAMPLES = 60_000_000  # one writer's OpenMetrics text at a time: about 13 GB at some 210 bytes a sample
PEER_JOB = "node"  # node-exporter-mixin's default selector is job="node"
OUR_JOB = "tpuscope"
START_TIMES = ("process_start_time_seconds", "node_boot_time_seconds", SIDECAR_START)
# Grafana's interval rounding (its roundInterval), in seconds: below the first bound, the second.
NICE_INTERVALS = ((7.5, 5), (12.5, 10), (17.5, 15), (25, 20), (45, 30), (90, 60), (210, 120), (450, 300), (900, 600))


@dataclass(frozen=True)
class Budgets:
    """What a fleet may cost, on this project's 2-core machine (docs/fleet.md, "A thousand hosts")."""

    group_share_of_interval: float = 0.10  # every rule group evaluates within a tenth of its interval
    board_p95_seconds: float = 2.0  # each dashboard's queries over 24 h, p95
    host_series: int = catalog.HOST_SERIES_BUDGET  # one sidecar of 8 devices, every collector on


# --- The series of one host -------------------------------------------------------------------------------


@dataclass(frozen=True)
class HostSeries:
    """One series as a real exporter served it, without target labels, and how it moves: a counter at
    ``slope`` a second, a timestamp with the clock, a start time at the fleet's start, anything else steady."""

    name: str
    labels: tuple[tuple[str, str], ...]
    value: float
    slope: float = 0.0
    clock: bool = False
    start: bool = False


def parse_exposition(text: str, seconds: float) -> list[HostSeries]:
    """The series of an exposition; counters (and histograms' parts) grew steadily over ``seconds``."""
    out: list[HostSeries] = []
    for family in text_string_to_metric_families(text):
        grows = family.type in ("counter", "histogram", "summary")
        for sample in family.samples:
            if sample.name.endswith("_created"):
                continue  # OpenMetrics' creation times: the text format Prometheus scrapes has none
            out.append(
                HostSeries(
                    sample.name,
                    tuple(sorted(sample.labels.items())),
                    sample.value,
                    slope=sample.value / seconds if grows and "quantile" not in sample.labels else 0.0,
                    clock=sample.name.endswith("_timestamp_seconds") or sample.name == "node_time_seconds",
                    start=sample.name in START_TIMES or sample.name.endswith("_start_time_seconds"),
                )
            )
    return out


def load_snapshot(path: Path = SNAPSHOT) -> list[HostSeries]:
    """The committed scrape; its first line says how long the run had run when it was taken."""
    header, _, body = path.read_text().partition("\n")
    return parse_exposition(body, float(header.removeprefix(SNAPSHOT_HEADER)))


def text_of(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return str(response.read().decode())


def node_exporter_series(seconds: float = 5.0) -> list[HostSeries]:
    """A real node_exporter's series on this machine: two scrapes ``seconds`` apart give its counters' rates."""
    binary = shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")
    if binary is None:
        raise SystemExit("fleet-scale: the peer is node_exporter: install Debian's prometheus-node-exporter")
    url = f"http://127.0.0.1:{free_port()}/metrics"
    address = url.split("/")[2]
    process = subprocess.Popen(
        [binary, f"--web.listen-address={address}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        wait_for(lambda: reachable(url), 30, "node_exporter")
        first = text_of(url)
        time.sleep(seconds)  # the interval its counters' rates are measured over
        second = text_of(url)
    finally:
        process.terminate()
        process.wait(timeout=10)
    before = {(s.name, s.labels): s.value for s in parse_exposition(first, 1.0)}
    grown = [(s, s.value - before.get((s.name, s.labels), s.value)) for s in parse_exposition(second, 1.0)]
    return [HostSeries(s.name, s.labels, s.value, max(0.0, g / seconds) if s.slope else 0.0) for s, g in grown]


def reachable(url: str) -> bool:
    try:
        text_of(url)
    except OSError:
        return False
    return True


# --- The fleet --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Variation:
    """What one series does differently: a rate scaled, a rise of ``step`` at a time, a stretch without samples
    (seconds before the history's end), or at ``held`` instead (a suspended Job's), after which counters start
    again from 0 and start times are its end."""

    factor: float = 1.0
    step_at: float | None = None
    gap: tuple[float, float] | None = None  # (from, to) seconds before the end
    held: float | None = None
    step: float = 1.0

    def value(self, s: HostSeries, t: float, end: float, origin: float) -> float:
        restarted = self.gap is not None and end - t <= self.gap[1]
        since = end - self.gap[1] if self.gap is not None and restarted else origin
        if self.held is not None and self.during(t, end):
            return self.held
        if s.clock:
            return t
        if s.start:
            return since
        stepped = self.step if self.step_at is not None and end - t <= self.step_at else 0.0
        if not s.slope:
            return s.value * self.factor + stepped
        return s.slope * self.factor * (t - since) + stepped

    def during(self, t: float, end: float) -> bool:
        return self.gap is not None and self.gap[1] < end - t <= self.gap[0]

    def missing(self, t: float, end: float) -> bool:
        return self.held is None and self.during(t, end)


STEADY = Variation()
UP = HostSeries("up", (), 1.0)
PREEMPTION = (3 * 3600.0, 2.5 * 3600.0)  # the third workload's gap, (from, to) seconds before the end
# A series as a target serves it, without the target's labels: name, labels, model, variation.
Served = tuple[str, dict[str, str], HostSeries, Variation]


@dataclass(frozen=True)
class Fleet:
    """N hosts (``fleet_series.fleet``: workloads of 16 workers, 4 to a slice), each serving ``ours`` and ``peer``; and
    the cluster's exporters (``cluster``, by job: :mod:`tpuscope.bench.kube_state`), one target each."""

    hosts: list[fleet_series.Host]
    ours: list[HostSeries]
    peer: list[HostSeries]
    varied: dict[tuple[int, str], Variation] = field(default_factory=dict)
    cluster: dict[str, list[Served]] = field(default_factory=dict)

    @classmethod
    def of(cls, hosts: int, ours: list[HostSeries], peer: list[HostSeries]) -> Fleet:
        fleet = cls(fleet_series.fleet(hosts), [*ours, *crash_counters(ours)], peer)
        fleet.varied.update(variations(hosts))
        preempted = sorted({fleet.hosts[i].workload for (i, _), v in fleet.varied.items() if v.gap == PREEMPTION})
        chips, waited = chips_of(ours), PREEMPTION[0] - PREEMPTION[1]
        fleet.cluster[KSM_JOB] = cluster_served(kube_state.kube_state_series(fleet.hosts, chips, preempted))
        fleet.cluster[KUEUE_JOB] = cluster_served(kube_state.kueue_series(fleet.hosts, preempted, waited))
        return fleet

    def targets(self) -> Iterator[tuple[int, str]]:
        """Every scrape target as (host index, job): each host's sidecar and node_exporter, then each of the
        cluster's exporters, as host 0's."""
        for index in range(len(self.hosts)):
            yield from ((index, job) for job in (OUR_JOB, PEER_JOB))
        yield from ((0, job) for job in self.cluster)

    def target(self, index: int, job: str) -> dict[str, str]:
        """The labels the scrape gives every series of the host's ``job``, as the shipped relabelling does: the
        sidecar's pod, its node and its controller, which join with kube-state-metrics' series of them; a cluster
        exporter's, none of any host's."""
        if job in self.cluster:
            return {"job": job, "instance": kube_state.INSTANCES[job]}
        host = self.hosts[index]
        labels = host.target | {"job": job}
        if job == OUR_JOB:
            node = kube_state.node_of(index)
            labels |= {"node": node.name, CONTROLLER_KIND: "Job"}
            labels |= {ours: node.topology[gke] for ours, gke in GKE_TOPOLOGY.items()}  # attached from the node
            labels[CONTROLLER_NAME] = kube_state.job_of(host)
        if job == PEER_JOB:
            labels["instance"] = labels["instance"].replace(":9478", ":9100")
        return labels

    def series(self, index: int, job: str, scraped: bool = False) -> Iterator[Served]:
        """The host's series of ``job`` as it serves them (no target labels): name, labels, model, variation;
        ``scraped``: with ``up``, which Prometheus writes for every scrape (the history needs it too)."""
        if job in self.cluster:
            yield from self.cluster[job]
            if scraped:
                yield UP.name, {}, UP, STEADY
            return
        host = self.hosts[index]
        for s in [*(self.ours if job == OUR_JOB else self.peer), *([UP] if scraped else [])]:
            labels = dict(s.labels)
            if job == OUR_JOB and s is not UP:  # the sidecar's own labels: the host's place and its workload
                labels[Label.SLICE], labels[Label.WORKER] = host.slice, host.worker
                if Label.WORKLOAD in labels:
                    labels[Label.WORKLOAD] = host.workload
            varied = self.varied.get((index, s.name)) or self.varied.get((index, "*")) or STEADY
            yield s.name, labels, s, varied


def crash_counters(ours: list[HostSeries]) -> list[HostSeries]:
    """The crash's counters, which a sidecar serves only once a job has failed: at 0 on every host (the
    variation makes one of them rise), unless the snapshot has them."""
    names = {s.name for s in ours}
    workload = ((Label.WORKLOAD.value, "bench"),)
    added = [
        HostSeries(catalog.WORKLOAD_FAILURES.name, (("reason", "crash"), *workload), 0.0),
        HostSeries(catalog.WORKLOAD_RESTARTS.name, workload, 0.0),
    ]
    return [s for s in added if s.name not in names]


def chips_of(ours: list[HostSeries]) -> int:
    """The TPU chips of a host: the devices its sidecar serves series of (by number: not ``host``)."""
    return len({value for s in ours for label, value in s.labels if label == "device" and value.isdigit()}) or 1


def cluster_served(series: list[kube_state.Series]) -> list[Served]:
    """A cluster exporter's series as the feed and the backfill take them: a model of each, and how the preemption
    varies it (:data:`PREEMPTION`: absent, or held at a value, while it lasts; a counter's rise at its end)."""
    return [
        (s.name, dict(s.labels), HostSeries(s.name, s.labels, s.value, start=s.began), preemption(s)) for s in series
    ]


def preemption(s: kube_state.Series) -> Variation:
    """How :data:`PREEMPTION` varies a cluster exporter's series, as :class:`kube_state.Preempted` says."""
    if s.preempted is None:
        return STEADY
    if s.preempted.rise:
        return Variation(step_at=PREEMPTION[1], step=s.preempted.rise)
    return Variation(gap=PREEMPTION, held=s.preempted.held)


def variations(hosts: int) -> dict[tuple[int, str], Variation]:
    """(host index, series name or "*") -> how it differs. The first workload's fourth host is a straggler (its
    compute takes half as long again); the second workload's first host crashed half an hour ago and its job
    restarted; every host of the third was preempted 3 hours ago for half an hour."""
    per = fleet_series.WORKERS_PER_WORKLOAD
    out = {(3, name): Variation(factor=1.5) for name in ("tpuscope_step_phase_duration_seconds_sum",)}
    out[(3, catalog.PROFILE_TIME.name)] = Variation(factor=1.5)
    for name in (catalog.WORKLOAD_FAILURES.name, catalog.WORKLOAD_RESTARTS.name):
        out[(per, name)] = Variation(step_at=1800)
    out.update({(index, "*"): Variation(gap=PREEMPTION) for index in range(2 * per, 3 * per)})
    return {key: value for key, value in out.items() if key[0] < hosts}


# --- History --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Reach:
    """How far back each series name is read: by a rule (its range and offset, or the lookback), or, for a
    name a dashboard reads, as far back as the longest board range the history is to hold."""

    rules: rule_files.Reads
    boards: frozenset[str]
    board_seconds: float

    def seconds(self, name: str) -> float:
        return max(self.rules.reach.get(name, 0.0), self.board_seconds if name in self.boards else 0.0)


Family = tuple[str, int, list[tuple[str, HostSeries, Variation]]]  # name, first time, (line prefix, model, variation)


def history(
    fleet: Fleet, reach: Reach, recorded: list[fleet_series.Series], end: float, directory: Path
) -> fleet_series.Backfill:
    """A TSDB in ``directory``/tsdb of the fleet's history up to ``end``. Its families are split into parts
    (:func:`parts_of`), one writer a core writing them."""
    families: dict[str, Family] = {}
    for index, job in fleet.targets():
        for name, labels, s, varied in fleet.series(index, job, scraped=True):
            if (seconds := reach.seconds(name)) > 0:
                first = int(end - seconds - SCRAPE_SECONDS)
                text = name + fleet_series.label_text(labels | fleet.target(index, job)) + " "
                families.setdefault(name, (name, first, []))[2].append((text, s, varied))
    writers = max(1, min(os.cpu_count() or 1, 4))
    shares = parts_of(list(families.values()), end, writers)
    origin = fleet_origin(end)
    parts: list[fleet_series.Part] = [
        functools.partial(write_share, share, end, origin, recorded if index == 0 else [])
        for index, share in enumerate(shares)
    ]
    return fleet_series.backfill(parts, directory, writers)


def parts_of(families: list[Family], end: float, writers: int, most: int = PART_SAMPLES) -> list[list[Family]]:
    """The families' series split into parts of about ``most`` samples, at least one a writer, each family's
    series whole and once: so that the text waiting for promtool fits on the disk (a day of 1,000 hosts is far more
    than the disk holds), as each writer deletes its part's text before it takes the next. A family of many series
    (a histogram's buckets on every host) is cut into pieces of whole series, a quarter part at most."""

    def size(piece: Family) -> float:  # its samples
        return len(piece[2]) * (end - piece[1]) / SCRAPE_SECONDS

    pieces = [
        (name, first, entries[i : i + per])
        for name, first, entries in families
        for per in [max(1, int(most / 4 / ((end - first) / SCRAPE_SECONDS)))]
        for i in range(0, len(entries), per)
    ]
    shares: list[list[Family]] = [[] for _ in range(max(writers, math.ceil(sum(map(size, pieces)) / most)))]
    for piece in sorted(pieces, key=size, reverse=True):  # the biggest first, each where the least is yet
        min(shares, key=lambda share: sum(map(size, share))).append(piece)
    return shares


def fleet_origin(end: float) -> float:
    """When the fleet started: ten days before the history's end, so its counters are well under way."""
    return end - 10 * 86_400


def write_share(
    share: list[Family], end: float, origin: float, recorded: list[fleet_series.Series], out: TextIO
) -> tuple[int, int]:
    """A part of the history (:data:`fleet_series.Part`): the share's families, and ``recorded``."""
    series = samples = 0
    # A family's lines together: the pieces of one family in a share are written one after another.
    for _, first, entries in sorted(share, key=lambda piece: piece[0]):
        times = range(first, int(end) + 1, SCRAPE_SECONDS)
        for text, s, varied in entries:
            lines = sample_lines(text, s, varied, times, end, origin)
            out.writelines(lines)
            series, samples = series + 1, samples + len(lines)
    more_series, more_samples = fleet_series.write_series(recorded, end, out)
    return series + more_series, samples + more_samples


def sample_lines(text: str, s: HostSeries, varied: Variation, times: range, end: float, origin: float) -> list[str]:
    """One series' lines. A steady series (most of them) is written without a call a sample: a constant, the
    clock, or a counter growing from the fleet's start."""
    if varied is STEADY and not s.start:
        if s.clock:
            return [f"{text}{t}.0 {t}\n" for t in times]
        if s.slope:
            slope = s.slope
            return [f"{text}{slope * (t - origin)!r} {t}\n" for t in times]
        value = number(s.value)
        return [f"{text}{value} {t}\n" for t in times]
    return [f"{text}{number(varied.value(s, t, end, origin))} {t}\n" for t in times if not varied.missing(t, end)]


# --- The present: every host's /metrics, served from here -----------------------------------------------


class Targets:
    """Every host's sidecar and node_exporter, and the cluster's exporters, past the history's end, as a
    :class:`fleet_series.Feed` serves them: target ``I/JOB`` is host I's series of JOB at the time of asking.
    ``read`` narrows each target to the series some rule reads."""

    def __init__(self, fleet: Fleet, end: float, read: set[str] | None = None) -> None:
        self.fleet, self.end, self.origin = fleet, end, fleet_origin(end)
        # kube-state-metrics' series of every pod and node, rendered at every scrape, held the feed past the
        # scrapes' timeout and took the CPU the rules are measured on; the real one serves them from memory.
        self.rendered: dict[str, str] = {}
        self.prefixes = {
            (index, job): [
                (name + fleet_series.label_text(labels) + " ", s, varied)
                for name, labels, s, varied in fleet.series(index, job)
                if read is None or name in read
            ]
            for index, job in fleet.targets()
        }

    def render(self, target: str, t: float) -> str:
        index, _, job = target.partition("/")
        if job in self.fleet.cluster:  # the cluster's objects hold still past the history's end: rendered once
            if job not in self.rendered:
                self.rendered[job] = self.exposition(int(index), job, t)
            return self.rendered[job]
        return self.exposition(int(index), job, t)

    def exposition(self, index: int, job: str, t: float) -> str:
        return "".join(
            f"{text}{number(varied.value(s, t, self.end, self.origin))}\n"
            for text, s, varied in self.prefixes[(index, job)]
        )


def scrape_configs(fleet: Fleet, feed: fleet_series.Feed, interval: int) -> list[dict[str, Any]]:
    """One scrape job each for ours, the peer and the cluster's exporters, each target (:class:`Targets`) with its
    labels."""
    targets = list(fleet.targets())
    return [
        {
            "job_name": job,
            "scrape_interval": f"{interval}s",
            "static_configs": [
                {
                    "targets": [feed.address],
                    "labels": fleet.target(index, job) | {"__param_target": f"{index}/{job}"},
                }
                for index, of in targets
                if of == job
            ],
        }
        for job in dict.fromkeys(job for _, job in targets)
    ]


def prometheus(
    workdir: Path, fleet: Fleet, feed: fleet_series.Feed, interval: int, rules: list[Path], tsdb: Path | None = None
) -> PrometheusServer:
    """A Prometheus scraping the feed every ``interval`` seconds and evaluating the rules as often (their groups
    may say otherwise), on a hard-linked copy of ``tsdb`` if given (it writes only its head beside the blocks)."""
    flags = ["--storage.tsdb.retention.time=10y", "--query.max-samples=500000000"]
    if tsdb is not None:
        shutil.copytree(tsdb, workdir / "data", copy_function=os.link)
    return PrometheusServer(
        workdir, [], f"{interval}s", rule_files=rules, scrape_configs=scrape_configs(fleet, feed, interval), flags=flags
    )


def probe_recorded(
    fleet: Fleet, files: list[rule_files.RulesFile], reads: rule_files.Reads, reach: Reach, end: float, workdir: Path
) -> list[dict[str, Any]]:
    """The series the files' rules record on this fleet that a rule or a board reads, once their number settles: a
    Prometheus scraping only the series some rule reads, and evaluating the rules, every 2 s (a hundred hosts)."""
    records = {name for f in files for name in f.records if reach.seconds(name) > 0}
    if not records:
        return []
    feed = fleet_series.Feed(Targets(fleet, end, read=set(reads.reach)).render)
    pattern = "|".join(sorted(records))
    counts = f'count by (__name__) ({{__name__=~"{pattern}"}})'
    try:
        pace = PROBE_SECONDS_PER_100_HOSTS * max(1, math.ceil(len(fleet.hosts) / 100))
        with prometheus(workdir, fleet, feed, pace, [f.path for f in files]) as probe:
            previous: list[tuple[str, str]] = []
            for _ in range(60):
                rule_files.wait_for_round(probe.api, 300)
                now = sorted((r["metric"]["__name__"], r["value"][1]) for r in probe.query(counts))
                if now and now == previous:
                    return probe.query(f'{{__name__=~"{pattern}"}}')
                previous = now
    finally:
        feed.close()
    raise PrometheusError("the recorded series did not settle in 60 evaluations")


# --- The measures -----------------------------------------------------------------------------------------


@dataclass
class GroupFigures:
    file: str
    group: str
    interval_seconds: float
    eval_seconds_median: float
    eval_seconds_max: float
    recorded_series: int  # what its recording rules write each evaluation

    @property
    def share(self) -> float:
        return self.eval_seconds_max / self.interval_seconds


@dataclass(frozen=True)
class QueryFigures:
    panel: str  # its title and the target's ref
    seconds: float  # as Grafana waits for it: the whole answer, the last of QUERY_ROUNDS
    samples: int  # Prometheus' totalQueryableSamples: each sample counted at every step that reads it


@dataclass
class BoardFigures:
    board: str
    hours: int
    queries: list[QueryFigures]
    failed: list[str] = field(default_factory=list)

    @property
    def seconds(self) -> list[float]:
        return sorted(q.seconds for q in self.queries) or [math.nan]

    @property
    def p50_seconds(self) -> float:
        return statistics.median(self.seconds)

    @property
    def p95_seconds(self) -> float:
        """Nearest rank: the query that 95 % of the board's are no slower than."""
        return self.seconds[max(0, math.ceil(0.95 * len(self.seconds)) - 1)]

    @property
    def samples(self) -> int:
        return sum(q.samples for q in self.queries)

    def heaviest(self, n: int = 3) -> list[QueryFigures]:
        return sorted(self.queries, key=lambda q: -q.samples)[:n]

    def slowest(self, n: int = 3) -> list[QueryFigures]:
        return sorted(self.queries, key=lambda q: -q.seconds)[:n]

    def summary(self) -> dict[str, Any]:
        """What the JSON keeps of it: the figures, and its heaviest queries."""
        return {
            "board": self.board,
            "hours": self.hours,
            "queries": len(self.queries),
            "p50_seconds": self.p50_seconds,
            "p95_seconds": self.p95_seconds,
            "samples": self.samples,
            "heaviest": [asdict(q) for q in self.heaviest()],
            "slowest": [asdict(q) for q in self.slowest()],
            "failed": self.failed,
        }


@dataclass
class ScaleFigures:
    hosts: int
    workloads: int
    history: dict[str, float]
    head_series: int
    head_series_ours: int
    head_series_peer: int
    prometheus_rss_mb: float
    prometheus_heap_mb: float
    groups: list[GroupFigures]
    boards: list[dict[str, Any]]  # BoardFigures.summary()
    top_recorded: list[tuple[str, int]]
    # The alerts pending or firing at the end, by name and state: each writes a series every evaluation, and the
    # fleet's variations show in them (the straggler, the restart).
    alerts: dict[str, int]
    failing_targets: list[str]  # the targets whose last scrape failed, and why
    slowest_rules: list[tuple[str, str, float]] = field(default_factory=list)  # group, rule, seconds of its last run
    head_series_cluster: dict[str, int] = field(default_factory=dict)  # kube-state-metrics' and Kueue's, by job
    joins: dict[str, int] = field(default_factory=dict)  # cluster_joins()
    ledger_series: int = 0  # the bad-host ledger's records (tpuscope.alerts.nodes), every window and kind


# The bad-host ledger's records, and the share of the head its series may take: a node's topology labels
# ride on its sidecar's target, adding no series; the ledger adds a few per node and workload.
LEDGER_RECORDS = frozenset(r["record"] for r in nodes.evidence_rules(Thresholds()) + nodes.ledger_rules())
LEDGER_SHARE = 0.01


# What the cluster's exporters' series say of the fleet once scraped: whether they join with the sidecars' targets on
# the labels the platform rules join on, and hold every object. Each query counts what it names.
SIDECARS = f'up{{job="{OUR_JOB}"}}'
JOBS_OF_JOBSETS = (
    'label_replace(label_replace(kube_job_owner{owner_kind="JobSet"}, "controller", "$1", "job_name", "(.+)"), '
    '"jobset", "$1", "owner_name", "(.+)")'
)
# A node's pods that hold chips (its DaemonSets' run on every node, idle or not).
TPU_PODS = 'kube_pod_container_resource_requests{resource="google_com_tpu"}'
CLUSTER_JOINS = {
    "sidecars joined to their pod on their node": f"count({SIDECARS} * on (namespace, pod, node) kube_pod_info)",
    "sidecars joined to their Job of their JobSet": f"count({SIDECARS} * on (namespace, jobset, controller) "
    f"group_left () {JOBS_OF_JOBSETS})",
    "nodes of sidecars": f"count(kube_node_info * on (node) group by (node) ({SIDECARS}))",
    "nodes that run no pod": f"count(kube_node_info unless on (node) {TPU_PODS})",
    "node pools that run no pod": "count(count by (label_cloud_google_com_gke_nodepool) "
    f"(kube_node_labels unless on (node) {TPU_PODS}))",
    "chips of the nodes": 'sum(kube_node_status_capacity{resource="google_com_tpu"})',
    "chips the pods request": 'sum(kube_pod_container_resource_requests{resource="google_com_tpu"})',
    "ClusterQueues": "count(kueue_admitted_active_workloads)",
    "workloads admitted": "sum(kueue_admitted_active_workloads)",
}


def cluster_joins(api: PrometheusAPI) -> dict[str, int]:
    """:data:`CLUSTER_JOINS`, each what its query counts now (0 for none)."""
    return {
        what: int(float(answer[0]["value"][1])) if (answer := api.query(query)) else 0
        for what, query in CLUSTER_JOINS.items()
    }


def group_evaluations(api: PrometheusAPI, after: float, timeout: float) -> dict[tuple[str, str], list[float]]:
    """Each group's (file, group) evaluation seconds, ``EVALUATIONS`` of them that began ``after``: of every group,
    a slow one too, which may not have begun one yet when the others have all theirs."""
    seen: dict[tuple[str, str], dict[float, float]] = {}

    def enough() -> bool:
        groups = api.get("rules")["groups"]
        for group in groups:
            if (began := rule_files.instant(group["lastEvaluation"])) > after:
                seen.setdefault((group["file"], group["name"]), {})[began] = float(group["evaluationTime"])
        return len(seen) == len(groups) > 0 and all(len(times) >= EVALUATIONS for times in seen.values())

    wait_for(enough, timeout, f"{EVALUATIONS} evaluations of every group")
    return {key: [times[t] for t in sorted(times)][:EVALUATIONS] for key, times in seen.items()}


def slowest_rules(api: PrometheusAPI, n: int = 8) -> list[tuple[str, str, float]]:
    """The ``n`` rules whose last evaluation took longest: (group, the record or alert, seconds)."""
    rules = [
        (group["name"], rule.get("name", ""), float(rule.get("evaluationTime", 0.0)))
        for group in api.get("rules")["groups"]
        for rule in group["rules"]
    ]
    return sorted(rules, key=lambda rule: -rule[2])[:n]


def recorded_counts(api: PrometheusAPI, files: list[rule_files.RulesFile]) -> dict[str, int]:
    names = "|".join(sorted(set().union(*(f.records for f in files))))
    return {
        r["metric"]["__name__"]: int(r["value"][1]) for r in api.query(f'count by (__name__) ({{__name__=~"{names}"}})')
    }


def grafana_interval(range_seconds: int) -> int:
    """The step Grafana asks for: the range over the panel's data points, rounded, at least the scrape interval."""
    raw = max(range_seconds / MAX_DATA_POINTS, SCRAPE_SECONDS)
    return next((nice for bound, nice in NICE_INTERVALS if raw < bound), int(raw))


def substitute(expr: str, variables: dict[str, str], range_seconds: int, interval: int) -> str:
    """What Grafana sends at a step of ``interval`` seconds: its ``$__rate_interval`` is the step and a scrape, at
    least four scrapes."""
    rate_interval = max(interval + SCRAPE_SECONDS, 4 * SCRAPE_SECONDS)
    return grafana.substitute(expr, variables, range_seconds, interval, rate_interval)


def measure_board(api: PrometheusAPI, path: Path, hours: int, end: float) -> BoardFigures:
    """Every query of the board, as Grafana sends it with its variables' defaults over the last ``hours``."""
    board = json.loads(path.read_text())
    variables = grafana.variables(board, api.label_values).sent
    range_seconds = hours * 3600
    step = grafana_interval(range_seconds)
    figures = BoardFigures(board.get("title", path.stem), hours, [])
    for panel, expr, instant in grafana.queries(board):
        query = substitute(expr, variables, range_seconds, step)
        if instant:
            endpoint, parameters = "query", {"query": query, "time": end}
        else:
            endpoint, parameters = (
                "query_range",
                {"query": query, "start": end - range_seconds, "end": end, "step": step},
            )
        try:
            for _ in range(QUERY_ROUNDS):
                began = time.perf_counter()
                answer = api.get(endpoint, {**parameters, "stats": "all"})
                seconds = time.perf_counter() - began
        except PrometheusError as e:
            figures.failed.append(f"{panel}: {e}")
            continue
        samples = int(answer["stats"]["samples"]["totalQueryableSamples"])
        figures.queries.append(QueryFigures(panel, seconds, samples))
    return figures


def own_metrics(url: str) -> dict[str, float]:
    """Prometheus' own /metrics, the series this run reads: head series, resident and heap memory."""
    wanted = ("prometheus_tsdb_head_series", "process_resident_memory_bytes", "go_memstats_heap_inuse_bytes")
    text = text_of(f"{url}/metrics")
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name in wanted
    }


def with_interval(rules: rule_files.RulesFile, seconds: int, directory: Path) -> rule_files.RulesFile:
    """A copy of the file with every group evaluated every ``seconds``, as the generated ClusterRules say: a group of
    a slower pace of its own too (the SLO's slow windows), since one evaluation costs what it costs at any pace and
    waiting for its own would take minutes; :func:`group_intervals` says the pace it is judged against."""
    return rule_files.paced(rules, directory, f"{seconds}s")


def group_intervals(files: list[rule_files.RulesFile], seconds: int) -> dict[tuple[str, str], float]:
    """(file label, group) -> the seconds between the group's evaluations in a fleet: its own interval, scaled as
    ``seconds`` (the run's) is to the ClusterRules' 30 s, or ``seconds``."""
    return {
        (f.label, group["name"]): durations.prometheus_ms(str(group["interval"])) / 1000 * seconds / EVALUATION_SECONDS
        if "interval" in group
        else float(seconds)
        for f in files
        for group in yaml.safe_load(f.path.read_text())["groups"]
    }


@dataclass(frozen=True)
class Settings:
    board_hours: int = 6
    evaluation_seconds: int = EVALUATION_SECONDS  # shorter in the tests, which cannot wait 2 minutes
    # (file label, group) -> the interval a group is judged against, where it is not evaluation_seconds
    intervals: dict[tuple[str, str], float] = field(default_factory=dict)

    def ranges(self) -> list[int]:
        """The board ranges measured: those the history holds, else the history's whole length."""
        return [hours for hours in RANGES_HOURS if hours <= self.board_hours] or [self.board_hours]


def boards_read() -> frozenset[str]:
    """The series names the dashboards' queries read."""
    names = set()
    for path in sorted(DASHBOARDS.glob("*.json")):
        board = json.loads(path.read_text())
        sent = grafana.variables(board).sent
        for _, expr, _ in grafana.queries(board):
            names |= {read.name for read in rule_files.reads(substitute(expr, sent, 3600, 60))}
    return frozenset(names)


def measure(
    hosts: int, files: list[rule_files.RulesFile], ours: list[HostSeries], peer: list[HostSeries], settings: Settings,
    workdir: Path,
) -> ScaleFigures:  # fmt: skip
    fleet = Fleet.of(hosts, ours, peer)
    reads = rule_files.Reads.of(files)
    reach = Reach(reads, boards_read(), settings.board_hours * 3600)
    end = float(int(time.time()))
    print(f"  {hosts} hosts: probing what the rules record ...", flush=True)
    found = probe_recorded(fleet, files, reads, reach, end, workdir / "probe")
    # The recorded series, one per workload or so, go back as far as a rule reads them (3 days: the SLO windows), or
    # a board (the records only the boards read, such as the hour of restarts).
    timing = fleet_series.Timing(end, RECORDED_DAYS, SCRAPE_SECONDS, settings.evaluation_seconds)
    recorded = fleet_series.recorded_series(found, timing, reach.seconds)
    written = history(fleet, reach, recorded, end, workdir / "history")
    backfilled = {
        "series": written.series,
        "samples": written.samples,
        "seconds": round(written.seconds, 1),
        "parts": written.parts,
    }
    print(
        f"  {hosts} hosts: a TSDB of {written.series:,} series, {written.samples:,} samples ({written.parts} parts, "
        f"{written.seconds:.0f} s)",
        flush=True,
    )
    feed = fleet_series.Feed(Targets(fleet, end).render)
    try:
        with prometheus(workdir / "run", fleet, feed, SCRAPE_SECONDS, [f.path for f in files], written.path) as p:
            timeout = 20 * settings.evaluation_seconds + 600
            targets = len(list(fleet.targets()))
            # Scraped live: the history holds an `up` of every target too, which says nothing of this Prometheus.
            wait_for(lambda: len(p.query("scrape_samples_scraped")) == targets, timeout, f"{targets} targets scraped")
            evaluated = group_evaluations(p.api, time.time(), timeout)
            counts = recorded_counts(p.api, files)
            slow_rules = slowest_rules(p.api)
            own = own_metrics(p.url)
            joins = cluster_joins(p.api)
            # What the last scrapes of each job brought in: every host's series, whatever the rules add.
            scraped = p.query("sum by (job) (scrape_samples_scraped)")
            heads = {r["metric"]["job"]: int(float(r["value"][1])) for r in scraped}
            failing = sorted(
                f"{t['labels']['job']} {t['labels']['instance']}: {t['lastError']}"
                for t in p.api.get("targets")["activeTargets"]
                if t["lastError"]
            )
            alerts = {
                f"{a['metric']['alertname']} {a['metric']['alertstate']}": int(a["value"][1])
                for a in p.query("count by (alertname, alertstate) (ALERTS)")
            }
            api = PrometheusAPI(p.url, timeout=QUERY_TIMEOUT_SECONDS)
            now = time.time()
            boards = sorted(DASHBOARDS.glob("*.json"))
            measured_boards = [
                measure_board(api, path, hours, now).summary() for hours in settings.ranges() for path in boards
            ]
    finally:
        feed.close()
    groups = []
    for (file_path, group), times in sorted(evaluated.items()):
        rules = next(f for f in files if Path(file_path).resolve() == f.path.resolve())
        records = dict.fromkeys(r.name for r in rules.rules if r.group == group and r.record)
        measured = times[1:]  # the first warms up
        groups.append(
            GroupFigures(
                rules.label,
                group,
                settings.intervals.get((rules.label, group), settings.evaluation_seconds),
                statistics.median(measured),
                max(measured),
                sum(counts.get(name, 0) for name in records),
            )
        )
    return ScaleFigures(
        hosts,
        len({h.workload for h in fleet.hosts}),
        backfilled,
        int(own.get("prometheus_tsdb_head_series", 0)),
        heads[OUR_JOB],
        heads[PEER_JOB],
        own.get("process_resident_memory_bytes", 0) / 2**20,
        own.get("go_memstats_heap_inuse_bytes", 0) / 2**20,
        groups,
        measured_boards,
        sorted(counts.items(), key=lambda item: -item[1])[:10],
        alerts,
        failing,
        slow_rules,
        {job: heads[job] for job in fleet.cluster},
        joins,
        sum(counts.get(name, 0) for name in LEDGER_RECORDS),
    )


# --- The report -------------------------------------------------------------------------------------------


def report_lines(figures: list[ScaleFigures]) -> list[str]:
    lines = []
    for f in figures:
        lines += [
            "",
            f"{f.hosts} hosts, {f.workloads} workloads: head {f.head_series:,} series ({f.head_series_ours:,} ours, "
            f"{f.head_series_peer:,} node_exporter's{cluster_heads(f.head_series_cluster)}), Prometheus "
            f"{f.prometheus_rss_mb:,.0f} MiB resident ({f.prometheus_heap_mb:,.0f} MiB heap); history "
            f"{f.history['series']:,.0f} series, {f.history['samples']:,.0f} samples",
        ]
        if f.joins:
            lines.append("  the cluster's series: " + ", ".join(f"{what} {n:,}" for what, n in f.joins.items()))
        share = f.ledger_series / f.head_series
        lines.append(f"  the bad-host ledger: {f.ledger_series:,} series ({share:.2%} of the head)")
        rows = [["file", "group", "eval s (median)", "eval s (max)", "of interval", "series recorded"]]
        rows += [
            [
                g.file,
                g.group,
                f"{g.eval_seconds_median:.3f}",
                f"{g.eval_seconds_max:.3f}",
                f"{g.share:.1%}",
                f"{g.recorded_series:,}",
            ]
            for g in f.groups
        ]
        lines += ["  " + line for line in table(rows, right={2, 3, 4, 5})]
        lines += [f"  slow rule: {group} {rule}: {seconds:.3f} s" for group, rule, seconds in f.slowest_rules]
        rows = [["board", "range", "queries", "p50 s", "p95 s", "samples", "heaviest query"]]
        rows += [
            [
                b["board"],
                f"{b['hours']} h",
                str(b["queries"]),
                f"{b['p50_seconds']:.3f}",
                f"{b['p95_seconds']:.3f}",
                f"{b['samples']:,}",
                heaviest(b),
            ]
            for b in f.boards
        ]
        lines += ["  " + line for line in table(rows, right={2, 3, 4, 5})]
        lines += [
            f"  slow query: {b['board']} {b['hours']} h: {q['panel']}: {q['seconds']:.2f} s, {q['samples']:,} samples"
            for b in f.boards
            for q in b["slowest"]
            if q["seconds"] > 0.5
        ]
        lines += [f"  failed: {failure}" for b in f.boards for failure in b["failed"]]
        lines += [f"  target failing: {target}" for target in f.failing_targets]
    return lines


def cluster_heads(heads: dict[str, int]) -> str:
    """The cluster's exporters' part of the head, for the report's line: ``, N kube-state-metrics', M Kueue's``."""
    owners = {KSM_JOB: "kube-state-metrics'", KUEUE_JOB: "Kueue's"}
    return "".join(f", {n:,} {owners.get(job, job)}" for job, n in heads.items())


def markdown(scales: list[dict[str, Any]]) -> str:
    """docs/fleet.md's tables of a run (its JSON's ``scales``): per size, the storage, each group, each board."""
    lines = [
        "| hosts | workloads | head series (ours / node_exporter's / kube-state-metrics' / Kueue's) | "
        "Prometheus resident | history samples |",
        "|--:|--:|--:|--:|--:|",
    ]
    for f in scales:
        cluster = f.get("head_series_cluster", {})  # none in a run from before the cluster's exporters
        parts = [f["head_series_ours"], f["head_series_peer"], *(cluster.get(job, 0) for job in (KSM_JOB, KUEUE_JOB))]
        lines.append(
            f"| {f['hosts']:,} | {f['workloads']} | {f['head_series']:,} ({' / '.join(f'{n:,}' for n in parts)}) | "
            f"{f['prometheus_rss_mb']:,.0f} MiB | {f['history']['samples']:,.0f} |"
        )
    lines += ["", "| hosts | rules | group | eval s, median | eval s, most | of its interval | series recorded |"]
    lines.append("|--:|---|---|--:|--:|--:|--:|")
    for f in scales:
        for g in f["groups"]:
            share = g["eval_seconds_max"] / g["interval_seconds"]
            lines.append(
                f"| {f['hosts']:,} | {g['file']} | {g['group']} | {g['eval_seconds_median']:.3f} | "
                f"{g['eval_seconds_max']:.3f} | {share:.1%} | {g['recorded_series']:,} |"
            )
    lines += ["", "| hosts | board | range | queries | p50 s | p95 s | samples touched | heaviest query (samples, s) |"]
    lines.append("|--:|---|--:|--:|--:|--:|--:|---|")
    for f in scales:
        for b in f["boards"]:
            if b["queries"] and b["samples"]:
                lines.append(
                    f"| {f['hosts']:,} | {b['board'].split(' / ')[-1]} | {b['hours']} h | {b['queries']} | "
                    f"{b['p50_seconds']:.3f} | {b['p95_seconds']:.3f} | {b['samples']:,} | {heaviest(b)} |"
                )
    return "\n".join(lines)


def heaviest(board: dict[str, Any]) -> str:
    if not board["heaviest"]:
        return ""
    q = board["heaviest"][0]
    return f"{q['panel']}: {q['samples']:,} samples, {q['seconds']:.2f} s"


def checks(figures: list[ScaleFigures], host_series: int, budgets: Budgets) -> list[Check]:
    largest = max(figures, key=lambda f: f.hosts)
    worst = max((g for g in largest.groups if g.file == OUR_JOB), key=lambda g: g.share)
    longest = max((b["hours"] for b in largest.boards), default=0)
    boards = [b for b in largest.boards if b["hours"] == longest]
    slowest = max(boards, key=lambda b: float(b["p95_seconds"]))
    return [
        Check(
            "groups within their interval",
            worst.share <= budgets.group_share_of_interval,
            f"at {largest.hosts} hosts the most, {worst.group}: {worst.eval_seconds_max:.3f} s of "
            f"{worst.interval_seconds:g} s ({worst.share:.1%}; budget {budgets.group_share_of_interval:.0%})",
        ),
        Check(
            f"board queries p95 at {longest} h",
            slowest["p95_seconds"] <= budgets.board_p95_seconds and not any(b["failed"] for b in boards),
            f"at {largest.hosts} hosts the slowest board, {slowest['board']}: {slowest['p95_seconds']:.2f} s "
            f"(budget {budgets.board_p95_seconds:g} s)",
        ),
        Check(
            "the bad-host ledger's series",
            largest.ledger_series <= LEDGER_SHARE * largest.head_series,
            f"at {largest.hosts} hosts: {largest.ledger_series:,} of the head's {largest.head_series:,} "
            f"({largest.ledger_series / largest.head_series:.2%}; budget {LEDGER_SHARE:.0%})",
        ),
        Check(
            "series per host",
            host_series <= budgets.host_series,
            f"one sidecar of the recorded run: {host_series:,} (budget {budgets.host_series:,})",
        ),
    ]


def run(args: argparse.Namespace) -> int:
    if args.record_series:
        return record_series(args.record_series)
    ours = load_snapshot()
    peer = node_exporter_series()
    files = [rule_files.load_rules(f"{OUR_JOB}={args.rules or DEFAULT_RULES}")]
    if args.peer_rules:
        files.append(rule_files.load_rules(f"{PEER_JOB}={args.peer_rules}"))
    sizes = [int(n) for n in str(args.fleet_hosts).split(",")]
    # One history length for every size, or one each: 24 h of 1,000 hosts' board series is more than fits here.
    hours = [int(h) for h in str(args.board_hours).split(",")]
    if len(hours) not in (1, len(sizes)):
        raise SystemExit("fleet-scale: --board-hours takes one value, or one per --fleet-hosts size")
    hours *= len(sizes) // len(hours)
    print(
        f"fleet-scale: {', '.join(map(str, sizes))} hosts; one host serves {len(ours):,} series of ours and "
        f"{len(peer):,} of node_exporter's; rules: {', '.join(str(f.path) for f in files)}; dashboards' history "
        f"{args.board_hours} h",
        flush=True,
    )
    figures = []
    with tempfile.TemporaryDirectory(prefix="ts-fleet-scale-") as tmp:
        interval = int(durations.parse(args.interval))
        timed = [with_interval(f, interval, Path(tmp)) for f in files]
        intervals = group_intervals(files, interval)
        for hosts, board_hours in zip(sizes, hours, strict=True):
            settings = Settings(board_hours, interval, intervals)
            figures.append(measure(hosts, timed, ours, peer, settings, Path(tmp) / str(hosts)))
            print("\n".join(report_lines(figures[-1:])), flush=True)
    verdicts = checks(figures, len(ours), Budgets())
    print("\n".join(["", *check_lines(verdicts)]))
    failed = write_report(args.json or DEFAULT_JSON, {"scales": [asdict(f) for f in figures]}, verdicts)
    return 1 if failed else 0


# --- Recording the series set -----------------------------------------------------------------------------


def record_series(path: Path, steps: int = 300) -> int:
    """Run the fused workload with device profiles and 8 fake TPU chips, scrape its sidecar near the end, and write
    the scrape with the run's age as :data:`SNAPSHOT`'s format has it."""
    from tpuscope.testing.fake_tpu import Chip, FakeTpuRuntime, FakeTpuServer, default_megascale

    chips = FakeTpuRuntime([Chip(d, duty_cycle_percent=10.0 * d) for d in range(8)], default_megascale())
    with tempfile.TemporaryDirectory(prefix="ts-fleet-record-") as tmp, FakeTpuServer(chips) as runtime:
        listen = f"127.0.0.1:{free_port()}"
        env = {
            **os.environ,
            "XDG_RUNTIME_DIR": tmp,
            "TPU_RUNTIME_METRICS_PORTS": str(runtime.port),
            "XLA_FLAGS": "--xla_force_host_platform_device_count=8",
        }
        command = [
            sys.executable,
            "-m",
            "tpuscope",
            "workload",
            "--fused",
            f"--steps={steps}",
            "--profile-period=2s",
            f"--listen={listen}",
        ]
        command += [f"--run-dir={tmp}/run", "--linger=60"]
        started = time.time()
        job = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert job.stdout is not None
        for line in job.stdout:
            if "serves http" in line:  # the run is over; its sidecar lingers
                break
        text = text_of(f"http://{listen}/metrics")
        job.terminate()
        job.wait(timeout=60)
    uptime = round(time.time() - started)
    path.write_text(f"{SNAPSHOT_HEADER}{uptime}\n{text}")
    print(f"wrote {path}: {len(parse_exposition(text, uptime)):,} series")
    return 0
