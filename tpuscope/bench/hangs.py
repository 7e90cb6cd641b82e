"""``tpuscope bench hangs``: does a hung job get diagnosed, and does a healthy slow one not page?

Each trial is a real 4-process ``jax.distributed`` job on the CPU (gloo), one sidecar per process, and a real
Prometheus scraping them with the generated rules, at the deployed speed (deploy/prometheus/prometheus.yml:
scrapes every 15 s, rules every 30 s). Worker 1 hangs one way (``tpuscope workload --inject WAY=STEP@1``:
tpuscope/workload/hangs.py): its input blocks in a read (``hang-input``), it spins in Python in its metrics code
(``hang-spin``), or it skips the barrier its peers enter (``skip-collective``). A trial passes when
TpuscopeWorkloadHung fires within :data:`WITHIN_SECONDS` of the hang naming worker 1 alone, with its phase and
its top Python frames; and when, after every process of the job and every sidecar is killed, the sidecars' logs
still give each worker's stacks and the verdict (``tpuscope hangs``). The three ways run side by side, one trial of
each at a time.

The clean runs must not page: one job with a 5-minute eval the job does not mark, a 2-minute recompile halfway
and a 3-minute final checkpoint save, and one whose steps each take 40 s. They run to their end; no
TpuscopeWorkloadHung nor TpuscopeWorkloadStalled may be pending or firing at any time.

It prints each trial, then a table of the figures, writes them as JSON, and exits 1 if any check failed.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tpuscope import catalog
from tpuscope.bench.verdict import Check, check_lines, write_report
from tpuscope.conventions import AlertName
from tpuscope.stats import percentile
from tpuscope.testing import bench as testing_bench
from tpuscope.testing.prometheus import PrometheusServer, target_of
from tpuscope.workload.distributed import of_worker
from tpuscope.workload.launcher import WORKER_VARIABLE
from tpuscope.workload.sidecar import SidecarProcess

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy/prometheus/tpuscope-rules.yaml"
DEPLOYED = yaml.safe_load((ROOT / "deploy/prometheus/prometheus.yml").read_text())["global"]
WAYS = ("hang-input", "hang-spin", "skip-collective")
# Where each way leaves worker 1, as the alert must say it: its phase, and a function among its top frames.
EXPECTED = {
    "hang-input": ("io", "read_that_never_returns"),
    "hang-spin": ("step", "summarise_metrics_forever"),
    "skip-collective": ("compute", "fused_step"),  # the next step's program, waiting for peers at the barrier
}
PROCESSES, DEVICES, HUNG = 4, 2, 1
HANG_STEP = 20  # the step worker 1 hangs at: enough steps before it for the sidecars to learn a step's time
# JAX's default: a hung process still sends its heartbeats, and the workload's 10 s aborts a job whose processes a
# loaded machine starved that long (seen: trials that ended with exit 134 before any hang).
HEARTBEAT_TIMEOUT_S = 100
WITHIN_SECONDS = 120.0  # the acceptance: named within 2 minutes of the hang
PAGES = (AlertName.WORKLOAD_HUNG, AlertName.WORKLOAD_STALLED)
CLEAN = {  # the clean runs: their faults (every worker), steps
    # slow-compile=60: a program XLA takes about a minute to compile alone, longer beside its peers.
    "eval-recompile-save": (("eval=300", "slow-compile=60", "slow-save=180"), 40),
    "40s-steps": (("slow-steps=40",), 8),
}


@dataclass(frozen=True)
class Speed:
    """How fast the pipeline runs: the sidecars' hang floor, Prometheus' scrape and rule intervals."""

    hang_after: str = "60s"
    scrape: str = DEPLOYED["scrape_interval"]
    evaluation: str = DEPLOYED["evaluation_interval"]
    model: tuple[str, ...] = ()  # the workload's model flags: smaller starts sooner (its compile)


@dataclass
class TrialResult:
    way: str
    seconds_to_alert: float | None = None  # from the hang's onset to the alert naming the worker
    seconds_to_onset: float | None = None  # from the job's start to the hang's onset (start-up, 20 steps)
    named: list[str] = field(default_factory=list)  # the workers the alert's description names
    phase_and_frames: bool = False  # the description gives the named worker's phase and frames
    logs_verdict: list[str] = field(default_factory=list)  # the workers the sidecars' logs name elsewhere
    logs_stacks: int = 0  # workers whose stacks the logs hold
    description: str = ""
    error: str = ""

    @property
    def ok(self) -> bool:
        return (
            self.seconds_to_alert is not None
            and self.seconds_to_alert <= WITHIN_SECONDS
            and self.named == [str(HUNG)]
            and self.phase_and_frames
            and self.logs_verdict == [str(HUNG)]
            and self.logs_stacks == PROCESSES
        )


class BenchJob(testing_bench.Running):
    """``tpuscope workload --processes 4`` in its own process group, its output kept line by line with arrival times."""

    def __init__(self, directory: Path, workload: str, steps: int, *injected: str, model: tuple[str, ...] = ()) -> None:
        command = testing_bench.command(
            "--fused",
            *model,
            "--checkpoint-every=0",
            "--profile-period=off",
            f"--heartbeat-timeout={HEARTBEAT_TIMEOUT_S:g}",
            *(f"--inject={fault}" for fault in injected),
            processes=PROCESSES,
            cpu_devices=DEVICES,
            steps=steps,
            workload=workload,
            socket=directory / "events.sock",
            run_dir=directory / "run",
        )
        super().__init__(command)
        self._log = directory / "job.log"

    def output(self) -> str:
        return "\n".join(line for line in self.lines.texts() if "[Gloo]" not in line)[-4000:]

    def kill(self) -> None:
        super().kill()
        self._log.write_text("\n".join(self.lines.texts()) + "\n")  # the whole output, for a failed run's why


@contextmanager
def pipeline(directory: Path, speed: Speed) -> Iterator[tuple[list[SidecarProcess], PrometheusServer]]:
    """A sidecar per worker (on the sockets the workload gives its workers) and a Prometheus on the rules."""
    shutil.rmtree(directory, ignore_errors=True)  # a Prometheus on an earlier run's data would restore its alerts
    directory.mkdir(parents=True)
    with ExitStack() as stack:
        sidecars = [
            stack.enter_context(
                SidecarProcess(
                    of_worker(directory / "events.sock", worker),
                    "127.0.0.1:0",
                    "--hang-after",
                    speed.hang_after,
                    env={WORKER_VARIABLE: str(worker)},
                )
            )
            for worker in range(PROCESSES)
        ]
        prom = stack.enter_context(
            PrometheusServer(
                directory / "prometheus",
                [target_of(s.url) for s in sidecars],
                scrape_interval=speed.scrape,
                evaluation_interval=speed.evaluation,
                rule_files=[RULES],
            )
        )
        yield sidecars, prom


def alerts(prom: PrometheusServer, name: str, workload: str) -> list[dict[str, Any]]:
    """The alerts ``name`` of ``workload``, pending or firing."""
    found: list[dict[str, Any]] = prom.api.get("alerts")["alerts"]
    return [a for a in found if a["labels"].get("alertname") == name and a["labels"].get("workload") == workload]


def named_workers(description: str) -> list[str]:
    """The workers a hang alert's description names elsewhere than their peers."""
    words = description.split()
    return sorted(
        {words[i + 1] for i, w in enumerate(words[:-1]) if w == "Worker" and "elsewhere" in " ".join(words[i : i + 9])}
    )


def trial(way: str, directory: Path, speed: Speed, timeout: float = 300.0) -> TrialResult:
    """One trial: the job, worker 1 hanging ``way``; the alert waited for; everything killed; the logs read."""
    result = TrialResult(way)
    workload = f"hang-{way}"
    onset_line = f"[worker {HUNG}] {way}: step {HANG_STEP}"
    with pipeline(directory, speed) as (sidecars, prom):
        started = time.time()
        job = BenchJob(directory, workload, 100_000, f"{way}={HANG_STEP}@{HUNG}", model=speed.model)
        try:
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline and job.proc.poll() is None:
                onset = job.lines.when(onset_line)
                firing = [a for a in alerts(prom, AlertName.WORKLOAD_HUNG, workload) if a["state"] == "firing"]
                if onset is not None and firing:
                    description = firing[0]["annotations"].get("description", "")
                    if (named := named_workers(description)) or time.time() - onset > WITHIN_SECONDS:
                        result.seconds_to_alert = round(time.time() - onset, 1)
                        result.seconds_to_onset = round(onset - started, 1)
                        result.named, result.description = named, description
                        phase, function = EXPECTED[way]
                        result.phase_and_frames = f", {phase}, at " in description and function in description
                        break
                time.sleep(1.0)
            else:
                result.error = f"no alert naming a worker in {timeout:g} s (job exit {job.proc.poll()}): {job.output()}"
        finally:
            job.kill()
            for sidecar in sidecars:  # killed, not stopped: what they logged is all that is left
                sidecar.proc.kill()
                sidecar.proc.wait(10)
    verdict = read_logs([s.log_path for s in sidecars]).get(workload, {})
    result.logs_stacks = sum(1 for process in verdict.get("workers", []) if process.get("threads"))
    result.logs_verdict = sorted(str(w["worker"]) for w in verdict.get("elsewhere", []))
    return result


def read_logs(paths: list[Path]) -> dict[str, dict[str, Any]]:
    """``tpuscope hangs --json`` on the sidecars' logs: each workload's verdict, by workload."""
    done = subprocess.run(
        [sys.executable, "-m", "tpuscope", "hangs", "--json", *map(str, paths)], capture_output=True, text=True
    )
    if done.returncode not in (0, 1):
        raise RuntimeError(f"tpuscope hangs failed ({done.returncode}): {done.stderr}")
    return {verdict["workload"]: verdict for verdict in json.loads(done.stdout or "[]")}


def clean_run(name: str, directory: Path, speed: Speed) -> dict[str, Any]:
    """One clean run to its end; what paged meanwhile, and the longest each place lasted against its limit."""
    injected, steps = CLEAN[name]
    paged: set[str] = set()
    longest: dict[str, tuple[float, float]] = {}  # phase -> (longest seconds seen there, its limit then)
    with pipeline(directory, speed) as (_, prom):
        job = BenchJob(directory, f"clean-{name}", steps, *injected)
        started = time.time()
        try:
            while job.proc.poll() is None:
                for page in PAGES:
                    if alerts(prom, page, f"clean-{name}"):
                        paged.add(page)
                for r in prom.query(catalog.POSITION_AGE.name):
                    phase, age = r["metric"]["phase"], float(r["value"][1])
                    limits = prom.query(f'{catalog.POSITION_LIMIT.name}{{phase="{phase}"}}')
                    limit = max((float(x["value"][1]) for x in limits), default=0.0)
                    if age > longest.get(phase, (0.0, 0.0))[0]:
                        longest[phase] = (round(age, 1), limit)
                time.sleep(2.0)
        finally:
            job.kill()
    return {
        "faults": list(injected),
        "exit": job.proc.returncode,
        "minutes": round((time.time() - started) / 60, 1),
        "paged": sorted(paged),
        "longest": {phase: {"seconds": s, "limit": limit} for phase, (s, limit) in sorted(longest.items())},
        "output": job.output()[-800:] if job.proc.returncode else "",
    }


def run(args: argparse.Namespace) -> int:
    trials = int(args.trials)
    out = Path("run/hangs")
    speed = Speed()
    print(f"Hang trials: {trials} of each way ({', '.join(WAYS)}), side by side; then the clean runs.")
    results: list[TrialResult] = []
    with ThreadPoolExecutor(len(WAYS)) as pool:
        for n in range(trials):
            directories = [out / f"{way}-{n}" for way in WAYS]
            for r in pool.map(trial, WAYS, directories, [speed] * len(WAYS)):
                results.append(r)
                print(
                    f"  trial {n} {r.way:16} {'ok  ' if r.ok else 'FAIL'} alert after {r.seconds_to_alert} s "
                    f"naming {r.named}; logs name {r.logs_verdict}, stacks of {r.logs_stacks} workers {r.error[:300]}",
                    flush=True,
                )
        names = list(CLEAN)
        runs = pool.map(clean_run, names, [out / f"clean-{name}" for name in names], [speed] * len(names))
        clean = dict(zip(names, runs, strict=True))
    checks = []
    figures: dict[str, Any] = {"speed": vars(speed), "trials": {}, "clean": clean}
    for way in WAYS if trials else ():  # --trials 0: the clean runs alone
        mine = [r for r in results if r.way == way]
        seconds = [r.seconds_to_alert for r in mine if r.seconds_to_alert is not None]
        figures["trials"][way] = {"results": [vars(r) for r in mine], "seconds_to_alert": seconds}
        spread = f"{min(seconds):.0f} / {percentile(seconds, 0.5):.0f} / {max(seconds):.0f} s" if seconds else "none"
        ok = sum(r.ok for r in mine)
        detail = f"{ok}/{len(mine)} trials; alert after min/median/max {spread} (bound {WITHIN_SECONDS:g} s)"
        checks.append(Check(f"{way}: worker {HUNG} named", ok == len(mine), detail))
    for name, figure in clean.items():
        longest = ", ".join(f"{p} {v['seconds']:g} s (limit {v['limit']:g} s)" for p, v in figure["longest"].items())
        detail = f"exit {figure['exit']}, {figure['minutes']} min, paged {figure['paged'] or 'nothing'}; {longest}"
        checks.append(Check(f"clean {name}: no page", not figure["paged"] and figure["exit"] == 0, detail))
    print("\n".join(check_lines(checks, width=34)))
    failed = write_report(args.json or Path("run/hangs.json"), figures, checks)
    return 1 if failed else 0
