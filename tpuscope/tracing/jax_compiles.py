"""Compile time and compilation-cache look-ups, from JAX's own monitoring events.

JAX reports each compilation stage's duration through ``jax.monitoring`` with
the function's name, and each persistent-cache look-up as an event. It also
calls ``record_scalar`` under the same stage names with a *timestamp* as the
value, so only duration listeners are registered here: exporting scalars
blindly would report the Unix epoch as a compile time.

Two things JAX does not report as events are taken from its other hooks. A backend compile that fails goes
through JAX's handlers of XLA runtime errors (``register_xla_runtime_error_handler``, which Pallas uses for
its own messages): the watcher counts it, marks the exception so that the job's failure reads as a compile
error, and lets it propagate unchanged. A function traced again is explained by JAX when
``jax_explain_cache_misses`` is on: the watcher turns it on (unless the job did) and reads the explanation's
log record into a cause of :data:`tpuscope.failures.RECOMPILE_VALUES`, keeping the record from the job's log
unless the job asked for it.

The listeners are process-wide and JAX calls each registered one, so a
watcher installs them once however often it is asked (the Monitor installs
one by itself when jax is imported, and a job may still call
``watch_jax_compiles()``): twice would count every compile twice. JAX calls
them on the thread that compiles, which is how tpuscope leaves out a compile
of its own (measuring a CPU's peak) with :meth:`JaxCompileWatcher.ignoring`.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from tpuscope import catalog, events
from tpuscope.tracing import failures
from tpuscope.tracing.monitor import Monitor

log = logging.getLogger("tpuscope")

STAGES: dict[str, events.CompileStage] = {
    "/jax/core/compile/jaxpr_trace_duration": "tracing",
    "/jax/core/compile/jaxpr_to_mlir_module_duration": "lowering",
    "/jax/core/compile/backend_compile_duration": "backend",
}
CACHE_RESULTS = {
    "/jax/compilation_cache/cache_hits": True,
    "/jax/compilation_cache/cache_misses": False,
}
_WRAPPED = re.compile(r"^\w+\((.*)\)$")  # "jit(train_step)" -> "train_step"
# The setting that makes JAX explain each tracing-cache miss.
EXPLAIN_CONFIG = "jax_explain_cache_misses"
# Where JAX logs its explanation of a tracing-cache miss: partial_eval since JAX 0.5 or so, pjit before.
EXPLAIN_LOGGERS = ("jax._src.interpreters.partial_eval", "jax._src.pjit")
# Where the setting also raises the persistent compilation cache's messages from DEBUG to WARNING.
RAISED_LOGGERS = ("jax._src.compiler", "jax._src.compilation_cache")
# The explanation's words, lowercased, and the cause they give; newer JAX's wording first, then older JAX's.
_CAUSES = (
    ("seen another function defined on the same line", "redefined_function"),
    ("different input types", "input_types"),
    ("never seen input type signature", "input_types"),
    ("different input pytree", "input_structure"),
    ("never seen passing", "input_structure"),
    ("tracing context doesn't match", "tracing_context"),
)
_FIRST_TRACE = "never seen function"  # a first compile, not a recompile
_MISS = "cache miss"  # in every explanation, and in none of the loggers' other records
# Explanations the watcher asks JAX for, at most, in a process. JAX compares a miss with every earlier key of
# the function, so a job with hundreds of shapes pays more for each (measured on this CPU: +4 % on a retrace
# and compile at 100 shapes of one function, +48 % at 400): past this, the setting goes back off, and the
# compile counts (TpuscopeRecompiling) go on alone.
EXPLAIN_BUDGET = 200
# The persistent cache's records the setting raises to WARNING (DEBUG without it), by their first words.
_RAISED = ("PERSISTENT COMPILATION CACHE MISS", "Not writing persistent cache entry")


def recompile_cause(explanation: str) -> str | None:
    """The cause JAX's cache-miss explanation gives, or None for a function's first trace."""
    words = explanation.lower()
    for said, cause in _CAUSES:
        if said in words:
            return cause
    return None if _FIRST_TRACE in words else "other"


# The watcher JAX's runtime-error hook reports to: the hook cannot be removed, so it is registered once per
# process and forwards to whichever watcher is installed.
_current: JaxCompileWatcher | None = None
_hook_registered = False


def _on_backend_error(error: Exception) -> None:
    """JAX's hook for a failed backend compile: count it and mark it; return None, so JAX raises it as it is."""
    watcher = _current
    if watcher is None or watcher._ignoring_here():
        return None
    try:
        failures.mark(error, "compile_error", stage="backend")
        watcher._monitor.compile_failed(error)
    except Exception:  # telemetry must never change the job's error
        log.debug("tpuscope: failed compile not reported", exc_info=True)
    return None


class JaxCompileWatcher:
    """Forwards JAX's compile events to a Monitor while installed. Never raises into JAX."""

    def __init__(self, monitor: Monitor) -> None:
        self._monitor = monitor
        self.installed = False
        self._ignored = threading.local()  # .active on a thread whose compiles are tpuscope's own
        self._explaining = False  # the watcher turned jax_explain_cache_misses on (and keeps its records)
        self._explained = 0  # recompiles it reported a cause for

    def install(self) -> None:
        global _current, _hook_registered
        if self.installed:
            return
        import jax
        import jax.monitoring

        jax.monitoring.register_event_duration_secs_listener(self._on_duration)
        jax.monitoring.register_event_listener(self._on_event)
        self.installed = True
        _current = self
        try:
            if not _hook_registered:
                from jax._src import compiler  # the hook's one home; no public alias

                compiler.register_xla_runtime_error_handler(_on_backend_error)
                _hook_registered = True
        except (ImportError, AttributeError) as e:  # a JAX without it: failed backend compiles go uncounted
            log.info("tpuscope: failed backend compiles are not counted: %s", e)
        try:
            self._explaining = not getattr(jax.config, EXPLAIN_CONFIG)
            if self._explaining:
                jax.config.update(EXPLAIN_CONFIG, True)  # type: ignore[no-untyped-call]
        except (AttributeError, KeyError, ValueError) as e:  # a JAX without the setting: no causes
            log.info("tpuscope: recompiles are not explained: %s", e)
            self._explaining = False
            return
        for name in EXPLAIN_LOGGERS:
            logging.getLogger(name).addFilter(self._on_explanation)
        for name in RAISED_LOGGERS:
            logging.getLogger(name).addFilter(self._on_cache_record)

    def uninstall(self) -> None:
        global _current
        if not self.installed:
            return
        import jax
        import jax.monitoring

        jax.monitoring.unregister_event_duration_listener(self._on_duration)
        jax.monitoring.unregister_event_listener(self._on_event)
        for name in EXPLAIN_LOGGERS:
            logging.getLogger(name).removeFilter(self._on_explanation)
        for name in RAISED_LOGGERS:
            logging.getLogger(name).removeFilter(self._on_cache_record)
        if self._explaining:
            jax.config.update(EXPLAIN_CONFIG, False)  # type: ignore[no-untyped-call]
        if _current is self:
            _current = None
        self.installed = False

    def _on_explanation(self, record: logging.LogRecord) -> bool:
        """A filter on JAX's explanation loggers: report the cause, then log the record as the job would have
        without the watcher (:meth:`_lowered`)."""
        message = record.getMessage()
        if _MISS not in message.lower():
            return True  # another record of the logger's: none of ours
        if not self._ignoring_here():
            try:
                if (cause := recompile_cause(message)) is not None:
                    self._monitor.recompile(cause)
                    self._explained += 1
                    if self._explained == EXPLAIN_BUDGET and self._explaining:
                        self._stop_explaining()
            except Exception:
                log.debug("tpuscope: recompile not reported", exc_info=True)
        return self._lowered(record)

    def _stop_explaining(self) -> None:
        import jax

        jax.config.update(EXPLAIN_CONFIG, False)  # type: ignore[no-untyped-call]
        log.info(
            "tpuscope: %d recompiles explained; JAX's explanations are off from here (each costs more as a "
            "function's shapes grow), %s still counts every compile",
            self._explained,
            catalog.COMPILE_DURATION.name,
        )

    def _on_cache_record(self, record: logging.LogRecord) -> bool:
        """A filter on the persistent cache's loggers: the records the setting raised go back to DEBUG."""
        if isinstance(record.msg, str) and record.msg.startswith(_RAISED):
            return self._lowered(record)
        return True  # the cache's own warnings (an unreadable entry) stay warnings

    def _lowered(self, record: logging.LogRecord) -> bool:
        """What the setting raised to WARNING, at DEBUG again while only the watcher asked for it: kept where the
        job logs that logger at DEBUG, dropped elsewhere (each miss would print a warning into the job's log)."""
        if not self._explaining or record.levelno != logging.WARNING:
            return True
        record.levelno, record.levelname = logging.DEBUG, logging.getLevelName(logging.DEBUG)
        return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)

    def _ignoring_here(self) -> bool:
        """Whether this thread is inside :meth:`ignoring`: what JAX reports now is tpuscope's own compile."""
        return bool(getattr(self._ignored, "active", False))

    @contextmanager
    def ignoring(self) -> Iterator[None]:
        """Leave out what this thread compiles inside the block (tpuscope's own programs, not the job's)."""
        self._ignored.active = True
        try:
            yield
        finally:
            self._ignored.active = False

    def _on_duration(self, event: str, duration_secs: float, **kwargs: Any) -> None:
        if (stage := STAGES.get(event)) is None or self._ignoring_here():
            return
        try:
            name = str(kwargs.get("fun_name", ""))
            match = _WRAPPED.match(name)
            self._monitor.compile(stage, duration_secs, function=match[1] if match else name)
        except Exception:  # telemetry must never break a compile
            log.debug("tpuscope: compile event %s not reported", event, exc_info=True)

    def _on_event(self, event: str, **kwargs: Any) -> None:
        if (hit := CACHE_RESULTS.get(event)) is None or self._ignoring_here():
            return
        try:
            self._monitor.compile_cache(hit)
        except Exception:
            log.debug("tpuscope: cache event %s not reported", event, exc_info=True)
