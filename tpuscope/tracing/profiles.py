"""Sampled device profiles: where a fused step's time goes on the devices, measured live.

A real job runs one fused jitted step, in which collectives overlap compute: no timer on the host can
split it. Only a device trace can. So every K steps the Monitor traces a few steps in-process (the
profiler JAX itself uses, held in memory, never written), and a thread of its own stops the trace and
parses it (:mod:`tpuscope.tracing.xspace`); the result rides on the next step's event to the sidecar
(``Step.profile``).

- **Which steps.** K is a power of two near ``period / step time``, and a capture starts at a step
  divisible by K. Hosts of a synchronous job step in lockstep and measure nearly the same step time, so
  they choose the same K; where one chose twice another's (near a power-of-two boundary, or after
  widening its period), its captures are still a subset of the other's: every host that captures at a
  step captures the same steps.
- **What it costs.** A step annotation on each captured step is all the training thread does (about a
  microsecond); starting, stopping and parsing the trace run on the profiler's thread, and are measured
  each time. A capture costing more than :data:`COST_BUDGET` of its period's
  wall time doubles K.
- **The user's profiler comes first.** A capture is skipped (counted ``busy``) while a profiling session
  or a profiler server of the user's is active. A ``jax.profiler.start_trace`` (``trace()``) called
  during a capture first stops the capture, so the user's trace works and JAX's profiler state stays
  usable: JAX allows one session per process, and a second session's stop fails and leaves that state
  set until the process ends.
- **Never in the way.** Nothing here raises into the training loop; what fails is counted (``error``)
  and said once in the log.

``period`` (seconds, or a duration such as ``"10m"``, or ``"off"``) comes from the Monitor's
``profile_period``, else ``$TPUSCOPE_PROFILE_PERIOD``, else :data:`DEFAULT_PERIOD`.
"""

from __future__ import annotations

import logging
import math
import os
import queue
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tpuscope import durations, events

log = logging.getLogger("tpuscope")

PERIOD_ENV = "TPUSCOPE_PROFILE_PERIOD"
DEFAULT_PERIOD = 600.0  # seconds: a capture every 10 minutes of steps
# Steps annotated per capture. The session starts on the profiler's thread while the first runs, so the
# first may be missing from the trace; the first step in the trace holds the trace's start and is left out;
# the last only ends the window of the one before it (a step's window runs from its start to the next's).
CAPTURED_STEPS = 5
WARMUP_STEPS = 10  # a process's first steps compile: no capture, and their time does not count
COST_BUDGET = 0.005  # the most of its period's wall time a capture may cost before the period widens
STOP_TIMEOUT = 60.0  # the most close() waits for the last capture to be stopped and parsed
STEP_TIME_SMOOTHING = 0.1  # weight of the newest step in the mean step time that K follows
NEVER = 1 << 62  # K until it is chosen: no step number the profiler is given is a multiple of it, but 0

# Every profiler's "a user's trace is starting: give way", called by the wrapped jax.profiler.start_trace.
_GIVE_WAY: weakref.WeakSet[DeviceProfiler] = weakref.WeakSet()
# A forked child's profilers are its parent's (their sessions and threads did not survive): forget them.
os.register_at_fork(after_in_child=_GIVE_WAY.clear)


def parse_period(value: float | str | None) -> float | None:
    """Seconds between captures from a Monitor argument or the environment; None: profiles are off."""
    if value is None:
        value = os.environ.get(PERIOD_ENV, "") or DEFAULT_PERIOD
    if isinstance(value, str):
        if value.strip().lower() in ("off", "0", "false", "no", "none"):
            return None
        value = durations.parse(value)
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"a profile period must be a duration or 'off', not {value!r}")
    return float(value) or None


@dataclass
class _Capture:
    first: int  # the first annotated step
    last: int  # the last annotated step
    session: Any = None  # the profiler's session, from its start (on the worker) until stopped
    started_s: float = 0.0  # what starting it cost
    busy: str = ""  # why it did not start: a profiler of the user's
    yielded: bool = False  # stopped for a user's trace: nothing to measure


class DeviceProfiler:
    """Decides which steps to trace, traces them and hands the parsed profile to the next step's event.

    The Monitor's step reads two attributes: it calls :meth:`step_started` when the step number is a
    multiple of ``every`` (K) or ``watching`` is set, and :meth:`step_ended` when ``watching`` is set: while
    K is not chosen yet, while a capture runs and while a profile waits for the next step's event. Outside
    them a step costs the profiler nothing more. Neither method raises.
    """

    def __init__(self, period: float) -> None:
        self.period = period
        self.every = NEVER  # K, once the step time is known
        self.watching = True  # whether the next step's end concerns the profiler (see the class's docstring)
        self._seen = 0  # steps timed so far, until K is chosen
        self._step_time = 0.0  # seconds: the warm steps' mean, then measured between two captures' first steps
        self._last_request: tuple[int, float] | None = None  # the latest capture's first step and when it began
        self._jax: _Jax | None = None
        self._capture: _Capture | None = None
        self._ready: events.DeviceProfile | None = None
        self._handoff = threading.Lock()  # _ready and watching: set by the worker, taken by the training thread
        self._lock = threading.Lock()  # the capture's session: the training thread, the worker, a user's trace
        # ("start" | "stop", capture), or None to end the worker.
        self._work: queue.SimpleQueue[tuple[str, _Capture] | None] = queue.SimpleQueue()
        self._stopping = False  # a capture handed to the worker is not stopped and parsed yet
        self._worker: threading.Thread | None = None
        self._said: set[str] = set()
        self.captures: dict[str, int] = dict.fromkeys(events.PROFILE_RESULTS, 0)

    # --- the training thread ---------------------------------------------------------------
    def step_started(self, number: int) -> Any:
        """Start a capture at the steps that begin one; returns the step annotation to exit, or None."""
        try:
            capture = self._capture
            if capture is None:
                # Not while the last capture is still being stopped: JAX allows one session at a time.
                if self.every == NEVER or number % self.every or self._stopping:
                    return None
                capture = self._request(number)
            if capture.first <= number <= capture.last and not capture.yielded:
                annotation = self._jax_api().step_annotation(number)
                annotation.__enter__()
                return annotation
        except Exception as e:
            self._count("error", events.DeviceProfile(result="error"))
            self._say("error", f"a device-profile capture failed to start: {type(e).__name__}: {e}")
        return None

    def step_ended(self, number: int, seconds: float, annotation: Any) -> events.DeviceProfile | None:
        """End a traced step's annotation and a capture's last step; returns a finished capture's profile, once."""
        try:
            if annotation is not None:
                annotation.__exit__(None, None, None)
            if self.every == NEVER:
                self._warm_step(seconds)
            capture = self._capture
            if capture is not None and number >= capture.last:
                self._capture = None
                self._stopping = True
                self._work.put(("stop", capture))
        except Exception as e:
            self._say("error", f"a device-profile capture failed: {type(e).__name__}: {e}")
        return self.take()

    def take(self) -> events.DeviceProfile | None:
        """The latest finished capture's profile, once."""
        with self._handoff:
            ready, self._ready = self._ready, None
            self.watching = self._capture is not None or self.every == NEVER
        return ready

    def _warm_step(self, seconds: float) -> None:
        """K from the mean time of this process's warm steps: counted, not read from step numbers, since a
        resumed job's first step (which compiles) may be numbered 5000."""
        self._seen += 1
        if self._seen <= WARMUP_STEPS:
            return
        if not self._step_time:
            self._step_time = seconds
        self._step_time += STEP_TIME_SMOOTHING * (seconds - self._step_time)
        if self._seen >= 2 * WARMUP_STEPS:
            self.every = self._steps_per(self.period)

    def close(self) -> None:
        """Stop a capture still running and the worker; what was measured is kept for :meth:`take`."""
        capture, self._capture = self._capture, None
        if capture is not None:
            self._stopping = True
            self._work.put(("stop", capture))
        if self._worker is not None:
            self._work.put(None)
            self._worker.join(timeout=STOP_TIMEOUT)

    def _steps_per(self, seconds: float) -> int:
        """K for a period: a power of two (see the module's docstring), at least the steps a capture traces."""
        steps = max(seconds / max(self._step_time, 1e-6), CAPTURED_STEPS + 1)
        return 1 << max(0, round(math.log2(steps)))

    def _request(self, number: int) -> _Capture:
        """Begin a capture at step ``number``: the profiler's thread starts the session, so the training
        thread only annotates its steps (an annotation before the session started is not in the trace,
        which is why a capture annotates more steps than it measures)."""
        self._jax_api()  # here, once: the worker and this thread would race to make it
        now = time.perf_counter()
        if self._last_request is not None and number > self._last_request[0]:  # the step time as it is now
            self._step_time = (now - self._last_request[1]) / (number - self._last_request[0])
        self._last_request = (number, now)
        capture = _Capture(number, number + CAPTURED_STEPS - 1)
        self._capture = capture
        self.watching = True
        _GIVE_WAY.add(self)
        if self._worker is None:
            self._worker = threading.Thread(target=self._run, name="tpuscope-profiles", daemon=True)
            self._worker.start()
        self._work.put(("start", capture))
        return capture

    def give_way(self) -> None:
        """A user's start_trace is about to run: end our capture first (JAX allows one session)."""
        capture = self._capture
        with self._lock:  # held by the worker while it starts a session: it is then stopped here
            if capture is None:
                return
            session, capture.session, capture.yielded = capture.session, None, True
        if session is None:  # not started yet, and now it will not be
            return
        try:
            self._jax_api().stop(session)
        except Exception:
            log.debug("tpuscope: stopping a capture for a user's trace failed", exc_info=True)

    # --- the profiler's thread ----------------------------------------------------------------
    def _run(self) -> None:
        while (work := self._work.get()) is not None:
            action, capture = work
            try:
                if action == "start":
                    self._start(capture)
                else:
                    self._finish(capture)
            except Exception as e:
                if action == "stop":
                    self._count("error", events.DeviceProfile(result="error"))
                self._say("error", f"a device-profile capture failed: {type(e).__name__}: {e}")
            finally:
                if action == "stop":
                    self._stopping = False

    def _start(self, capture: _Capture) -> None:
        api = self._jax_api()
        began = time.perf_counter()
        with self._lock:
            if capture.yielded:  # a user's trace began before this one could
                return
            if busy := api.busy():
                capture.busy = busy
                return
            capture.session = api.start()
        capture.started_s = time.perf_counter() - began

    def _finish(self, capture: _Capture) -> None:
        began = time.perf_counter()
        with self._lock:
            session, capture.session = capture.session, None
        if session is None:  # a profiler of the user's was running, or a user's trace took its place
            self._count("busy", events.DeviceProfile(result="busy"))
            why = capture.busy or "it gave way to a user's trace"
            self._say(f"busy {why}", f"a device-profile capture was skipped: {why} (counted as busy)")
            return
        trace = self._jax_api().stop(session)
        from tpuscope.tracing.xspace import split_steps

        split = split_steps(trace)
        cost = capture.started_s + time.perf_counter() - began
        if split is None:
            self._count("error", events.DeviceProfile(result="error", capture_s=cost, trace_bytes=len(trace)))
            self._say("empty", "a device-profile capture held no device ops of the traced steps (counted as error)")
            return
        profile = events.DeviceProfile(
            result="ok",
            steps=split.steps,
            devices=split.devices,
            step_s=split.step_s,
            compute_s=split.compute_s,
            exposed_collective_s=split.exposed_collective_s,
            overlapped_collective_s=split.overlapped_collective_s,
            idle_s=split.idle_s,
            slowest_compute_s=split.slowest_compute_s,
            capture_s=cost,
            trace_bytes=len(trace),
        )
        self._count("ok", profile)
        # The period's wall time is K steps; a capture dearer than its budget of it doubles K.
        if cost > COST_BUDGET * self.every * max(self._step_time, 1e-6):
            self.every *= 2
            log.info("tpuscope: a device-profile capture cost %.3f s; capturing every %d steps", cost, self.every)

    def _count(self, result: str, profile: events.DeviceProfile) -> None:
        self.captures[result] += 1
        with self._handoff:
            self._ready = profile
            self.watching = True

    # --- JAX ------------------------------------------------------------------------------------
    def _jax_api(self) -> _Jax:
        if self._jax is None:
            self._jax = _Jax()
        return self._jax

    def _say(self, key: str, message: str) -> None:
        if key not in self._said:
            self._said.add(key)
            log.warning("tpuscope: %s", message)


class _Jax:
    """The parts of JAX's profiler a capture uses, some of them private: looked up once, each guarded.

    In memory: ``jax._src.lib._profiler.ProfilerSession``, whose ``stop()`` returns the serialized XSpace
    (JAX's own profile-guided latency estimation uses it). A JAX where it moved falls back to the public
    ``jax.profiler.start_trace`` into a temporary directory, read back.
    """

    def __init__(self) -> None:
        import jax
        import jax._src.profiler as jax_profiler

        self._profiler = jax_profiler
        self._annotation = jax.profiler.StepTraceAnnotation
        self._user_start_trace: Callable[..., Any] = getattr(
            jax_profiler.start_trace, "__wrapped__", jax_profiler.start_trace
        )
        try:
            from jax._src.lib import _profiler

            self._session = _profiler.ProfilerSession
            self._options = _profiler.ProfileOptions
        except (ImportError, AttributeError):
            self._session = None
        self._patch_start_trace()

    def step_annotation(self, number: int) -> Any:
        from tpuscope.tracing.xspace import STEP_ANNOTATION

        return self._annotation(STEP_ANNOTATION, step_num=number)

    def busy(self) -> str:
        """Why a capture cannot start now ("" when it can)."""
        if self._profiler._profile_state.profile_session is not None:
            return "a profiling session (jax.profiler.start_trace or trace) is active"
        if self._profiler._profiler_server is not None:
            return "a profiler server (jax.profiler.start_server) is running"
        return ""

    def start(self) -> Any:
        if self._session is None:
            import tempfile

            directory = tempfile.mkdtemp(prefix="tpuscope-profile-")
            self._user_start_trace(directory)
            return directory
        options = self._options()
        if hasattr(options, "python_tracer_level"):
            options.python_tracer_level = 0  # the devices' ops, not every Python call
        return self._session(options)

    def stop(self, session: Any) -> bytes:
        if isinstance(session, str):  # the public path: a directory
            import glob
            import shutil

            self._profiler.stop_trace()  # type: ignore[no-untyped-call]
            try:
                (path,) = glob.glob(os.path.join(session, "**", "*.xplane.pb"), recursive=True)
                with open(path, "rb") as f:
                    return f.read()
            finally:
                shutil.rmtree(session, ignore_errors=True)
        return bytes(session.stop())

    def _patch_start_trace(self) -> None:
        """Make ``jax.profiler.start_trace`` (and ``trace()``, which calls it) end a capture first."""
        original = self._user_start_trace
        if getattr(self._profiler.start_trace, "__wrapped__", None) is original:
            return  # wrapped already (another Monitor's)

        def start_trace(*args: Any, **kwargs: Any) -> Any:
            for profiler in list(_GIVE_WAY):
                profiler.give_way()
            return original(*args, **kwargs)

        start_trace.__wrapped__ = original  # type: ignore[attr-defined]
        start_trace.__doc__ = original.__doc__
        import jax

        self._profiler.start_trace = start_trace
        jax.profiler.start_trace = start_trace
