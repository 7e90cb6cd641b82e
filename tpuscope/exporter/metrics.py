"""Turn the catalogue into metric objects (collectors of our own, see fast.py) in one registry."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry

from tpuscope import catalog
from tpuscope.exporter import fast

_CLASSES: dict[catalog.Kind, type[fast.Counter | fast.Gauge | fast.Histogram]] = {
    catalog.Kind.COUNTER: fast.Counter,
    catalog.Kind.GAUGE: fast.Gauge,
    catalog.Kind.HISTOGRAM: fast.Histogram,
}


UPDATED = tuple(m for m in catalog.CATALOG if not m.sampled)


def register(registry: CollectorRegistry, metrics: tuple[catalog.Metric, ...] = UPDATED) -> dict[catalog.Metric, Any]:
    """Create and register one metric object per catalogue entry that events update.

    Sampled metrics are served from snapshots instead (:mod:`tpuscope.exporter.samples`).
    """
    created: dict[catalog.Metric, Any] = {}
    for metric in metrics:
        created[metric] = _CLASSES[metric.kind](metric)
        registry.register(created[metric])
    return created
