"""Spans for the steps worth looking at, decided when each step ends.

Creating a span costs tens of microseconds; a step loop runs thousands of
steps an hour, most of them alike. So nothing is created while a step runs:
the step only keeps its phase timings (a tuple per phase). When it ends,
:class:`TrainingSampler` decides whether to keep it: 1 in ``every`` steps,
and every step slower than the recent p99 times ``slow_factor``. Only a kept
step becomes spans (a ``step`` span with its ``io``, ``compute`` and ``sync``
children), back-dated to when things happened. Compiles and checkpoints are
rare and always kept; lifecycle changes become span events.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from collections.abc import Sequence

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import Status, StatusCode

from tpuscope import events, placement

log = logging.getLogger("tpuscope")

ATTRIBUTE_PREFIX = "tpuscope."
CLOSE_TIMEOUT_SECONDS = 2.0


class TrainingSampler:
    """Keep 1 in ``every`` steps, and every step slower than the recent p99 times ``slow_factor`` (and by at
    least :attr:`MIN_EXCESS_SECONDS`).

    A step only appends its time to a list; the window and its p99 are brought up to date every
    :attr:`REFRESH` steps, which is what keeps this cheap enough for every step.
    """

    WINDOW = 1024  # recent step times the p99 is taken over
    # Steps between two p99 computations: sorting the window is the sampler's one cost, shared by this many steps.
    REFRESH = 256
    # ... or sooner, after this many slow steps: when a job's steps become slower for good, the p99 follows
    # once 1% of the window is slow, so the span burst of a new regime is a few dozen steps, not REFRESH.
    REFRESH_SLOW = 8
    # The first steps compile (often twice: JAX recompiles when donated buffers change layout), and
    # taking them into a short window would set the threshold at compile time for a hundred steps.
    SKIP = 8
    WARMUP = 32  # steps in the window before slowness is judged at all
    # A slow step is also this much over the p99: a few microseconds of a tiny step's jitter make no trace
    # worth looking at (and would make a loop of sub-millisecond steps keep a span tree per step).
    MIN_EXCESS_SECONDS = 100e-6

    def __init__(self, every: int = 100, slow_factor: float = 1.2) -> None:
        self.every = max(1, every)
        self.slow_factor = slow_factor
        self._window: deque[float] = deque(maxlen=self.WINDOW)
        self._pending: list[float] = []  # step times since the last refresh
        self._skip = self.SKIP  # of the first steps still to be left out of the window
        self._refresh_after = self.SKIP + self.WARMUP  # pending steps that make the next refresh
        self._slow = 0  # slow steps since the last refresh
        self.threshold = float("inf")

    def keep(self, step: int, seconds: float) -> bool:
        slow = seconds > self.threshold
        pending = self._pending
        pending.append(seconds)
        if slow:
            self._slow += 1
        if len(pending) >= self._refresh_after or self._slow >= self.REFRESH_SLOW:
            self._refresh()
        return slow or step % self.every == 0

    def _refresh(self) -> None:
        pending = self._pending
        if self._skip:
            skipped = min(self._skip, len(pending))
            del pending[:skipped]
            self._skip -= skipped
        self._window.extend(pending)
        pending.clear()
        self._slow = 0
        if len(self._window) < self.WARMUP:
            self._refresh_after = self.WARMUP - len(self._window)
            return
        ordered = sorted(self._window)
        p99 = ordered[int(0.99 * (len(ordered) - 1))]
        self.threshold = max(p99 * self.slow_factor, p99 + self.MIN_EXCESS_SECONDS)
        self._refresh_after = self.REFRESH


class SpanRecorder:
    """Turns the Monitor's finished work into spans on one TracerProvider."""

    def __init__(
        self, workload: str, provider: TracerProvider, sampler: TrainingSampler, destination: str = ""
    ) -> None:
        self.provider = provider
        self.destination = destination  # where the spans go, in words (for people)
        self.sampler = sampler
        self._tracer = provider.get_tracer("tpuscope")
        self._workload = workload
        self._slice, self._worker = placement.slice_of(os.environ), placement.worker_of(os.environ)
        # perf_counter times (what the Monitor measures with) to Unix nanoseconds.
        self._epoch_offset = time.time() - time.perf_counter()
        self._compile: dict[str, dict[str, float]] = {}  # function -> stage seconds, until its backend stage
        self._cache_hit: bool | None = None
        self._lock = threading.Lock()
        self.kept = 0

    def _ns(self, perf_seconds: float) -> int:
        return int((perf_seconds + self._epoch_offset) * 1e9)

    def step(self, number: int, start: float, end: float, phases: Sequence[tuple[str, float, float]]) -> str:
        """Spans for a step the sampler kept (the Monitor asks it first); returns their trace id."""
        attributes: dict[str, str | int] = {
            "tpuscope.step": number,
            "tpuscope.workload": self._workload,
            "tpuscope.slice": self._slice,
            "tpuscope.worker": self._worker,
        }
        span = self._tracer.start_span("step", attributes=attributes, start_time=self._ns(start))
        parent = trace.set_span_in_context(span)
        for name, phase_start, phase_end in phases:
            if name != "other":
                child = self._tracer.start_span(name, context=parent, start_time=self._ns(phase_start))
                child.end(end_time=self._ns(phase_end))
        span.end(end_time=self._ns(end))
        self.kept += 1
        return f"{span.get_span_context().trace_id:032x}"

    def event(self, event: events.AnyEvent, blocking_s: float | None = None) -> None:
        """Spans for the rare events: compiles, checkpoints, lifecycle changes.

        ``blocking_s`` is the part of a checkpoint that held the job (the call of an async save, whose event
        lasts until the checkpoint is durable): the event has no field for it, the span shows it as an
        attribute and as a ``blocking`` child from the checkpoint's start.
        """
        with self._lock:  # JAX reports compiles from whichever thread compiles
            self._event(event, blocking_s)

    def _event(self, event: events.AnyEvent, blocking_s: float | None) -> None:
        if isinstance(event, events.Compile):
            self._compile_stage(event)
        elif isinstance(event, events.CompileCache):
            self._cache_hit = event.hit
        elif isinstance(event, events.Checkpoint):
            attributes: dict[str, str | float | bool | int] = {
                "tpuscope.step": event.step,
                "tpuscope.checkpoint.bytes": event.bytes,
            }
            if blocking_s is not None:
                attributes["tpuscope.checkpoint.blocking_seconds"] = blocking_s
            span, start = self._ended(f"checkpoint.{event.operation}", event.duration_s, attributes, ok=event.ok)
            if blocking_s is not None:
                child = self._tracer.start_span("blocking", context=trace.set_span_in_context(span), start_time=start)
                child.end(end_time=start + int(blocking_s * 1e9))
        elif isinstance(event, events.Lifecycle):
            span = self._tracer.start_span("lifecycle", attributes={"tpuscope.workload": self._workload})
            span.add_event(event.state, {"tpuscope.reason": event.reason})
            span.end()

    def _compile_stage(self, event: events.Compile) -> None:
        if event.stage == "tracing":  # a new compile; drop what a trace-only call (eval_shape) left
            self._compile.pop(event.function, None)
        stages = self._compile.setdefault(event.function, {})
        stages[event.stage] = stages.get(event.stage, 0.0) + event.duration_s
        if event.stage != "backend":  # the last stage: the compile is over
            return
        del self._compile[event.function]
        attributes: dict[str, str | float | bool] = {"tpuscope.compile.function": event.function}
        attributes.update({f"tpuscope.compile.{stage}_seconds": s for stage, s in stages.items()})
        if self._cache_hit is not None:
            attributes["tpuscope.compile.cache_hit"] = self._cache_hit
            self._cache_hit = None
        self._ended("compile", sum(stages.values()), attributes, ok=True)

    def _ended(
        self, name: str, seconds: float, attributes: dict[str, str | float | bool | int], ok: bool
    ) -> tuple[trace.Span, int]:
        """A span for something that just ended after ``seconds``, and its start (Unix nanoseconds)."""
        end = time.time_ns()
        start = end - int(seconds * 1e9)
        span = self._tracer.start_span(
            name, attributes={"tpuscope.workload": self._workload, **attributes}, start_time=start
        )
        if not ok:
            span.set_status(Status(StatusCode.ERROR))
        span.end(end_time=end)
        return span, start

    def close(self, timeout: float = CLOSE_TIMEOUT_SECONDS) -> None:
        """Flush what is queued, waiting ``timeout`` seconds at most: a collector that is down or hung
        (the exporter retries for up to 10 s) must not hold the job's exit."""

        def shutdown() -> None:
            try:
                self.provider.shutdown()
            except Exception:
                log.debug("tpuscope: span export failed at close", exc_info=True)

        flusher = threading.Thread(target=shutdown, name="tpuscope-spans-close", daemon=True)
        flusher.start()
        flusher.join(timeout)
        if flusher.is_alive():
            log.warning("tpuscope: spans not delivered within %g s at close; left behind", timeout)
