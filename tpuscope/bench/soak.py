"""``tpuscope bench soak``: the workload, a sidecar and a real Prometheus for N minutes; then what was lost.

What must hold after a long run, as Prometheus sees it:

- nothing is lost: every counter Prometheus holds for a workload equals what the job
  reported (steps, step time count and sum, compiles by stage, cache look-ups by
  result, checkpoints and their bytes by operation, restarts, failures), the sidecar
  accepted every event the jobs recorded, and neither side dropped any;
- the sidecar does not leak: its resident memory, sampled by Prometheus every second,
  grows by less than ``RSS_GROWTH_BOUND_MB`` after the warm-up.

The jobs are real ``python -m tpuscope workload`` processes sending to the soak's own
sidecar, each with ``--record``: the recorded events are the truth of what each job
reported. Each workload is a *lane* of successive processes: the JAX workload
resumes from its checkpoints at every new run (restarts are part of a soak, and they
bring checkpoint restores and compilation-cache hits), the synthetic ones start
afresh. No process is signalled: each run is given as many steps as fit in the time
left (judged from the lane's previous run), so every job ends on its own with a
clean stop, and the soak ends within a short run of its deadline. Prometheus is
queried through its HTTP API only: the point is what Prometheus holds, not what
the sidecar would say now. Prints a table, writes JSON, and exits 1 when a check fails.
"""

from __future__ import annotations

import argparse
import math
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import typing
from collections import Counter as Tally
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tpuscope import catalog, events
from tpuscope.bench.memory import SIDECAR_RSS
from tpuscope.bench.verdict import Check, check_lines, write_report
from tpuscope.promql import SIDECAR_START
from tpuscope.testing.prometheus import PrometheusServer, target_of
from tpuscope.testing.waiting import wait_for
from tpuscope.workload.sidecar import SidecarProcess

DEFAULT_JSON = Path("run/soak.json")
SCRAPE_INTERVAL = "1s"
# The warm-up: a quarter of the run, at least 30 s (by then every workload has started, compiled,
# checkpointed and restarted once, so every series exists), at most half of a short run.
WARMUP_SHARE = 0.25
WARMUP_MIN_SECONDS = 30.0
# The sidecar's RSS may grow by this much after the warm-up. Once every series exists its state has a fixed
# size (counters, histograms, one entry per connected job), so all that may move is allocator noise (pymalloc
# arenas, HTTP threads' buffers, a gzip scrape's output). The 2-minute soak sends ~25,000 events after its
# warm-up, so a leak of about 120 bytes per event (a small object kept per step) passes 3 MB; longer soaks catch
# smaller leaks.
RSS_GROWTH_BOUND_MB = 3.0
# A run still going this long after the deadline is interrupted (Ctrl-C: a clean stop) and fails the soak.
OVERRUN_SECONDS = 120.0
# How long Prometheus may take, after the last job exited, to hold every event the jobs recorded.
SETTLE_SECONDS = 60.0
# A float counter (a sum of seconds or FLOPs) is equal within this relative tolerance: the sidecar adds
# the same float64s in the same order as the recording, and the text formats round-trip them.
FLOAT_TOLERANCE = 1e-9
# The workload's run summary says what the Monitor sent and dropped (the recording cannot: a drop is
# known only to the socket sink).
EVENTS_LINE = re.compile(r"^\s*events\s+(?P<sent>\d+) sent to .*, (?P<dropped>\d+) dropped$", re.MULTILINE)
# Every kind of event a healthy training job reports: not a serving job's (inference batches, model loads), nor
# those of a job that fails to compile or keeps changing its shapes (tests/test_failures.py causes those), nor the
# position thread's hello (its own connection's, never recorded: tests/test_hang_watch.py), nor the training values a
# job leaves unsent at its close (a healthy job's ride on its steps, read as soon as computed).
NOT_TRAINING = (
    events.InferenceBatch,
    events.ModelLoaded,
    events.CompileFailure,
    events.Recompile,
    events.Watch,
    events.TrainingValues,
)
TRAINING_EVENTS = tuple(kind.__name__ for kind in typing.get_args(events.AnyEvent) if kind not in NOT_TRAINING)


@dataclass(frozen=True)
class Lane:
    """One workload, run as successive job processes until the time is up."""

    workload: str
    flags: tuple[str, ...]  # besides --socket, --record, --workload, --run-dir and --steps
    steps_per_run: int  # the most steps one run is given
    min_steps: int  # fewer than this left in the time: the lane is done
    jax: bool = False  # --steps is then the step to reach (the run resumes from its checkpoint)


LANES = (
    # The real JAX workload at its default size, fed by an input pipeline slower than its compute, as a job
    # waiting on its data is: it leaves the CPU to the others most of the time (docs/bench.md), which fed
    # faster would measure its contention. What the soak checks of it is its restarts, not its step rate.
    # Every run resumes from the checkpoint of the previous one's last step: a restart, a restore, cache hits.
    Lane("soak-jax", ("--checkpoint-every", "50", "--io-latency", "0.3"), steps_per_run=150, min_steps=20, jax=True),
    # A brisk synthetic job: ~125 steps/s on 2 cores beside the JAX job, so the sidecar sees thousands of
    # steps, plus a compile at each run's start, 8 device-memory reports every 10 steps, a checkpoint every 500.
    Lane("soak-fast", ("--synthetic", "--step-time", "0.005", "--checkpoint-every", "500"), 4000, min_steps=100),
    # A slower one beside it: another connection interleaving with the others, at the default profile.
    Lane("soak-steady", ("--synthetic", "--step-time", "0.05", "--checkpoint-every", "50"), 600, min_steps=20),
)


@dataclass
class RunResult:
    """One job process of a lane."""

    steps: int  # the steps it was given (a JAX run: from where it resumed)
    seconds: float
    returncode: int | None  # None: it had to be killed
    sent: int | None  # None: the run printed no summary
    dropped: int | None
    log: str


@dataclass
class LaneRunner:
    """Starts a lane's runs one after the other, each sized to the time left."""

    lane: Lane
    workdir: Path
    socket: Path
    runs: list[RunResult] = field(default_factory=list)
    done: bool = False
    interrupted: bool = False
    _proc: subprocess.Popen[bytes] | None = None
    _started: float = 0.0
    _steps: int = 0
    _target: int = 0  # JAX: the step the last run was to reach
    _log: Path = Path()

    @property
    def record(self) -> Path:
        return self.workdir / f"{self.lane.workload}.jsonl"

    @property
    def running(self) -> bool:
        return self._proc is not None

    def poll(self, remaining: float) -> None:
        """Reap a finished run; start the next one if there is time left for it."""
        if self._proc is not None:
            if self._proc.poll() is None:
                return
            self._reap(self._proc.returncode)
        if self.done:
            return
        steps = self._steps_for(remaining)
        if steps < self.lane.min_steps:
            self.done = True
            return
        self._start(steps)

    def _steps_for(self, remaining: float) -> int:
        """As many steps as fit in ``remaining`` seconds at the previous run's pace (its start-up included)."""
        if not self.runs:
            return self.lane.steps_per_run if remaining > 0 else 0
        last = self.runs[-1]
        seconds_per_step = last.seconds / max(1, last.steps)
        return min(self.lane.steps_per_run, int(remaining / seconds_per_step))

    def _start(self, steps: int) -> None:
        run_dir = self.workdir / self.lane.workload
        if self.lane.jax:
            # --steps is the step to reach: the run resumes from the previous run's last checkpoint (its
            # last step when its target was a multiple of --checkpoint-every; else it redoes a few steps,
            # as a job restarted after a crash would).
            self._target += steps
            steps_flag = self._target
            extra: tuple[str, ...] = ("--compile-cache", str(run_dir / "xla-cache"))
        else:
            steps_flag, extra = steps, ()
        command = [
            *(sys.executable, "-m", "tpuscope", "workload", *self.lane.flags, *extra),
            *("--workload", self.lane.workload, "--socket", str(self.socket), "--record", str(self.record)),
            *("--run-dir", str(run_dir), "--steps", str(steps_flag)),
        ]
        log_path = self.workdir / f"{self.lane.workload}-{len(self.runs) + 1}.log"
        with open(log_path, "wb") as log:
            self._proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        self._started, self._steps = time.monotonic(), steps
        self._log = log_path

    def _reap(self, returncode: int | None) -> None:
        text = self._log.read_text(errors="replace")
        summary = EVENTS_LINE.search(text)
        self.runs.append(
            RunResult(
                steps=self._steps,
                seconds=time.monotonic() - self._started,
                returncode=returncode,
                sent=int(summary["sent"]) if summary else None,
                dropped=int(summary["dropped"]) if summary else None,
                log=str(self._log),
            )
        )
        self._proc = None

    def interrupt(self) -> None:
        """Stop an overrunning run as Ctrl-C would (the Monitor still sends its stop), killing it if need be."""
        if self._proc is None:
            return
        self.interrupted = self.done = True
        self._proc.send_signal(signal.SIGINT)
        try:
            self._proc.wait(30)
            self._reap(self._proc.returncode)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
            self._reap(None)


def run_jobs(runners: list[LaneRunner], seconds: float) -> float:
    """Run every lane until ``seconds`` have passed and every run has ended; the time it took."""
    start = time.monotonic()
    deadline = start + seconds
    while True:
        now = time.monotonic()
        for runner in runners:
            runner.poll(deadline - now)
        if not any(runner.running for runner in runners):
            return time.monotonic() - start
        if now > deadline + OVERRUN_SECONDS:
            for runner in runners:
                runner.interrupt()
            return time.monotonic() - start
        time.sleep(0.2)


# --- ground truth and what Prometheus holds -------------------------------------------------------------
Key = tuple[str, str]  # (workload, the counter's other label value, "" when it has none)


@dataclass(frozen=True)
class CounterSpec:
    """A counter to compare: its Prometheus series and what each recorded event adds to it."""

    title: str
    series: str
    label: catalog.Label | None  # the label it is split by besides workload
    adds: Callable[[events.AnyEvent], tuple[str, float] | None]  # (label value, amount), or None
    exact: bool = True  # False: a sum of floats, equal within FLOAT_TOLERANCE


def _step(amount: Callable[[events.Step], float]) -> Callable[[events.AnyEvent], tuple[str, float] | None]:
    return lambda e: ("", amount(e)) if isinstance(e, events.Step) else None


def _lifecycle(state: str) -> Callable[[events.AnyEvent], tuple[str, float] | None]:
    return lambda e: (e.reason, 1) if isinstance(e, events.Lifecycle) and e.state == state else None


COUNTERS = (
    CounterSpec("steps done", catalog.STEPS.name, None, _step(lambda e: 1)),
    CounterSpec("step time count", catalog.STEP_DURATION.series("count"), None, _step(lambda e: 1)),
    CounterSpec("step time sum", catalog.STEP_DURATION.series("sum"), None, _step(lambda e: e.duration_s), False),
    CounterSpec("model FLOPs", catalog.MODEL_FLOPS.name, None, _step(lambda e: e.flops), False),
    CounterSpec(
        "compiles",
        catalog.COMPILE_DURATION.series("count"),
        catalog.Label.STAGE,
        lambda e: (e.stage, 1) if isinstance(e, events.Compile) else None,
    ),
    CounterSpec(
        "cache look-ups",
        catalog.COMPILE_CACHE_REQUESTS.name,
        catalog.Label.RESULT,
        lambda e: ("hit" if e.hit else "miss", 1) if isinstance(e, events.CompileCache) else None,
    ),
    CounterSpec(
        "checkpoints",
        catalog.CHECKPOINT_DURATION.series("count"),
        catalog.Label.OPERATION,
        lambda e: (e.operation, 1) if isinstance(e, events.Checkpoint) else None,
    ),
    CounterSpec(
        "checkpoint bytes",
        catalog.CHECKPOINT_BYTES.name,
        catalog.Label.OPERATION,
        lambda e: (e.operation, e.bytes) if isinstance(e, events.Checkpoint) else None,
    ),
    CounterSpec("restarts", catalog.WORKLOAD_RESTARTS.name, catalog.Label.REASON, _lifecycle("restart")),
    # A job that vanished without its stop event would show here with no recorded failure.
    CounterSpec("failures", catalog.WORKLOAD_FAILURES.name, catalog.Label.REASON, _lifecycle("failure")),
)


@dataclass
class Row:
    counter: str
    workload: str
    label: str
    reported: float
    prometheus: float
    exact: bool

    @property
    def lost(self) -> float:
        return self.reported - self.prometheus

    @property
    def equal(self) -> bool:
        if self.exact:
            return self.reported == self.prometheus
        return math.isclose(self.reported, self.prometheus, rel_tol=FLOAT_TOLERANCE, abs_tol=FLOAT_TOLERANCE)


def reported(spec: CounterSpec, records: dict[str, list[events.AnyEvent]]) -> dict[Key, float]:
    totals: dict[Key, float] = {}
    for workload, recorded in records.items():
        for event in recorded:
            if (added := spec.adds(event)) is not None:
                key = (workload, added[0])
                totals[key] = totals.get(key, 0.0) + added[1]
    return totals


def held(prom: PrometheusServer, spec: CounterSpec) -> dict[Key, float]:
    """Prometheus' latest value of the counter per workload (and label)."""
    by = [catalog.Label.WORKLOAD, *([spec.label] if spec.label else [])]
    values: dict[Key, float] = {}
    for series in prom.query(f"sum by ({', '.join(by)}) ({spec.series})"):
        labels = series["metric"]
        key = (labels.get(catalog.Label.WORKLOAD, ""), labels.get(spec.label, "") if spec.label else "")
        values[key] = float(series["value"][1])
    return values


def compare(prom: PrometheusServer, records: dict[str, list[events.AnyEvent]]) -> list[Row]:
    rows = []
    for spec in COUNTERS:
        truth, seen = reported(spec, records), held(prom, spec)
        for key in sorted(truth.keys() | seen.keys()):
            rows.append(Row(spec.title, *key, truth.get(key, 0.0), seen.get(key, 0.0), spec.exact))
    return rows


def ingest(prom: PrometheusServer, result: str) -> float:
    return prom.scalar(f'sum({catalog.INGEST_EVENTS.name}{{{catalog.Label.RESULT}="{result}"}})') or 0.0


def scraped_at(prom: PrometheusServer) -> float:
    """When Prometheus last scraped the sidecar (0 before its first scrape)."""
    return prom.scalar("timestamp(up)") or 0.0


def settle(prom: PrometheusServer, expected: float, after: float) -> bool:
    """Wait until Prometheus holds every recorded event, then for one scrape more; whether it did in time.

    A scrape reads the counters one after another, so the scrape that first shows the last event
    accepted might have read a histogram just before that event; the next scrape cannot have.
    """
    deadline = time.monotonic() + SETTLE_SECONDS
    while time.monotonic() < deadline:
        seen = scraped_at(prom)
        if seen > after and ingest(prom, "accepted") >= expected:
            while time.monotonic() < deadline and scraped_at(prom) <= seen:
                time.sleep(0.2)
            return True
        time.sleep(0.2)
    return False


@dataclass
class Rss:
    start_mb: float  # the first sample, before any job
    warmup_mb: float  # at the end of the warm-up
    max_mb: float  # the highest after the warm-up
    end_mb: float
    growth_mb: float  # max_mb - warmup_mb
    bound_mb: float
    warmup_seconds: float
    samples: int


def sidecar_rss(prom: PrometheusServer, start: float, end: float, warmup: float) -> Rss:
    """The sidecar's RSS as Prometheus sampled it from ``start`` to ``end`` (Unix times)."""
    step = max(1.0, (end - start) / 10_000)  # within Prometheus' 11,000 points per query
    result = prom.query_range(SIDECAR_RSS, start, end, step)
    points = [(float(t), float(v) / 1e6) for t, v in result[0]["values"]] if result else []
    if not points:
        return Rss(0.0, 0.0, 0.0, 0.0, math.inf, RSS_GROWTH_BOUND_MB, warmup, 0)
    before = [mb for t, mb in points if t <= start + warmup] or [points[0][1]]
    after = [mb for t, mb in points if t > start + warmup] or [before[-1]]
    max_mb = max(after)
    return Rss(
        points[0][1], before[-1], max_mb, points[-1][1], max_mb - before[-1], RSS_GROWTH_BOUND_MB, warmup, len(points)
    )


# --- the whole run ---------------------------------------------------------------------------------------


def soak(seconds: float, workdir: Path) -> dict[str, Any]:
    """Run the soak in ``workdir``; its figures (checks not yet made)."""
    warmup = min(max(WARMUP_MIN_SECONDS, WARMUP_SHARE * seconds), seconds / 2)
    # The host collector on, as on every host: it reads each job process as it comes and goes.
    with SidecarProcess(workdir / "soak.sock", "127.0.0.1:0", "--collectors=host") as sidecar:
        prom_dir = workdir / "prometheus"
        with PrometheusServer(prom_dir, [target_of(sidecar.url)], scrape_interval=SCRAPE_INTERVAL) as prom:
            wait_for(lambda: scraped_at(prom) > 0, 30.0, "Prometheus' first scrape of the sidecar")
            runners = [LaneRunner(lane, workdir, sidecar.socket) for lane in LANES]
            start = time.time()
            print(f"  sidecar {sidecar.url}, Prometheus {prom.url}, work in {workdir}", flush=True)
            elapsed = run_jobs(runners, seconds)
            end = time.time()
            records = {
                r.lane.workload: [e for _, e in events.read_records(r.record)] for r in runners if r.record.exists()
            }
            recorded = sum(len(recorded) for recorded in records.values())
            settled = settle(prom, recorded, end)
            rows = compare(prom, records)
            window = f"{math.ceil(time.time() - start)}s"
            figures: dict[str, Any] = {
                "minutes": seconds / 60,
                "seconds": elapsed,
                "settled": settled,
                "jobs": [_job(r, records.get(r.lane.workload, [])) for r in runners],
                "counters": [{**asdict(row), "lost": row.lost, "equal": row.equal} for row in rows],
                "events_recorded": recorded,
                "events_sent": sum(run.sent or 0 for r in runners for run in r.runs),
                "accepted": ingest(prom, "accepted"),
                "invalid": ingest(prom, "invalid"),
                "dropped_by_sidecar": ingest(prom, "dropped"),
                "dropped_by_jobs": sum(run.dropped or 0 for r in runners for run in r.runs),
                "scrapes": prom.scalar(f"count_over_time(up[{window}])") or 0.0,
                "scrapes_failed": prom.scalar(f"count_over_time(up[{window}]) - sum_over_time(up[{window}])") or 0.0,
                "sidecar_restarts": prom.scalar(f"changes({SIDECAR_START}[{window}])") or 0.0,
                "sidecar_alive": sidecar.proc.poll() is None,
                "rss": asdict(sidecar_rss(prom, start, time.time(), warmup)),
            }
    return figures


def _job(runner: LaneRunner, recorded: list[events.AnyEvent]) -> dict[str, Any]:
    kinds = Tally(type(e).__name__ for e in recorded)
    lifecycle = Tally(e.state for e in recorded if isinstance(e, events.Lifecycle))
    return {
        "workload": runner.lane.workload,
        "kind": "jax" if runner.lane.jax else "synthetic",
        "runs": [asdict(run) for run in runner.runs],
        "interrupted": runner.interrupted,
        "steps_reported": kinds[events.Step.__name__],
        "events": len(recorded),
        "event_kinds": dict(sorted(kinds.items())),
        "restarts": lifecycle["restart"],
        "starts": lifecycle["start"],
        "stops": lifecycle["stop"],
    }


def checks(f: dict[str, Any]) -> list[Check]:
    rows, jobs, rss = f["counters"], f["jobs"], f["rss"]
    unequal = [f"{r['counter']} {r['workload']} {r['label']}".strip() for r in rows if not r["equal"]]
    runs = [run for job in jobs for run in job["runs"]]
    unclean = [run["log"] for run in runs if run["returncode"] != 0 or run["sent"] is None]
    kinds = Tally[str]()
    for job in jobs:
        kinds.update(job["event_kinds"])
    missing = [kind for kind in TRAINING_EVENTS if not kinds[kind]]
    return [
        Check(
            "every counter equal",
            bool(rows) and not unequal,
            f"{len(rows) - len(unequal)} of {len(rows)} equal" + (f"; not: {', '.join(unequal)}" if unequal else ""),
        ),
        Check(
            "every event accepted",
            f["accepted"] == f["events_recorded"] == f["events_sent"] and f["invalid"] == 0,
            f"recorded {f['events_recorded']:,}, sent {f['events_sent']:,}, accepted {f['accepted']:,.0f}, "
            f"invalid {f['invalid']:,.0f}",
        ),
        Check(
            "nothing dropped",
            f["dropped_by_jobs"] == 0 and f["dropped_by_sidecar"] == 0,
            f"jobs {f['dropped_by_jobs']}, sidecar {f['dropped_by_sidecar']:,.0f}",
        ),
        Check(
            "every job ended cleanly",
            bool(runs) and not unclean and all(job["starts"] == job["stops"] for job in jobs),
            f"{len(runs)} runs, {len(unclean)} not clean" + (f": {', '.join(unclean)}" if unclean else ""),
        ),
        Check(
            "every event kind reported",
            not missing,
            ", ".join(f"{kind} {kinds[kind]:,}" for kind in TRAINING_EVENTS),
        ),
        Check(
            "sidecar RSS bounded",
            rss["growth_mb"] <= rss["bound_mb"],
            f"warm-up {rss['warmup_mb']:.1f} MB, max {rss['max_mb']:.1f}, end {rss['end_mb']:.1f}: "
            f"+{rss['growth_mb']:.2f} MB, bound {rss['bound_mb']:g} MB",
        ),
        Check(
            "sidecar up throughout",
            f["sidecar_alive"] and f["sidecar_restarts"] == 0 and f["scrapes_failed"] == 0 and f["scrapes"] > 0,
            f"{f['scrapes']:.0f} scrapes, {f['scrapes_failed']:.0f} failed, {f['sidecar_restarts']:.0f} restarts",
        ),
        Check("Prometheus settled", f["settled"], "held every recorded event after the jobs ended"),
    ]


def table(f: dict[str, Any], results: list[Check]) -> str:
    def counted(value: float, exact: bool) -> str:
        return f"{value:,.0f}" if exact else f"{value:,.6g}"

    lines = ["Jobs:"]
    for job in f["jobs"]:
        runs = job["runs"]
        lines.append(
            f"  {job['workload']:<12} {job['kind']:<9} {len(runs):>3} runs  {job['steps_reported']:>7,} steps  "
            f"{job['events']:>7,} events  {job['restarts']} restarts"
        )
    lines.append(f"Counters, job reported vs Prometheus (after {f['seconds']:.0f} s):")
    lines.append(f"  {'counter':<18} {'workload':<12} {'label':<9} {'reported':>16} {'Prometheus':>16} {'lost':>8}")
    for r in f["counters"]:
        lost = "0" if r["equal"] else counted(r["lost"], r["exact"])
        lines.append(
            f"  {r['counter']:<18} {r['workload']:<12} {r['label']:<9} {counted(r['reported'], r['exact']):>16} "
            f"{counted(r['prometheus'], r['exact']):>16} {lost:>8}"
        )
    lines.append(
        f"  {'events accepted':<18} {'all':<12} {'':<9} {f['events_recorded']:>16,} {f['accepted']:>16,.0f} "
        f"{f['events_recorded'] - f['accepted']:>8,.0f}"
    )
    rss = f["rss"]
    lines.append(
        f"Sidecar RSS: {rss['start_mb']:.1f} MB at the start, {rss['warmup_mb']:.1f} MB after the "
        f"{rss['warmup_seconds']:.0f} s warm-up, max {rss['max_mb']:.1f} MB, end {rss['end_mb']:.1f} MB "
        f"({rss['samples']} samples)"
    )
    lines += check_lines(results, 26)
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    seconds = float(args.minutes) * 60
    json_path = args.json or DEFAULT_JSON
    lanes = ", ".join(f"{lane.workload} ({'JAX' if lane.jax else 'synthetic'})" for lane in LANES)
    print(
        f"tpuscope bench soak: {seconds / 60:g} min of {lanes}; Prometheus scrapes every {SCRAPE_INTERVAL}", flush=True
    )
    # Short, for the socket path (Unix sockets stop at 108 bytes); kept when the soak fails, for its logs.
    workdir = Path(tempfile.mkdtemp(prefix="ts-soak-"))
    figures = soak(seconds, workdir)
    results = checks(figures)
    print(table(figures, results), flush=True)
    failed = write_report(json_path, figures, results)
    if failed:
        print(f"FAILED: {', '.join(failed)}; the jobs' logs and recordings are in {workdir}")
    else:
        shutil.rmtree(workdir, ignore_errors=True)
        print(f"PASSED: nothing lost in {figures['seconds']:.0f} s, the sidecar's RSS within its bound")
    return 1 if failed else 0
