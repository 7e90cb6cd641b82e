"""An OTLP/gRPC receiver for the tests: the collector's trace and metrics services on 127.0.0.1, recording."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc


class Receiver(trace_service_pb2_grpc.TraceServiceServicer, metrics_service_pb2_grpc.MetricsServiceServicer):  # type: ignore[misc]
    def __init__(self) -> None:
        self.trace_requests: list[Any] = []
        self.metrics_requests: list[Any] = []
        self.lock = threading.Lock()
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(self, self._server)
        metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(self, self._server)
        self.port = self._server.add_insecure_port("127.0.0.1:0")
        self._server.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def Export(self, request: Any, context: Any) -> Any:  # both services' method is named Export
        with self.lock:
            if isinstance(request, trace_service_pb2.ExportTraceServiceRequest):
                self.trace_requests.append(request)
                return trace_service_pb2.ExportTraceServiceResponse()
            self.metrics_requests.append(request)
            return metrics_service_pb2.ExportMetricsServiceResponse()

    def spans(self) -> Iterator[tuple[dict[str, Any], Any]]:
        """Every span received, with its resource's attributes."""
        with self.lock:
            requests = list(self.trace_requests)
        for request in requests:
            for resource_spans in request.resource_spans:
                resource = {a.key: value(a.value) for a in resource_spans.resource.attributes}
                for scope in resource_spans.scope_spans:
                    for span in scope.spans:
                        yield resource, span

    def stop(self) -> None:
        self._server.stop(None)


def value(any_value: Any) -> Any:
    return getattr(any_value, any_value.WhichOneof("value"))


def attributes(span: Any) -> dict[str, Any]:
    return {a.key: value(a.value) for a in span.attributes}
