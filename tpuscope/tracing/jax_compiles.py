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

from tpuscope import events
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
# Where JAX logs its explanation of a tracing-cache miss, and how the explanation's first words map to a cause.
EXPLAIN_LOGGER = "jax._src.interpreters.partial_eval"
EXPLAIN_CONFIG = "jax_explain_cache_misses"
_CAUSES = (
    ("seen another function defined on the same line", "redefined_function"),
    ("different input types", "input_types"),
    ("different input pytree", "input_structure"),
    ("Tracing context doesn't match", "tracing_context"),
)
_FIRST_TRACE = "never seen function"  # a first compile, not a recompile


def recompile_cause(explanation: str) -> str | None:
    """The cause JAX's cache-miss explanation gives, or None for a function's first trace."""
    for words, cause in _CAUSES:
        if words in explanation:
            return cause
    return None if _FIRST_TRACE in explanation else "other"


# The watcher JAX's runtime-error hook reports to: the hook cannot be removed, so it is registered once per
# process and forwards to whichever watcher is installed.
_current: JaxCompileWatcher | None = None
_hook_registered = False


def _on_backend_error(error: Exception) -> None:
    """JAX's hook for a failed backend compile: count it and mark it; return None, so JAX raises it as it is."""
    watcher = _current
    if watcher is None or getattr(watcher._ignored, "active", False):
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
        self._explaining = not getattr(jax.config, EXPLAIN_CONFIG)
        if self._explaining:
            jax.config.update(EXPLAIN_CONFIG, True)  # type: ignore[no-untyped-call]
        logging.getLogger(EXPLAIN_LOGGER).addFilter(self._on_explanation)

    def uninstall(self) -> None:
        global _current
        if not self.installed:
            return
        import jax
        import jax.monitoring

        jax.monitoring.unregister_event_duration_listener(self._on_duration)
        jax.monitoring.unregister_event_listener(self._on_event)
        logging.getLogger(EXPLAIN_LOGGER).removeFilter(self._on_explanation)
        if self._explaining:
            jax.config.update(EXPLAIN_CONFIG, False)  # type: ignore[no-untyped-call]
        if _current is self:
            _current = None
        self.installed = False

    def _on_explanation(self, record: logging.LogRecord) -> bool:
        """A filter on JAX's explanation logger: report the cause; keep the record only if the job asked for it
        (with the setting on by the watcher alone, each miss would print a warning into the job's log)."""
        if not getattr(self._ignored, "active", False):
            try:
                if (cause := recompile_cause(record.getMessage())) is not None:
                    self._monitor.recompile(cause)
            except Exception:
                log.debug("tpuscope: recompile not reported", exc_info=True)
        return not self._explaining

    @contextmanager
    def ignoring(self) -> Iterator[None]:
        """Leave out what this thread compiles inside the block (tpuscope's own programs, not the job's)."""
        self._ignored.active = True
        try:
            yield
        finally:
            self._ignored.active = False

    def _on_duration(self, event: str, duration_secs: float, **kwargs: Any) -> None:
        if (stage := STAGES.get(event)) is None or getattr(self._ignored, "active", False):
            return
        try:
            name = str(kwargs.get("fun_name", ""))
            match = _WRAPPED.match(name)
            self._monitor.compile(stage, duration_secs, function=match[1] if match else name)
        except Exception:  # telemetry must never break a compile
            log.debug("tpuscope: compile event %s not reported", event, exc_info=True)

    def _on_event(self, event: str, **kwargs: Any) -> None:
        if (hit := CACHE_RESULTS.get(event)) is None or getattr(self._ignored, "active", False):
            return
        try:
            self._monitor.compile_cache(hit)
        except Exception:
            log.debug("tpuscope: cache event %s not reported", event, exc_info=True)
