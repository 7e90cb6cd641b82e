"""tpuscope's rules on VictoriaMetrics, beside Prometheus, from the same sidecars (docs/fleet.md).

Six real sidecars on fake TPU runtimes serve four simulated workloads (tpuscope/fleetsim/jobs.py). Prometheus
scrapes them and evaluates the generated rules time compressed K times (tpuscope/fleetsim/rules.py); vmagent
scrapes the same sidecars into victoria-metrics, where vmalert evaluates the same rules file and writes the
recording rules' results back. Then the faults of the detection scenarios, all at once:

- a straggler: one of fleet-00's three hosts computes 1.5x as long (TpuscopeStraggler, naming it);
- a stall: fleet-01's collective hangs, its process still connected (TpuscopeWorkloadStalled);
- a crash: the job process of ``crash`` is killed; its sidecar books it vanished (TpuscopeWorkloadFailed),
  and it stays down (TpuscopeWorkloadDown; the goodput burn of that downtime is the page's, and
  TpuscopeGoodputBudgetBurn stays quiet over it: tests/alert_cases_clusters.py);
- a vanished pod: the sidecar of ``gone`` and its job killed, its target gone from both engines' discovery
  (TpuscopeWorkloadDown, from what the rules remember of it).

Both engines must fire the same alerts with the same labels; the test prints when each fired on each.
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from conftest import require

from tpuscope.conventions import AlertName
from tpuscope.fleetsim import simulator as fleet
from tpuscope.fleetsim.jobs import Host, Plan
from tpuscope.fleetsim.rules import scaled_rules_file
from tpuscope.generator_config import GeneratorConfig
from tpuscope.testing.prometheus import PrometheusServer, target_of
from tpuscope.testing.victoriametrics import (
    PROMPT_QUERY_FLAGS,
    VMALERT_FLAGS,
    VictoriaMetricsServer,
    VMAgent,
    VMAlert,
)
from tpuscope.testing.waiting import wait_for
from tpuscope.workload.sidecar import SidecarProcess

pytestmark = pytest.mark.long

K = 60.0  # the fast goodput burn looks 2 hours back: 2 minutes here
SCRAPE = 1.0  # the shortest rate window (5m) is 5 s: five scrapes
STRAGGLE, STALL, CRASH, GONE = "fleet-00", "fleet-01", "crash", "gone"
STRAGGLER_WORKER = "1"
SETTINGS = fleet.Settings(
    hosts=6,
    chips=2,
    hosts_per_workload=3,
    hosts_per_slice=3,
    time_scale=K,
    scrape_interval=SCRAPE,
    collector_interval=5.0,
    step_seconds=0.5,
    straggler_factor=1.5,
    seconds=240.0,
    seed=0,
)
# Two hours (compressed) after the jobs start the fast burn may fire: its window and its offset, and its for:.
BURN_AFTER = 2 * 3600 / K
# The faults, once every recording rule's series exists on both engines. A series vmalert writes for the first
# time reaches its own queries about 10 s later (measured): the straggler's chain of three recording rules
# (per-worker mean, workload median, ratio) takes half a minute to fill on VictoriaMetrics, a second on
# Prometheus, whose rules read their group's earlier results at once.
WARM_UP = 40.0
NEW_SERIES_LAG = 10.0
HOPS = 3  # the most series a fault's alert reads that the fault itself creates (crash: failures, grown1h)
# but the bad-host ticket's: the evidence now, its day's and week's ledger, the suspect nodes
HOPS_OF = {AlertName.NODE_SUSPECT: 4}
SETTLE = 6.0  # seconds every alert has, once one engine fired it, to fire on the other
ENGINES = ("prometheus", "victoriametrics")

Key = tuple[str, tuple[tuple[str, str], ...]]  # an alert: its name and its labels


def layout(sockets: Path) -> list[Host]:
    """fleet-00: three hosts, worker 1 the straggler; then one host each for the stall, the crash, the pod gone."""
    straggle = [
        Host(STRAGGLE, "0", str(w), str(sockets / f"s{w}.sock"), straggler=str(w) == STRAGGLER_WORKER) for w in range(3)
    ]
    return straggle + [Host(name, "0", "0", str(sockets / f"{name}.sock")) for name in (STALL, CRASH, GONE)]


@dataclass
class Firings:
    """When each alert first fired on each engine, and what the engines said besides."""

    at: dict[str, dict[Key, float]] = field(default_factory=lambda: {engine: {} for engine in ENGINES})

    def see(self, engine: str, alerts: list[dict[str, Any]]) -> None:
        now = time.time()
        for alert in alerts:
            if alert["state"] == "firing":
                labels = alert["labels"]
                key = (labels["alertname"], tuple(sorted((k, v) for k, v in labels.items() if k != "alertname")))
                self.at[engine].setdefault(key, now)

    def first(self, engine: str, alertname: str, **labels: str) -> float | None:
        found = [
            at for (name, have), at in self.at[engine].items() if name == alertname and labels.items() <= set(have)
        ]
        return min(found, default=None)


# The alerts the faults must raise, each by the labels that say whom it names.
EXPECTED: list[tuple[str, dict[str, str]]] = [
    (AlertName.STRAGGLER, {"workload": STRAGGLE, "worker": STRAGGLER_WORKER}),
    (AlertName.WORKLOAD_STALLED, {"workload": STALL}),
    (AlertName.WORKLOAD_FAILED, {"workload": CRASH, "reason": "vanished"}),
    (AlertName.WORKLOAD_DOWN, {"workload": CRASH}),
    (AlertName.WORKLOAD_DOWN, {"workload": GONE}),
    # Every sidecar here runs on one machine, the straggler's and the crashed job's: two workloads' evidence there.
    (AlertName.NODE_SUSPECT, {"node": "127.0.0.1"}),
]


@dataclass
class Run:
    firings: Firings
    faults_at: float
    ended_at: float
    injected: dict[str, str]  # the straggler's labels
    rule_errors: dict[str, str]


def _up(server: PrometheusServer | VictoriaMetricsServer, count: int) -> bool:
    result = server.query('count(up{job="tpuscope"} == 1)')
    return bool(result) and float(result[0]["value"][1]) == count


def _all_fired(firings: Firings) -> bool:
    return all(firings.first(engine, name, **labels) is not None for engine in ENGINES for name, labels in EXPECTED)


def _vanish(sidecar: SidecarProcess, job: subprocess.Popen[bytes]) -> None:
    """A pod gone with its node: the sidecar first (so that it books nothing of the job's end), then the job."""
    sidecar.proc.send_signal(signal.SIGKILL)
    job.send_signal(signal.SIGKILL)
    sidecar.proc.wait()
    job.wait()


def run_faults(workdir: Path, sockets: Path) -> Run:
    config = GeneratorConfig()
    assert fleet.validate(SETTINGS, config) == ""
    rules = workdir / "rules.yaml"
    rules.write_text(scaled_rules_file(config, K))
    hosts = layout(sockets)
    interval = f"{SCRAPE:g}s"
    profile = fleet.fleet_profile(SETTINGS)
    firings = Firings()
    with ExitStack() as stack:
        runtimes = fleet.start_runtimes(SETTINGS, stack)
        sidecars = fleet.start_sidecars(SETTINGS, hosts, runtimes, stack)
        targets = [target_of(sidecar.url) for sidecar in sidecars]
        prom = stack.enter_context(
            PrometheusServer(workdir / "prometheus", targets, interval, rule_files=[rules], discovered=True)
        )
        vm = stack.enter_context(VictoriaMetricsServer(workdir / "victoria-metrics", PROMPT_QUERY_FLAGS))
        agent = stack.enter_context(VMAgent(workdir / "vmagent", targets, vm.write_url, interval, discovered=True))
        vmalert = stack.enter_context(
            VMAlert(workdir / "vmalert", [rules], vm.url, vm.write_url, interval, [*VMALERT_FLAGS])
        )
        wait_for(lambda: _up(prom, len(hosts)) and _up(vm, len(hosts)), 60, "scrape of every sidecar by both engines")

        begin = time.time()
        faults_at = begin + WARM_UP
        stalled = Plan(hosts[:4], profile, SETTINGS.straggler_factor, faults_at, STALL, faults_at, faults_at + 3600)
        jobs = {
            "steady": stack.enter_context(fleet.jobs_process(stalled, _mkdir(workdir / "jobs-steady"))),
            CRASH: stack.enter_context(fleet.jobs_process(Plan(hosts[4:5], profile), _mkdir(workdir / "jobs-crash"))),
            GONE: stack.enter_context(fleet.jobs_process(Plan(hosts[5:6], profile), _mkdir(workdir / "jobs-gone"))),
        }
        faulted = False

        def settled() -> bool:
            """One round: the faults once it is time, then what each engine fires; whether every expected alert
            fired on both and the latest at least SETTLE ago."""
            nonlocal faults_at, faulted
            if not faulted and time.time() >= faults_at:
                jobs[CRASH].send_signal(signal.SIGKILL)
                _vanish(sidecars[5], jobs[GONE])
                prom.discover(targets[:5])
                agent.discover(targets[:5])
                faults_at, faulted = time.time(), True
            firings.see("prometheus", prom.api.get("alerts")["alerts"])
            firings.see("victoriametrics", vmalert.alerts())
            return _all_fired(firings) and time.time() - max(_latest(firings)) >= SETTLE

        # Two rounds a second: when each alert first fired is known to that, without taking the engines' CPU.
        wait_for(
            settled,
            begin + BURN_AFTER + WARM_UP + 30 - time.time(),
            "every expected alert fired on both engines",
            detail=lambda: _table(Run(firings, faults_at, time.time(), {}, vmalert.rule_errors())),
            interval=0.5,
        )
        straggler = hosts[int(STRAGGLER_WORKER)]
        injected = {"workload": straggler.workload, "worker": straggler.worker, "instance": targets[1]}
        return Run(firings, faults_at, time.time(), injected, vmalert.rule_errors())


def _latest(firings: Firings) -> list[float]:
    return [at for engine in ENGINES for at in firings.at[engine].values()]


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def _table(run: Run) -> str:
    keys = sorted(set(run.firings.at["prometheus"]) | set(run.firings.at["victoriametrics"]))
    lines = [f"{'alert':<60} {'prometheus':>11} {'victoriametrics':>16}   (seconds after the faults)"]
    for name, labels in keys:
        named = dict(labels)
        who = f"{name}{{workload={named.get('workload', '')}, severity={named.get('severity', '')}"
        who += f", worker={named['worker']}" if "worker" in named else ""
        who += f", reason={named['reason']}" if "reason" in named else ""
        cells = [run.firings.at[e].get((name, labels)) for e in ENGINES]
        text = [f"{at - run.faults_at:.0f}" if at is not None else "-" for at in cells]
        lines.append(f"{who + '}':<60} {text[0]:>11} {text[1]:>16}")
    return "\n".join(lines)


@pytest.fixture(scope="module")
def faults(module_tmp: Path) -> Iterator[Run]:
    for binary in ("prometheus", "victoria-metrics", "vmagent", "vmalert"):
        require(binary)
    sockets = module_tmp / "sockets"
    sockets.mkdir()
    run = run_faults(module_tmp, sockets)
    print(_table(run))
    yield run


@pytest.mark.timeout(420)
def test_the_faults_raise_the_same_alerts_on_victoriametrics_as_on_prometheus(faults: Run) -> None:
    for engine in ENGINES:
        for name, labels in EXPECTED:
            assert faults.firings.first(engine, name, **labels) is not None, (engine, name, labels, _table(faults))
    assert faults.rule_errors == {}
    # The same alerts, with the same labels: all that fired on one engine long enough ago to fire on the other.
    # Not TpuscopeExporterDown, unless a fault causes it: it reads `up`, and each engine scrapes for itself
    # (Prometheus, vmagent), so a scrape that timed out on one under load is that scraper's, not the rules' (a
    # fresh-clone run fired it on Prometheus alone, 6 s after the faults, with every sidecar up).
    expected = {name for name, _ in EXPECTED}
    own_scrapes = set() if AlertName.EXPORTER_DOWN in expected else {str(AlertName.EXPORTER_DOWN)}
    settled = faults.ended_at - SETTLE
    for engine, other in (ENGINES, ENGINES[::-1]):
        fired = faults.firings.at[engine].items()
        only = [k for k, at in fired if at < settled and k not in faults.firings.at[other] and k[0] not in own_scrapes]
        assert only == [], (f"fired on {engine} only", _table(faults))


def test_the_straggler_is_named_exactly_on_both(faults: Run) -> None:
    for engine in ENGINES:
        named = [dict(labels) for name, labels in faults.firings.at[engine] if name == AlertName.STRAGGLER]
        assert [{k: n[k] for k in faults.injected} for n in named] == [faults.injected], engine


def test_victoriametrics_fires_no_later_than_its_new_series_lag(faults: Run) -> None:
    """A compressed minute is a second here: an engine that answers as of 30 s ago (-search.latencyOffset) or
    keeps a stopped series for 5 minutes (-datasource.queryStep) fires half an hour late, or fires what
    Prometheus does not. What is left is the lag of series the fault creates, a few per alert."""
    for name, labels in EXPECTED:
        prom = faults.firings.first("prometheus", name, **labels)
        vm = faults.firings.first("victoriametrics", name, **labels)
        assert prom is not None and vm is not None
        assert vm - prom < HOPS_OF.get(name, HOPS) * NEW_SERIES_LAG, (name, labels, vm - prom, _table(faults))
