"""A synthetic fleet's series, for the benchmarks that measure Prometheus on a fleet (``bench rule-cost``,
``bench fleet-scale``): its hosts, each series as a model of its value over time, its history written into a TSDB
by promtool (:func:`backfill`), and its present served on ``/metrics`` (:class:`Feed`).

The history and the present come from the same models: a series carries on live, past the history's end, from
where its history left it.
"""

from __future__ import annotations

import http.server
import multiprocessing
import os
import shutil
import subprocess
import time
import urllib.parse
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from tpuscope.catalog import Label
from tpuscope.exporter.exposition import number
from tpuscope.prometheus_api import PrometheusError

WORKERS_PER_WORKLOAD = 16
WORKERS_PER_SLICE = 4
SCRAPES_KEPT = 1024  # a feed keeps the times of its latest scrapes, this many


# --- The hosts and their series ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Host:
    workload: str
    namespace: str
    slice: str
    worker: str

    @property
    def target(self) -> dict[str, str]:
        """The labels its scrape gives every series (the shipped prometheus.yml's, from Kubernetes)."""
        pod = f"{self.workload}-{self.slice}-{self.worker}"
        return {
            "job": "tpuscope",
            "instance": f"{pod}:9478",
            "namespace": self.namespace,
            "jobset": self.workload,
            "pod": pod,
        }

    @property
    def labels(self) -> dict[str, str]:
        """Those of every series its sidecar serves."""
        return {**self.target, Label.SLICE: self.slice, Label.WORKER: self.worker}


def fleet(hosts: int) -> list[Host]:
    """``hosts`` hosts in workloads of 16 workers, 4 to a slice, the workloads in 4 namespaces."""
    return [
        Host(
            workload=f"train-{index // WORKERS_PER_WORKLOAD:03d}",
            namespace=f"team-{index // WORKERS_PER_WORKLOAD % 4}",
            slice=str(index % WORKERS_PER_WORKLOAD // WORKERS_PER_SLICE),
            worker=str(index % WORKERS_PER_SLICE),
        )
        for index in range(hosts)
    ]


@dataclass(frozen=True)
class Series:
    """One series to synthesise, as a line's text up to its value, and its value at a time: ``level`` plus
    ``slope`` per second since ``origin`` (a counter), or the time itself (``clock``: a timestamp gauge)."""

    name: str
    labels: str
    since: float  # seconds of history before the end
    every: float  # seconds between its samples
    level: float = 0.0
    slope: float = 0.0
    origin: float = 0.0
    clock: bool = False

    def value(self, t: float) -> float:
        return t if self.clock else self.level + self.slope * (t - self.origin)


def label_text(labels: dict[str, str]) -> str:
    return "{" + ",".join(f'{name}="{value}"' for name, value in labels.items()) + "}"


@dataclass(frozen=True)
class Timing:
    end: float  # the history's last instant
    days: float
    scrape: float  # seconds between a sidecar series' samples
    interval: float  # seconds between a recorded series' samples

    @property
    def origin(self) -> float:
        """When the fleet started: an hour before its history, so its counters are well under way."""
        return self.end - self.days * 86_400 - 3600

    def since(self, reach: float, every: float) -> float:
        """History for a series read ``reach`` back: that far (at most the history) and a sample more."""
        return min(reach, self.days * 86_400) + every


def recorded_series(found: Iterable[dict[str, Any]], timing: Timing, reach: Callable[[str], float]) -> list[Series]:
    """The recorded series the probes found, each at its probed value over the history it is read back: as far as
    ``reach`` says of its name (a rule's reach, or a dashboard's beside it)."""
    unique: dict[tuple[str, str], Series] = {}
    for result in found:
        labels = dict(result["metric"])
        name = labels.pop("__name__")
        text = label_text(labels)
        since = timing.since(reach(name), timing.interval)
        level = float(result["value"][1])
        unique.setdefault((name, text), Series(name, text, since, timing.interval, level=level))
    return list(unique.values())


def exposition(series: Iterable[Series], t: float) -> str:
    """The series at ``t`` in Prometheus' text format."""
    return "".join(f"{s.name}{s.labels} {number(s.value(t))}\n" for s in series)


def write_series(series: Iterable[Series], end: float, out: TextIO) -> tuple[int, int]:
    """Each series' samples up to ``end`` as OpenMetrics lines, a family's together: a :data:`Part`."""
    count = samples = 0
    for s in sorted(series, key=lambda s: s.name):
        times = range(int(end - s.since), int(end) + 1, int(s.every))
        fixed = None if s.clock or s.slope else number(s.level)
        out.write("".join(f"{s.name}{s.labels} {fixed or number(s.value(t))} {t}\n" for t in times))
        count, samples = count + 1, samples + len(times)
    return count, samples


# --- The history ------------------------------------------------------------------------------------------


# Writes part of the history as OpenMetrics lines, each family's lines together and without the closing ``# EOF``;
# returns the series and samples it wrote.
Part = Callable[[TextIO], tuple[int, int]]


@dataclass
class Backfill:
    path: Path  # the TSDB
    series: int = 0
    samples: int = 0
    seconds: float = 0.0
    parts: int = 0


def backfill(parts: Sequence[Part], directory: Path, writers: int = 1) -> Backfill:
    """A TSDB in ``directory``/tsdb of the parts' history. Each part's OpenMetrics text is written, turned into
    blocks by promtool and deleted before its writer takes the next, so that the text waiting for promtool fits on
    the disk; ``writers`` forked processes write at once. Prometheus reads the TSDB whole: blocks that overlap in
    time are merged as they are read."""
    started = time.monotonic()
    tsdb = directory / "tsdb"
    tsdb.mkdir(parents=True, exist_ok=True)
    global _WRITING  # forked writers read the parts from here: closures do not pickle
    _WRITING = (parts, directory)
    if writers > 1:
        with multiprocessing.get_context("fork").Pool(writers) as pool:
            counts = pool.map(_write_part, range(len(parts)), chunksize=1)
    else:
        counts = [_write_part(index) for index in range(len(parts))]
    _WRITING = None
    for part in directory.glob("part-*"):
        for block in part.iterdir():
            block.rename(tsdb / block.name)
        part.rmdir()
    series, samples = sum(c[0] for c in counts), sum(c[1] for c in counts)
    return Backfill(tsdb, series, samples, time.monotonic() - started, len(parts))


_WRITING: tuple[Sequence[Part], Path] | None = None


def _write_part(index: int) -> tuple[int, int]:
    assert _WRITING is not None
    parts, directory = _WRITING
    source = directory / f"part-{index}.om"
    with open(source, "w") as out:
        counts = parts[index](out)
        out.write("# EOF\n")
    promtool = shutil.which("promtool")
    if promtool is None:
        raise PrometheusError("promtool not found: install Debian's prometheus package (`make test` does)")
    # Blocks of up to 20 days (promtool's largest range under 1000 h), not 2 hours: few blocks, none
    # overlapping, so Prometheus neither compacts them nor opens dozens.
    command = [promtool, "tsdb", "create-blocks-from", "openmetrics", "--max-block-duration=1000h", "-q"]
    run = subprocess.run([*command, str(source), str(directory / f"part-{index}")], capture_output=True, text=True)
    if run.returncode != 0:
        raise PrometheusError(f"promtool could not backfill {source}: {run.stderr.strip()[-2000:]}")
    source.unlink()
    return counts


def prometheus_on(tsdb: Path, workdir: Path) -> list[str]:
    """A fresh Prometheus' data directory in ``workdir``: the TSDB's blocks, hard-linked (it writes only its
    head beside them). Returns the flags that keep the whole history (15 days by default)."""
    shutil.copytree(tsdb, workdir / "data", copy_function=os.link)
    return ["--storage.tsdb.retention.time=10y"]


# --- The present ------------------------------------------------------------------------------------------


class Feed:
    """The fleet's exporters past the history's end: ``/metrics?target=T`` serves ``render(T, now)`` (``T`` is ""
    for a plain ``/metrics``). It counts the scrapes, and keeps when the latest :data:`SCRAPES_KEPT` ended.

    It serves from a process of its own, forked so that it has the series without a copy: in this one, decoding
    a large query answer holds the interpreter for long enough that scrapes time out."""

    def __init__(self, render: Callable[[str, float], str]) -> None:
        context = multiprocessing.get_context("fork")
        self._count = context.Value("Q", 0)
        self._ended = context.Array("d", SCRAPES_KEPT, lock=False)
        feed = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                query = urllib.parse.parse_qs(urllib.parse.urlparse(self.path).query)
                body = render(query.get("target", [""])[0], time.time()).encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                feed._scraped(time.time())

            def log_message(self, *_: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.address = f"127.0.0.1:{self.server.server_address[1]}"
        self.process = context.Process(target=self.server.serve_forever, daemon=True)
        self.process.start()
        self.server.socket.close()  # the child listens on it; this process only needs the address

    @property
    def scrapes(self) -> int:
        """Scrapes served so far."""
        return int(self._count.value)

    def scraped_at(self, scrape: int) -> float:
        """When scrape number ``scrape`` (from 0) ended: one of the latest :data:`SCRAPES_KEPT`."""
        if not self.scrapes - SCRAPES_KEPT <= scrape < self.scrapes:
            raise ValueError(f"scrape {scrape} is not among the latest {SCRAPES_KEPT} of {self.scrapes}")
        return float(self._ended[scrape % SCRAPES_KEPT])

    def _scraped(self, t: float) -> None:
        with self._count.get_lock():
            self._ended[self._count.value % SCRAPES_KEPT] = t
            self._count.value += 1

    def close(self) -> None:
        self.process.terminate()
        self.process.join(timeout=10)
        if self.process.is_alive():  # a SIGTERM handler it inherited kept it
            self.process.kill()
            self.process.join()
