"""The metric objects on the ingest hot path: collectors of our own, cheap per event and per scrape.

A step event updates eight series. With prometheus_client's own objects each
update pays a ``labels()`` call (validation, a lock, a dict) and each histogram
observation a lock and a linear bucket search: 20 us an event, 50,000 events a
second at most. Here each catalogue metric is a collector of our own, on
prometheus_client's public protocol (``collect()`` yields metric families, the
registry knows nothing else), that keeps its series in a dict by label values:

- ``labels(...)`` is one dict look-up after the first call.
- A :class:`Histogram` series adds to plain lists found by ``bisect``, with no
  lock: one writer (the ingest thread) adds, a scrape reads. A scrape that lands
  between a bucket's and the sum's update is off by one observation for one
  scrape, which Prometheus' ``rate()`` cannot tell.
- Counters and gauges add under a lock, as prometheus_client's values do: a
  counter may have writers on several threads (the collectors' runners).

``collect()`` yields a :class:`SeriesFamily`: each series' label values and
sample values. It makes prometheus_client samples only when a reader asks for
them (``generate_latest``, the OTLP push, ``get_sample_value``); ``/metrics``'
writer reads the values as they are and writes each line from a prefix it
rendered once (:mod:`tpuscope.exporter.exposition`).

All three can drop every series with a given label value at once
(``remove_matching``), which is how an expired workload's series go.
"""

from __future__ import annotations

import threading
import time
from bisect import bisect_left
from collections.abc import Iterator, Mapping, Sequence
from itertools import accumulate
from typing import Generic, TypeVar

from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Exemplar, Sample
from prometheus_client.utils import floatToGoString

from tpuscope import catalog

LabelValues = tuple[str, ...]
# Each sample of a series, in order: the suffix its name takes after the family's, and its le label (None: none).
Shape = tuple[tuple[str, str | None], ...]
# One series at a scrape: its label values, its samples' values in the family's shape, the exemplars by sample index.
Row = tuple[LabelValues, Sequence[float], Mapping[int, Exemplar] | None]


class SeriesFamily(Metric):
    """One of our metrics as a scrape sees it: ``rows``, one per series, in the order of ``shape``.

    A metric family of prometheus_client's (``Metric``) to every reader; ``samples`` are made from the rows on
    the first read, so that /metrics' writer, which reads the rows, does not pay for sample objects.
    """

    def __init__(self, metric: catalog.Metric, shape: Shape, rows: list[Row]) -> None:
        super().__init__(metric.base_name, metric.help, str(metric.kind), metric.unit)
        self.labelnames: tuple[str, ...] = tuple(str(label) for label in metric.labels)
        self.shape = shape
        self.rows = rows
        self._samples: list[Sample] | None = None  # after the base class's ``samples = []``: made on first read

    @property
    def samples(self) -> list[Sample]:
        if self._samples is None:
            self._samples = list(self._make_samples())
        return self._samples

    @samples.setter
    def samples(self, samples: list[Sample]) -> None:  # the base class sets them, and so may a reader (a copy's)
        self._samples = samples

    def _make_samples(self) -> Iterator[Sample]:
        for values, numbers, exemplars in self.rows:
            labels = dict(zip(self.labelnames, values, strict=True))
            for index, ((suffix, le), value) in enumerate(zip(self.shape, numbers, strict=True)):
                exemplar = exemplars.get(index) if exemplars else None
                sample_labels = {**labels, "le": le} if le else dict(labels)  # each its own, as prometheus_client's
                yield Sample(self.name + suffix, sample_labels, value, None, exemplar)


class CounterSeries:
    __slots__ = ("_lock", "value")

    def __init__(self, lock: threading.Lock) -> None:
        self._lock = lock
        self.value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        if amount < 0:
            raise ValueError(f"a counter only goes up, not by {amount}")
        with self._lock:
            self.value += amount


class GaugeSeries:
    __slots__ = ("_lock", "value")

    def __init__(self, lock: threading.Lock) -> None:
        self._lock = lock
        self.value = 0.0

    def set(self, value: float) -> None:
        value = float(value)  # now, not at a scrape: a value that is no number must fail its caller
        with self._lock:  # not between another thread's inc() reading the value and writing it back
            self.value = value

    def inc(self, amount: float = 1.0) -> None:
        with self._lock:
            self.value += amount


class HistogramSeries:
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


S = TypeVar("S", CounterSeries, GaugeSeries, HistogramSeries)


class _Metric(Collector, Generic[S]):
    """A catalogue metric's series by label values, with prometheus_client's ``labels()``/``remove()`` interface."""

    shape: Shape

    def __init__(self, metric: catalog.Metric) -> None:
        self.metric = metric
        self._lock = threading.Lock()
        self._series: dict[LabelValues, S] = {}
        if not metric.labels:  # an unlabelled metric is served from the start, as prometheus_client's are
            self._series[()] = self._new_series()

    def _new_series(self) -> S:
        raise NotImplementedError

    def _row(self, values: LabelValues, series: S) -> Row:
        raise NotImplementedError

    def labels(self, *values: str) -> S:
        try:
            return self._series[values]
        except KeyError:
            return self._add(values)

    def _add(self, values: tuple[str, ...]) -> S:
        if len(values) != len(self.metric.labels):
            raise ValueError(f"{self.metric.name} takes {len(self.metric.labels)} label values, not {values}")
        key = tuple(str(value) for value in values)  # a StrEnum's value, not the member: the writer reads str
        if (series := self._series.get(key)) is None:
            series = self._series[key] = self._new_series()
        return series

    def _only(self) -> S:
        """The series of an unlabelled metric."""
        if self.metric.labels:
            raise ValueError(f"{self.metric.name} has labels: use labels(...)")
        return self._series[()]

    def remove(self, *values: str) -> None:
        self._series.pop(tuple(str(value) for value in values), None)

    def clear(self) -> None:
        self._series.clear()
        if not self.metric.labels:
            self._series[()] = self._new_series()

    def remove_matching(self, label: str, value: str) -> None:
        """Remove every series whose ``label`` is ``value``."""
        index = self.metric.labels.index(catalog.Label(label))
        for values in [values for values in self._series if values[index] == value]:
            self._series.pop(values, None)

    def collect(self) -> Iterator[SeriesFamily]:
        # A copy of the dict in one call: the ingest thread may add a series meanwhile.
        yield SeriesFamily(self.metric, self.shape, [self._row(v, s) for v, s in list(self._series.items())])

    def describe(self) -> Iterator[SeriesFamily]:
        yield SeriesFamily(self.metric, self.shape, [])


class Counter(_Metric[CounterSeries]):
    shape: Shape = (("_total", None),)

    def _new_series(self) -> CounterSeries:
        return CounterSeries(self._lock)

    def _row(self, values: LabelValues, series: CounterSeries) -> Row:
        return values, (series.value,), None

    def inc(self, amount: float = 1.0) -> None:
        self._only().inc(amount)


class Gauge(_Metric[GaugeSeries]):
    shape: Shape = (("", None),)

    def _new_series(self) -> GaugeSeries:
        return GaugeSeries(self._lock)

    def _row(self, values: LabelValues, series: GaugeSeries) -> Row:
        return values, (series.value,), None

    def set(self, value: float) -> None:
        self._only().set(value)


class Histogram(_Metric[HistogramSeries]):
    """A histogram with prometheus_client's ``labels(...).observe(v, exemplar)`` interface."""

    def __init__(self, metric: catalog.Metric) -> None:
        self._bounds = tuple(float(b) for b in metric.buckets)
        les = [floatToGoString(b) for b in self._bounds] + ["+Inf"]  # type: ignore[no-untyped-call]
        self.shape = (*(("_bucket", le) for le in les), ("_sum", None), ("_count", None))
        super().__init__(metric)

    def _new_series(self) -> HistogramSeries:
        return HistogramSeries(self._bounds)

    def _row(self, values: LabelValues, series: HistogramSeries) -> Row:
        cumulative = list(accumulate(series.counts))
        return values, (*cumulative, series.sum, cumulative[-1]), dict(series.exemplars) or None

    def observe(self, value: float, exemplar: dict[str, str] | None = None) -> None:
        self._only().observe(value, exemplar)
