"""A real multi-host job: ``tpuscope bench --processes 4``, one ``jax.distributed`` job of 4 processes of 2 CPU
devices each (gloo collectives over loopback), one sidecar per process, each with its own worker id.

- A straggler slowed inside the fused program (worker 2 computes each gradient several times) is named by the
  device profiles, through the generated rules on a real Prometheus scraping the 4 sidecars, and on a central
  Prometheus that evaluates the same rules on what a cluster's Prometheus remote-writes to it with the
  ``remote_write`` block of deploy/prometheus/prometheus.yml; the host-timed phases alone name no one.
- A worker that crashes fails the whole job within a bounded time, every sidecar counts one failure, and the
  same command resumes every worker from the last checkpoint, the gap booked as downtime.

The rules run time compressed (:mod:`tpuscope.fleetsim.rules`), as fleet-sim runs them. fleet-sim covers what
does not fit on this machine (64 hosts); what each test proves: docs/bench.md, "Many hosts".
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from conftest import PROFILE_PROMPTLY

from tpuscope import catalog
from tpuscope.conventions import COMPUTE_OVER_MEDIAN, PROFILE_OVER_MEDIAN, AlertName
from tpuscope.fleetsim.rules import scaled_rules_file
from tpuscope.generator_config import GeneratorConfig
from tpuscope.scrape import Scrape
from tpuscope.testing import bench as testing_bench
from tpuscope.testing.prometheus import PrometheusServer, target_of
from tpuscope.testing.waiting import wait_for
from tpuscope.workload.distributed import HEARTBEAT_TIMEOUT_S, of_worker
from tpuscope.workload.launcher import WORKER_VARIABLE
from tpuscope.workload.sidecar import SidecarProcess

pytestmark = [pytest.mark.long, pytest.mark.alone]  # 4 JAX processes, 3 Prometheus, 4 sidecars at a time

ROOT = Path(__file__).resolve().parents[1]
DEPLOYED = yaml.safe_load((ROOT / "deploy/prometheus/prometheus.yml").read_text())
PROCESSES, DEVICES = 4, 2
STRAGGLER, FACTOR = 2, 16  # worker 2 computes each gradient 16 times, from a third of the run on
ONSET = f"[worker {STRAGGLER}] straggler: from step"  # the line the straggler's worker prints at its onset
AFTER_ONSET = 5.0  # a capture received this long after the onset traced steps after it (5 steps, then parsed)
K = 30  # the rules' time compression: 5-minute windows of 10 s, the straggler alert's for: 10m of 20 s
FACTOR_BOUND = GeneratorConfig().thresholds.straggler_factor


@pytest.fixture
def sidecars(short_tmp: Path) -> Iterator[list[SidecarProcess]]:
    """One sidecar per worker, on the sockets ``bench --processes`` gives its workers, each with its worker id in
    the environment as a TPU pod's host has it (the bench finds them listening and uses them)."""
    started: list[SidecarProcess] = []
    try:
        for worker in range(PROCESSES):
            env = {WORKER_VARIABLE: str(worker), **PROFILE_PROMPTLY}  # its straggler is told by a profile
            started.append(SidecarProcess(of_worker(short_tmp / "events.sock", worker), env=env))
        yield started
    finally:
        for sidecar in started:
            sidecar.stop()


class Job(testing_bench.Running):
    """``tpuscope bench --processes 4`` running in its own process group, its output kept line by line with the
    time each line arrived."""

    def __init__(self, directory: Path, shared: Path, *flags: str) -> None:
        """``shared``: the module's directory, whose compilation cache and CPU calibration every job of its tests
        uses (the first compiles, the others hit, as one job's restarts do)."""
        command = testing_bench.command(
            "--fused",
            *flags,
            processes=PROCESSES,
            cpu_devices=DEVICES,
            workload="multihost",
            socket=directory / "events.sock",
            run_dir=directory / "run",
            compile_cache=shared / "xla-cache",
        )
        super().__init__(command, {"XDG_CACHE_HOME": str(shared / "cache"), **PROFILE_PROMPTLY})

    def when(self, text: str) -> float | None:
        """When the first line containing ``text`` arrived."""
        return self.lines.when(text)

    def output(self) -> str:
        return "\n".join(line for line in self.lines.texts() if "@ " not in line)[-6000:]


def firing(prom: PrometheusServer) -> list[dict[str, str]]:
    """The labels of every firing straggler alert."""
    return [r["metric"] for r in prom.query(f'ALERTS{{alertname="{AlertName.STRAGGLER}",alertstate="firing"}}')]


def pending(prom: PrometheusServer) -> list[dict[str, str]]:
    """The labels of every straggler alert whose condition holds, not yet for its whole ``for:``."""
    return [r["metric"] for r in prom.query(f'ALERTS{{alertname="{AlertName.STRAGGLER}",alertstate="pending"}}')]


def by_worker(prom: PrometheusServer, expr: str) -> dict[str, float]:
    return {r["metric"]["worker"]: float(r["value"][1]) for r in prom.query(expr)}


@pytest.mark.timeout(600)
def test_the_profiles_name_a_straggler_in_a_fused_multihost_job_on_one_prometheus_and_centrally(
    short_tmp: Path, module_tmp: Path, sidecars: list[SidecarProcess]
) -> None:
    rules = short_tmp / "rules.yaml"
    rules.write_text(scaled_rules_file(GeneratorConfig(), K))
    targets = [target_of(sidecar.url) for sidecar in sidecars]
    (block,) = DEPLOYED["remote_write"]
    with (
        # The cluster's Prometheus of a single cluster: it scrapes the sidecars and evaluates the rules.
        PrometheusServer(short_tmp / "prom", targets, rule_files=[rules]) as prom,
        # Many clusters, the rules in a central ruler (docs/fleet.md): a central Prometheus receiving what ...
        PrometheusServer(
            short_tmp / "central", [], rule_files=[rules], flags=["--web.enable-remote-write-receiver"]
        ) as central,
        # ... a cluster's Prometheus without rules sends with the deployed remote_write block, only its URL ours.
        PrometheusServer(
            short_tmp / "cluster",
            targets,
            external_labels=DEPLOYED["global"]["external_labels"],
            remote_write=[{**block, "url": f"{central.url}/api/v1/write"}],
        ),
    ):
        job = Job(
            short_tmp,
            module_tmp,
            "--steps=1200",
            "--checkpoint-every=0",
            "--profile-period=1s",
            f"--inject=straggler={FACTOR}@{STRAGGLER}",
        )
        named: dict[str, float] = {}  # seconds from the onset to each view's first firing for the straggler
        try:

            def seen() -> bool:
                """Whether both Prometheus servers name the straggler on captures every worker took after its
                onset (before it, all are equal: a noisy capture may make anyone pending, the straggler too)."""
                now, onset = time.time(), job.when(ONSET)
                assert job.proc.poll() is None, job.output()
                if onset is None:
                    return False
                naming = []
                for where, server in (("prometheus", prom), ("central", central)):
                    naming.append(any(a["worker"] == str(STRAGGLER) for a in firing(server)))
                    if naming[-1]:
                        named.setdefault(where, now - onset)
                captured = by_worker(prom, catalog.PROFILE_LAST_CAPTURE.name)
                return all(naming) and len(captured) == PROCESSES and min(captured.values()) > onset + AFTER_ONSET

            # Once a second: a tighter loop of queries would take the cores the job's 8 devices share. 420 s: a
            # loaded machine's steps are 3 times as slow.
            wait_for(
                seen,
                420,
                "the straggler named by both Prometheus servers",
                detail=lambda: (named, job.output()),
                interval=1,
            )

            for where, server in (("prometheus", prom), ("central", central)):
                alerts = firing(server)
                assert [a["worker"] for a in alerts] == [str(STRAGGLER)], (where, alerts)
                assert alerts[0]["source"] == "profile", alerts
            assert all(alert["cluster"] == "my-cluster" for alert in firing(central)), "what the cluster sent"
            # The central ruler's recorded measures, from what the cluster sent, say what its alert says.
            over = {
                part: by_worker(central, f'{PROFILE_OVER_MEDIAN}{{part="{part}"}}')
                for part in ("compute", "exposed_collective")
            }
            assert over["compute"][str(STRAGGLER)] > FACTOR_BOUND, over
            assert over["exposed_collective"][str(STRAGGLER)] < 1 / FACTOR_BOUND, over
            # Anyone else earlier in the run, printed, not asserted: on this CPU a healthy worker's noisy capture can
            # hold the condition a while, and on a loaded machine once for the whole for: (docs/bench.md).
            ever = f'max_over_time(ALERTS{{alertname="{AlertName.STRAGGLER}",worker!="{STRAGGLER}"}}[1h])'
            others = [(r["metric"]["worker"], r["metric"]["alertstate"]) for r in prom.query(ever)]

            # The healthy workers wait at the collectives for the straggler; it waits least.
            profiled = f'{catalog.PROFILE_TIME.name}{{part="exposed_collective"}}'
            waits = by_worker(prom, profiled)
            computes = by_worker(prom, f'{catalog.PROFILE_TIME.name}{{part="compute"}}')
            healthy = [wait for worker, wait in waits.items() if worker != str(STRAGGLER)]
            # Several times: 3.8 to 6.5 times alone here, 2.9 to 3.0 under the whole suite's load, on one capture each
            # (docs/bench.md). The sidecar serves the mean of the last 3 captures (issue 36), which may still hold
            # captures from before the onset, when every worker waited alike: 2.0 in one loaded run.
            assert len(healthy) == PROCESSES - 1 and min(healthy) >= 1.5 * waits[str(STRAGGLER)], (waits, job.output())

            # The host-timed phases alone: one fused program, every worker waits inside it for the straggler, so
            # each worker's compute phase is the same step and the host-timed rule names no one.
            host = by_worker(prom, COMPUTE_OVER_MEDIAN)
            assert len(host) == PROCESSES and max(host.values()) < FACTOR_BOUND, host
            assert host[str(STRAGGLER)] == pytest.approx(1.0, abs=0.1), host

            costs = {}
            for worker, sidecar in enumerate(sidecars):
                scrape = Scrape.fetch(sidecar.url)
                captures = scrape.present(catalog.PROFILE_CAPTURES.name, result="ok")
                seconds = scrape.present(catalog.PROFILE_CAPTURE_SECONDS.name)
                wall = scrape.present(catalog.GOODPUT_WALL.name)
                costs[worker] = (captures, seconds / max(captures, 1), seconds / wall)
            firing_after = ", ".join(f"{where} {seconds:.1f} s" for where, seconds in named.items())
            print(
                f"\nTpuscopeStraggler firing for worker {STRAGGLER}, from its onset (rules {K}x faster): {firing_after}"
            )
            print("other workers named earlier:", sorted(others) or "none")
            print("exposed collective (ms):", {w: round(v * 1e3, 1) for w, v in sorted(waits.items())})
            print("profiled compute (ms):", {w: round(v * 1e3, 1) for w, v in sorted(computes.items())})
            print("host-timed compute over the median:", {w: round(v, 3) for w, v in sorted(host.items())})
            for worker, (captures, each, share) in costs.items():
                print(
                    f"worker {worker}: {captures:g} captures, {each:.2f} s each to start and stop, {share:.1%} of wall"
                )
        finally:
            job.kill()


@pytest.mark.timeout(600)
@pytest.mark.parametrize("crashing", [1, 0], ids=["a worker", "the coordinator's worker"])
def test_a_worker_crash_fails_the_job_in_bounded_time_and_the_rerun_resumes_every_worker(
    short_tmp: Path, module_tmp: Path, sidecars: list[SidecarProcess], crashing: int
) -> None:
    """Worker 0 runs the job's coordination service too: its crash takes the service with it, where another
    worker's crash leaves the service to notice the missing heartbeats."""
    flags = ("--steps=40", "--checkpoint-every=10", "--profile-period=off")
    crashed = Job(short_tmp, module_tmp, *flags, f"--inject=crash=25@{crashing}")
    code = crashed.wait(300)
    assert code == 3, crashed.output()
    crash = crashed.when(f"[worker {crashing}] tpuscope bench: injected crash at step 25")
    assert crash is not None, crashed.output()
    ended, summary = crashed.lines.lines[-1]
    # The others end by themselves, aborted by JAX's coordination service (SIGABRT), not by the launcher's kill.
    assert not crashed.when(" still runs "), crashed.output()
    peers = [w for w in range(PROCESSES) if w != crashing]
    assert all(f"worker {w} killed by signal {signal.SIGABRT.value}" in summary for w in peers), summary
    assert ended - crash < HEARTBEAT_TIMEOUT_S + 15, crashed.output()
    print(f"\nthe job ended {ended - crash:.1f} s after worker {crashing} crashed; {summary}")

    def failures(sidecar: SidecarProcess) -> dict[str, float]:
        scrape = Scrape.fetch(sidecar.url)
        return {s.labels["reason"]: s.value for s in scrape.find(catalog.WORKLOAD_FAILURES.name, workload="multihost")}

    wait_for(
        lambda: all(sum(failures(s).values()) == 1 for s in sidecars),
        30,
        "all(sum(failures(s).values()) == 1 for s in sidecars)",
        detail=lambda: [failures(s) for s in sidecars],
    )
    assert failures(sidecars[crashing]) == {"other": 1}, "the worker that crashed says so"
    assert all(failures(sidecars[w]) == {"vanished": 1} for w in peers), "its peers ended without a word"
    print("failures by sidecar:", [failures(s) for s in sidecars])

    down = 3.0
    time.sleep(down)  # down a while: the downtime under test
    resumed = Job(short_tmp, module_tmp, *flags)
    assert resumed.wait(300) == 0, resumed.output()
    for worker in range(PROCESSES):
        assert resumed.when(f"[worker {worker}] resumed from the checkpoint of step 19"), resumed.output()
    for worker, sidecar in enumerate(sidecars):
        scrape = Scrape.fetch(sidecar.url)
        restarts = scrape.value(catalog.WORKLOAD_RESTARTS.name, workload="multihost", reason="resumed")
        downtime = scrape.present(catalog.GOODPUT.name, workload="multihost", category="downtime")
        assert restarts == 1, scrape.text
        # From the failure (the crashed worker) or the vanishing (its peers, aborted up to a heartbeat timeout
        # later) to the rerun's start: at least the wait.
        assert downtime >= down, (worker, downtime)
        print(f"worker {worker}: downtime {downtime:.1f} s booked between the crash and the resumed start")
