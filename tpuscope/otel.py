"""The OpenTelemetry conventions that the job and the sidecar both follow: the ``OTEL_*`` variables and the resource.

Neither side owns this module (as opentelemetry-python's SDK and exporters share one common package):
the in-job spans (:mod:`tpuscope.tracing.span_export`) and the sidecar's OTLP metrics
(:mod:`tpuscope.exporter.otlp_push`) read the same variables the same way and describe their process
with the same resource. It imports the OpenTelemetry SDK only inside :func:`resource`, so that reading
the variables (the sidecar's settings, which every ``tpuscope`` command's ``--help`` builds) stays light.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from opentelemetry.sdk.resources import Resource

# The job's spans file, where no OTLP endpoint is set (tracing/span_export.py).
SPANS_FILE_VARIABLE = "TPUSCOPE_SPANS_FILE"


def spans_wanted(spans_file: object = None, environ: Mapping[str, str] = os.environ) -> bool:
    """Whether anything would receive the job's spans: an OTLP endpoint, the console exporter, or a spans file.
    Read before the SDK is imported: a job that configured none of them pays nothing for spans."""
    if spans_file or environ.get(SPANS_FILE_VARIABLE):
        return True
    if environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        return True
    return "console" in environ.get("OTEL_TRACES_EXPORTER", "").lower()


# The specification's default OTEL_METRIC_EXPORT_INTERVAL.
DEFAULT_INTERVAL_MS = 60_000

# Resource attribute -> the environment variables (set through the downward API) it is read from.
K8S_VARIABLES = {
    "k8s.pod.name": ("K8S_POD_NAME", "POD_NAME"),
    "k8s.pod.uid": ("K8S_POD_UID", "POD_UID"),
    "k8s.namespace.name": ("K8S_NAMESPACE_NAME", "POD_NAMESPACE"),
    "k8s.node.name": ("K8S_NODE_NAME", "NODE_NAME"),
    # The downward API cannot give a container's name, so only the explicit variable counts: a bare
    # CONTAINER_NAME is set by too many unrelated tools to be trusted.
    "k8s.container.name": ("K8S_CONTAINER_NAME",),
}


def resource(service: str, instance: str = "", environ: Mapping[str, str] = os.environ) -> Resource:
    """``service.name``, ``host.name``, ``service.instance.id`` and ``k8s.*`` from the variables a pod spec sets
    through the downward API; what ``OTEL_SERVICE_NAME`` and ``OTEL_RESOURCE_ATTRIBUTES`` say wins over ours."""
    from opentelemetry.sdk.resources import OTELResourceDetector, Resource

    attributes: dict[str, str] = {"host.name": socket.gethostname(), "service.name": service}
    if instance:
        attributes["service.instance.id"] = instance
    for attribute, names in K8S_VARIABLES.items():
        if value := next((environ[n] for n in names if environ.get(n)), None):
            attributes[attribute] = value
    configured = set(OTELResourceDetector().detect().attributes)
    if environ.get("OTEL_SERVICE_NAME"):
        configured.add("service.name")
    # create() adds the SDK's own attributes and the configured ones, which ours would otherwise override.
    return Resource.create({k: v for k, v in attributes.items() if k not in configured})


def otlp_protocol(signal: str, environ: Mapping[str, str] = os.environ) -> str:
    """``grpc`` or ``http/protobuf`` (the specification's default) for TRACES or METRICS."""
    variable = f"OTEL_EXPORTER_OTLP_{signal}_PROTOCOL"
    if not environ.get(variable):
        variable = "OTEL_EXPORTER_OTLP_PROTOCOL"
    protocol = environ.get(variable) or "http/protobuf"
    if protocol not in ("grpc", "http/protobuf"):
        # http/json is in the specification but not in OpenTelemetry's Python exporters.
        raise ValueError(f"{variable}={protocol!r}: use grpc or http/protobuf")
    return protocol


def metric_interval_seconds(environ: Mapping[str, str] = os.environ) -> float:
    """``OTEL_METRIC_EXPORT_INTERVAL`` in seconds."""
    raw = environ.get("OTEL_METRIC_EXPORT_INTERVAL", "")
    try:
        milliseconds = float(raw) if raw else DEFAULT_INTERVAL_MS
    except ValueError:
        raise ValueError(f"OTEL_METRIC_EXPORT_INTERVAL: expected milliseconds, got {raw!r}") from None
    if milliseconds <= 0:
        raise ValueError(f"OTEL_METRIC_EXPORT_INTERVAL: expected a positive number, got {raw!r}")
    return milliseconds / 1000
