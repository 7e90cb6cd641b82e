"""Sampled metrics: the latest snapshot from each collector, served as it is at scrape time.

A collector reads a device or the OS every interval and hands over everything
it saw at once (:meth:`SampleStore.replace`). A device, process or port it no
longer sees disappears with the next snapshot instead of lingering at its last
value, and a collector that fails takes its series with it (its
``collector_up`` says why). Scrapes read the store and never wait for a
device, so a hung runtime cannot slow ``/metrics``.

Workload events about device memory land here too (:meth:`SampleStore.set`),
so one metric family holds both sources, told apart by the ``source`` label.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.metrics_core import Metric as MetricFamily
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from tpuscope import catalog

SAMPLED: tuple[catalog.Metric, ...] = tuple(m for m in catalog.CATALOG if m.sampled)


@dataclass(frozen=True)
class Histogram:
    """A cumulative distribution as a source reports it: ``(upper bound, cumulative count)`` pairs, +Inf last."""

    buckets: tuple[tuple[float, float], ...]
    sum: float

    @property
    def count(self) -> float:
        return self.buckets[-1][1] if self.buckets else 0.0

    def __add__(self, other: Histogram) -> Histogram:
        """Two counts of the same thing (two runtime ports; two kinds of one megascale size). Bounds that only one
        of them has cannot be added exactly, so the sum keeps the bounds both have: coarser, never wrong."""
        theirs = dict(other.buckets)  # each ends at +Inf: the sum keeps at least that bound
        merged = tuple((bound, count + theirs[bound]) for bound, count in self.buckets if bound in theirs)
        return Histogram(merged, self.sum + other.sum)


@dataclass(frozen=True)
class Sample:
    metric: catalog.Metric
    labels: tuple[str, ...]
    value: float | Histogram


Key = tuple[catalog.Metric, tuple[str, ...]]


class SampleStore(Collector):
    """Holds the sampled series; registered in the sidecar's registry like any prometheus_client collector."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._snapshots: dict[str, dict[Key, float | Histogram]] = {}

    def replace(self, owner: str, samples: Iterable[Sample]) -> None:
        """Everything ``owner`` (a collector) sees now; what it saw before and not now is gone."""
        snapshot: dict[Key, float | Histogram] = {}
        for s in samples:
            _check(s.metric, s.labels, s.value)
            snapshot[(s.metric, s.labels)] = s.value
        with self._lock:
            self._snapshots[owner] = snapshot

    def set(self, owner: str, metric: catalog.Metric, labels: tuple[str, ...], value: float) -> None:
        """One series from a source that reports changes one at a time (a workload's events)."""
        _check(metric, labels, value)
        with self._lock:
            self._snapshots.setdefault(owner, {})[(metric, labels)] = value

    def remove_matching(self, owner: str, label: catalog.Label, value: str) -> None:
        """Remove ``owner``'s series whose ``label`` is ``value`` (a device no workload reports any more)."""
        with self._lock:
            snapshot = self._snapshots.get(owner, {})
            for metric, labels in [
                (metric, labels)
                for metric, labels in snapshot
                if label in metric.labels and labels[metric.labels.index(label)] == value
            ]:
                del snapshot[(metric, labels)]

    def clear(self, owner: str) -> None:
        with self._lock:
            self._snapshots.pop(owner, None)

    def describe(self) -> Iterator[MetricFamily]:
        # Names only, so the registry can refuse a clash with another collector at registration.
        for metric in SAMPLED:
            yield _family(metric)

    def collect(self) -> Iterator[MetricFamily]:
        with self._lock:
            merged: dict[catalog.Metric, list[tuple[tuple[str, ...], float | Histogram]]] = {}
            for snapshot in self._snapshots.values():
                for (metric, labels), value in snapshot.items():
                    merged.setdefault(metric, []).append((labels, value))
        for metric in SAMPLED:
            if series := merged.get(metric):
                family = _family(metric)
                for labels, value in series:
                    _add(family, list(labels), value)
                yield family


def _check(metric: catalog.Metric, labels: tuple[str, ...], value: float | Histogram) -> None:
    """Refuse what would make the whole exposition fail later, at scrape time."""
    if not metric.sampled or len(labels) != len(metric.labels):
        raise ValueError(f"{metric.name} takes labels {[str(label) for label in metric.labels]}, not {labels}")
    if isinstance(value, Histogram) != (metric.kind is catalog.Kind.HISTOGRAM):
        raise ValueError(f"{metric.name} is a {metric.kind}, not {type(value).__name__}")


def _family(metric: catalog.Metric) -> MetricFamily:
    labels = [str(label) for label in metric.labels]
    if metric.kind is catalog.Kind.HISTOGRAM:
        return HistogramMetricFamily(metric.base_name, metric.help, labels=labels, unit=metric.unit)
    if metric.kind is catalog.Kind.COUNTER:
        return CounterMetricFamily(metric.base_name, metric.help, labels=labels, unit=metric.unit)
    return GaugeMetricFamily(metric.base_name, metric.help, labels=labels, unit=metric.unit)


def _add(family: MetricFamily, labels: list[str], value: float | Histogram) -> None:
    if isinstance(value, Histogram):
        assert isinstance(family, HistogramMetricFamily)
        buckets = [(floatToGoString(bound), count) for bound, count in value.buckets]  # type: ignore[no-untyped-call]
        family.add_metric(labels, buckets, value.sum)
    else:
        family.add_metric(labels, value)  # type: ignore[attr-defined]
