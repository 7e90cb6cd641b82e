"""The metric objects on the ingest hot path, made cheap per event.

A step event updates eight series. With prometheus_client's own objects each
update pays a ``labels()`` call (validation, a lock, a dict) and each histogram
observation a lock and a linear bucket search: 20 us an event, 50,000 events a
second at most. Here:

- :class:`Histogram` is a collector of our own: one writer (the ingest thread)
  adds to plain lists found by ``bisect``; a scrape copies them. No lock: a
  scrape that lands between a bucket's and the sum's update is off by one
  observation for one scrape, which Prometheus' ``rate()`` cannot tell.
- :class:`Counter` and :class:`Gauge` are prometheus_client's, with their
  labelled children kept in a dict by label values: ``labels()`` becomes one
  dict look-up after the first call.

All three can drop every series with a given label value at once
(``remove_matching``), which is how an expired workload's series go.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Iterator
from typing import Any

from prometheus_client import Counter as _Counter
from prometheus_client import Gauge as _Gauge
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.registry import Collector
from prometheus_client.samples import Exemplar
from prometheus_client.utils import floatToGoString

from tpuscope import catalog
from tpuscope.exporter.exposition import escape_help, exemplar_text, number, render_labels


class _CachedLabels:
    """``labels()`` by one dict look-up; ``remove()`` and ``clear()`` keep the cache in step."""

    _cache: dict[tuple[str, ...], Any]

    def labels(self, *values: Any, **by_name: Any) -> Any:
        if by_name:  # not on the hot path: prometheus_client resolves the names
            return super().labels(*values, **by_name)  # type: ignore[misc]
        try:
            return self._cache[values]
        except KeyError:
            child = super().labels(*values)  # type: ignore[misc]
            self._cache[values] = child
            return child

    def remove(self, *values: str) -> None:
        self._cache.pop(values, None)
        super().remove(*values)  # type: ignore[misc]

    def clear(self) -> None:
        self._cache.clear()
        super().clear()  # type: ignore[misc]

    def remove_matching(self, label: str, value: str) -> None:
        """Remove every child whose ``label`` is ``value`` (the cache first: a later ``labels()`` makes a new one)."""
        index = list(self._labelnames).index(label)  # type: ignore[attr-defined]
        for key in [key for key in self._cache if str(key[index]) == value]:
            del self._cache[key]
        super().remove_by_labels({label: value})  # type: ignore[misc]


class Counter(_CachedLabels, _Counter):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._cache = {}
        super().__init__(*args, **kwargs)


class Gauge(_CachedLabels, _Gauge):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._cache = {}
        super().__init__(*args, **kwargs)


class _Series:
    """One label set's observations: per-bucket counts (not cumulative), the sum, the latest exemplars."""

    __slots__ = ("bounds", "counts", "exemplars", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last: above every bound (+Inf)
        self.sum = 0.0
        self.exemplars: dict[int, Exemplar] = {}

    def observe(self, value: float, exemplar: dict[str, str] | None = None) -> None:
        bucket = bisect_left(self.bounds, value)  # the first bound >= value: Prometheus' le
        self.counts[bucket] += 1
        self.sum += value
        if exemplar:
            self.exemplars[bucket] = Exemplar(exemplar, value, time.time())


class Histogram(Collector):
    """A labelled histogram with prometheus_client's ``labels(...).observe(v, exemplar)`` interface."""

    def __init__(self, metric: catalog.Metric) -> None:
        self.metric = metric
        self._series: dict[tuple[str, ...], _Series] = {}
        self._prefixes: dict[tuple[str, ...], list[str]] = {}  # each series' rendered line starts
        self._host_labels = ""
        self._bounds = tuple(float(b) for b in metric.buckets)
        self._les = [floatToGoString(b) for b in self._bounds] + ["+Inf"]  # type: ignore[no-untyped-call]

    def labels(self, *values: str) -> _Series:
        try:
            return self._series[values]
        except KeyError:
            if len(values) != len(self.metric.labels):
                raise ValueError(f"{self.metric.name}: expected {len(self.metric.labels)} label values") from None
            series = self._series[values] = _Series(self._bounds)
            return series

    def remove(self, *values: str) -> None:
        self._series.pop(values, None)
        self._prefixes.pop(values, None)

    def remove_matching(self, label: str, value: str) -> None:
        """Remove every series whose ``label`` is ``value``."""
        index = self.metric.labels.index(catalog.Label(label))
        for values in [values for values in self._series if values[index] == value]:
            self.remove(*values)

    def collect(self) -> Iterator[HistogramMetricFamily]:
        family = HistogramMetricFamily(
            self.metric.base_name,
            self.metric.help,
            labels=[str(label) for label in self.metric.labels],
            unit=self.metric.unit,
        )
        for values, series in list(self._series.items()):
            counts, total, exemplars = list(series.counts), series.sum, dict(series.exemplars)
            buckets: list[Any] = []
            cumulative = 0
            for index, (le, count) in enumerate(zip(self._les, counts, strict=True)):
                cumulative += count
                exemplar = exemplars.get(index)
                buckets.append((le, cumulative, exemplar) if exemplar else (le, cumulative))
            family.add_metric(list(values), buckets, total)
        yield family

    def write_exposition(self, openmetrics: bool, lines: list[str], host_labels: str = "") -> None:
        """Append the family in the exposition format: what :meth:`collect` says, without building
        sample objects (a scrape of 10,000 series spends most of its time there otherwise).

        ``host_labels``: rendered labels every series also carries (see ``exposition.Writer``).
        """
        if host_labels != self._host_labels:  # the same for a sidecar's life; the cached prefixes hold them
            self._host_labels = host_labels
            self._prefixes.clear()
        name, metric = self.metric.base_name, self.metric
        lines.append(f"# HELP {name} {escape_help(metric.help)}\n# TYPE {name} histogram\n")
        if openmetrics and metric.unit:
            lines.append(f"# UNIT {name} {metric.unit}\n")
        for values, series in list(self._series.items()):
            prefixes = self._prefixes.get(values) or self._prefix(values)
            counts, total, exemplars = list(series.counts), series.sum, dict(series.exemplars) if openmetrics else {}
            cumulative = 0
            for index, count in enumerate(counts):
                cumulative += count
                line = f"{prefixes[index]}{cumulative}.0"
                if (exemplar := exemplars.get(index)) is not None:
                    line += exemplar_text(exemplar)
                lines.append(line + "\n")
            lines.append(f"{prefixes[-2]}{number(total)}\n{prefixes[-1]}{cumulative}.0\n")

    def _prefix(self, values: tuple[str, ...]) -> list[str]:
        """Each line's start up to its value (the bucket lines, then _sum and _count), rendered once."""
        name = self.metric.base_name
        own = render_labels(dict(zip(self.metric.labels, values, strict=True)))
        inner = ",".join(filter(None, (own, self._host_labels)))
        joined = inner + "," if inner else ""
        braces = f"{{{inner}}}" if inner else ""
        prefixes = [f'{name}_bucket{{{joined}le="{le}"}} ' for le in self._les]
        prefixes += [f"{name}_sum{braces} ", f"{name}_count{braces} "]
        if values in self._series:  # not for a series an expiry removed during this scrape: it would linger
            self._prefixes[values] = prefixes
        return prefixes

    def describe(self) -> Iterator[HistogramMetricFamily]:
        yield HistogramMetricFamily(self.metric.base_name, self.metric.help, labels=[], unit=self.metric.unit)
