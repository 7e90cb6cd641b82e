"""Compile time and compilation-cache look-ups, from JAX's own monitoring events.

JAX reports each compilation stage's duration through ``jax.monitoring`` with
the function's name, and each persistent-cache look-up as an event. It also
calls ``record_scalar`` under the same stage names with a *timestamp* as the
value, so only duration listeners are registered here: exporting scalars
blindly would report the Unix epoch as a compile time.

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


class JaxCompileWatcher:
    """Forwards JAX's compile events to a Monitor while installed. Never raises into JAX."""

    def __init__(self, monitor: Monitor) -> None:
        self._monitor = monitor
        self.installed = False
        self._ignored = threading.local()  # .active on a thread whose compiles are tpuscope's own

    def install(self) -> None:
        if self.installed:
            return
        import jax.monitoring

        jax.monitoring.register_event_duration_secs_listener(self._on_duration)
        jax.monitoring.register_event_listener(self._on_event)
        self.installed = True

    def uninstall(self) -> None:
        if not self.installed:
            return
        import jax.monitoring

        jax.monitoring.unregister_event_duration_listener(self._on_duration)
        jax.monitoring.unregister_event_listener(self._on_event)
        self.installed = False

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
