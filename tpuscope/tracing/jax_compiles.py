"""Compile time, compilation-cache look-ups and recompiles, from JAX's own hooks: one watcher per process.

JAX reports each compilation stage's duration through ``jax.monitoring`` with the function's name, and each
persistent-cache look-up as an event. Only duration listeners are registered: JAX also calls ``record_scalar``
under the same stage names with a *timestamp* as the value, which would report the Unix epoch as a compile time.

JAX's listeners, hooks and settings belong to the process, and JAX calls every registered listener, so the
process has one watcher, hooked in while any Monitor is subscribed (:func:`subscribe`). Each event goes to the
earliest subscriber still open (a library's Monitor made first, and after it closes the user's).

Two things JAX does not report as events come from its other hooks. A failed backend compile goes through JAX's
handlers of XLA runtime errors (``register_xla_runtime_error_handler``, which Pallas uses for its own messages):
the watcher counts it, marks the exception so that the job's failure reads as a compile error, and lets it
propagate unchanged. A recompile, which JAX explains only in a log record, is seen two ways:

- With ``jax_explain_cache_misses`` on, JAX logs an explanation of each tracing-cache miss, which a filter on
  JAX's loggers reads into a cause of :data:`tpuscope.reasons.RECOMPILE_VALUES`. A filter runs only for a record
  its logger is enabled for, so a job that quiets JAX's loggers hides them from tpuscope too.
- Whatever the log levels, each top-level trace of a jitted function is a ``jaxpr_trace_duration`` event on the
  tracing thread, right after JAX's explanation of it. The event names only the function (two lambdas share a
  name, and JAX's eager primitives trace under theirs), so the watcher reads the traced callable from JAX's
  tracing frame: a job's function traced again (the same object, or one made from the same code, as a lambda
  jitted in a loop) with no explanation seen on that thread is an ``unexplained`` recompile.

``jax_explain_cache_misses`` stays the job's (docs/hooks.md, ``explain_recompiles``): the watcher turns it on only
where the job left it at its default and while a subscriber asks, sets it back to False when none does, and gives
it up for good at the job's own ``jax.config.update``, heard through JAX's hook on the setting. Meanwhile the job's
log must read as if it were off: the watcher's filters, first on JAX's loggers, drop each explanation once read
and put the persistent cache's records the setting raised to WARNING back at DEBUG.
"""

from __future__ import annotations

import functools
import inspect
import logging
import os
import re
import sys
import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import CodeType
from typing import Any

from tpuscope import events, reasons
from tpuscope.tracing import failures
from tpuscope.tracing.adapter_protocol import CompileReporter

log = logging.getLogger("tpuscope")

TRACE_EVENT = "/jax/core/compile/jaxpr_trace_duration"
STAGES: dict[str, events.CompileStage] = {
    TRACE_EVENT: "tracing",
    "/jax/core/compile/jaxpr_to_mlir_module_duration": "lowering",
    "/jax/core/compile/backend_compile_duration": "backend",
}
CACHE_RESULTS = {
    "/jax/compilation_cache/cache_hits": True,
    "/jax/compilation_cache/cache_misses": False,
}
EXPLAIN_CONFIG = "jax_explain_cache_misses"
EXPLAIN_ENV = EXPLAIN_CONFIG.upper()
# Where JAX logs its explanation of a tracing-cache miss: partial_eval since JAX 0.5 or so, pjit before.
EXPLAIN_LOGGERS = ("jax._src.interpreters.partial_eval", "jax._src.pjit")
# Where the setting also raises the persistent compilation cache's records from DEBUG to WARNING.
RAISED_LOGGERS = ("jax._src.compiler", "jax._src.compilation_cache")
# Recompiles explained at most per process: JAX compares each miss with every earlier key of the function, so an
# explanation costs more as shapes grow; past this the setting goes off and recompiles count as unexplained.
EXPLAIN_BUDGET = 200
# pjit's function that traces a jitted callable (its local ``fun``): the one place that tells which was traced.
_TRACING_MODULE, _TRACING_FRAME = "jax._src.pjit", "_trace_for_jit"
_FRAMES_TO_TRACING = 8  # the listener, JAX's monitoring, the timer's exit, then the tracing frame: a few
_MAX_CODES = 10_000  # the job's traced code objects kept, to tell a lambda made again; a bound on odd jobs
_WRAPPED = re.compile(r"^\w+\((.*)\)$")  # "jit(train_step)" -> "train_step"
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
# The persistent cache's records the setting raises from DEBUG to WARNING, by their formats' first words.
_RAISED = ("PERSISTENT COMPILATION CACHE MISS", "Not writing persistent cache entry", "Writing %s to persistent")


def recompile_cause(explanation: str) -> str | None:
    """The cause JAX's cache-miss explanation gives, or None for a function's first trace."""
    words = explanation.lower()
    for said, cause in _CAUSES:
        if said in words:
            return cause
    return None if _FIRST_TRACE in words else reasons.OTHER


def subscribe(monitor: CompileReporter, *, explain: bool = True) -> bool:
    """Report JAX's compiles to ``monitor`` (while it is the earliest subscriber) until :func:`unsubscribe`.

    ``explain``: this Monitor wants JAX's explanations of recompiles; subscribing again changes only that.
    Returns False, and logs why once, where this JAX has no ``jax.monitoring`` listeners."""
    return _watcher.subscribe(monitor, explain)


def unsubscribe(monitor: CompileReporter) -> None:
    """Stop reporting to ``monitor``; the last one to leave removes the hooks and gives the setting back."""
    _watcher.unsubscribe(monitor)


@contextmanager
def ignoring() -> Iterator[None]:
    """Leave out what this thread compiles inside the block (tpuscope's own programs, not the job's)."""
    local = _watcher.local
    local.ignoring = getattr(local, "ignoring", 0) + 1
    try:
        yield
    finally:
        local.ignoring -= 1


class _Explanations:
    """``jax_explain_cache_misses``, borrowed from the job only while untouched, and given back as it was."""

    def __init__(self) -> None:
        self.ours = False  # the watcher turned it on, and the job has not set it since
        self.job_set = False  # the job set it (environment, a value other than JAX's default, an update heard)
        self.spent = False  # the process had its EXPLAIN_BUDGET explained recompiles: never on again
        self._state: Any = None  # JAX's State of the setting, while the watcher's hook is on it
        self._previous_hook: Callable[[Any], None] | None = None
        self._own_update = threading.local()  # .active while the watcher itself updates the setting

    def take(self) -> None:
        if self.ours or self.job_set or self.spent:
            return
        try:
            from jax._src import config  # the setting's State and its hook have no public alias

            state = config.config_states[EXPLAIN_CONFIG]
            untouched = os.environ.get(EXPLAIN_ENV) is None and state.get_global() is False
            hook = state._update_global_hook
        except (ImportError, AttributeError, KeyError) as e:  # a JAX without it: causes only where the job asks
            _say_once(f"tpuscope: recompiles are explained only where the job asks JAX to: {e!r}")
            return
        if not untouched:
            self.job_set = True
            return
        self._state, self._previous_hook = state, hook
        state._update_global_hook = self._on_update
        self._set(True)
        self.ours = True

    def give_back(self) -> None:
        if self._state is None:
            return
        if self.ours:
            self._set(False)
            self.ours = False
        if self._state._update_global_hook == self._on_update:
            self._state._update_global_hook = self._previous_hook
        self._state = None

    def spend(self, recompiles: int) -> None:
        """The budget is spent: off for good (a job that turns it on itself still gets its explanations)."""
        self.spent = True
        self.give_back()
        log.info(
            "tpuscope: %d recompiles counted with JAX's explanations on; they are off from here (each costs more "
            "as a function's shapes grow), and recompiles are counted as %s",
            recompiles,
            reasons.UNEXPLAINED,
        )

    def only_ours_here(self) -> bool:
        """Whether only the watcher asked for this thread's explanation (the job set no local value either)."""
        state = self._state
        return self.ours and (state is None or state.get_local() is not True)

    def _on_update(self, value: Any) -> None:
        """JAX's hook, called by ``jax.config.update`` of the setting: an update not the watcher's is the job's."""
        if self._previous_hook is not None:
            self._previous_hook(value)
        if not getattr(self._own_update, "active", False):
            self.job_set, self.ours = True, False

    def _set(self, value: bool) -> None:
        import jax

        self._own_update.active = True
        try:
            jax.config.update(EXPLAIN_CONFIG, value)  # type: ignore[no-untyped-call]
        finally:
            self._own_update.active = False


class _Watcher:
    """The process's one set of JAX hooks and the Monitors subscribed to them. Never raises into JAX."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._subscribers: list[tuple[CompileReporter, bool]] = []  # (monitor, wants explanations), earliest first
        self._listening = False
        self._registered = False  # JAX's listeners: kept registered where this JAX cannot unregister them
        self._backend_hook = False  # JAX's runtime-error hook, registered once: it cannot be removed
        self.local = threading.local()  # .ignoring: depth of ignoring() blocks; .explained: since the last trace
        self.explanations = _Explanations()
        self._traced: weakref.WeakSet[Any] = weakref.WeakSet()
        self._codes: set[CodeType] = set()  # and their code: a lambda made again has a new object, the same code
        self._recompiles = 0
        self._users_file: Callable[[str], bool] = lambda filename: False  # JAX's test, once found; none till then

    def subscribe(self, monitor: CompileReporter, explain: bool) -> bool:
        with self._lock:
            if not self._listening and not self._listen():
                return False
            if any(m is monitor for m, _ in self._subscribers):  # again: its place kept, its wish changed
                self._subscribers = [(m, explain if m is monitor else e) for m, e in self._subscribers]
            else:
                self._subscribers = [*self._subscribers, (monitor, explain)]
            self._explain_if_asked()
            return True

    def unsubscribe(self, monitor: CompileReporter) -> None:
        with self._lock:
            left = [s for s in self._subscribers if s[0] is not monitor]
            if len(left) == len(self._subscribers):
                return
            self._subscribers = left
            if left:
                self._explain_if_asked()
            else:
                self._stop_listening()

    def _target(self) -> CompileReporter | None:
        subscribers = self._subscribers  # replaced, never changed in place: no lock to read it
        return subscribers[0][0] if subscribers else None

    def _explain_if_asked(self) -> None:
        if any(explain for _, explain in self._subscribers):
            self.explanations.take()
        else:
            self.explanations.give_back()

    def _listen(self) -> bool:
        try:
            import jax.monitoring

            if not self._registered:  # twice would report each compile twice
                jax.monitoring.register_event_duration_secs_listener(self._on_duration)
                jax.monitoring.register_event_listener(self._on_event)
                self._registered = True
        except (ImportError, AttributeError) as e:
            _say_once(f"tpuscope: JAX's compiles are not reported: {e!r}")
            return False
        self._listening = True
        if not self._backend_hook:
            try:
                from jax._src import compiler  # the hook's one home; no public alias

                compiler.register_xla_runtime_error_handler(_on_backend_error)
                self._backend_hook = True
            except (ImportError, AttributeError) as e:  # a JAX without it: failed backend compiles go uncounted
                _say_once(f"tpuscope: failed backend compiles are not counted: {e!r}")
        try:
            from jax._src import pjit, source_info_util

            getattr(pjit, _TRACING_FRAME)  # where _traced_function reads the callable
            self._users_file = source_info_util.is_user_filename  # JAX's own test for its explanations
        except (ImportError, AttributeError) as e:
            _say_once(f"tpuscope: only the recompiles JAX explains are counted: {e!r}")
        for name in EXPLAIN_LOGGERS:
            _filter_first(logging.getLogger(name), self._on_explanation)
        for name in RAISED_LOGGERS:
            _filter_first(logging.getLogger(name), self._on_cache_record)
        return True

    def _stop_listening(self) -> None:
        import jax.monitoring

        self.explanations.give_back()
        for name in EXPLAIN_LOGGERS:
            logging.getLogger(name).removeFilter(self._on_explanation)
        for name in RAISED_LOGGERS:
            logging.getLogger(name).removeFilter(self._on_cache_record)
        try:
            jax.monitoring.unregister_event_duration_listener(self._on_duration)
            jax.monitoring.unregister_event_listener(self._on_event)
            self._registered = False
        except (AttributeError, ValueError) as e:  # a JAX that cannot: they stay, with no one to report to
            log.debug("tpuscope: JAX's listeners stay registered: %r", e)
        self._listening = False

    def ignoring_here(self) -> bool:
        return getattr(self.local, "ignoring", 0) > 0

    def _on_duration(self, event: str, duration_secs: float, **kwargs: Any) -> None:
        if (stage := STAGES.get(event)) is None or self.ignoring_here() or (monitor := self._target()) is None:
            return
        try:
            name = str(kwargs.get("fun_name", ""))
            match = _WRAPPED.match(name)
            monitor.compile(stage, duration_secs, function=match[1] if match else name)
            # After lowering the backend compile goes on (tracing/position.py); after the backend's it is over.
            if stage == "backend":
                monitor._whereabouts.compiled()
            elif stage == "lowering":
                monitor._whereabouts.compiling()
            if event == TRACE_EVENT:
                self._on_trace()
        except Exception:  # telemetry must never break a compile
            log.debug("tpuscope: compile event %s not reported", event, exc_info=True)

    def _on_trace(self) -> None:
        """A function was traced at the top level: a recompile JAX did not explain if the job traced it before."""
        explained, self.local.explained = getattr(self.local, "explained", False), False
        if (fun := _traced_function()) is None:
            return
        if (filename := _filename_of(fun)) is not None and not self._users_file(filename):
            return  # JAX's own (an eager primitive, a jitted jnp function): JAX does not explain those either
        if self._seen_before(fun) and not explained:
            self._recompiled(reasons.UNEXPLAINED)

    def _seen_before(self, fun: Any) -> bool:
        """Whether ``fun``, or a function of the job's made from the same code, was traced before; remember it."""
        try:
            seen = fun in self._traced
            self._traced.add(fun)
        except TypeError:  # not weakly referenceable: known by its code alone
            seen = False
        code = getattr(fun, "__code__", None)  # its own, not a wrapper's: jax.grad's wrappers share theirs
        if isinstance(code, CodeType) and self._users_file(code.co_filename):
            seen = seen or code in self._codes
            if len(self._codes) < _MAX_CODES:
                self._codes.add(code)
        return seen

    def _recompiled(self, cause: str) -> None:
        if (monitor := self._target()) is None:
            return
        monitor.recompile(cause)
        if self.explanations.ours:
            self._recompiles += 1
            if self._recompiles >= EXPLAIN_BUDGET:
                self.explanations.spend(self._recompiles)

    def _on_event(self, event: str, **kwargs: Any) -> None:
        if (hit := CACHE_RESULTS.get(event)) is None or self.ignoring_here() or (monitor := self._target()) is None:
            return
        try:
            if hit:  # the executable comes from the persistent cache: no backend compile follows
                monitor._whereabouts.compiled()
            monitor.compile_cache(hit)
        except Exception:
            log.debug("tpuscope: cache event %s not reported", event, exc_info=True)

    def _on_explanation(self, record: logging.LogRecord) -> bool:
        """A filter on JAX's explanation loggers: report the cause; keep the record only where the job asked JAX
        for it (without the watcher's setting JAX would not have logged it, at any level)."""
        message = record.getMessage()
        if _MISS not in message.lower():
            return True  # another record of the logger's: none of ours
        keep = not self.explanations.only_ours_here()  # before counting: the one that spends the budget is ours
        if not self.ignoring_here():
            self.local.explained = True  # the trace event that follows on this thread is explained
            try:
                if (cause := recompile_cause(message)) is not None:
                    self._recompiled(cause)
            except Exception:
                log.debug("tpuscope: recompile not reported", exc_info=True)
        return keep

    def _on_cache_record(self, record: logging.LogRecord) -> bool:
        """A filter on the persistent cache's loggers: a record the watcher's setting raised to WARNING goes back
        to DEBUG. The logger checked its level at WARNING, before its filters, so this keeps the record only where
        the logger is enabled for DEBUG (where JAX would have logged it)."""
        raised = isinstance(record.msg, str) and record.msg.startswith(_RAISED)
        if not raised or record.levelno != logging.WARNING or not self.explanations.only_ours_here():
            return True  # the cache's own warnings (an unsupported runtime), or the job asked for the setting
        record.levelno, record.levelname = logging.DEBUG, logging.getLevelName(logging.DEBUG)
        return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)

    def on_backend_error(self, error: Exception) -> None:
        if self.ignoring_here() or (monitor := self._target()) is None:
            return
        try:
            failures.mark(error, "compile_error", stage="backend")
            monitor.compile_failed(error)
        except Exception:  # telemetry must never change the job's error
            log.debug("tpuscope: failed compile not reported", exc_info=True)


def _traced_function() -> Any:
    """The callable JAX is tracing, read from its tracing frame below the listener; None where it is not there."""
    frame = sys._getframe(1)
    for _ in range(_FRAMES_TO_TRACING):
        if frame is None:
            return None
        if frame.f_code.co_name == _TRACING_FRAME and frame.f_globals.get("__name__") == _TRACING_MODULE:
            return frame.f_locals.get("fun")
        frame = frame.f_back  # type: ignore[assignment]
    return None


def _filename_of(fun: Any) -> str | None:
    """The file that defines ``fun``, as JAX finds it for its explanations (partials and wrappers unwrapped)."""
    while isinstance(fun, functools.partial):
        fun = fun.func
    try:
        return str(inspect.unwrap(fun).__code__.co_filename)
    except (AttributeError, ValueError):  # a callable object: JAX explains those
        return None


def _filter_first(logger: logging.Logger, on_record: Callable[[logging.LogRecord], bool]) -> None:
    """Add ``on_record`` to ``logger``'s filters, before the job's: they see a record as without the watcher."""
    if on_record not in logger.filters:
        logger.filters.insert(0, on_record)


_said: set[str] = set()


def _say_once(message: str) -> None:
    if message not in _said:
        _said.add(message)
        log.info(message)


_watcher = _Watcher()


def _on_backend_error(error: Exception) -> None:
    """JAX's hook for a failed backend compile: count it and mark it; return None, so JAX raises it as it is."""
    _watcher.on_backend_error(error)
    return None
