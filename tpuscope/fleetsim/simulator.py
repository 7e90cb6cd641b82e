"""``tpuscope fleet-sim``: a fleet of simulated TPU hosts, each with its real sidecar, one real Prometheus
running the project's rules with time compressed; what that costs, and whether the alerts name the faults.

- N ``tpuscope serve`` processes, one per host, each with its own socket and port, labelled with the
  host's place in the fleet (``--slice``, ``--worker``), reading a fake TPU runtime of C chips with
  the libtpu collector and nothing else (no host collector: N sidecars share 2 cores here);
- the N fake runtimes (tpuscope/testing/fake_tpu.py), served from this process;
- the jobs (tpuscope/fleetsim/jobs.py), one process of a Monitor per host, hosts grouped into
  multi-slice workloads that step in lockstep; one host of the first workload becomes a straggler,
  the last workload stalls (a hung collective) for a while;
- Prometheus scraping every sidecar and evaluating the generated rules, time compressed K times
  (tpuscope/fleetsim/rules.py), which it writes into the run directory beside its configuration.

The run ends once both faults' alerts have fired and one (compressed) rate window more has passed, or
after ``--seconds``. It prints and writes (``--json``) Prometheus' cost (head series, ingest rate,
samples per scrape, rule evaluation time, scrape duration), the sidecars' memory and CPU, and which
straggler and which stalled workload the alerts named; it exits 1 when a check fails, above all when
TpuscopeStraggler did not name exactly the injected worker.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import psutil

from tpuscope import alerts, durations
from tpuscope.bench.memory import SIDECAR_RSS, status_mb
from tpuscope.bench.verdict import Check, check_lines, write_report
from tpuscope.conventions import STEPS_RATE, STRAGGLER_HISTORY, AlertName
from tpuscope.fleetsim import rules as fleet_rules
from tpuscope.fleetsim.jobs import Host, Plan
from tpuscope.generator_config import GeneratorConfig
from tpuscope.scrape import Scrape
from tpuscope.stats import percentile
from tpuscope.testing.fake_tpu import Chip, FakeTpuRuntime, FakeTpuServer, default_megascale
from tpuscope.testing.prometheus import PrometheusServer, target_of
from tpuscope.testing.waiting import wait_for
from tpuscope.workload import synthetic
from tpuscope.workload.sidecar import SidecarProcess

DEFAULT_JSON = Path("run/fleet.json")
JOB = "tpuscope"  # the scrape job PrometheusServer configures
RATE_WINDOW = "5m"  # the window of the recording rules the straggler alert reads, before compression
STRAGGLER_FOR = next(a.for_ for a in alerts.alerts(GeneratorConfig()) if a.name == AlertName.STRAGGLER)
# A rate over fewer scrapes than this is noise (two samples make a rate; four make a steady one).
SCRAPES_PER_WINDOW = 4
POLL_SECONDS = 1.0
COMPILE_SECONDS = 2.0  # each job's compile before its first step
SIDECARS_STARTING_AT_ONCE = 4  # each start imports tpuscope: two cores, a few at a time


@dataclass(frozen=True)
class Settings:
    hosts: int
    chips: int
    hosts_per_workload: int
    hosts_per_slice: int
    time_scale: float
    scrape_interval: float
    collector_interval: float
    step_seconds: float
    straggler_factor: float
    seconds: float
    seed: int

    @property
    def workloads(self) -> int:
        return self.hosts // self.hosts_per_workload

    def scaled(self, duration: str) -> float:
        """A duration of the real rules, in seconds of this run."""
        return durations.prometheus_ms(duration) / 1000 / self.time_scale


@dataclass
class Fleet:
    """The hosts, where their sidecars listen, and the faults."""

    hosts: list[Host]
    instances: list[str]  # each host's sidecar, as Prometheus' instance label names it
    straggler: int  # the index of the injected straggler
    stall_workload: str

    def identity(self, i: int) -> dict[str, str]:
        h = self.hosts[i]
        return {"workload": h.workload, "slice": h.slice, "worker": h.worker, "instance": self.instances[i]}


def layout(s: Settings, sockets: Path) -> tuple[list[Host], int, str]:
    """Workloads of ``hosts_per_workload`` hosts, each of slices of ``hosts_per_slice``: slice and worker
    as ``MEGASCALE_SLICE_ID`` and ``TPU_WORKER_ID`` would say. The straggler: a host of the first
    workload, drawn with ``seed``; the stall: the last workload."""
    hosts = []
    for i in range(s.hosts):
        workload, rank = divmod(i, s.hosts_per_workload)
        slice_, worker = divmod(rank, s.hosts_per_slice)
        hosts.append(Host(f"fleet-{workload:02d}", str(slice_), str(worker), str(sockets / f"h{i}.sock")))
    straggler = random.Random(s.seed).randrange(s.hosts_per_workload)
    hosts[straggler] = replace(hosts[straggler], straggler=True)
    return hosts, straggler, hosts[-1].workload


def validate(s: Settings, config: GeneratorConfig) -> str:
    """What is wrong with these settings, or ""."""
    if s.hosts_per_slice < 1 or s.hosts_per_workload % s.hosts_per_slice:
        return "--hosts-per-workload must be a multiple of --hosts-per-slice"
    if s.hosts_per_workload < 3:
        return "--hosts-per-workload must be at least 3 (a straggler is judged against its workload's median)"
    if s.hosts % s.hosts_per_workload or s.workloads < 2:
        return (
            "--hosts must be a multiple of --hosts-per-workload, at least two workloads: the straggler and the stall "
            "go into different ones"
        )
    if s.chips < 1 or s.time_scale <= 0 or s.scrape_interval <= 0 or s.step_seconds <= 0:
        return "--chips, --time-scale, --scrape-interval and --step-time must be positive"
    if s.straggler_factor <= config.thresholds.straggler_factor:
        bound = config.thresholds.straggler_factor
        return f"--straggler-factor must be above straggler_factor, the boards' straggler bound, {bound:g}"
    shortest = min(fleet_rules.ranges_ms(fleet_rules.scaled_groups(config, s.time_scale))) / 1000
    if shortest < SCRAPES_PER_WINDOW * s.scrape_interval:
        return (
            f"at --time-scale {s.time_scale:g} the shortest rate window is {shortest:g} s, under "
            f"{SCRAPES_PER_WINDOW} scrapes of {s.scrape_interval:g} s: lower the time scale or the scrape interval"
        )
    # The faults come after the compile and a window; the straggler alert needs a window, to be the straggler for
    # its chronic share of the history, and its for: more.
    chronic = s.scaled(STRAGGLER_HISTORY) * config.thresholds.straggler_chronic
    needed = COMPILE_SECONDS + 2 * s.scaled(RATE_WINDOW) + chronic + s.scaled(STRAGGLER_FOR)
    if s.seconds < needed:
        return f"--seconds {s.seconds:g} is too short to see the straggler named: at least {needed:g} at this scale"
    return ""


# --- the processes ---------------------------------------------------------------------------------------


def start_runtimes(s: Settings, stack: ExitStack) -> list[FakeTpuServer]:
    """A fake TPU runtime of ``chips`` chips per host, all in this process, each on its own port."""
    rng = random.Random(s.seed)
    servers = []
    for _ in range(s.hosts):
        chips = [
            Chip(d, duty_cycle_percent=rng.uniform(60, 80), hbm_used=int((16 << 30) * rng.uniform(0.7, 0.75)))
            for d in range(s.chips)
        ]
        servers.append(stack.enter_context(FakeTpuServer(FakeTpuRuntime(chips, default_megascale()))))
    return servers


def start_sidecars(
    s: Settings, hosts: list[Host], runtimes: list[FakeTpuServer], stack: ExitStack
) -> list[SidecarProcess]:
    """One ``tpuscope serve`` per host, a few starting at a time; all stopped together on exit."""

    def start(i: int) -> SidecarProcess:
        host = hosts[i]
        return SidecarProcess(
            Path(host.socket),
            "127.0.0.1:0",
            *("--collectors=libtpu", f"--libtpu-address={runtimes[i].address}"),
            *(f"--collector-interval={s.collector_interval:g}", f"--slice={host.slice}", f"--worker={host.worker}"),
            "--log-level=warning",
            timeout=60.0,
        )

    sidecars: list[SidecarProcess] = []
    stack.callback(_stop_all, sidecars)
    with ThreadPoolExecutor(SIDECARS_STARTING_AT_ONCE) as pool:
        futures = [pool.submit(start, i) for i in range(len(hosts))]
    failed = [e for future in futures if (e := future.exception()) is not None]
    sidecars.extend(future.result() for future in futures if future.exception() is None)  # stopped on exit
    if failed:
        raise RuntimeError(f"{len(failed)} of {len(hosts)} sidecars did not start: {failed[0]}")
    return sidecars


def _stop_all(sidecars: list[SidecarProcess]) -> None:
    """SIGTERM to every sidecar first, then wait for each: N sidecars stop in the time of one."""
    for sidecar in sidecars:
        if sidecar.proc.poll() is None:
            sidecar.proc.send_signal(signal.SIGTERM)
    for sidecar in sidecars:
        sidecar.stop()


@contextmanager
def jobs_process(plan: Plan, run_dir: Path) -> Iterator[subprocess.Popen[bytes]]:
    plan_path = run_dir / "plan.json"
    plan.dump(plan_path)
    with open(run_dir / "jobs.log", "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tpuscope.fleetsim.jobs", str(plan_path)], stdout=log, stderr=subprocess.STDOUT
        )
    try:
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# --- watching the run ------------------------------------------------------------------------------------


@dataclass
class Watch:
    """What polling Prometheus saw during the run: when each alert first fired, the slowest rule evaluations."""

    fired: dict[tuple[str, tuple[tuple[str, str], ...]], float] = field(default_factory=dict)
    rule_group_max_s: dict[str, float] = field(default_factory=dict)

    def poll(self, prom: PrometheusServer) -> None:
        now = time.time()
        for alert in prom.query('ALERTS{alertstate="firing"}'):
            labels = alert["metric"]
            key = (labels["alertname"], tuple(sorted((k, v) for k, v in labels.items() if k != "alertname")))
            self.fired.setdefault(key, now)
        for sample in _self_metrics(prom).find("prometheus_rule_group_last_duration_seconds"):
            group = _group_name(sample.labels["rule_group"])
            self.rule_group_max_s[group] = max(self.rule_group_max_s.get(group, 0.0), sample.value)

    def firings(self, alertname: str) -> list[tuple[dict[str, str], float]]:
        """Each series of ``alertname`` that fired (its labels) and when it first did, earliest first."""
        found = [(dict(labels), at) for (name, labels), at in self.fired.items() if name == alertname]
        return sorted(found, key=lambda item: item[1])


def _self_metrics(prom: PrometheusServer) -> Scrape:
    return Scrape.fetch(prom.url + "/metrics")


def _group_name(rule_group: str) -> str:
    """``/path/rules.yaml;tpuscope.recording`` -> ``tpuscope.recording``."""
    return rule_group.rpartition(";")[2]


def straggler_named(watch: Watch) -> list[dict[str, str]]:
    keys = ("workload", "slice", "worker", "instance")
    return [{k: labels.get(k, "") for k in keys} for labels, _ in watch.firings(AlertName.STRAGGLER)]


def _for_seconds(groups: list[dict[str, Any]], alertname: str) -> float:
    """How long ``alertname`` waits (its ``for:``) in these rule groups."""
    rule = next(rule for group in groups for rule in group["rules"] if rule.get("alert") == alertname)
    return durations.parse(rule.get("for", "0s"))


def stalled_named(watch: Watch) -> list[str]:
    return sorted({labels.get("workload", "") for labels, _ in watch.firings(AlertName.WORKLOAD_STALLED)})


def first_fired(watch: Watch, alertname: str, match: Callable[[dict[str, str]], bool]) -> float | None:
    return next((at for labels, at in watch.firings(alertname) if match(labels)), None)


# --- the figures -----------------------------------------------------------------------------------------


class CpuClock:
    """CPU seconds that processes used from a starting point, as a share of wall time (cores busy)."""

    def __init__(self, pids: dict[str, list[int]]) -> None:
        self.processes = {name: [psutil.Process(pid) for pid in group] for name, group in pids.items()}
        self.start = time.monotonic()
        self.begun = {name: self._cpu(group) for name, group in self.processes.items()}
        psutil.cpu_percent()  # starts the machine-wide count (the load average reads 0 in some containers)

    @staticmethod
    def _cpu(group: list[psutil.Process]) -> float:
        total = 0.0
        for process in group:
            try:
                times = process.cpu_times()
            except psutil.Error:
                continue
            total += times.user + times.system
        return total

    def cores(self) -> dict[str, float]:
        wall = time.monotonic() - self.start
        cores = {name: (self._cpu(group) - self.begun[name]) / wall for name, group in self.processes.items()}
        return {**cores, "machine": psutil.cpu_percent() / 100 * (psutil.cpu_count() or 1)}


def rss_mb(pids: list[int], key: str = "VmRSS") -> list[float]:
    """Each live process's resident memory (``VmHWM``: its peak), in MB."""
    return [mb for pid in pids if (mb := status_mb(pid, key)) is not None]


def measure(
    prom: PrometheusServer, groups: list[dict[str, Any]], window: float, appended_before: tuple[float, float]
) -> dict[str, Any]:
    """What Prometheus holds and what it cost, over the last ``window`` seconds."""
    w = f"{max(1, math.floor(window))}s"
    target = f'{{job="{JOB}"}}'
    scraped = [float(v) for series in prom.query(f"scrape_duration_seconds{target}[{w}]") for _, v in series["values"]]
    own = _self_metrics(prom)
    appended, at = own.present("prometheus_tsdb_head_samples_appended_total"), time.time()
    groups_last = {
        _group_name(s.labels["rule_group"]): s.value for s in own.find("prometheus_rule_group_last_duration_seconds")
    }
    missed = {
        _group_name(s.labels["rule_group"]): s.value for s in own.find("prometheus_rule_group_iterations_missed_total")
    }
    records = [rule["record"] for group in groups for rule in group["rules"] if "record" in rule]
    recorded = {}
    for name in records:
        workloads = [r["metric"].get("workload", "") for r in prom.query(f"count by (workload) ({name})")]
        recorded[name] = {"series": prom.scalar(f"count({name})") or 0.0, "workloads": sorted(workloads)}
    # up and scrape_* are Prometheus' own, a name with a colon a recording rule's (which may keep job): not served
    served = f'job="{JOB}", __name__!~"up|scrape_.+|.+:.+"'
    return {
        "targets": prom.scalar(f"count(up{target})") or 0.0,
        "targets_up": prom.scalar(f"count(up{target} == 1)") or 0.0,
        "scrapes": prom.scalar(f"sum(count_over_time(up{target}[{w}]))") or 0.0,
        "scrapes_failed": prom.scalar(f"sum(count_over_time(up{target}[{w}]) - sum_over_time(up{target}[{w}]))") or 0.0,
        "head_series": own.present("prometheus_tsdb_head_series"),
        "ingest_samples_per_second": (appended - appended_before[0]) / (at - appended_before[1]),
        "samples_per_scrape_per_target": prom.scalar(f"avg(scrape_samples_scraped{target})") or 0.0,
        "scrape_duration_seconds": {
            "p50": percentile(scraped, 0.5),
            "p99": percentile(scraped, 0.99),
            "max": max(scraped, default=0.0),
            "samples": len(scraped),
        },
        "scrape_interval_p99_seconds": max(
            (s.value for s in own.find("prometheus_target_interval_length_seconds", quantile="0.99")), default=math.nan
        ),
        "rule_groups": {
            name: {"last_seconds": last, "iterations_missed": missed.get(name, 0.0)}
            for name, last in sorted(groups_last.items())
        },
        "rule_groups_loaded": sorted(groups_last) == sorted(group["name"] for group in groups),
        "rule_eval_seconds_total": sum(groups_last.values()),
        "rule_evaluation_seconds": {
            s.labels["quantile"]: s.value for s in own.find("prometheus_rule_evaluation_duration_seconds")
        },
        "rule_evaluation_failures": own.present("prometheus_rule_evaluation_failures_total"),
        "labels": {
            "tpuscope_series": prom.scalar('count({__name__=~"tpuscope_.+"})') or 0.0,
            "served_series": prom.scalar(f"count({{{served}}})") or 0.0,
            "without_slice": prom.scalar(f'count({{{served}, slice=""}})') or 0.0,
            "without_worker": prom.scalar(f'count({{{served}, worker=""}})') or 0.0,
        },
        "recording_rules": recorded,
        "sidecar_rss_prometheus_mb": (prom.scalar(f"sum({SIDECAR_RSS}{target})") or 0.0) / 1e6,
    }


# --- the run ---------------------------------------------------------------------------------------------


def fleet_profile(s: Settings) -> synthetic.Profile:
    """Each host's step: mostly compute, a little input, a collective; a checkpoint every rate window."""
    return replace(
        synthetic.Profile(),
        step_seconds=s.step_seconds,
        io_share=0.05,
        compute_share=0.75,
        sync_share=0.10,  # the reduction itself; waiting for the slowest host comes on top
        compile_seconds=COMPILE_SECONDS,
        checkpoint_every=max(10, round(s.scaled(RATE_WINDOW) / s.step_seconds)),
        checkpoint_seconds=0.2,
        devices=s.chips,
    )


def simulate(s: Settings, config: GeneratorConfig, run_dir: Path, sockets: Path) -> dict[str, Any]:
    """Run the fleet (``validate`` has passed its settings); its figures (checks not yet made)."""
    groups = fleet_rules.scaled_groups(config, s.time_scale)
    rules_path = run_dir / "tpuscope-rules.yaml"
    rules_path.write_text(fleet_rules.scaled_rules_file(config, s.time_scale))
    hosts, straggler, stall_workload = layout(s, sockets)
    window = s.scaled(RATE_WINDOW)
    stall_after = fleet_rules.scaled_config(config, s.time_scale).thresholds.stall_seconds
    stall_for = _for_seconds(groups, AlertName.WORKLOAD_STALLED)
    profile = fleet_profile(s)
    with ExitStack() as stack:
        started = time.monotonic()
        runtimes = start_runtimes(s, stack)
        sidecars = start_sidecars(s, hosts, runtimes, stack)
        fleet = Fleet(hosts, [target_of(sidecar.url) for sidecar in sidecars], straggler, stall_workload)
        print(f"  {s.hosts} sidecars up in {time.monotonic() - started:.0f} s; sockets and logs in {sockets}")
        prom_dir = run_dir / "prometheus"
        interval = f"{s.scrape_interval:g}s"
        prom = stack.enter_context(PrometheusServer(prom_dir, fleet.instances, interval, rule_files=[rules_path]))
        print(f"  Prometheus {prom.url}: configuration {prom_dir / 'prometheus.yml'}, rules {rules_path}")
        up = f'count(up{{job="{JOB}"}} == 1)'
        wait_for(lambda: (prom.scalar(up) or 0) == s.hosts, 30 + 2 * s.scrape_interval, "scrape of every sidecar up")

        # Faults once every job has compiled and the rate windows hold steady steps.
        begin = time.time()
        faults_at = begin + profile.compile_seconds + window
        # Long enough for the alert to fire: its threshold, its for: and a margin for the scrapes.
        stall_until = faults_at + stall_after + stall_for + max(4 * s.scrape_interval, stall_after / 2)
        plan = Plan(hosts, profile, s.straggler_factor, faults_at, stall_workload, faults_at, stall_until, s.seed)
        jobs = stack.enter_context(jobs_process(plan, run_dir))
        cpu = CpuClock(
            {
                "sidecars": [sidecar.proc.pid for sidecar in sidecars],
                "prometheus": [prom.proc.pid],
                "jobs": [jobs.pid],
                "fake runtimes and fleet-sim": [os.getpid()],
            }
        )
        injected = fleet.identity(fleet.straggler)
        print(
            f"  straggler from {faults_at - begin:.0f} s: {_who(injected)} at {s.straggler_factor:g}x compute; "
            f"{stall_workload} stalls from {faults_at - begin:.0f} s to {stall_until - begin:.0f} s",
            flush=True,
        )
        watch, appended_before = watch_run(prom, jobs, fleet, begin, faults_at, begin + s.seconds, window)
        end = time.time()
        figures = measure(prom, groups, end - appended_before[1], appended_before)
        for name, group in figures["rule_groups"].items():  # the slowest evaluation seen, besides the last
            group["max_seconds"] = max(watch.rule_group_max_s.get(name, 0.0), group["last_seconds"])
        figures["rule_eval_seconds_total_max"] = sum(group["max_seconds"] for group in figures["rule_groups"].values())
        sidecar_pids = [sidecar.proc.pid for sidecar in sidecars]
        sidecar_rss = rss_mb(sidecar_pids)
        figures["resources"] = {
            "cores_busy": cpu.cores(),
            "sidecar_rss_mb_total": sum(sidecar_rss),
            "sidecar_rss_mb_max": max(sidecar_rss, default=0.0),
            "sidecar_peak_rss_mb_max": max(rss_mb(sidecar_pids, "VmHWM"), default=0.0),
            "prometheus_rss_mb": sum(rss_mb([prom.proc.pid])),
        }
    stalled_at = first_fired(watch, AlertName.WORKLOAD_STALLED, lambda labels: labels.get("workload") == stall_workload)
    straggler_at = first_fired(
        watch, AlertName.STRAGGLER, lambda labels: labels.get("instance") == injected["instance"]
    )
    return {
        "hosts": s.hosts,
        "chips": s.chips,
        "workloads": s.workloads,
        "hosts_per_workload": s.hosts_per_workload,
        "hosts_per_slice": s.hosts_per_slice,
        "time_scale": s.time_scale,
        "scrape_interval_seconds": s.scrape_interval,
        "collector_interval_seconds": s.collector_interval,
        "step_seconds": s.step_seconds,
        "started_at": begin,
        "ended_at": end,
        "seconds": end - begin,
        "measured_seconds": end - appended_before[1],
        "rules_file": str(rules_path),
        "prometheus_config": str(prom_dir / "prometheus.yml"),
        **figures,
        "straggler": {
            "injected": injected,
            "factor": s.straggler_factor,
            "injected_after_seconds": faults_at - begin,
            "fired": straggler_at is not None,
            "named": straggler_named(watch),
            "time_to_fire_seconds": None if straggler_at is None else straggler_at - faults_at,
            "time_to_fire_unscaled_seconds": None
            if straggler_at is None
            else (straggler_at - faults_at) * s.time_scale,
        },
        "stall": {
            "workload": stall_workload,
            "from_seconds": faults_at - begin,
            "until_seconds": stall_until - begin,
            "threshold_seconds": stall_after,
            "for_seconds": stall_for,
            "fired": stalled_at is not None,
            "named": stalled_named(watch),
            "time_to_fire_seconds": None if stalled_at is None else stalled_at - faults_at,
        },
        "alerts_fired": _alerts_fired(watch),
    }


def watch_run(
    prom: PrometheusServer,
    jobs: subprocess.Popen[bytes],
    fleet: Fleet,
    begin: float,
    faults_at: float,
    deadline: float,
    window: float,
) -> tuple[Watch, tuple[float, float]]:
    """Poll Prometheus until the alerts have named the faults (and a window more) or the deadline; what was
    seen, and Prometheus' count of samples appended when the faults began (the measured window's start)."""
    watch = Watch()
    appended_before = (0.0, 0.0)
    last_report = 0.0
    while True:
        now = time.time()
        if jobs.poll() is not None:
            raise RuntimeError(f"the jobs process exited with {jobs.returncode}: see its jobs.log")
        if not appended_before[1] and (now >= faults_at or now + POLL_SECONDS >= deadline):
            appended_before = (_self_metrics(prom).present("prometheus_tsdb_head_samples_appended_total"), now)
        watch.poll(prom)
        if now - last_report >= 10:
            firing = sorted({name for name, _ in watch.fired})
            print(f"  {now - begin:4.0f} s  fired so far: {', '.join(firing) or 'none'}", flush=True)
            last_report = now
        done = _done_at(watch, fleet, window)
        if (done is not None and now >= done) or now >= deadline:
            return watch, appended_before
        time.sleep(POLL_SECONDS)


def _done_at(watch: Watch, fleet: Fleet, window: float) -> float | None:
    """When the run has shown what it is for: both alerts fired, then one rate window more, in which a
    wrongly named straggler would show too."""
    stalled = first_fired(
        watch, AlertName.WORKLOAD_STALLED, lambda labels: labels.get("workload") == fleet.stall_workload
    )
    straggler = first_fired(watch, AlertName.STRAGGLER, lambda _: True)
    if stalled is None or straggler is None:
        return None
    return max(stalled, straggler) + window


def _alerts_fired(watch: Watch) -> dict[str, list[str]]:
    """Every alert that fired, with whom it named (a workload, a worker, an instance)."""
    named: dict[str, set[str]] = {}
    for (name, labels), _ in watch.fired.items():
        named.setdefault(name, set()).add(_who(dict(labels)))
    return {name: sorted(whom) for name, whom in sorted(named.items())}


def _who(labels: dict[str, str]) -> str:
    """``fleet-00 slice 1 worker 2 (127.0.0.1:4321)``, as much of it as the labels say."""
    parts = [labels.get("workload", "")]
    if "worker" in labels:
        parts.append(f"slice {labels.get('slice', '')} worker {labels['worker']}")
    if "instance" in labels:
        parts.append(f"({labels['instance']})")
    return " ".join(part for part in parts if part)


# --- the verdict -----------------------------------------------------------------------------------------


def checks(f: dict[str, Any]) -> list[Check]:
    straggler, stall, labels = f["straggler"], f["stall"], f["labels"]
    steps = f["recording_rules"].get(STEPS_RATE, {"series": 0, "workloads": []})
    missed = sum(group["iterations_missed"] for group in f["rule_groups"].values())
    return [
        Check(
            "every target up",
            f["targets"] == f["targets_up"] == f["hosts"] and f["scrapes_failed"] == 0,
            f"{f['targets_up']:.0f} of {f['hosts']} up; {f['scrapes_failed']:.0f} of {f['scrapes']:.0f} scrapes failed",
        ),
        Check(
            "straggler named exactly",
            straggler["named"] == [straggler["injected"]],
            f"injected {_who(straggler['injected'])}; named "
            + (", ".join(_who(who) for who in straggler["named"]) or "nobody"),
        ),
        Check(
            "stall named",
            stall["named"] == [stall["workload"]],
            f"stalled {stall['workload']}; named {', '.join(stall['named']) or 'nobody'}",
        ),
        Check(
            "every series has slice, worker",
            labels["served_series"] > 0 and labels["without_slice"] == labels["without_worker"] == 0,
            f"{labels['served_series']:,.0f} series served; {labels['without_slice']:.0f} without slice, "
            f"{labels['without_worker']:.0f} without worker",
        ),
        Check(
            "per-workload rules aggregate",
            steps["series"] == f["workloads"] == len(steps["workloads"]),
            f"{STEPS_RATE}: {steps['series']:.0f} series for {f['workloads']} workloads",
        ),
        Check(
            "rules loaded and keep up",
            f["rule_groups_loaded"] and f["rule_evaluation_failures"] == 0 and missed == 0,
            f"groups {', '.join(f['rule_groups']) or 'none'}; {f['rule_evaluation_failures']:.0f} evaluations "
            f"failed, {missed:.0f} iterations missed",
        ),
    ]


def table(f: dict[str, Any], results: list[Check]) -> str:
    scrape, res, straggler, stall = f["scrape_duration_seconds"], f["resources"], f["straggler"], f["stall"]
    cores = ", ".join(f"{name} {busy:.2f}" for name, busy in res["cores_busy"].items())
    quantiles = ", ".join(f"p{float(q) * 100:g} {v * 1000:.1f} ms" for q, v in f["rule_evaluation_seconds"].items())
    lines = [
        f"Fleet: {f['hosts']} hosts x {f['chips']} chips, {f['workloads']} workloads of {f['hosts_per_workload']} "
        f"(slices of {f['hosts_per_slice']}); time compressed {f['time_scale']:g}x; scrape and evaluation every "
        f"{f['scrape_interval_seconds']:g} s; {f['seconds']:.0f} s run, {f['measured_seconds']:.0f} s measured",
        f"  targets up            {f['targets_up']:.0f} of {f['hosts']} ({f['scrapes_failed']:.0f} of "
        f"{f['scrapes']:.0f} scrapes failed)",
        f"  head series           {f['head_series']:,.0f}",
        f"  ingest                {f['ingest_samples_per_second']:,.0f} samples/s "
        f"({f['samples_per_scrape_per_target']:,.0f} samples per scrape per target)",
        f"  scrape duration       p50 {scrape['p50'] * 1000:.1f} ms, p99 {scrape['p99'] * 1000:.1f} ms, max "
        f"{scrape['max'] * 1000:.1f} ms; scrape interval p99 {f['scrape_interval_p99_seconds']:.2f} s",
    ]
    for name, group in f["rule_groups"].items():
        lines.append(
            f"  rule group            {name}: {group['last_seconds'] * 1000:.1f} ms last evaluation, "
            f"{group['max_seconds'] * 1000:.1f} ms the slowest; {group['iterations_missed']:.0f} iterations missed"
        )
    lines += [
        f"  rule groups, total    {f['rule_eval_seconds_total'] * 1000:.1f} ms last evaluation, "
        f"{f['rule_eval_seconds_total_max'] * 1000:.1f} ms the slowest; each rule: {quantiles}",
        f"  sidecar RSS           {res['sidecar_rss_mb_total']:,.0f} MB in all, {res['sidecar_rss_mb_max']:.1f} MB at "
        f"most ({res['sidecar_peak_rss_mb_max']:.1f} MB peak); Prometheus {res['prometheus_rss_mb']:.0f} MB",
        f"  cores busy            {cores} (of {psutil.cpu_count()})",
        f"  straggler             injected {_who(straggler['injected'])} x{straggler['factor']:g}; "
        + (
            f"fired after {straggler['time_to_fire_seconds']:.0f} s "
            f"({straggler['time_to_fire_unscaled_seconds'] / 60:.1f} min unscaled)"
            if straggler["fired"]
            else "did not fire"
        ),
        f"  stall                 {stall['workload']} for {stall['until_seconds'] - stall['from_seconds']:.0f} s "
        f"(alert from {stall['threshold_seconds']:g} s and {stall['for_seconds']:g} s more); "
        + (f"fired after {stall['time_to_fire_seconds']:.0f} s" if stall["fired"] else "did not fire"),
        "  alerts fired          "
        + ("; ".join(f"{name}: {len(who)}" for name, who in f["alerts_fired"].items()) or "none"),
    ]
    lines += check_lines(results, 32)
    return "\n".join(lines)


def settings(args: argparse.Namespace) -> Settings:
    return Settings(
        hosts=args.hosts,
        chips=args.chips,
        hosts_per_workload=args.hosts_per_workload,
        hosts_per_slice=args.hosts_per_slice,
        time_scale=args.time_scale,
        scrape_interval=args.scrape_interval,
        collector_interval=args.collector_interval,
        step_seconds=args.step_time,
        straggler_factor=args.straggler_factor,
        seconds=args.seconds,
        seed=args.seed,
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Start a real sidecar per simulated host (a fake TPU runtime of --chips chips each), jobs stepping in "
        "lockstep workloads through a Monitor per host, and a real Prometheus scraping them all with the generated "
        "rules, every duration in them divided by --time-scale. One host straggles, one workload stalls. Prints and "
        "writes (--json) what Prometheus and the sidecars cost and what the alerts named; exits 1 when "
        f"{AlertName.STRAGGLER} does not name exactly the injected worker (docs/bench.md)."
    )
    parser.add_argument("--hosts", type=int, default=16, help="simulated hosts, one sidecar each (default %(default)s)")
    parser.add_argument("--chips", type=int, default=4, help="TPU chips per host (default %(default)s)")
    parser.add_argument(
        "--hosts-per-workload", type=int, default=8, help="hosts of one lockstep job (default %(default)s)"
    )
    parser.add_argument(
        "--hosts-per-slice", type=int, default=4, help="hosts per slice of a workload (default %(default)s)"
    )
    parser.add_argument(
        "--time-scale",
        type=float,
        default=10.0,
        help="divide every range, offset and for: of the rules, and the thresholds that are times, by this "
        "(default %(default)s: 5m windows of 30 s)",
    )
    parser.add_argument(
        "--scrape-interval",
        type=float,
        default=2.0,
        help="Prometheus' scrape and evaluation interval, seconds (default %(default)s)",
    )
    parser.add_argument(
        "--collector-interval", type=float, default=5.0, help="the sidecars' libtpu interval (default %(default)s)"
    )
    parser.add_argument("--step-time", type=float, default=0.5, help="mean step time, seconds (default %(default)s)")
    parser.add_argument(
        "--straggler-factor",
        type=float,
        default=1.5,
        help="the straggler's compute time over its peers' (default %(default)s)",
    )
    parser.add_argument(
        "--seconds", type=float, default=600.0, help="the longest the run may take (default %(default)s)"
    )
    parser.add_argument("--seed", type=int, default=0, help="picks the straggler and the jitter (default %(default)s)")
    parser.add_argument(
        "--run-dir",
        type=Path,
        default=Path("run/fleet"),
        help="Prometheus' configuration, rules and data, the jobs' plan and log (default %(default)s)",
    )
    parser.add_argument("--json", type=Path, help=f"where the JSON report goes (default {DEFAULT_JSON})")


def main(args: argparse.Namespace) -> int:
    s, config = settings(args), GeneratorConfig()
    if problem := validate(s, config):
        print(f"tpuscope fleet-sim: {problem}", file=sys.stderr)
        return 2
    run_dir: Path = args.run_dir.resolve()  # absolute, for the paths the run prints and reports
    shutil.rmtree(run_dir / "prometheus", ignore_errors=True)  # a previous run's data would answer the queries
    run_dir.mkdir(parents=True, exist_ok=True)
    print(
        f"tpuscope fleet-sim: {s.hosts} hosts x {s.chips} chips, time compressed {s.time_scale:g}x, "
        f"at most {s.seconds:g} s; run directory {run_dir}",
        flush=True,
    )
    # Short, for the socket paths (Unix sockets stop at 108 bytes); kept when the run fails, for the sidecars' logs.
    sockets = Path(tempfile.mkdtemp(prefix="ts-fleet-"))
    try:
        figures = simulate(s, config, run_dir, sockets)
    except (RuntimeError, TimeoutError) as e:  # a sidecar, Prometheus or the jobs failed: their logs say why
        print(f"tpuscope fleet-sim: {e}; the sidecars' logs are in {sockets}, the jobs' in {run_dir}", file=sys.stderr)
        return 1
    results = checks(figures)
    print(table(figures, results), flush=True)
    failed = write_report(args.json or DEFAULT_JSON, figures, results)
    if failed:
        print(f"FAILED: {', '.join(failed)}; the sidecars' logs are in {sockets}, the jobs' in {run_dir}")
        return 1
    shutil.rmtree(sockets, ignore_errors=True)
    print("PASSED: every target up, the straggler and the stalled workload named, nothing else")
    return 0
