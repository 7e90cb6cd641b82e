"""The in-job API: a training loop tells tpuscope what happened, in a few lines.

    from tpuscope.tracing import Monitor

    mon = Monitor(workload="llm-pretrain")
    checkpoints = mon.orbax(ocp.CheckpointManager(directory, options=options))
    mon.flops_of(train_step, state, example_batch)      # MFU: the step's FLOPs and the devices' peak
    for n in range(steps):
        with mon.step(n) as s:
            with s.phase("io"):
                batch = next(data)
            with s.phase("compute"):
                state, loss = train_step(state, batch)
                s.loss(loss)                             # for the alerts on a NaN: never waits for the device
                loss = float(loss)                       # waits: the phase ends when the step's work does
        if n % 1000 == 0:
            checkpoints.save(n, args=ocp.args.StandardSave(state))

Compiles are reported by themselves when jax is imported (``hooks=Hooks(jax_compiles=False)`` turns that off).
Without Orbax, ``with mon.checkpoint("save", step=n) as c:`` times a checkpoint; without jit, ``s.flops`` and
``mon.hardware(...)`` give MFU. ``with mon.badput("eval"):`` books a block (an eval, a data check) as badput of its
own name (docs/goodput.md).

Every method returns quickly and never raises: the job's progress matters more than its telemetry (``badput``
alone refuses a name that is no category's, at once: a mistake in the code, not a condition of the run). Events
that cannot be delivered are counted in ``mon.dropped``. ``flops_of`` is the one slow call, made once: it may
compile the step, and on a CPU measure its peak.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.util
import logging
import os
import sys
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, fields, replace
from time import perf_counter
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, TypedDict, Unpack

from tpuscope import events, goodput, positions, reasons
from tpuscope.otel import spans_wanted
from tpuscope.tracing import failures, preemption, profile_sampler
from tpuscope.tracing import hooks as switches
from tpuscope.tracing.hooks import Hooks
from tpuscope.tracing.position import Nowhere, Whereabouts
from tpuscope.tracing.sinks import Sink, SocketSink
from tpuscope.tracing.training_values import PendingValues

if TYPE_CHECKING:
    from tpuscope.tracing.adapter_protocol import CheckpointReporter, CompileReporter
    from tpuscope.tracing.orbax_checkpoints import OrbaxCheckpoints
    from tpuscope.tracing.spans import SpanRecorder

log = logging.getLogger("tpuscope")

_MEASURED_PHASES = ("compute", "sync", "io")
# The position record's slots and codes the timers write, as module globals: one look-up each, per step.
_STEP_SLOT, _WHERE_SLOT, _SINCE_SLOT = positions.STEP_SLOT, positions.WHERE_SLOT, positions.SINCE_SLOT
_IN_STEP, _OUTSIDE, _PHASE_CODES = positions.STEP, positions.OUTSIDE, positions.PHASE_CODES


class _UncaughtException:
    """Whether an uncaught exception is ending the process, seen by chaining ``sys.excepthook``, which the
    interpreter calls before the exit handlers that close an unclosed Monitor. ``sys.last_type`` would say so too,
    but REPLs, IPython and pytest also set it for exceptions they only print, which would record a clean run as
    failed."""

    def __init__(self) -> None:
        self.value: BaseException | None = None
        self._installed = False

    def install(self) -> None:
        if self._installed:
            return
        self._installed = True
        previous = sys.excepthook

        def hook(kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
            self.value = value
            previous(kind, value, tb)

        sys.excepthook = hook


_uncaught = _UncaughtException()
_SIGTERM = preemption.sigterm  # read at every step: one global look-up
_closing = threading.Lock()

# Every open Monitor, for the fork hook below (weak: a Monitor the job dropped is not kept alive by it).
_open_monitors: weakref.WeakSet[Monitor] = weakref.WeakSet()


def _forget_in_forked_child() -> None:
    """A forked child (a multiprocessing data-loader worker) inherits the parent's Monitors, their connection
    to the sidecar and their atexit hook: none may speak for the parent (a stop or failure at the child's
    exit) nor keep the parent's connection open (the sidecar would not see the parent die while it lives)."""
    for monitor in list(_open_monitors):
        monitor._forget_parent()


os.register_at_fork(after_in_child=_forget_in_forked_child)


def _profile_period(value: float | str | None) -> float | None:
    """The device-profile period, or None (off); a bad value is said and turns profiles off: never raises."""
    try:
        period = profile_sampler.parse_period(value)
    except ValueError as e:
        log.warning("tpuscope: device profiles are off: %s (profile_period or $%s)", e, profile_sampler.PERIOD_ENV)
        return None
    try:
        installed = importlib.util.find_spec("jax") is not None
    except (ImportError, ValueError, OSError):  # ValueError: sys.modules["jax"] is None, as where jax is blocked
        installed = False
    if period is not None and not installed:
        log.info("tpuscope: device profiles are off: jax is not installed")
        return None
    return period


def sanitize_label(value: str) -> str:
    """Make ``value`` a valid label value (as the wire schema demands) instead of failing the job."""
    return events.label_value(value, "unknown")


def _close_every_monitor_preempted() -> None:
    """The SIGTERM watchdog is about to end the process: every open Monitor says it was preempted first."""
    for monitor in list(_open_monitors):
        monitor.close(failed="preemption")


@dataclass(frozen=True)
class Traces:
    """The Monitor's spans: 1 in ``sample_every`` steps, every step slower than the recent p99 times
    ``slow_factor``, every compile and checkpoint; exported as the ``OTEL_*`` variables say, else to
    ``spans_file`` (tracing/span_export.py). ``Monitor(traces=False)`` makes none."""

    spans_file: str | os.PathLike[str] | None = None
    sample_every: int = 100
    slow_factor: float = 1.2


class _FormerKeywords(TypedDict, total=False):
    """The Monitor's keywords before :class:`Traces` and :class:`Hooks` held them: each still works for one more
    release, with a DeprecationWarning that names its field."""

    spans_file: str | os.PathLike[str] | None
    sample_every: int
    slow_factor: float
    jax_compiles: bool | None
    profile_period: float | str | None
    sigterm: bool | None
    sigterm_grace: float | str | None
    explain_recompiles: bool | None
    profiles: bool | None
    excepthook: bool | None
    close_at_exit: bool | None
    hang_watch: bool | None
    exit_on_hang: bool | None


_TRACES_FIELDS = frozenset(f.name for f in fields(Traces))
_HOOKS_FIELDS = frozenset(f.name for f in fields(Hooks)) - {"every"}  # `every` was the `hooks` keyword itself


def _options(
    traces: Traces | bool, hooks: Hooks | bool | None, former: Mapping[str, Any]
) -> tuple[Traces | None, Hooks]:
    """The Monitor's spans (None: none) and hooks, with the former keywords folded in as they were meant."""
    spans = traces if isinstance(traces, Traces) else Traces() if traces else None
    chosen = hooks if isinstance(hooks, Hooks) else Hooks(every=hooks)
    for name, value in former.items():
        if name in _TRACES_FIELDS:
            if spans is not None:  # with traces off, a spans option never meant anything
                spans = replace(spans, **{name: value})
            instead = f"traces=Traces({name}=...)"
        elif name in _HOOKS_FIELDS:
            chosen = replace(chosen, **{name: value})
            instead = f"hooks=Hooks({name}=...)"
        else:
            raise TypeError(f"Monitor() got an unexpected keyword argument {name!r}")
        warnings.warn(
            f"tpuscope: Monitor({name}=...) is deprecated and goes in the next release; use Monitor({instead})",
            DeprecationWarning,
            stacklevel=3,  # the line that made the Monitor
        )
    return spans, chosen


class Monitor:
    """Reports steps, phases, compiles, checkpoints, memory and lifecycle to the sidecar.

    ``socket`` defaults to ``$TPUSCOPE_SOCKET``, else the sidecar's default path. ``sinks`` are further receivers
    of every event besides the sidecar (a run summary, a record file). ``traces``: the spans (:class:`Traces`),
    or False for none.

    ``hooks``: the process-wide changes the Monitor may make (:class:`~tpuscope.tracing.hooks.Hooks`; docs/hooks.md),
    or False for none of them; ``sigterm`` and ``exit_on_hang`` are off unless asked for. JAX's compiles
    (:meth:`watch_jax_compiles`) and device profiles start once jax is imported in the process, here or at a later
    step: the Monitor never imports jax itself, and a job without JAX pays nothing for it.
    """

    def __init__(
        self,
        workload: str,
        *,
        socket: str | os.PathLike[str] | None = None,
        sinks: Sequence[Sink] = (),
        traces: Traces | bool = True,
        hooks: Hooks | bool | None = None,
        **former: Unpack[_FormerKeywords],
    ) -> None:
        trace_options, hook_options = _options(traces, hooks, former)
        self.workload = sanitize_label(workload)
        if self.workload != workload:
            warnings.warn(f"tpuscope: workload {workload!r} reported as {self.workload!r}", stacklevel=2)
        self._sidecar = SocketSink(socket)
        self.sinks: tuple[Sink, ...] = (self._sidecar, *sinks)
        self._warned_phases: set[str] = set()
        self._jax_watched = False  # subscribed to the process's one compile watcher (tracing/jax_compiles.py)
        self._jax_pending = hook_options.on(switches.JAX_COMPILES)  # to watch JAX's compiles once imported
        self._explain_recompiles = hook_options.on(switches.EXPLAIN_RECOMPILES)
        self.step_flops = 0.0  # each step's model FLOPs unless the step sets its own (flops_of sets it)
        self._last_step: int | None = None  # the last step number read from a JAX array (see _host_number)
        # Compile seconds reported so far: a step or checkpoint reports those reported while it ran.
        self.compile_seconds = 0.0
        # Checkpoint seconds that held the loop so far, compiles aside, and step seconds: a badput section takes out
        # those inside it, which are booked as such.
        self.checkpoint_seconds = 0.0
        self.step_seconds = 0.0
        # Custom badput: the sections ended and not yet sent, (name, seconds, start), carried by the next step or close.
        self._badput_names = goodput.BadputNames()  # as the sidecar keeps them
        self._badput_folded = False  # a name past the bound came, and was said
        self._badput: list[tuple[str, float, float]] = []
        self._badput_lock = threading.Lock()
        # Sections open on each thread: one opened inside another is the outer one's time.
        self._badput_depth = threading.local()
        self._hardware_sent = False
        self._closed = False
        self._values = PendingValues()  # the losses given and not yet computed (tracing/training_values.py)
        self.spans: SpanRecorder | None = None
        if trace_options is not None:
            self.spans = _span_recorder(self.workload, trace_options)
        self._profiler: profile_sampler.DeviceProfiler | None = None
        self._profile_period = (
            _profile_period(hook_options.profile_period) if hook_options.on(switches.PROFILES) else None
        )
        self.lifecycle("start")
        self._watch_jax_if_imported()
        if hook_options.on(switches.EXCEPTHOOK):
            _uncaught.install()
        if hook_options.on(switches.SIGTERM):
            preemption.sigterm.install(preemption.watchdog_grace(hook_options.sigterm_grace))
            preemption.sigterm.before_kill = _close_every_monitor_preempted
        # Where the process is, for the sidecar's hang verdict; the timers write it (tracing/position.py).
        self._whereabouts: Whereabouts | Nowhere = Nowhere()
        if hook_options.on(switches.HANG_WATCH):
            exit_on = hook_options.on(switches.EXIT_ON_HANG)
            self._whereabouts = Whereabouts(
                self.workload, self.socket_path, exit_on_hang=exit_on, on_exit=lambda: self.close(failed=reasons.HANG)
            )
        self._close_at_exit_on = hook_options.on(switches.CLOSE_AT_EXIT)
        if self._close_at_exit_on:
            atexit.register(self._close_at_exit)
        _open_monitors.add(self)

    @property
    def preempted(self) -> bool:
        """Whether a SIGTERM came (with ``sigterm`` on): a loop that wants to save before it leaves reads it; the
        next :meth:`step` raises :class:`~tpuscope.tracing.preemption.Preempted` once."""
        return preemption.sigterm.received

    # --- the step loop ---------------------------------------------------------
    def step(self, number: int) -> StepTimer:
        """Time one training step: ``with mon.step(n) as s: ...``."""
        if self._jax_pending or (self._profiler is None and self._profile_period is not None):
            self._watch_jax_if_imported()  # a job that created its Monitor before importing jax
        return StepTimer(self, number)

    def _host_number(self, value: Any, advance: bool = True) -> Any:
        """The step number ``value`` holds, read without waiting on the device.

        A JAX step counter (``state.step``) is the previous step's result: reading it at once would wait for that
        step, and take away the asynchronous dispatch that lets the host prepare a step while the device runs the
        last. So it is read only once ``is_ready()``; until then the step is numbered one past the last number read
        (the first step's counter is read regardless: that step compiles anyway). Anything ``int()`` cannot read is
        returned as it is, and its step dropped at exit. ``advance=False`` (a checkpoint's step) counts nothing."""
        is_ready = getattr(value, "is_ready", None)
        try:
            if is_ready is not None:
                if self._last_step is not None and not is_ready():
                    if not advance:
                        return self._last_step + 1
                    self._last_step += 1
                    return self._last_step
                number = events.as_int(value)
                if advance:
                    self._last_step = number
                return number
            return events.as_int(value)
        except (TypeError, ValueError):
            return value

    def _host_flops(self, value: Any) -> float:
        """A step's FLOPs as a float, without waiting on the device: a JAX value not computed yet counts as the
        Monitor's default (:meth:`flops_of`'s)."""
        is_ready = getattr(value, "is_ready", None)
        if is_ready is not None and not is_ready():
            return self.step_flops
        return float(value)

    def position_at(self, operation: Literal["save", "restore"]) -> AbstractContextManager[None]:
        """Inside the block the process is in a checkpoint's ``operation``: a hang verdict judges it on the long
        scale of saves and restores (tracing/position.py)."""
        return self._whereabouts.at(positions.SAVE if operation == "save" else positions.RESTORE)

    def checkpoint(self, operation: Literal["save", "restore"] = "save", *, step: int = 0) -> CheckpointTimer:
        """Time a checkpoint: ``with mon.checkpoint("save", step=n) as c: c.bytes = ...``. An exception inside the
        block records a failed checkpoint, then propagates."""
        return CheckpointTimer(self, operation, step if type(step) is int else self._host_number(step, advance=False))

    def badput(self, name: str) -> BadputTimer:
        """Book the block's time as custom badput ``name``: ``with mon.badput("eval"): evaluate()``.

        For time the job spends on purpose away from training (an eval, a data or silent-data-corruption check),
        served as ``tpuscope_goodput_seconds_total{category=name}``. Between steps it is time that would otherwise
        be ``other``; inside a step it is taken out of that step's productive time. The compiles and checkpoints
        inside the block are booked as such, and a block opened inside another is the outer one's time.

        ``name``: a lower-case word that is no built-in category; anything else raises ValueError at once, a
        mistake to fix. Past ``goodput.MAX_CUSTOM_BADPUT`` names, later ones are booked as ``custom`` (said once).
        """
        category = name if name in self._badput_names.kept else self._badput_category(name)
        return BadputTimer(self, category)

    def _badput_category(self, name: str) -> str:
        if (error := goodput.badput_name_error(name)) is not None:
            raise ValueError(f"tpuscope: Monitor.badput: {error}")
        if (category := self._badput_names.category(name)) == goodput.CUSTOM_BADPUT and not self._badput_folded:
            self._badput_folded = True
            log.warning(
                "tpuscope: custom badput %r and any further name is booked as %r: a process keeps %d names (%s)",
                name,
                goodput.CUSTOM_BADPUT,
                goodput.MAX_CUSTOM_BADPUT,
                ", ".join(self._badput_names.kept),
            )
        return category

    def _badput_ended(self, name: str, seconds: float, started: float) -> None:
        with self._badput_lock:
            self._badput.append((name, seconds, started))

    def _take_badput(self, step_started: float | None) -> tuple[events.Badput, ...]:
        """The sections ended since the last event that carried them, one entry per name and place: inside the
        step that began at ``step_started`` (perf_counter), or before it (None: no step, the close)."""
        with self._badput_lock:
            marked, self._badput = self._badput, []
        totals: dict[tuple[str, bool], float] = {}
        for name, seconds, started in marked:
            key = (name, step_started is not None and started >= step_started)
            totals[key] = totals.get(key, 0.0) + seconds
        return tuple(
            events.Badput(name, min(max(seconds, 0.0), events.MAX_SECONDS), in_step)
            for (name, in_step), seconds in totals.items()
        )

    def orbax(self, manager: Any, *, raise_errors: bool = False) -> OrbaxCheckpoints:
        """Report every save and restore of an Orbax ``CheckpointManager``; use what it returns in its place:
        ``checkpoints = mon.orbax(ocp.CheckpointManager(directory, options=options))``.

        Each save is reported when it is durable, with the bytes on disk. A failed save is logged and ``save``
        returns False; ``raise_errors=True`` raises it where Orbax would. See tracing/orbax_checkpoints.py.
        """
        from tpuscope.tracing.orbax_checkpoints import OrbaxCheckpoints

        return OrbaxCheckpoints(manager, self, raise_errors=raise_errors)

    def flops_of(self, step: Callable[..., Any], *args: Any, **kwargs: Any) -> float:
        """Read the model FLOPs of the jitted ``step`` from its compiled program, for MFU: every later step
        reports them (a step's ``s.flops`` still overrides its own). Returns them; 0.0 when they cannot be read.

        Give it the arguments the step is called with (arrays, or ``jax.ShapeDtypeStruct`` of their shapes); the
        step compiles once either way. Unless :meth:`hardware` was called, it also reports the devices the step
        runs on and their peak FLOP/s: from a table for TPUs and GPUs; a CPU's is measured, then kept for later
        runs (tracing/jax_costs.py).
        """
        from tpuscope.tracing import jax_costs

        self._watch_jax_if_imported()  # the compile it may cause is the job's own
        name = getattr(step, "__name__", repr(step))
        try:
            cost = jax_costs.step_cost(step, *args, **kwargs)
        except Exception as e:  # wrong arguments, or a backend without cost analysis: no MFU, the job goes on
            log.warning("tpuscope: no FLOPs for %s, so no MFU: %s", name, e)
            return 0.0
        self.step_flops = cost.flops
        if not self._hardware_sent:
            try:
                with self._ignoring_compiles():  # measuring a CPU's peak compiles a matmul: not the job's
                    peak, source = jax_costs.peak_flops_per_second(cost.devices)
            except Exception as e:
                log.warning("tpuscope: no peak FLOP/s for %s, so no MFU: %s", cost.devices[0], e)
                return cost.flops
            accelerator = jax_costs.accelerator_of(cost.devices[0])
            self.hardware(accelerator, len(cost.devices), peak)
            log.info(
                "tpuscope: %s does %.4g FLOPs a step on %d %s device(s), peak %.4g FLOP/s (%s)",
                name,
                cost.flops,
                len(cost.devices),
                accelerator,
                peak,
                source,
            )
        return cost.flops

    # --- one-off reports ---------------------------------------------------------
    def record_checkpoint(
        self,
        operation: Literal["save", "restore"],
        seconds: float,
        *,
        ok: bool,
        bytes: int = 0,
        step: int = 0,
        blocking_seconds: float | None = None,
        compile_seconds: float | None = None,
    ) -> None:
        """Report a checkpoint timed elsewhere (an async save that finished on another thread).

        ``blocking_seconds``: how much of ``seconds`` held the job (an async save's call), the only part the goodput
        ledger books as checkpoint time. ``compile_seconds``: the compiles reported while it ran, if known.
        """
        event = self._event(
            events.Checkpoint,
            operation=operation,
            duration_s=seconds,
            ok=ok,
            bytes=bytes,
            step=step,
            compile_s=compile_seconds,
            blocking_s=blocking_seconds,
        )
        if event is not None:
            held = seconds if blocking_seconds is None else min(blocking_seconds, seconds)
            with contextlib.suppress(TypeError, ValueError):  # the event took them: they are numbers
                self.checkpoint_seconds += max(0.0, float(held) - float(compile_seconds or 0.0))
            self._span(event, blocking_seconds)
            self._deliver(event)

    def compiled_since(self, before: float, within: float) -> float:
        """The compile seconds reported since :attr:`compile_seconds` read ``before``, at most ``within`` (the
        duration of what ran meanwhile: a compile on another thread may overrun it). An exact 0 is an int: one
        byte on the wire, where 0.0 takes nine."""
        compiled = self.compile_seconds - before
        return min(compiled, within) if compiled else 0

    def compile(self, stage: events.CompileStage, seconds: float, function: str = "") -> None:
        with contextlib.suppress(TypeError, ValueError):  # a bad value is the event's to drop, below
            self.compile_seconds += float(seconds)
        self._send(events.Compile, stage=stage, duration_s=seconds, function=function[:256])

    def compile_cache(self, hit: bool) -> None:
        self._send(events.CompileCache, hit=hit)

    def device_memory(
        self,
        device: str,
        accelerator: str,
        *,
        used_bytes: int,
        limit_bytes: int = 0,
        peak_bytes: int = 0,
        source: Literal["workload", "process"] = "workload",
    ) -> None:
        """A device's memory as the job sees it. ``device``: its index on the host (0 to 7), as the collectors name
        the same chip; not ``jax.Device.id``, which on a multi-host TPU slice counts across the slice."""
        self._send(
            events.DeviceMemory,
            device=sanitize_label(device),
            accelerator=sanitize_label(accelerator),
            used_bytes=used_bytes,
            limit_bytes=limit_bytes,
            peak_bytes=peak_bytes,
            source=source,
        )

    def program_memory(self, program: str, *, spill_bytes: int) -> None:
        self._send(events.ProgramMemory, program=sanitize_label(program), spill_bytes=spill_bytes)

    def hardware(self, accelerator: str, devices: int, peak_flops_per_second: float) -> None:
        """What the job runs on; with each step's ``flops`` the sidecar derives MFU."""
        self._hardware_sent = True
        self._send(
            events.Hardware,
            accelerator=sanitize_label(accelerator),
            devices=devices,
            peak_flops_per_second=peak_flops_per_second,
        )

    def watch_jax_compiles(self) -> None:
        """Report JAX's compile stages and compilation-cache look-ups until the Monitor closes.

        The Monitor calls it itself once jax is imported (unless ``jax_compiles`` is off); calling it again
        changes nothing. Each compile goes to one Monitor of the process (tracing/jax_compiles.py).
        """
        self._jax_pending = False
        if self._jax_watched or self._closed:
            return
        try:
            from tpuscope.tracing import jax_compiles

            self._jax_watched = jax_compiles.subscribe(self, explain=self._explain_recompiles)
        except Exception as e:
            log.warning("tpuscope: JAX's compiles are not reported: %s", e)

    def _watch_jax_if_imported(self) -> None:
        # sys.modules, not an import: a job that does not use JAX must not load it for the Monitor's sake.
        if "jax" not in sys.modules:
            return
        if self._jax_pending:
            self.watch_jax_compiles()
        if self._profile_period is not None and self._profiler is None and not self._closed:
            # One profiler a process: a second Monitor's steps are profiled only once it takes over from the first.
            try:
                self._profiler = profile_sampler.claim(self, self._profile_period, self.socket_path)
            except Exception as e:  # never the job's problem: no profiles
                log.warning("tpuscope: device profiles are off: %s", e)
                self._profile_period = None

    def _ignoring_compiles(self) -> AbstractContextManager[None]:
        """What this thread compiles inside the block is tpuscope's own (measuring a CPU's peak), not the job's."""
        if not self._jax_watched:
            return nullcontext()
        from tpuscope.tracing import jax_compiles

        return jax_compiles.ignoring()

    def lifecycle(self, state: events.LifecycleState, reason: str = "none") -> None:
        self._send(events.Lifecycle, state=state, reason=sanitize_label(reason))

    def model_loaded(self, version: str) -> None:
        """The serving process loaded the model it serves now: its age counts from here (TpuscopeModelStale).
        ``version`` becomes a label: a release name or a step, not a hash per build."""
        self._send(events.ModelLoaded, version=sanitize_label(version))

    def recompile(self, cause: str) -> None:
        """A function was traced again; ``cause`` one of :data:`tpuscope.reasons.RECOMPILE_VALUES`."""
        self._send(events.Recompile, cause=cause)

    def inference_batch(self, batch_size: int, queue_depth: int, request_seconds: Sequence[float] = ()) -> None:
        self._send(
            events.InferenceBatch,
            batch_size=batch_size,
            queue_depth=queue_depth,
            request_seconds=list(request_seconds)[:1024],
        )

    # --- delivery ------------------------------------------------------------------
    @property
    def socket_path(self) -> str:
        """Where events go: the sidecar's socket."""
        return self._sidecar.path

    @property
    def sent(self) -> int:
        """Events delivered to the sidecar's socket."""
        return self._sidecar.sent

    @property
    def dropped(self) -> int:
        """Events that could not be delivered to the sidecar (no sidecar, or its buffer was full)."""
        return self._sidecar.dropped

    def emit(self, event: events.AnyEvent) -> None:
        """Hand a finished event to every sink (and the rare ones to the span recorder). Never raises."""
        if not isinstance(event, events.Step):  # a step's spans are made when it ends, sampled (StepTimer)
            self._span(event)
        self._deliver(event)

    def _span(self, event: events.AnyEvent, blocking_s: float | None = None) -> None:
        if self.spans is not None:
            try:
                self.spans.event(event, blocking_s)
            except Exception:
                log.debug("tpuscope: span for %r failed", event, exc_info=True)

    def _deliver(self, event: events.AnyEvent) -> None:
        for sink in self.sinks:
            try:
                sink.emit(event)
            except Exception:  # a sink's bug must not reach the training loop
                log.debug("tpuscope sink %r failed", sink, exc_info=True)

    def _event(self, record: type[events.AnyEvent], **fields: object) -> events.AnyEvent | None:
        try:
            # NumPy and JAX numbers made Python ones (StepTimer does it for steps, at less cost per step).
            if record is not events.Step and not all(type(v) in events.PLAIN_TYPES for v in fields.values()):
                fields = events.plain_fields(record, fields)
            return record(workload=self.workload, **fields)  # type: ignore[arg-type]
        except Exception as e:  # e.g. phases longer than the step: drop, count, carry on
            self._sidecar.drop(f"invalid {record.__name__}: {e}")
            return None

    def _send_last_training_values(self) -> None:
        """At the close: the values computed by now and the count of those not, which no step will carry."""
        try:
            values = self._values.ready()
            self._values.drop_all()
            if values or self._values.unread:
                self._deliver(events.TrainingValues(self.workload, values, self._values.take_unread()))
        except Exception:  # telemetry must never fail the job
            log.debug("tpuscope: training values failed", exc_info=True)

    def _send(self, record: type[events.AnyEvent], **fields: object) -> None:
        if (event := self._event(record, **fields)) is not None:
            self.emit(event)

    def close(self, failed: bool | BaseException | str = False) -> None:
        """Send the stop (or failure) event and report drops. Called at exit too.

        ``failed``: the exception that ends the job (its reason is read from it: :func:`failure_reason`), a
        reason of :data:`tpuscope.reasons.FAILURE_VALUES` (``"preemption"`` where the job learnt of it
        itself, as from JAX's preemption sync point), or True (a failure tpuscope cannot name: ``other``).
        A SIGTERM the Monitor saw makes the end a preemption, even a clean one after a last save.
        """
        with _closing:  # once, whoever calls: the main thread, the exit handler, the SIGTERM watchdog's thread
            if self._closed:
                return
            self._closed = True
        if isinstance(failed, BaseException):
            self.compile_failed(failed)
        self._send_last_training_values()
        reason = self._failure_reason(failed)
        # The last word first: what follows may wait (a capture being stopped), and the SIGTERM watchdog gives
        # its close only a moment before it ends the process. It carries the custom badput no step carried.
        self._send(
            events.Lifecycle,
            state="stop" if reason is None else "failure",
            reason=sanitize_label(reason or "none"),
            badput=self._take_badput(None) if self._badput else (),
        )
        if self._jax_watched:
            from tpuscope.tracing import jax_compiles

            jax_compiles.unsubscribe(self)
        if self._profiler is not None:
            try:
                profile_sampler.release(self)
            except Exception:
                log.debug("tpuscope: the device profiler failed to close", exc_info=True)
        if self._close_at_exit_on:
            atexit.unregister(self._close_at_exit)
        self._whereabouts.close()
        _open_monitors.discard(self)
        if not _open_monitors:  # a job that goes on after its last Monitor: SIGTERM is as it was before it
            preemption.sigterm.uninstall()
        if self._sidecar.dropped:
            log.warning(
                "tpuscope: %d of %d events were not delivered to the sidecar (last: %s)",
                self._sidecar.dropped,
                self._sidecar.dropped + self._sidecar.sent,
                self._sidecar.last_error,
            )
        for sink in self.sinks:
            try:
                sink.close()
            except Exception:
                log.debug("tpuscope sink %r failed to close", sink, exc_info=True)
        if self.spans is not None:
            self.spans.close()

    def compile_failed(self, exc: BaseException) -> None:
        """Count ``exc`` as a failed compile if it is one not counted yet (it passes a step's exit and the
        Monitor's). The backend's are counted as they happen (tracing/jax_compiles.py)."""
        if (failure := failures.uncounted_compile_failure(exc)) is not None:
            stage, reason = failure
            self._send(events.CompileFailure, stage=stage, reason=reason)

    @staticmethod
    def _failure_reason(failed: bool | BaseException | str) -> str | None:
        """The failure's reason, or None for a clean stop."""
        if isinstance(failed, SystemExit) and not isinstance(failed, preemption.Preempted):
            failed = failed.code not in (0, None)  # sys.exit(0) is a clean end, sys.exit(2) not
        if isinstance(failed, KeyboardInterrupt):
            failed = False  # the person at the keyboard stopped it
        if (preempted := preemption.sigterm.reason()) is not None:  # a SIGTERM came: the job ends on its account
            return preempted
        if isinstance(failed, BaseException):
            return failures.failure_reason(failed)
        if isinstance(failed, str):
            if failed not in reasons.FAILURE_VALUES:
                log.warning(
                    "tpuscope: failure reason %r is none of %s: reported as other", failed, reasons.FAILURE_VALUES
                )
                return reasons.OTHER
            return failed
        return reasons.OTHER if failed else None

    def _forget_parent(self) -> None:
        """In a forked child: silent from now on, the inherited connection closed, nothing sent at exit."""
        self._closed = True
        atexit.unregister(self._close_at_exit)
        self._sidecar.close()  # closes this process's copy of the socket; the parent's stays open
        self.sinks = ()  # nor does it write into the parent's recording
        self.spans = None  # the exporter's threads did not survive the fork; the parent exports its spans
        self._profiler = None  # nor did the profiler's; the parent profiles
        self._whereabouts.forget_in_child()  # nor did the position thread; the record is the parent's
        _open_monitors.discard(self)

    def _close_at_exit(self) -> None:
        """Close a Monitor the job never closed, as a failure if an uncaught exception is ending the job
        (without this a crashed job would be reported as a clean stop)."""
        self.close(failed=_uncaught.value or False)

    def __enter__(self) -> Monitor:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        self.close(failed=exc or False)

    def _phase_name(self, name: str) -> str:
        if name in _MEASURED_PHASES:
            return name
        if name not in self._warned_phases:  # once per name: the loop calls this every step
            self._warned_phases.add(name)
            warnings.warn(
                f"tpuscope: unknown phase {name!r} counts as 'other'; use one of {_MEASURED_PHASES}",
                stacklevel=3,
            )
        return "other"


def _span_recorder(workload: str, options: Traces) -> SpanRecorder | None:
    """The span recorder the environment asks for; None when spans are off, nothing would receive them (no OTLP
    endpoint, no spans file: then the SDK is not even imported), or OpenTelemetry fails to start."""
    if not spans_wanted(options.spans_file):
        log.debug("tpuscope: no spans: no OTLP endpoint (OTEL_EXPORTER_OTLP_ENDPOINT) and no spans file")
        return None
    try:
        from tpuscope.tracing import span_export
        from tpuscope.tracing.spans import SpanRecorder, TrainingSampler

        sampler = TrainingSampler(int(options.sample_every), float(options.slow_factor))
        exporter = span_export.exporter(options.spans_file)
        if exporter is None:
            return None
        provider = span_export.tracer_provider(workload, exporter)
        recorder = SpanRecorder(workload, provider, sampler, span_export.destination(exporter))
    except Exception as e:  # a bad setting, or a spans file it cannot create, must not stop the job
        log.warning("tpuscope: spans are off: %s", e)
        return None
    if isinstance(exporter, span_export.JsonLinesExporter):
        log.info(
            "tpuscope: spans go to %s, rotated at %s ($%s)",
            recorder.destination,
            span_export.size_in_words(exporter.max_bytes),
            span_export.MAX_BYTES_VARIABLE,
        )
    return recorder


class StepTimer:
    """Times one step and its phases; sends one event when the step ends.

    The time no phase claims is reported as ``other``, so a step's phases always add up to its duration. This and
    :class:`PhaseTimer` are the hot path of every step: what they do per step is kept to attribute reads and one event.
    """

    __slots__ = (
        "_annotation",
        "_compiled_before",
        "_intervals",
        "_monitor",
        "_phase",
        "_phases",
        "_start",
        "flops",
        "number",
    )

    def __init__(self, monitor: Monitor, number: int) -> None:
        self._monitor = monitor
        if type(number) is not int:  # a JAX step counter, an np.int64: its host value; anything else drops at exit
            number = monitor._host_number(number)
        self.number = number
        self.flops = monitor.step_flops  # the step's model FLOPs, for MFU (Monitor.flops_of sets the default)
        self._phases = {"compute": 0.0, "sync": 0.0, "io": 0.0, "other": 0.0}
        # (phase, start, end) of each phase, for the step's spans should it be kept; None without spans.
        self._intervals: list[tuple[str, float, float]] | None = [] if monitor.spans is not None else None
        self._phase: PhaseTimer | None = None  # made at the first phase, then reused: phases follow each other
        self._start = 0.0
        self._compiled_before = 0.0
        self._annotation: Any = None  # a device-profile capture's step annotation, while one runs

    def __enter__(self) -> StepTimer:
        if _SIGTERM.received:  # with `sigterm` on, a SIGTERM came: the job leaves here, at a step boundary, once
            _SIGTERM.raise_once()
        # The profiler is called only at a capture's steps (and the few before its K is chosen).
        profiler = self._monitor._profiler
        number = self.number
        if profiler is not None and type(number) is int and (profiler.watching or not number % profiler.every):
            self._annotation = profiler.step_started(number)
        self._compiled_before = self._monitor.compile_seconds
        self._start = start = perf_counter()
        slots = self._monitor._whereabouts.slots
        if type(number) is int:
            slots[_STEP_SLOT] = number
        slots[_SINCE_SLOT] = start
        slots[_WHERE_SLOT] = _IN_STEP
        return self

    def loss(self, loss: Any, *, grad_norm: Any = None, local: Any = None) -> None:
        """Report the step's loss, and its gradient norm and this process's value before the reduction
        (``local``: its own loss or gradient norm, to name the first worker to go non-finite) where the job has
        them: JAX arrays or numbers. Never waits for the device: an array still being computed is read at the
        end of a later step, once ready (tracing/training_values.py)."""
        values = self._monitor._values
        try:
            if type(self.number) is int:
                values.give(self.number, loss, grad_norm, local)
            else:  # a step number the host cannot read: nor could the sidecar file its values
                values.unread += 1
        except Exception:  # telemetry must never fail the step
            log.debug("tpuscope: training values failed", exc_info=True)

    def phase(self, name: str) -> PhaseTimer:
        """Time a phase of this step: ``"io"``, ``"compute"`` or ``"sync"``. Phases must not nest."""
        if name not in _MEASURED_PHASES:
            name = self._monitor._phase_name(name)
        timer = self._phase
        if timer is None or timer._start:  # the first phase, or one begun inside another: a timer of its own
            timer = PhaseTimer(self._phases, name, self._monitor._whereabouts, self._intervals)
            if self._phase is None:
                self._phase = timer
            return timer
        timer.name = name
        timer.code = _PHASE_CODES[name]
        return timer

    def __exit__(self, kind: object, value: object, tb: object) -> None:  # no *args: a tuple a step
        end = perf_counter()
        duration = end - self._start
        monitor = self._monitor
        monitor.step_seconds += duration
        slots = monitor._whereabouts.slots
        slots[_SINCE_SLOT] = end
        slots[_WHERE_SLOT] = _OUTSIDE
        if value is not None:  # a step that raised: a compile that failed is counted now, should the job go on
            monitor.compile_failed(value)  # type: ignore[arg-type]
        profile = None
        profiler = monitor._profiler
        if profiler is not None and (profiler.watching or self._annotation is not None) and type(self.number) is int:
            profile = profiler.step_ended(self.number, duration, self._annotation)
        if type(self.number) is not int or type(self.flops) is not float:  # np.float32 FLOPs, or an unreadable step
            try:
                self.number, self.flops = events.as_int(self.number), monitor._host_flops(self.flops)
            except (TypeError, ValueError) as e:
                monitor._sidecar.drop(f"invalid Step: {type(e).__name__}: {e}")
                return
        trace_id = ""
        if self._intervals is not None and (spans := monitor.spans) is not None:
            try:
                if spans.sampler.keep(self.number, duration):  # most steps: no span is made
                    trace_id = spans.step(self.number, self._start, end, self._intervals)
            except Exception:  # telemetry must never fail the step
                log.debug("tpuscope: step span failed", exc_info=True)
        p = self._phases
        compute, sync, io = p["compute"], p["sync"], p["io"]
        # "other" is whatever the measured phases leave; an explicit or unknown phase is part of it.
        other = duration - compute - sync - io
        if other < 0.0:
            other = 0.0
        badput: tuple[events.Badput, ...] = ()
        if monitor._badput:  # custom badput marked since the last step
            try:
                badput = monitor._take_badput(self._start)
            except Exception:
                log.debug("tpuscope: custom badput failed", exc_info=True)
        values: tuple[events.StepValues, ...] = ()
        unread = 0
        given = monitor._values
        if given.waiting or given.unread:  # losses given this step or before (s.loss): those the device has computed
            try:
                values, unread = given.ready(), given.take_unread()
            except Exception:
                log.debug("tpuscope: training values failed", exc_info=True)
        try:  # positionally, in the schema's order
            # Monitor.compiled_since, written out: a call costs the hot path more than the subtraction.
            compiled = monitor.compile_seconds - self._compiled_before
            compiled = min(compiled, duration) if compiled else 0
            event = events.Step(
                monitor.workload,
                self.number,
                duration,
                compute,
                sync,
                io,
                other,
                0,
                self.flops,
                trace_id,
                profile,
                compiled,
                values,
                unread,
                badput,
            )
        except Exception as e:  # phases longer than the step (phases run outside it): drop, count, carry on
            monitor._sidecar.drop(f"invalid Step: {e}")
            return
        monitor._deliver(event)


class PhaseTimer:
    """Times one phase into its step's totals. A step reuses one for the phases that follow each other."""

    __slots__ = ("_intervals", "_phases", "_start", "_whereabouts", "code", "name")

    def __init__(
        self,
        phases: dict[str, float],
        name: str,
        whereabouts: Whereabouts | Nowhere,
        intervals: list[tuple[str, float, float]] | None = None,
    ) -> None:
        self._phases = phases
        self.name = name
        self.code = _PHASE_CODES[name]  # the phase's code in the position record
        self._whereabouts = whereabouts
        self._intervals = intervals
        self._start = 0.0  # while it runs, when it began (perf_counter is never 0)

    def __enter__(self) -> PhaseTimer:
        self._start = start = perf_counter()
        slots = self._whereabouts.slots
        slots[_SINCE_SLOT] = start
        slots[_WHERE_SLOT] = self.code
        return self

    def __exit__(self, kind: object, value: object, tb: object) -> None:
        end = perf_counter()
        slots = self._whereabouts.slots
        slots[_SINCE_SLOT] = end
        slots[_WHERE_SLOT] = _IN_STEP
        self._phases[self.name] += end - self._start
        if self._intervals is not None:
            self._intervals.append((self.name, self._start, end))
        self._start = 0.0
        if value is not None and self.name == "io":  # the input pipeline raised: should it end the job, why
            failures.mark(value, "data_error")  # type: ignore[arg-type]


class CheckpointTimer:
    """Times a checkpoint; set ``bytes`` inside the block to report its size."""

    __slots__ = ("_compiled_before", "_monitor", "_position", "_start", "bytes", "operation", "step")

    def __init__(self, monitor: Monitor, operation: Literal["save", "restore"], step: int) -> None:
        self._monitor = monitor
        self.operation = operation
        self.step = step
        self.bytes = 0
        self._start = 0.0
        self._compiled_before = 0.0
        self._position: AbstractContextManager[None] = nullcontext()

    def __enter__(self) -> CheckpointTimer:
        self._compiled_before = self._monitor.compile_seconds
        self._position = self._monitor.position_at(self.operation)
        self._position.__enter__()
        self._start = time.perf_counter()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        seconds = time.perf_counter() - self._start
        self._position.__exit__(None, None, None)
        if exc is not None and self.operation == "restore":
            failures.mark(exc, "checkpoint_restore")
        compiled = self._monitor.compiled_since(self._compiled_before, seconds)
        self._monitor.record_checkpoint(
            self.operation, seconds, ok=exc_type is None, bytes=self.bytes, step=self.step, compile_seconds=compiled
        )


class BadputTimer:
    """Times a block of custom badput (:meth:`Monitor.badput`): its wall time, less the compiles, checkpoints and
    steps that ran inside it (booked as such), unless it runs inside another block of its thread, whose time it is."""

    __slots__ = ("_checkpointed_before", "_compiled_before", "_monitor", "_outer", "_start", "_stepped_before", "name")

    def __init__(self, monitor: Monitor, name: str) -> None:
        self._monitor = monitor
        self.name = name
        self._outer = False
        self._start = self._compiled_before = self._checkpointed_before = self._stepped_before = 0.0

    def __enter__(self) -> BadputTimer:
        monitor = self._monitor
        depth = monitor._badput_depth
        self._outer = getattr(depth, "open", 0) == 0
        depth.open = getattr(depth, "open", 0) + 1
        self._compiled_before = monitor.compile_seconds
        self._checkpointed_before = monitor.checkpoint_seconds
        self._stepped_before = monitor.step_seconds
        self._start = perf_counter()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        seconds = perf_counter() - self._start
        monitor = self._monitor
        monitor._badput_depth.open -= 1
        if not self._outer:
            return
        seconds -= monitor.compiled_since(self._compiled_before, seconds)
        seconds -= min(monitor.checkpoint_seconds - self._checkpointed_before, seconds)
        seconds -= min(monitor.step_seconds - self._stepped_before, seconds)
        monitor._badput_ended(self.name, seconds, self._start)


if TYPE_CHECKING:  # the adapters call a Monitor only through their protocols (tracing/adapter_protocol.py): it has them

    def _reports_compiles(monitor: Monitor) -> CompileReporter:
        return monitor

    def _reports_checkpoints(monitor: Monitor) -> CheckpointReporter:
        return monitor
