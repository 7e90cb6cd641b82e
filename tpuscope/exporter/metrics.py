"""Turn the catalogue into metric objects (collectors of our own, see fast.py) in one registry.

:func:`register` makes them once, as a :class:`Series`: the sidecar's handle on each metric, looked up by its
catalogue entry and typed by its kind, so that ``series[catalog.STEPS].labels(w)`` is a counter's series
(``inc``, no ``set``) to the type checker as well as at run time.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import overload

from prometheus_client import CollectorRegistry

from tpuscope import catalog
from tpuscope.exporter import fast

Handle = fast.Counter | fast.Gauge | fast.Histogram

_CLASSES: dict[catalog.Kind, type[Handle]] = {
    catalog.Kind.COUNTER: fast.Counter,
    catalog.Kind.GAUGE: fast.Gauge,
    catalog.Kind.HISTOGRAM: fast.Histogram,
}


UPDATED = tuple(m for m in catalog.CATALOG if not m.sampled)


class Series(Mapping[catalog.Metric, Handle]):
    """Each registered catalogue metric's object, by its catalogue entry.

    An entry typed by its kind (every catalogue constant is) gives the object of that kind; a plain
    :class:`catalog.Metric` gives any of the three, which its reader must tell apart before it updates one.
    """

    def __init__(self, handles: Mapping[catalog.Metric, Handle]) -> None:
        self._handles = dict(handles)

    @overload
    def __getitem__(self, metric: catalog.CounterMetric) -> fast.Counter: ...
    @overload
    def __getitem__(self, metric: catalog.GaugeMetric) -> fast.Gauge: ...
    @overload
    def __getitem__(self, metric: catalog.HistogramMetric) -> fast.Histogram: ...
    @overload
    def __getitem__(self, metric: catalog.Metric) -> Handle: ...
    def __getitem__(self, metric: catalog.Metric) -> Handle:
        return self._handles[metric]

    def __iter__(self) -> Iterator[catalog.Metric]:
        return iter(self._handles)

    def __len__(self) -> int:
        return len(self._handles)


def register(registry: CollectorRegistry, metrics: tuple[catalog.Metric, ...] = UPDATED) -> Series:
    """Create and register one metric object per catalogue entry that events update.

    Sampled metrics are served from snapshots instead (:mod:`tpuscope.exporter.samples`).
    """
    handles: dict[catalog.Metric, Handle] = {}
    for metric in metrics:
        handles[metric] = _CLASSES[metric.kind](metric)
        registry.register(handles[metric])
    return Series(handles)
