"""OpenTelemetry wiring for the job's spans: resource, exporter and provider, from the standard variables.

- Export: ``OTEL_EXPORTER_OTLP_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` set means OTLP, over
  gRPC or HTTP as ``OTEL_EXPORTER_OTLP[_TRACES]_PROTOCOL`` says (``http/protobuf`` by default, as the
  specification has it); the exporters read the rest (headers, timeout, certificates) themselves.
  ``OTEL_TRACES_EXPORTER=none`` or ``OTEL_SDK_DISABLED=true`` turns spans off.
- With no endpoint: spans are written as JSON lines (one OTLP-shaped span per line) to a file, by
  default ``tpuscope-spans.jsonl`` in the working directory (``$TPUSCOPE_SPANS_FILE`` to move it), so
  traces exist without any collector.
- Resource: ``service.name`` is the workload, with the attributes of :func:`tpuscope.otel.resource`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import ALWAYS_ON

from tpuscope.otel import otlp_protocol, resource

DEFAULT_SPANS_FILE = "tpuscope-spans.jsonl"


def exporter(
    spans_file: str | os.PathLike[str] | None = None, environ: Mapping[str, str] = os.environ
) -> SpanExporter | None:
    """The exporter the environment asks for; None when spans are turned off."""
    if environ.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return None
    chosen = {name.strip().lower() for name in environ.get("OTEL_TRACES_EXPORTER", "otlp").split(",")}
    if "none" in chosen:
        return None
    if unknown := chosen - {"otlp", "console"}:
        raise ValueError(f"OTEL_TRACES_EXPORTER: {', '.join(sorted(unknown))} not offered (otlp, console, none)")
    if "otlp" not in chosen:
        return ConsoleSpanExporter()
    if environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        if otlp_protocol("TRACES", environ) == "grpc":
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter

            return GrpcExporter()
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter

        return HttpExporter()
    path = Path(spans_file or environ.get("TPUSCOPE_SPANS_FILE") or DEFAULT_SPANS_FILE)
    return JsonLinesExporter(path)


def destination(span_exporter: SpanExporter, environ: Mapping[str, str] = os.environ) -> str:
    """Where ``span_exporter`` sends spans, in words."""
    if isinstance(span_exporter, JsonLinesExporter):
        return str(span_exporter.path)
    if isinstance(span_exporter, ConsoleSpanExporter):
        return "standard output"
    endpoint = environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    return f"OTLP ({otlp_protocol('TRACES', environ)}) to {endpoint}"


def tracer_provider(workload: str, span_exporter: SpanExporter) -> TracerProvider:
    # Always on: tpuscope decides which steps to keep (see spans.py) before it creates any span.
    # No atexit shutdown of its own: the Monitor's close flushes with a bound on the wait.
    provider = TracerProvider(resource=resource(workload), sampler=ALWAYS_ON, shutdown_on_exit=False)
    # Batched on a thread of its own: ending a span only queues it; a full queue drops, never blocks.
    # Our defaults (a larger queue, a shorter delay than the SDK's) give way to the standard OTEL_BSP_* variables.
    provider.add_span_processor(
        BatchSpanProcessor(
            span_exporter,
            max_queue_size=None if "OTEL_BSP_MAX_QUEUE_SIZE" in os.environ else 4096,
            schedule_delay_millis=None if "OTEL_BSP_SCHEDULE_DELAY" in os.environ else 1000,
        )
    )
    return provider


class JsonLinesExporter(SpanExporter):
    """Spans as JSON lines, in OTLP's JSON field names, appended to a file: traces with no collector."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        lines = "".join(json.dumps(span_record(span), separators=(",", ":")) + "\n" for span in spans)
        # One write to an O_APPEND file: the lines of several processes sharing the file never interleave.
        os.write(self._fd, lines.encode())
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        os.close(self._fd)


def span_record(span: ReadableSpan) -> dict[str, Any]:
    context = span.get_span_context()
    assert context is not None
    return {
        "traceId": f"{context.trace_id:032x}",
        "spanId": f"{context.span_id:016x}",
        "parentSpanId": f"{span.parent.span_id:016x}" if span.parent else "",
        "name": span.name,
        "startTimeUnixNano": span.start_time,
        "endTimeUnixNano": span.end_time,
        "attributes": dict(span.attributes or {}),
        "events": [
            {"name": e.name, "timeUnixNano": e.timestamp, "attributes": dict(e.attributes or {})} for e in span.events
        ],
        "status": span.status.status_code.name,
        "resource": dict(span.resource.attributes),
    }
