"""Compile time and compilation-cache look-ups, from JAX's own monitoring events.

JAX reports each compilation stage's duration through ``jax.monitoring`` with
the function's name, and each persistent-cache look-up as an event. It also
calls ``record_scalar`` under the same stage names with a *timestamp* as the
value, so only duration listeners are registered here: exporting scalars
blindly would report the Unix epoch as a compile time.
"""

from __future__ import annotations

import logging
import re
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

    def install(self) -> None:
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

    def _on_duration(self, event: str, duration_secs: float, **kwargs: Any) -> None:
        if (stage := STAGES.get(event)) is None:
            return
        try:
            name = str(kwargs.get("fun_name", ""))
            match = _WRAPPED.match(name)
            self._monitor.compile(stage, duration_secs, function=match[1] if match else name)
        except Exception:  # telemetry must never break a compile
            log.debug("tpuscope: compile event %s not reported", event, exc_info=True)

    def _on_event(self, event: str, **kwargs: Any) -> None:
        if (hit := CACHE_RESULTS.get(event)) is None:
            return
        try:
            self._monitor.compile_cache(hit)
        except Exception:
            log.debug("tpuscope: cache event %s not reported", event, exc_info=True)
