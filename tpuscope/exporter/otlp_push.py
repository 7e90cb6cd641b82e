"""``--otlp-metrics on``: push what ``/metrics`` serves to an OpenTelemetry collector over OTLP.

For fleets whose collector gathers metrics instead of Prometheus scraping. What
is pushed is the registry's own families, converted one by one, so the two paths
cannot disagree: counters become monotonic cumulative sums (named with their
``_total``), gauges gauges, histograms explicit-bucket histograms with the same
bounds. Names are the Prometheus names and units are UCUM, so a collector that
writes to Prometheus again (``prometheusremotewrite``, ``prometheus`` exporters)
yields the very series the dashboards and alerts query.

Where to and how often come from the standard variables:
``OTEL_EXPORTER_OTLP[_METRICS]_ENDPOINT``, ``_PROTOCOL`` (``http/protobuf`` by
default), ``_HEADERS``, ``_TIMEOUT``, and ``OTEL_METRIC_EXPORT_INTERVAL`` in
milliseconds (60000 by default). Pushing runs on its own thread; a collector that
is down costs a log line per change of state and a count in
``tpuscope_otlp_pushes_total{result="error"}``, never a scrape.
"""

from __future__ import annotations

import copy
import logging
import os
import threading
import time
from collections.abc import Iterable, Mapping
from typing import Any

from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Gauge,
    Histogram,
    HistogramDataPoint,
    Metric,
    MetricExporter,
    MetricExportResult,
    MetricsData,
    NumberDataPoint,
    ResourceMetrics,
    ScopeMetrics,
    Sum,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric as Family

from tpuscope import __version__, catalog
from tpuscope.exporter.metrics import Series
from tpuscope.otel import otlp_protocol

log = logging.getLogger("tpuscope.exporter.otlp")


# Prometheus base unit -> UCUM, as OTLP expects (the collector maps them back to the same suffixes).
UCUM = {"seconds": "s", "bytes": "By", "ratio": "1", "celsius": "Cel", "watts": "W", "hertz": "Hz"}

CUMULATIVE = AggregationTemporality.CUMULATIVE


def metric_exporter(environ: Mapping[str, str] = os.environ) -> MetricExporter:
    """The OTLP exporter the environment asks for; it reads endpoint, headers and timeout itself."""
    if otlp_protocol("METRICS", environ) == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter as GrpcExporter

        return GrpcExporter()
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter as HttpExporter

    return HttpExporter()


class StartTimes:
    """When each cumulative series began counting, as OTLP wants it on every point.

    The sidecar's start, for a series first seen; now, for a series whose value went down: its source
    restarted counting (a job process, the TPU runtime), and a consumer that turns cumulative points
    into deltas (the collector's cumulativetodelta) must see a new start rather than a negative delta.
    """

    def __init__(self, origin_ns: int) -> None:
        self.origin_ns = origin_ns
        self._last: dict[tuple[str, tuple[tuple[str, str], ...]], tuple[int, float]] = {}
        self._seen: dict[tuple[str, tuple[tuple[str, str], ...]], tuple[int, float]] = {}

    def of(self, name: str, labels: dict[str, str], value: float, now_ns: int) -> int:
        key = (name, tuple(sorted(labels.items())))
        start, last = self._last.get(key, (self.origin_ns, value))
        if value < last:
            start = now_ns
        self._seen[key] = (start, value)
        return start

    def forget_unseen(self) -> None:
        """After a push: series that are gone (a job's old pid) stop taking memory."""
        self._last, self._seen = self._seen, {}


def metrics_data(families: Iterable[Family], resource: Resource, starts: StartTimes, now_ns: int) -> MetricsData:
    """One OTLP request's worth of data from a registry's families."""
    metrics = [m for family in families if (m := convert(family, starts, now_ns)) is not None]
    starts.forget_unseen()
    scope = InstrumentationScope("tpuscope", __version__)
    return MetricsData([ResourceMetrics(resource, [ScopeMetrics(scope, metrics, "")], "")])


def with_labels(families: Iterable[Family], labels: Mapping[str, str]) -> Iterable[Family]:
    """The families with ``labels`` added to every sample: the slice and worker that /metrics adds too."""
    for family in families:
        if labels:  # on a copy: a collector may hand out the same family object at every collect()
            family = copy.copy(family)
            family.samples = [s._replace(labels={**s.labels, **labels}) for s in family.samples]
        yield family


def convert(family: Family, starts: StartTimes, now_ns: int) -> Metric | None:
    """A prometheus_client family as one OTLP metric (None when empty, or of a kind this registry never holds)."""
    if not family.samples:  # a labelled metric nothing has set yet: OTLP has no empty form of it
        return None
    unit = UCUM.get(family.unit, family.unit)
    if family.type == "histogram":
        return Metric(family.name, family.documentation, unit, _histogram(family, starts, now_ns))
    samples = [s for s in family.samples if not s.name.endswith("_created")]
    if family.type == "counter":
        points = [
            NumberDataPoint(s.labels, starts.of(s.name, s.labels, s.value, now_ns), now_ns, s.value) for s in samples
        ]
        data: Sum | Gauge = Sum(points, CUMULATIVE, is_monotonic=True)
        return Metric(family.name + "_total", family.documentation, unit, data)
    points = [NumberDataPoint(s.labels, starts.origin_ns, now_ns, s.value) for s in samples]
    if family.type == "info":  # python_info: the labels are the information, the value is 1
        return Metric(family.name + "_info", family.documentation, unit, Gauge(points))
    if family.type in ("gauge", "unknown"):
        return Metric(family.name, family.documentation, unit, Gauge(points))
    return None  # summary, stateset, gaugehistogram: not in the sidecar's registry


def _histogram(family: Family, starts: StartTimes, now_ns: int) -> Histogram:
    """Prometheus' cumulative ``le`` buckets back into OTLP's per-bucket counts, one point per label set."""
    series: dict[tuple[tuple[str, str], ...], dict[str, Any]] = {}
    for sample in family.samples:
        labels = tuple(sorted((k, v) for k, v in sample.labels.items() if k != "le"))
        point = series.setdefault(labels, {"le": [], "sum": 0.0, "count": 0})
        if sample.name.endswith("_bucket"):
            point["le"].append((float(sample.labels["le"]), sample.value))
        elif sample.name.endswith("_sum"):
            point["sum"] = sample.value
        elif sample.name.endswith("_count"):
            point["count"] = int(sample.value)
    points = []
    for labels, point in series.items():
        cumulative = sorted(point["le"])  # the last is +Inf, which OTLP leaves implicit
        bounds = [le for le, _ in cumulative if le != float("inf")]
        counts, below = [], 0.0
        for _, count in cumulative:
            counts.append(int(count - below))
            below = count
        # Prometheus buckets do not know the min and max: None leaves those optional OTLP fields unset.
        unknown: Any = None
        attributes = dict(labels)
        start_ns = starts.of(family.name, attributes, point["count"], now_ns)
        points.append(
            HistogramDataPoint(
                attributes, start_ns, now_ns, point["count"], point["sum"], counts, bounds, unknown, unknown
            )
        )
    return Histogram(points, CUMULATIVE)


class OtlpPusher:
    """Pushes the registry every ``interval`` seconds, and once more when stopped."""

    def __init__(
        self,
        registry: CollectorRegistry,
        resource: Resource,
        exporter: MetricExporter,
        interval: float,
        metrics: Series,
        host_labels: Mapping[str, str] | None = None,
    ) -> None:
        self._registry, self._resource, self._exporter, self._interval = registry, resource, exporter, interval
        self._host_labels = dict(host_labels or {})
        self._pushes = metrics[catalog.OTLP_PUSHES]
        for result in catalog.OTLP_PUSHES.values(catalog.Label.RESULT):
            self._pushes.labels(result)  # both series from the start, so increase() sees the first error
        self._starts = StartTimes(time.time_ns())  # cumulative points count from the sidecar's start
        self._healthy: bool | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="tpuscope-otlp", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """One last push, so what happened since the previous one is not lost; bounded, because a
        collector that hangs must not hold the sidecar past its pod's grace period."""
        self._stop.set()
        last = threading.Thread(target=self._last_push, name="tpuscope-otlp-last", daemon=True)
        last.start()
        last.join(timeout)
        if last.is_alive():
            log.warning("OTLP metrics: the last push did not finish within %g s; left behind", timeout)

    def _last_push(self) -> None:
        self._thread.join()  # a push under way finishes first
        self.push()
        self._exporter.shutdown()

    def push(self) -> bool:
        try:
            families = with_labels(self._registry.collect(), self._host_labels)
            data = metrics_data(families, self._resource, self._starts, time.time_ns())
            ok = self._exporter.export(data) is MetricExportResult.SUCCESS
        except Exception:  # a bug here must not end the thread: the next push tries again
            log.exception("OTLP metrics push raised")
            ok = False
        self._pushes.labels(catalog.OK if ok else catalog.ERROR).inc()
        if ok != self._healthy:
            (log.info if ok else log.warning)("OTLP metrics push %s", "working" if ok else "failing; will retry")
            self._healthy = ok
        return ok

    def _loop(self) -> None:
        while not self._stop.wait(self._interval):
            self.push()
