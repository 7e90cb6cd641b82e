"""``tpuscope bench perf``: what tpuscope costs, side by side with its peers, against its targets.

Prints a table and writes JSON. Every figure is measured here, on this machine, in
one run: the job's cost per event and per step (the Monitor on and off, interleaved,
on the JAX workload), the sidecar's ingest throughput on one core, its scrape
latency at 1k, 10k and 50k series, its memory and CPU idle and busy; and, for
scale, a bare prometheus_client ``Histogram.observe``, one OpenTelemetry span per
step, and Debian's node_exporter scraped on the same machine.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil

from tpuscope import catalog, events
from tpuscope.bench.overhead import ab_test, direct_cost
from tpuscope.bench.scrape_latency import scrape_once
from tpuscope.scrape import Scrape
from tpuscope.stats import percentile
from tpuscope.testing.prometheus import free_port
from tpuscope.tracing import Monitor
from tpuscope.workload.sidecar import SidecarProcess


@dataclass(frozen=True)
class Size:
    emits: int = 20_000  # events timed one by one
    ab_steps: int = 405  # JAX steps per A/B run (5 warm-up, then blocks of 10 on and off)
    ingest_seconds: float = 5.0
    paced_rate: int = 90_000  # events/s that must all arrive (below the 100k target)
    series: tuple[int, ...] = (1_000, 10_000, 50_000)
    scrapes: int = 200
    settle_seconds: float = 10.0  # idle and busy windows for CPU and memory


FULL = Size()
TINY = Size(emits=300, ab_steps=25, ingest_seconds=0.5, paced_rate=2_000, series=(300,), scrapes=5, settle_seconds=0.5)


@dataclass
class Figure:
    name: str
    value: float | None
    unit: str
    target: str = ""  # "<= 10", ">= 100000": empty when there is none
    note: str = ""

    @property
    def met(self) -> bool | None:
        if not self.target or self.value is None:
            return None
        op, bound = self.target.split()
        return self.value <= float(bound) if op == "<=" else self.value >= float(bound)


@dataclass
class Report:
    machine: dict[str, Any]
    figures: list[Figure] = field(default_factory=list)

    def add(self, *figures: Figure) -> None:
        self.figures += figures
        for f in figures:
            print(line(f), flush=True)

    def json(self) -> dict[str, Any]:
        return {"machine": self.machine, "figures": [{**asdict(f), "met": f.met} for f in self.figures]}


def line(f: Figure) -> str:
    value = "n/a" if f.value is None else f"{f.value:,.{0 if abs(f.value) >= 100 else 2}f}"
    verdict = "" if f.met is None else ("met" if f.met else "MISSED")
    target = f"target {f.target} {verdict}" if f.target else ""
    return f"  {f.name:<50} {value:>10} {f.unit:<9} {target:<22} {f.note}".rstrip()


# --- the job side --------------------------------------------------------------------------------------
def timed_calls(call: Callable[[int], None], n: int, pause_every: int = 2000) -> list[float]:
    """Microseconds of each of ``n`` calls; a pause every ``pause_every`` lets a sidecar drain."""
    result = []
    for i in range(n):
        start = time.perf_counter_ns()
        call(i)
        result.append((time.perf_counter_ns() - start) / 1000)
        if i % pause_every == pause_every - 1:
            time.sleep(0.05)
    return result


def job_side(report: Report, size: Size, sidecar: SidecarProcess, workdir: Path) -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
    from prometheus_client import CollectorRegistry, Histogram

    class Discard(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    with Monitor("perf-emit", socket=sidecar.socket, traces=False) as mon:

        def emit(i: int) -> None:
            with mon.step(i):
                pass

        ours = timed_calls(emit, size.emits)
        dropped = mon.dropped
    child = Histogram("perf_step_seconds", "A bare histogram.", ["workload"], registry=CollectorRegistry()).labels("w")
    bare = timed_calls(lambda i: child.observe(0.1), size.emits)
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(Discard(), max_queue_size=size.emits * 2))
    tracer = provider.get_tracer("perf")
    spans = timed_calls(lambda i: tracer.start_span("step").end(), size.emits)
    provider.shutdown()
    report.add(
        Figure("emit one step event, p50", percentile(ours, 0.5), "us", note=f"{dropped} dropped"),
        Figure("emit one step event, p99", percentile(ours, 0.99), "us"),
        Figure("  peer: prometheus_client Histogram.observe, p50", percentile(bare, 0.5), "us"),
        Figure("  peer: prometheus_client Histogram.observe, p99", percentile(bare, 0.99), "us"),
        Figure("  peer: one OpenTelemetry span per step, p50", percentile(spans, 0.5), "us"),
        Figure("  peer: one OpenTelemetry span per step, p99", percentile(spans, 0.99), "us"),
    )
    per_step(report, size, sidecar, workdir)


def per_step(report: Report, size: Size, sidecar: SidecarProcess, workdir: Path) -> None:
    """The Monitor on the default JAX workload, on and off, interleaved; tracing unsampled, then sampled."""
    from tpuscope.workload.training import Workload, WorkloadOptions, ensure_cpu_devices

    ensure_cpu_devices(8)
    os.environ.setdefault("OTEL_BSP_MAX_QUEUE_SIZE", str(4 * 4 * size.emits))  # every kept step's spans: none dropped
    for label, every in (("spans unsampled", 10**9), ("spans sampled", 1)):
        spans = workdir / f"spans-{every}.jsonl"
        with Monitor("perf-step", socket=sidecar.socket, spans_file=spans, sample_every=every) as monitor:
            options = WorkloadOptions(steps=size.ab_steps, checkpoint_every=0, run_dir=workdir / f"run-{every}")
            with Workload(options, monitor, log=lambda _: None) as workload:
                ab = ab_test(workload, size.ab_steps)
            direct = direct_cost(monitor, steps=max(200, size.emits // 4))
        share = direct / ab.step_off * 100
        report.add(
            Figure(f"JAX step, Monitor off, p50 [{label}]", ab.step_off * 1e3, "ms"),
            Figure(
                f"  A/B on - off [{label}]",
                ab.difference * 1e6,
                "us",
                note=f"+- {ab.margin * 1e6:.0f} us over {ab.pairs} block pairs: the machine's noise",
            ),
            Figure(f"  instrumentation per step [{label}]", direct * 1e6, "us", "<= 10" if every > 1 else ""),
            Figure(f"  instrumentation share of a step [{label}]", share, "%", "<= 0.5" if every > 1 else ""),
        )


# --- the sidecar ----------------------------------------------------------------------------------------
def blast(path: str, seconds: float, rate: float, results: Any) -> None:
    """A job sending step events as fast as it can (``rate`` 0) or at ``rate`` per second."""
    os.sched_setaffinity(0, set(range(1, os.cpu_count() or 2)) or {0})
    with Monitor(f"perf-ingest-{os.getpid()}", socket=path, traces=False) as mon:
        sent, start = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - start) < seconds:
            if rate and sent > elapsed * rate:
                time.sleep(0.0005)
                continue
            for i in range(100):
                with mon.step(sent + i):
                    pass
            sent += 100
        dropped = mon.dropped
    results.put((sent, dropped))


def start_jobs(path: str, seconds: float, rate: float, count: int) -> Callable[[], list[tuple[int, int]]]:
    """Start ``count`` job processes running :func:`blast`; the function returned waits for them and
    gives each one's (events sent, events it dropped)."""
    spawn = multiprocessing.get_context("spawn")
    results: Any = spawn.Queue()
    jobs = [spawn.Process(target=blast, args=(path, seconds, rate, results)) for _ in range(count)]
    for job in jobs:
        job.start()

    def finish() -> list[tuple[int, int]]:
        sent_dropped = [results.get(timeout=120) for _ in jobs]
        for job in jobs:
            job.join()
        return sent_dropped

    return finish


def ingest_counts(url: str) -> tuple[float, float, float]:
    scrape = Scrape.fetch(url)
    name = catalog.INGEST_EVENTS.name
    return tuple(scrape.value(name, result=r) for r in ("accepted", "invalid", "dropped"))  # type: ignore[return-value]


def sidecar_side(report: Report, size: Size, workdir: Path) -> None:
    # The host collector on (it runs on every host), every 5 s as by default.
    with SidecarProcess(workdir / "ingest.sock", "127.0.0.1:0", "--collectors=host") as sidecar:
        os.sched_setaffinity(sidecar.proc.pid, {0})  # one core: the figure the target is about
        process = psutil.Process(sidecar.proc.pid)
        idle_cpu, idle_rss = usage(process, size.settle_seconds)
        # Steady load before the floods below, whose allocations the allocator keeps for a while.
        busy_cpu, busy_rss = usage(process, size.settle_seconds, str(sidecar.socket), rate=1000)
        report.add(
            Figure("sidecar RSS, idle", idle_rss, "MB", "<= 80"),
            Figure("sidecar CPU, idle", idle_cpu, "% core", "<= 1"),
            Figure("sidecar RSS, 1,000 steps/s", busy_rss, "MB", "<= 80"),
            Figure("sidecar CPU, 1,000 steps/s", busy_cpu, "% core"),
        )
        for label, rate, senders in (("flat out", 0, 2), (f"paced at {size.paced_rate:,}/s", size.paced_rate, 1)):
            before = ingest_counts(sidecar.url)
            sent_dropped = start_jobs(str(sidecar.socket), size.ingest_seconds, rate, senders)()
            time.sleep(1)
            after = ingest_counts(sidecar.url)
            accepted, invalid, _ = (b - a for a, b in zip(before, after, strict=True))
            accepted -= 2 * senders  # each job's lifecycle start and stop
            sent = sum(s for s, _ in sent_dropped)
            dropped = sum(d for _, d in sent_dropped)
            if rate:
                report.add(
                    Figure(
                        f"ingest {label}: events lost",
                        sent - accepted,
                        "events",
                        "<= 0",
                        f"{sent:,} sent, {accepted:,.0f} accepted, {invalid:.0f} invalid",
                    )
                )
            else:
                report.add(
                    Figure(
                        "ingest on one core, step events",
                        accepted / size.ingest_seconds,
                        "events/s",
                        ">= 100000",
                        f"{dropped:,} dropped by the jobs (counted), {invalid:.0f} invalid",
                    )
                )
        report.add(
            Figure(
                "sidecar RSS after the floods",
                process.memory_info().rss / 2**20,
                "MB",
                "<= 80",
                "three workloads of a million steps each, none checkpointed",
            )
        )


def usage(process: psutil.Process, seconds: float, path: str = "", rate: int = 0) -> tuple[float, float]:
    """The process' CPU (% of one core) over ``seconds`` (with a job sending at ``rate`` when given), and RSS."""
    finish = start_jobs(path, seconds, rate, 1) if path else None
    if finish:
        time.sleep(min(1.0, seconds))  # the job's start-up is not the sidecar's cost
    before, start = process.cpu_times(), time.perf_counter()
    time.sleep(seconds)
    after, elapsed = process.cpu_times(), time.perf_counter() - start
    if finish:
        finish()
    cpu = max(0.0, after.user + after.system - before.user - before.system) / elapsed * 100
    return cpu, process.memory_info().rss / 2**20


# --- scrapes ------------------------------------------------------------------------------------------
def series_count(url: str) -> int:
    with urllib.request.urlopen(url, timeout=30) as response:
        return sum(1 for raw in response.read().splitlines() if raw and not raw.startswith(b"#"))


def scrape_latencies(url: str, scrapes: int) -> list[float]:
    scrape_once(url)  # the first scrape warms the collectors' caches
    return [scrape_once(url)[0] * 1e3 for _ in range(scrapes)]


def scrape_side(report: Report, size: Size, workdir: Path) -> None:
    with SidecarProcess(workdir / "scrape.sock", "127.0.0.1:0", "--collectors=none") as sidecar:
        base = series_count(sidecar.url)
        fill_more(sidecar.socket, 0, 1)
        time.sleep(0.2)
        per_workload = series_count(sidecar.url) - base
        filled = 1
        for target in size.series:
            wanted = max(1, (target - base) // per_workload)
            fill_more(sidecar.socket, filled, wanted)
            filled = max(filled, wanted)
            time.sleep(0.5)
            count = series_count(sidecar.url)
            timings = scrape_latencies(sidecar.url, size.scrapes)
            report.add(
                Figure(f"scrape p50 at {count:,} series", percentile(timings, 0.5), "ms"),
                Figure(
                    f"scrape p99 at {count:,} series",
                    percentile(timings, 0.99),
                    "ms",
                    "<= 25" if target == 10_000 else "",
                ),
            )
    node_exporter(report, size)


def fill_more(path: Path, have: int, want: int) -> None:
    """Steps of workloads ``have`` to ``want`` - 1, one event each, over one connection (as many jobs would)."""
    if want > have:
        with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as s:
            s.connect(str(path))
            for w in range(have, want):
                event = events.Step(workload=f"w{w}", step=1, duration_s=0.1, compute_s=0.05, io_s=0.01)
                s.send(events.encode(event))
                if w % 200 == 199:
                    time.sleep(0.01)


def node_exporter(report: Report, size: Size) -> None:
    binary = shutil.which("prometheus-node-exporter")
    if binary is None:
        report.add(Figure("  peer: node_exporter scrape p99", None, "ms", note="not installed (make system-deps)"))
        return
    port = free_port()
    with running([binary, f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"]):
        url = f"http://127.0.0.1:{port}/metrics"
        deadline = time.monotonic() + 20
        while True:
            try:
                count = series_count(url)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        timings = scrape_latencies(url, size.scrapes)
    report.add(
        Figure(f"  peer: node_exporter scrape p50 ({count:,} series)", percentile(timings, 0.5), "ms"),
        Figure(f"  peer: node_exporter scrape p99 ({count:,} series)", percentile(timings, 0.99), "ms"),
    )


@contextmanager
def running(command: list[str]) -> Iterator[subprocess.Popen[bytes]]:
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield process
    finally:
        process.terminate()
        process.wait(10)


# --- the whole run -------------------------------------------------------------------------------------
def machine() -> dict[str, Any]:
    return {
        "cpus": os.cpu_count(),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "cpu_model": next(
            (
                line.split(":", 1)[1].strip()
                for line in Path("/proc/cpuinfo").read_text().splitlines()
                if "model name" in line
            ),
            "unknown",
        ),
        "python": ".".join(map(str, sys.version_info[:3])),
    }


def run(tiny: bool = False, json_path: Path | None = None) -> int:
    size = TINY if tiny else FULL
    report = Report(machine())
    print(f"tpuscope bench perf ({'tiny' if tiny else 'full'} size) on {report.machine}", flush=True)
    with tempfile.TemporaryDirectory(prefix="ts-perf-") as tmp:
        workdir = Path(tmp)
        print("The job:", flush=True)
        with SidecarProcess(workdir / "job.sock", "127.0.0.1:0", "--collectors=none") as sidecar:
            job_side(report, size, sidecar, workdir)
        print("The sidecar:", flush=True)
        sidecar_side(report, size, workdir)
        print("Scrapes:", flush=True)
        scrape_side(report, size, workdir)
    missed = [f.name for f in report.figures if f.met is False]
    print(
        f"{len(report.figures)} figures, {sum(f.met is True for f in report.figures)} targets met, "
        f"{len(missed)} missed{': ' + '; '.join(missed) if missed else ''}"
    )
    if json_path:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(report.json(), indent=2) + "\n")
        print(f"JSON: {json_path}")
    return 0
