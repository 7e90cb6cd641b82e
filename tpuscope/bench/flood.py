"""``tpuscope bench flood``: jobs sending at ten times the supported event rate against one sidecar.

What must hold while a host floods its sidecar far past capacity:

- ``/metrics`` always answers (a scraper times it every half second);
- no event is lost unseen: every event a job could not send is counted by the job
  (``Monitor.dropped``) and, through the ``dropped`` field of its next step, by
  the sidecar (``ingest_events_total{result="dropped"}``), and the two counts are
  equal; every event a job did send is accepted;
- a well-behaved job beside the flood (a Monitor stepping well below capacity)
  loses nothing: its connection has its own buffer and the sidecar serves its
  connections in turn;
- the sidecar's memory stays bounded: the backlog waits in the jobs' socket
  buffers (kernel memory, capped per connection), never in the sidecar.

Flooders are real processes with real Monitors sending step events as fast as
they can: each emits one prepared step event over and over, the cheapest path
through the Monitor's real delivery, so a core offers the most it can. At the end
each one waits until the sidecar has read everything it sent, then sends one last
step that carries its remaining drops. Prints a table, writes JSON, and exits 1
when a check fails.
"""

from __future__ import annotations

import argparse
import multiprocessing
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tpuscope import catalog, events
from tpuscope.bench.memory import status_mb
from tpuscope.bench.timing import scrape_once
from tpuscope.bench.verdict import Check, check_lines, write_report
from tpuscope.scrape import Scrape
from tpuscope.stats import percentile
from tpuscope.testing.waiting import WaitTimedOut, wait_for
from tpuscope.tracing import Monitor
from tpuscope.workload.sidecar import SidecarProcess

# The event rate one sidecar must sustain: a realistic busy host, e.g. 8 accelerators' jobs
# stepping every 10 ms with phases, compiles and memory reports, is a few thousand events per
# second; 10,000/s leaves room.
SUPPORTED_EVENTS_PER_SECOND = 10_000
# The flood offers at least this many times the supported rate.
OVERLOAD_FACTOR = 10
FLOODERS = 4
# The well-behaved job: a fast training loop, far below capacity.
GOOD_STEPS_PER_SECOND = 100
SCRAPE_INTERVAL_SECONDS = 0.5
# A scrape that takes longer than this counts as unanswered (Prometheus' default scrape timeout).
SCRAPE_TIMEOUT_SECONDS = 10.0
# The sidecar's resident memory must stay under this during the flood: the same target as bench
# perf's for a busy sidecar. The backlog waits in the jobs' socket buffers (kernel memory), so a
# flood must not cost the sidecar more than steady load does.
RSS_BOUND_MB = 80.0
# How long a flooder waits for the sidecar to drain its backlog before giving up (and failing the checks).
DRAIN_TIMEOUT_SECONDS = 120.0
DEFAULT_JSON = Path("run/flood.json")

STEPS = catalog.STEPS.name
INGEST = catalog.INGEST_EVENTS.name


@dataclass
class JobResult:
    """What one job process counted: its Monitor's figures and how many sends it attempted in the flood."""

    workload: str
    sent: int
    dropped: int
    attempts: int = 0  # sends attempted during the flood window
    seconds: float = 0.0  # the flood window as the job measured it
    stepped: int = 0  # steps the job ran in all
    drained: bool = True  # the sidecar read everything before the final step

    @property
    def offered_rate(self) -> float:
        return self.attempts / self.seconds if self.seconds else 0.0


def flooder(path: str, url: str, workload: str, seconds: float, go: Any, results: Any) -> None:
    """A job that steps as fast as it can for ``seconds`` after ``go``, then drains and reports its drops."""
    # One step event, made once and emitted again and again: the Monitor's delivery path (the
    # SocketSink, its drop counting and drop reporting) is all the sidecar sees, and skipping the
    # step timer (bench perf's business) offers more events per core.
    with Monitor(workload, socket=path, traces=False) as mon:
        step = events.Step(workload=mon.workload, step=0, duration_s=0.001, compute_s=0.001)
        go.wait()
        before = mon.sent + mon.dropped
        n, start = 0, time.perf_counter()
        deadline = start + seconds
        while time.perf_counter() < deadline:
            for _ in range(100):  # a clock read per 100 steps, so the loop is mostly sends
                mon.emit(step)
            n += 100
        elapsed = time.perf_counter() - start
        attempts = mon.sent + mon.dropped - before
        # Every step sent so far (all but the lifecycle start) must reach the sidecar before the
        # last one, so that the last one is not dropped and its drop count is the final word.
        drained = wait_for_steps(url, workload, mon.sent - 1, DRAIN_TIMEOUT_SECONDS)
        with mon.step(n):
            pass
        n += 1
    results.put(JobResult(workload, mon.sent, mon.dropped, attempts, elapsed, n, drained))


def wait_for_steps(url: str, workload: str, steps: int, timeout: float) -> bool:
    """Poll the sidecar until it has counted ``steps`` steps of ``workload``; whether it did in time (the job
    reports it, and a check fails on it: a flooder that raised would report nothing)."""

    def counted() -> float:
        # A workload whose first step has not arrived yet has no series: it has counted none.
        return Scrape.fetch(url, timeout=SCRAPE_TIMEOUT_SECONDS).value(STEPS, workload=workload) or 0.0

    try:
        # A slow scrape under the flood is "not yet": the scraper thread reports those.
        wait_for(lambda: counted() >= steps, timeout, f"{steps} steps of {workload}", ignoring=(OSError,), interval=0.2)
    except WaitTimedOut:
        return False
    return True


def good_job(path: str, workload: str, rate: float, stop: Any, results: Any) -> None:
    """A well-behaved job: ``rate`` steps per second until ``stop``."""
    with Monitor(workload, socket=path, traces=False) as mon:
        n, start = 0, time.perf_counter()
        while not stop.is_set():
            with mon.step(n):
                pass
            n += 1
            time.sleep(max(0.0, start + n / rate - time.perf_counter()))
    results.put(JobResult(workload, mon.sent, mon.dropped, stepped=n))


@dataclass
class Watch:
    """The scraper and the memory sampler, on threads of this process, for as long as the flood lasts."""

    url: str
    pid: int
    scrape_ms: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    rss_mb: list[float] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> None:
        self._threads = [threading.Thread(target=self._scrape), threading.Thread(target=self._sample_rss)]
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join()

    def _scrape(self) -> None:
        while not self._stop.is_set():
            started = time.perf_counter()
            try:
                seconds, _ = scrape_once(self.url)  # as Prometheus asks: OpenMetrics, gzip
                self.scrape_ms.append(seconds * 1e3)
            except OSError as e:  # refused, reset or timed out: unanswered
                self.failures.append(f"{type(e).__name__}: {e}")
            self._stop.wait(max(0.0, SCRAPE_INTERVAL_SECONDS - (time.perf_counter() - started)))

    def _sample_rss(self) -> None:
        while not self._stop.wait(0.1):
            if (rss := status_mb(self.pid, "VmRSS")) is not None:
                self.rss_mb.append(rss)


def flood(seconds: float, workdir: Path) -> tuple[dict[str, Any], list[Check]]:
    """Run the flood; its figures and the checks on them."""
    spawn = multiprocessing.get_context("spawn")
    results: Any = spawn.Queue()
    go, stop_good = spawn.Event(), spawn.Event()
    # The host collector on, as on every host: scrapes carry its series and its work.
    with SidecarProcess(workdir / "flood.sock", "127.0.0.1:0", "--collectors=host") as sidecar:
        path, url = str(sidecar.socket), sidecar.url
        watch = Watch(url, sidecar.proc.pid)
        watch.start()
        good = spawn.Process(target=good_job, args=(path, "flood-good", GOOD_STEPS_PER_SECOND, stop_good, results))
        good.start()
        flooders = [
            spawn.Process(target=flooder, args=(path, url, f"flood-{i}", seconds, go, results)) for i in range(FLOODERS)
        ]
        for process in flooders:
            process.start()
        # Every flooder has connected (its start event made its series) before the flood begins, so
        # that their windows coincide and the offered rates add up.
        wait(lambda: all(Scrape.fetch(url).has(STEPS, workload=f"flood-{i}") for i in range(FLOODERS)), "every flooder")
        go.set()
        flooded = [results.get(timeout=seconds + DRAIN_TIMEOUT_SECONDS + 60) for _ in flooders]
        for process in flooders:
            process.join()
        stop_good.set()
        good_result: JobResult = results.get(timeout=60)
        good.join()
        # Everything every job sent, the last steps and stop events included, must be accepted.
        expected = sum(r.sent for r in flooded) + good_result.sent
        wait(
            lambda: Scrape.fetch(url).present(INGEST, result=catalog.ACCEPTED) >= expected,
            f"{expected} events accepted",
            timeout=DRAIN_TIMEOUT_SECONDS,
        )
        time.sleep(0.5)  # anything beyond the expected count would show now
        watch.stop()
        final = Scrape.fetch(url)
        peak_mb = max([*watch.rss_mb, status_mb(sidecar.proc.pid, "VmHWM") or 0.0])
        sidecar_alive = sidecar.proc.poll() is None
    return figures_and_checks(flooded, good_result, final, watch, peak_mb, sidecar_alive, seconds)


def figures_and_checks(
    flooded: list[JobResult],
    good: JobResult,
    final: Scrape,
    watch: Watch,
    peak_mb: float,
    sidecar_alive: bool,
    seconds: float,
) -> tuple[dict[str, Any], list[Check]]:
    # The sidecar creates every result's series at start: one missing is a bug, not a zero.
    accepted = final.present(INGEST, result=catalog.ACCEPTED)
    sidecar_dropped = final.present(INGEST, result=catalog.DROPPED)
    invalid = final.present(INGEST, result=catalog.INVALID)
    offered = sum(r.offered_rate for r in flooded)
    flood_sent = sum(r.sent for r in flooded)
    flood_dropped = sum(r.dropped for r in flooded)
    # A workload the sidecar never saw has counted no steps: the check on its steps then reports it.
    good_on_sidecar = final.value(STEPS, workload=good.workload) or 0.0
    scrapes = watch.scrape_ms
    figures: dict[str, Any] = {
        "seconds": seconds,
        "supported_events_per_second": SUPPORTED_EVENTS_PER_SECOND,
        "flooders": len(flooded),
        "offered_events_per_second": offered,
        "offered_factor": offered / SUPPORTED_EVENTS_PER_SECOND,
        "flood_attempts": sum(r.attempts for r in flooded),
        "flood_sent": flood_sent,
        "flood_dropped_by_jobs": flood_dropped,
        "accepted_by_sidecar": accepted,
        "accepted_from_flooders": accepted - good.sent,
        "accepted_events_per_second_in_flood": sum(r.sent for r in flooded) / seconds,
        "dropped_by_sidecar": sidecar_dropped,
        "invalid_by_sidecar": invalid,
        "all_drained": all(r.drained for r in flooded),
        "good_steps_run": good.stepped,
        "good_steps_on_sidecar": good_on_sidecar,
        "good_sent": good.sent,
        "good_dropped": good.dropped,
        "scrapes_answered": len(scrapes),
        "scrapes_unanswered": len(watch.failures),
        "scrape_failures": watch.failures[:10],
        "scrape_p50_ms": percentile(scrapes, 0.5) if scrapes else None,
        "scrape_p99_ms": percentile(scrapes, 0.99) if scrapes else None,
        "scrape_max_ms": max(scrapes) if scrapes else None,
        "rss_peak_mb": peak_mb,
        "rss_bound_mb": RSS_BOUND_MB,
        "jobs": [asdict(r) for r in [*flooded, good]],
    }
    wanted_rate = OVERLOAD_FACTOR * SUPPORTED_EVENTS_PER_SECOND
    checks = [
        Check("offered rate", offered >= wanted_rate, f"{offered:,.0f}/s offered, >= {wanted_rate:,}/s wanted"),
        Check("flood overflowed", flood_dropped > 0, f"{flood_dropped:,} dropped by the flooders (> 0 wanted)"),
        Check(
            "drops counted on both sides",
            flood_dropped == sidecar_dropped,
            f"jobs {flood_dropped:,}, sidecar {sidecar_dropped:,.0f}",
        ),
        Check(
            "every sent event accepted",
            flood_sent == accepted - good.sent and invalid == 0,
            f"flooders sent {flood_sent:,}, the sidecar accepted {accepted - good.sent:,.0f}; {invalid:.0f} invalid",
        ),
        Check(
            "good job lost nothing",
            good.dropped == 0 and good_on_sidecar == good.stepped,
            f"{good.stepped:,} steps run, {good_on_sidecar:,.0f} on the sidecar, {good.dropped} dropped",
        ),
        Check(
            "every scrape answered",
            not watch.failures and bool(scrapes),
            f"{len(scrapes)} answered, {len(watch.failures)} not",
        ),
        Check("sidecar memory bounded", peak_mb <= RSS_BOUND_MB, f"peak {peak_mb:.1f} MB, bound {RSS_BOUND_MB:.0f} MB"),
        Check("sidecar alive", sidecar_alive, "still running at the end" if sidecar_alive else "it exited"),
    ]
    return figures, checks


def wait(condition: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    """``wait_for``, with a failed scrape (the sidecar under load) meaning "not yet"."""
    wait_for(condition, timeout, what, ignoring=(OSError,))


def table(figures: dict[str, Any], checks: list[Check]) -> str:
    f = figures

    def ms(value: float | None) -> str:
        return "n/a" if value is None else f"{value:,.1f} ms"

    rows = [
        ("offered rate, all flooders", f"{f['offered_events_per_second']:,.0f} events/s", ""),
        ("  supported rate", f"{f['supported_events_per_second']:,} events/s", f"x{f['offered_factor']:.1f} offered"),
        ("flooders' events sent", f"{f['flood_sent']:,}", f"{f['accepted_events_per_second_in_flood']:,.0f}/s"),
        ("  accepted by the sidecar (theirs)", f"{f['accepted_from_flooders']:,.0f}", ""),
        ("flooders' events dropped, jobs' count", f"{f['flood_dropped_by_jobs']:,}", ""),
        ("  dropped, sidecar's count", f"{f['dropped_by_sidecar']:,.0f}", ""),
        ("good job: steps run / on the sidecar", f"{f['good_steps_run']:,} / {f['good_steps_on_sidecar']:,.0f}", ""),
        ("  good job: dropped", f"{f['good_dropped']}", ""),
        ("scrapes answered / not", f"{f['scrapes_answered']} / {f['scrapes_unanswered']}", ""),
        ("  scrape p50", ms(f["scrape_p50_ms"]), ""),
        ("  scrape p99", ms(f["scrape_p99_ms"]), ""),
        ("  scrape max", ms(f["scrape_max_ms"]), ""),
        ("sidecar RSS peak", f"{f['rss_peak_mb']:.1f} MB", f"bound {f['rss_bound_mb']:.0f} MB"),
    ]
    lines = [f"  {name:<40} {value:>22}  {note}".rstrip() for name, value, note in rows]
    lines += check_lines(checks)
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    seconds = float(args.seconds)
    json_path = args.json or DEFAULT_JSON
    print(
        f"tpuscope bench flood: {FLOODERS} flooders for {seconds:g} s at >= {OVERLOAD_FACTOR}x "
        f"{SUPPORTED_EVENTS_PER_SECOND:,} events/s, one job at {GOOD_STEPS_PER_SECOND} steps/s",
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="ts-flood-") as tmp:
        figures, checks = flood(seconds, Path(tmp))
    print(table(figures, checks), flush=True)
    failed = write_report(json_path, figures, checks)
    print(
        f"{len(checks) - len(failed)} of {len(checks)} checks passed"
        + (f"; FAILED: {', '.join(failed)}" if failed else "")
    )
    return 1 if failed else 0
