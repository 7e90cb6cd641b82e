"""Turn the catalogue into prometheus_client metric objects in one registry."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.metrics import MetricWrapperBase

from tpuscope import catalog

_CLASSES: dict[catalog.Kind, type[MetricWrapperBase]] = {
    catalog.Kind.COUNTER: Counter,
    catalog.Kind.GAUGE: Gauge,
    catalog.Kind.HISTOGRAM: Histogram,
}


UPDATED = tuple(m for m in catalog.CATALOG if not m.sampled)


def register(registry: CollectorRegistry, metrics: tuple[catalog.Metric, ...] = UPDATED) -> dict[catalog.Metric, Any]:
    """Create and register one prometheus_client object per catalogue entry that events update.

    Sampled metrics are served from snapshots instead (:mod:`tpuscope.exporter.samples`).
    """
    created: dict[catalog.Metric, Any] = {}
    for metric in metrics:
        kwargs: dict[str, Any] = {}
        if metric.kind is catalog.Kind.HISTOGRAM:
            kwargs["buckets"] = metric.buckets
        created[metric] = _CLASSES[metric.kind](
            metric.base_name,
            metric.help,
            labelnames=[str(label) for label in metric.labels],
            unit=metric.unit,
            registry=registry,
            **kwargs,
        )
    return created
