"""The sidecar's hang verdicts as OpenTelemetry logs, where an OTLP endpoint is set.

The verdict's JSON line on stderr is what ``kubectl logs`` and Cloud Logging keep; a fleet that ships its logs
through an OpenTelemetry collector (to Loki, Elasticsearch, Cloud Logging) gets each verdict as a log record
too: its message, severity, and attributes under ``tpuscope.`` (the workload, the host's slice and worker, the
step, phase, seconds, top frames, and every thread's stacks as JSON). Where to and how: the standard
``OTEL_EXPORTER_OTLP_*`` variables (``_LOGS_`` ones first); ``OTEL_LOGS_EXPORTER=none`` turns it off.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from typing import Any

from tpuscope.otel import otlp_protocol, resource

LOGGER = "tpuscope.hang.otlp"
_LEVELS = {"INFO": logging.INFO, "WARNING": logging.WARNING}


def wanted(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether an OTLP endpoint would receive the verdicts."""
    if environ.get("OTEL_LOGS_EXPORTER", "").strip().lower() == "none":
        return False
    return bool(environ.get("OTEL_EXPORTER_OTLP_LOGS_ENDPOINT") or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"))


class VerdictLogs:
    """Sends each verdict as a log record, batched, on the SDK's thread; ``instance`` as Prometheus names the
    sidecar (``service.instance.id``)."""

    def __init__(self, instance: str, environ: Mapping[str, str] = os.environ) -> None:
        from opentelemetry.sdk._logs import LoggerProvider, LoggingHandler
        from opentelemetry.sdk._logs.export import BatchLogRecordProcessor

        self._provider = LoggerProvider(resource=resource("tpuscope", instance, environ))
        self._provider.add_log_record_processor(BatchLogRecordProcessor(_exporter(environ)))
        self._logger = logging.getLogger(LOGGER)
        self._logger.propagate = False  # the stderr line says it already
        self._logger.setLevel(logging.INFO)
        self._handler = LoggingHandler(logger_provider=self._provider)
        self._logger.addHandler(self._handler)

    def emit(self, severity: str, message: str, verdict: Mapping[str, Any]) -> None:
        attributes = {
            f"tpuscope.{key}": value if isinstance(value, str | int | float | bool) else json.dumps(value)
            for key, value in verdict.items()
            if value is not None
        }
        self._logger.log(_LEVELS.get(severity, logging.WARNING), message, extra=attributes)

    def close(self) -> None:
        self._logger.removeHandler(self._handler)
        self._provider.shutdown()  # what is still batched goes first


def _exporter(environ: Mapping[str, str]) -> Any:
    if otlp_protocol("LOGS", environ) == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter as GrpcExporter

        return GrpcExporter()
    from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter as HttpExporter

    return HttpExporter()
