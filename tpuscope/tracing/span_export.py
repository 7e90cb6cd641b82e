"""OpenTelemetry wiring for the job's spans: resource, exporter and provider, from the standard variables.

- Export: ``OTEL_EXPORTER_OTLP_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` set means OTLP, over
  gRPC or HTTP as ``OTEL_EXPORTER_OTLP[_TRACES]_PROTOCOL`` says (``http/protobuf`` by default, as the
  specification has it); the exporters read the rest (headers, timeout, certificates) themselves.
  ``OTEL_TRACES_EXPORTER=none`` or ``OTEL_SDK_DISABLED=true`` turns spans off.
- With no endpoint, spans are written as JSON lines (one OTLP-shaped span per line) only to a file the job
  names: ``$TPUSCOPE_SPANS_FILE`` or ``Traces.spans_file``. The file is rotated (renamed
  ``<name>.1``) when it would pass ``$TPUSCOPE_SPANS_MAX_BYTES`` (64 MiB), so a long job keeps about twice
  that at most. With neither an endpoint nor a file there are no spans, and the Monitor never imports this
  module nor the SDK (:func:`tpuscope.otel.spans_wanted`).
- Resource: ``service.name`` is the workload, with the attributes of :func:`tpuscope.otel.resource`.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import ALWAYS_ON

from tpuscope.otel import SPANS_FILE_VARIABLE, otlp_protocol, resource

log = logging.getLogger("tpuscope")

DEFAULT_MAX_BYTES = 64 * 2**20
MAX_BYTES_VARIABLE = "TPUSCOPE_SPANS_MAX_BYTES"


def exporter(
    spans_file: str | os.PathLike[str] | None = None, environ: Mapping[str, str] = os.environ
) -> SpanExporter | None:
    """The exporter the environment asks for; None when spans are turned off or nothing would receive them."""
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
    chosen_file = spans_file or environ.get(SPANS_FILE_VARIABLE)
    if not chosen_file:
        return None
    return JsonLinesExporter(Path(chosen_file), spans_max_bytes(environ))


def spans_max_bytes(environ: Mapping[str, str] = os.environ) -> int:
    """``$TPUSCOPE_SPANS_MAX_BYTES``: the size at which the spans file is rotated."""
    raw = environ.get(MAX_BYTES_VARIABLE, "").strip()
    if not raw:
        return DEFAULT_MAX_BYTES
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value <= 0:
        # 0 might mean "no limit" or "no spans": neither is for this variable to say.
        raise ValueError(
            f"{MAX_BYTES_VARIABLE}={raw!r}: expected a positive number of bytes"
            " (OTEL_TRACES_EXPORTER=none turns spans off)"
        )
    return value


def size_in_words(size: int) -> str:
    """``64 MiB`` for a whole number of MiB, else the bytes."""
    return f"{size // 2**20} MiB" if size % 2**20 == 0 else f"{size} bytes"


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
    """Spans as JSON lines, in OTLP's JSON field names, appended to a file: traces with no collector.

    When the next write would take the file past ``max_bytes`` it is renamed ``<name>.1`` (replacing the
    previous one) and a new file begun: about twice ``max_bytes`` on disk at most. Several exporters, in
    several processes, may share a file: each write is one append of whole lines, so their lines never
    interleave; one of them rotates it at a time and the others follow to the new file. Export never
    raises: spans that cannot be written are counted in ``dropped`` and logged.
    """

    def __init__(self, path: Path, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.path = path
        self.rotated = path.with_name(path.name + ".1")
        self.max_bytes = max_bytes
        self.dropped = 0
        self._last_error: OSError | None = None
        # The SDK's shutdown may close the exporter while an export is still writing.
        self._lock = threading.Lock()
        self._fd = self._open()

    def _open(self) -> int:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        return os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        lines = [(json.dumps(span_record(span), separators=(",", ":")) + "\n").encode() for span in spans]
        result = SpanExportResult.SUCCESS
        with self._lock:
            for chunk, count in _chunks(lines, self.max_bytes):
                try:
                    self._append(chunk)
                except OSError as e:  # a full disk, a directory removed: the spans go, the job carries on
                    self._drop(count, e)
                    result = SpanExportResult.FAILURE
        return result

    def _append(self, data: bytes) -> None:
        """Whole lines in one write, to the file now at ``path``, rotated first if they would take it past
        ``max_bytes``; all under a lock on the file that every writer sharing it takes, so that the check for
        room, the rotation and the write are one step for them (two writers rotating at once would lose a file)."""
        if self._fd < 0:
            raise OSError(errno.EBADF, "the spans exporter is shut down")
        # Busy writers may rotate the file again and again before this one gets its turn; the bound is for a file
        # system whose inode numbers are not stable, which must not keep the export spinning forever.
        for _ in range(100):
            with _locked(self._fd):
                if self._holds_path():
                    size = os.fstat(self._fd).st_size
                    if not size or size + len(data) <= self.max_bytes:
                        written = os.write(self._fd, data)
                        if written < len(data):
                            raise OSError(errno.ENOSPC, f"{written} of {len(data)} bytes written to {self.path}")
                        return
                    os.replace(self.path, self.rotated)
            # Rotated, by us or by another writer sharing the file, or removed: on to the file now at the path.
            self._reopen()
        raise OSError(errno.ESTALE, f"{self.path} changed under each of 100 writes")

    def _holds_path(self) -> bool:
        try:
            return os.path.samestat(os.fstat(self._fd), os.stat(self.path))
        except FileNotFoundError:
            return False

    def _reopen(self) -> None:
        fd = self._open()  # first: should it fail, the file held is still a place to write
        os.close(self._fd)
        self._fd = fd

    def _drop(self, count: int, error: OSError) -> None:
        if not self.dropped:
            log.warning("tpuscope: cannot write spans to %s (%s); dropping them", self.path, error)
        self.dropped += count
        self._last_error = error

    def shutdown(self) -> None:
        with self._lock:
            if self._fd < 0:  # shut down already (a provider shut down twice): nothing more to say
                return
            os.close(self._fd)
            self._fd = -1
        if self.dropped:
            log.warning("tpuscope: %d spans not written to %s (last: %s)", self.dropped, self.path, self._last_error)


@contextlib.contextmanager
def _locked(fd: int) -> Iterator[None]:
    """An exclusive (advisory) lock on the file open at ``fd``, released at the end of the block."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        locked = True
    except OSError:  # a file system without locks: still right for a file with one writer
        locked = False
    try:
        yield
    finally:
        if locked:
            fcntl.flock(fd, fcntl.LOCK_UN)


def _chunks(lines: Sequence[bytes], limit: int) -> Iterator[tuple[bytes, int]]:
    """``lines`` joined into runs of at most ``limit`` bytes (a longer line alone), each with its count of lines:
    a batch larger than the cap still leaves every file within it."""
    run: list[bytes] = []
    size = 0
    for line in lines:
        if run and size + len(line) > limit:
            yield b"".join(run), len(run)
            run, size = [], 0
        run.append(line)
        size += len(line)
    if run:
        yield b"".join(run), len(run)


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
