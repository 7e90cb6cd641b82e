"""OTLP receivers for the tests, recording what they get on 127.0.0.1: the collector's trace, metrics and logs
services over gRPC, and its metrics endpoint over HTTP (``POST /v1/metrics``, protobuf)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import grpc
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2, logs_service_pb2_grpc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc


class Receiver(
    trace_service_pb2_grpc.TraceServiceServicer,  # type: ignore[misc]
    metrics_service_pb2_grpc.MetricsServiceServicer,  # type: ignore[misc]
    logs_service_pb2_grpc.LogsServiceServicer,  # type: ignore[misc]
):
    def __init__(self, port: int = 0) -> None:
        self.trace_requests: list[Any] = []
        self.metrics_requests: list[Any] = []
        self.logs_requests: list[Any] = []
        self.lock = threading.Lock()
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(self, self._server)
        metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(self, self._server)
        logs_service_pb2_grpc.add_LogsServiceServicer_to_server(self, self._server)
        self.port = self._server.add_insecure_port(f"127.0.0.1:{port}")
        self._server.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def Export(self, request: Any, context: Any) -> Any:  # every service's method is named Export
        with self.lock:
            if isinstance(request, trace_service_pb2.ExportTraceServiceRequest):
                self.trace_requests.append(request)
                return trace_service_pb2.ExportTraceServiceResponse()
            if isinstance(request, logs_service_pb2.ExportLogsServiceRequest):
                self.logs_requests.append(request)
                return logs_service_pb2.ExportLogsServiceResponse()
            self.metrics_requests.append(request)
            return metrics_service_pb2.ExportMetricsServiceResponse()

    def log_records(self) -> Iterator[tuple[dict[str, Any], Any]]:
        """Every log record received, with its resource's attributes."""
        return self._items(self.logs_requests, "logs", "log_records")

    def spans(self) -> Iterator[tuple[dict[str, Any], Any]]:
        """Every span received, with its resource's attributes."""
        return self._items(self.trace_requests, "spans", "spans")

    def _items(self, received: list[Any], signal: str, items: str) -> Iterator[tuple[dict[str, Any], Any]]:
        """The items of each request of one signal (``resource_SIGNAL``, ``scope_SIGNAL``, then ``items``)."""
        with self.lock:
            requests = list(received)
        for request in requests:
            for of_resource in getattr(request, f"resource_{signal}"):
                resource = {a.key: value(a.value) for a in of_resource.resource.attributes}
                for scope in getattr(of_resource, f"scope_{signal}"):
                    for item in getattr(scope, items):
                        yield resource, item

    def stop(self) -> None:
        self._server.stop(None)


class HttpReceiver:
    """OTLP/HTTP metrics: each POST to /v1/metrics decoded as an ExportMetricsServiceRequest."""

    def __init__(self) -> None:
        self.metrics_requests: list[Any] = []
        self.paths: list[str] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                request = metrics_service_pb2.ExportMetricsServiceRequest.FromString(body)
                receiver.paths.append(self.path)
                receiver.metrics_requests.append(request)
                reply = metrics_service_pb2.ExportMetricsServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        self.endpoint = f"http://127.0.0.1:{self._server.server_port}"

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def as_prometheus(request: Any) -> tuple[dict[str, str], dict[tuple[str, frozenset[tuple[str, str]]], float]]:
    """One metrics request as (resource attributes, Prometheus samples): what a collector would write back.

    Histograms become cumulative ``_bucket`` series with an ``le`` (as a float's repr, +Inf last), ``_sum``
    and ``_count``; sums and gauges one sample each under the metric's name.
    """
    samples: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    (resource_metrics,) = request.resource_metrics
    resource = {a.key: value(a.value) for a in resource_metrics.resource.attributes}
    for scope in resource_metrics.scope_metrics:
        for metric in scope.metrics:
            kind = metric.WhichOneof("data")
            for point in getattr(metric, kind).data_points:
                labels = {a.key: str(value(a.value)) for a in point.attributes}
                if kind == "histogram":
                    cumulative = 0
                    for bound, count in zip([*point.explicit_bounds, float("inf")], point.bucket_counts, strict=True):
                        cumulative += count
                        key = frozenset({**labels, "le": repr(bound)}.items())
                        samples[(metric.name + "_bucket", key)] = cumulative
                    samples[(metric.name + "_sum", frozenset(labels.items()))] = point.sum
                    samples[(metric.name + "_count", frozenset(labels.items()))] = point.count
                else:
                    number = point.as_double if point.WhichOneof("value") == "as_double" else point.as_int
                    samples[(metric.name, frozenset(labels.items()))] = number
    return resource, samples


def value(any_value: Any) -> Any:
    return getattr(any_value, any_value.WhichOneof("value"))


def attributes(span: Any) -> dict[str, Any]:
    return {a.key: value(a.value) for a in span.attributes}
