"""What the dashboard tests share: the boards as built with the default thresholds, Grafana's substitutions,
and a Prometheus over a TSDB backfilled from series whose right answers are known (test_dashboard_queries'
fleet, test_report's)."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml
from conftest import require

from tpuscope import catalog as c
from tpuscope import dashboards, kubernetes
from tpuscope.dashboards import queries
from tpuscope.dashboards.panels import panels_of
from tpuscope.prometheus_api import PrometheusAPI
from tpuscope.promql import SIDECAR_START
from tpuscope.testing import grafana
from tpuscope.testing.prometheus import ServerProcess
from tpuscope.thresholds import Thresholds

ALL = ".*"
DEFAULTS = Thresholds()  # the built-in thresholds: the committed boards'
BOARDS = {name: build(DEFAULTS) for name, build in dashboards.DASHBOARDS.items()}
SCRAPE = 10  # seconds between a backfilled target's samples


def panel_titled(board: dict[str, Any], title: str) -> dict[str, Any]:
    (panel,) = [p for p in panels_of(board) if p["title"] == title]
    return panel


def step_values(panel: dict[str, Any]) -> list[float]:
    """Where the panel's colours change (the first step, everything below the next, has no value)."""
    return [s["value"] for s in panel["fieldConfig"]["defaults"]["thresholds"]["steps"] if s["value"] is not None]


def substitute(expr: str, values: dict[str, str], range_seconds: int, interval_seconds: int = 2) -> str:
    """Grafana's job before a query leaves it (tpuscope.testing.grafana), at the tests' short scrape interval, the
    price per chip-hour at its default."""
    return grafana.substitute(expr, {queries.PRICE: "1.20", **values}, range_seconds, interval_seconds, 10)


class Fleet:
    """Series as OpenMetrics text: ``name{labels} value timestamp`` lines, times relative to the evaluation."""

    def __init__(self, at: int) -> None:
        self.at = at
        self.families: dict[str, list[str]] = {}

    def series(
        self,
        name: str,
        labels: dict[str, str],
        start: int,
        end: int,
        value: Callable[[int], float],
        every: int = SCRAPE,
    ) -> None:
        """Samples ``every`` seconds from ``start`` to ``end`` (relative, inclusive); ``value`` of the time."""
        text = ",".join(f'{k}="{v}"' for k, v in labels.items())
        self.families.setdefault(name, []).extend(
            f"{name}{{{text}}} {value(t):.17g} {self.at + t}" for t in range(start, end + 1, every)
        )

    def sidecar(
        self,
        instance: str,
        pod: Mapping[str, str],
        slice_: str,
        worker: str,
        start: int,
        end: int,
        topology: str = "",
    ) -> dict[str, str]:
        """A sidecar in ``pod`` (its target labels) scraped from ``start`` to ``end``; the labels its series carry
        (``topology``: its ``--tpu-topology``, on every series but Prometheus' own ``up``)."""
        target = {"job": kubernetes.JOB, "instance": instance, **pod}
        self.series("up", target, start, end, lambda t: 1)
        host = {**target, "slice": slice_, "worker": worker}
        if topology:
            host[str(c.Label.TPU_TOPOLOGY)] = topology
        self.series(SIDECAR_START, host, start, end, lambda t: self.at + start)
        return host

    def counter(self, metric: str, labels: dict[str, str], start: int, end: int, steps: Mapping[int, float]) -> None:
        """A counter whose value is ``steps``' latest at or before each sample (its first key is its birth)."""
        self.series(metric, labels, min(steps), end, lambda t: steps[max(k for k in steps if k <= t)])

    def openmetrics(self) -> str:
        return "".join(line + "\n" for lines in self.families.values() for line in lines) + "# EOF\n"


@contextlib.contextmanager
def backfilled(directory: Path, series: Fleet, *flags: str) -> Iterator[PrometheusAPI]:
    """A Prometheus over a TSDB that promtool wrote from ``series``, with ``flags`` of its own."""
    source = directory / "fleet.om"
    source.write_text(series.openmetrics())
    data = directory / "data"
    # A few blocks for the 40 days, not one per 2 hours (the default): Prometheus starts at once.
    backfill = [require("promtool"), "tsdb", "create-blocks-from", "openmetrics", "--max-block-duration=1000h", "-q"]
    run = subprocess.run([*backfill, str(source), str(data)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    with served(directory, *flags) as api:
        yield api


@contextlib.contextmanager
def served(directory: Path, *flags: str) -> Iterator[PrometheusAPI]:
    """A Prometheus over the TSDB in ``directory``/data."""
    config = directory / "prometheus.yml"
    config.write_text(yaml.safe_dump({"global": {"scrape_interval": f"{SCRAPE}s"}}))
    require("prometheus")
    flags = (f"--config.file={config}", f"--storage.tsdb.path={directory / 'data'}", *flags)
    with ServerProcess("prometheus", "prometheus", list(flags), directory) as server:
        yield PrometheusAPI(server.url, timeout=30)
