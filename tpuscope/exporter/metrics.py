"""Turn the catalogue into prometheus_client metric objects in one registry."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry

from tpuscope import catalog
from tpuscope.exporter import fast

_CLASSES = {catalog.Kind.COUNTER: fast.Counter, catalog.Kind.GAUGE: fast.Gauge}


UPDATED = tuple(m for m in catalog.CATALOG if not m.sampled)


def register(registry: CollectorRegistry, metrics: tuple[catalog.Metric, ...] = UPDATED) -> dict[catalog.Metric, Any]:
    """Create and register one metric object per catalogue entry that events update (see fast.py).

    Sampled metrics are served from snapshots instead (:mod:`tpuscope.exporter.samples`).
    """
    created: dict[catalog.Metric, Any] = {}
    for metric in metrics:
        if metric.kind is catalog.Kind.HISTOGRAM:
            created[metric] = fast.Histogram(metric)
            registry.register(created[metric])
            continue
        created[metric] = _CLASSES[metric.kind](
            metric.base_name,
            metric.help,
            labelnames=[str(label) for label in metric.labels],
            unit=metric.unit,
            registry=registry,
        )
    return created
