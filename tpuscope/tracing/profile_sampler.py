"""Sampled device profiles: where a fused step's time goes on the devices, measured live.

A real job runs one fused jitted step, in which collectives overlap compute: no timer on the host can split it. Only
a device trace can. So every K steps the job traces a few steps in-process (the profiler JAX itself uses, held in
memory) and hands the trace to the sidecar, which parses it (:mod:`tpuscope.exporter.profiles`) and serves the split
itself; it answers the job too, whose next step's event carries it (``Step.profile``, marked ``served``) to the
job's own sinks.

- **Which steps.** K is a power of two near ``period / step time``, and a capture starts at a step divisible by K.
  Hosts of a synchronous job step in lockstep, so they choose the same K; where one chose twice another's (near a
  power-of-two boundary, or after widening its period), its captures are still a subset of the other's. The step
  that asks is not measured (the session starts during it), nor the lead-in after it (:data:`LEAD_IN_STEPS`).
- **What it costs the job.** On the training thread, a step annotation and a clock read per annotated step; on the
  profiler's threads, the trace's start, then its stop and write into the spool at the lowest CPU priority once it
  no longer records; never a parse. A capture costing more than :data:`COST_BUDGET` of its period doubles K.
- **Never under the GIL.** A session is always ended by its ``stop()``, which collects and serializes the trace
  without holding the GIL. Dropped unstopped, its C++ destructor would collect the whole trace holding the GIL,
  freezing every Python thread of the job for as long; so an expired or discarded capture is stopped too.
- **Nothing native at exit.** Each ``stop()`` runs on a thread that is *not* a daemon (``tpuscope-profile-stop``):
  a daemon thread inside ``stop()`` when the interpreter finalizes is killed as it takes the GIL back, through a
  C++ frame that may not unwind, and the finished job aborts (SIGABRT, a failed container that JobSet restarts).
  So :meth:`DeviceProfiler.close` returns at once, and a stop under way delays the job's exit by that stop. A
  killed job never finalizes, so it cannot abort there either.
- **Bounded.** JAX's profiler buffers every op it sees in host memory, so a capture ends after its annotated steps,
  or is discarded (counted ``error``) when the job goes :data:`DEADLINE_STEPS` mean step times without starting or
  ending a step (an eval, a checkpoint, the loop's end). ``ProfileOptions.duration_ms`` would not do: an
  in-process session ignores it.
- **The user's profiler comes first.** JAX allows one profiling session per process. While a profiler lives,
  JAX's own profiler lock is wrapped (:class:`_GivingWayLock`) so that whoever takes it first ends a capture under
  way, waiting only until the native profiler has let our session go: the runtime (tsl's ``ProfilerSession``)
  refuses a second session until the first is collected, and a session made before that is dead (its
  ``stop_trace`` raises ``ALREADY_EXISTS``). A capture does not start (counted ``busy``) while a session of the
  user's or a profiler server runs, nor while JAX's PGLE is on (``jax_enable_pgle``): its sessions start inside
  the user's jitted calls and raise there when another session runs. Steps are annotated only while a session of
  ours runs: none lands in a user's trace. One Monitor per process holds the profiler (:func:`claim`).
- **Only with a sidecar that parses.** The sidecar offers the service by making its spool
  (:func:`tpuscope.events.profile_spool`); without it no capture is taken, said once.
- **Never in the way.** Nothing here raises into the training loop; what fails is counted (``error``) and said once
  in the log, and a JAX without the parts used here means no captures, said once.

``period`` (seconds, or a duration such as ``"10m"``, or ``"off"``) comes from ``Hooks.profile_period``,
else ``$TPUSCOPE_PROFILE_PERIOD``, else :data:`DEFAULT_PERIOD`.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import itertools
import logging
import math
import os
import queue
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from tpuscope import durations, events

log = logging.getLogger("tpuscope")

PERIOD_ENV = "TPUSCOPE_PROFILE_PERIOD"
DEFAULT_PERIOD = 600.0  # seconds: a capture every 10 minutes of steps
# Steps begun inside a capture's session before its first annotated one, themselves not annotated: ops dispatched
# before the session began untraced, and a window they ran into would read their time as idle.
LEAD_IN_STEPS = 1
# Steps annotated per capture, after the lead-in. The sidecar measures every window [start of an annotated step,
# start of the next) the trace holds: 5 steps measured, and 4 should the trace hold one annotation fewer.
CAPTURED_STEPS = 6
WARMUP_STEPS = 10  # a process's first steps compile: no capture, and their time does not count
COST_BUDGET = 0.005  # the most of its period's wall time a capture may cost before the period widens
STEP_TIME_SMOOTHING = 0.1  # weight of the newest step in the mean step time that K follows
NEVER = 1 << 62  # K until it is chosen: no step number the profiler is given is a multiple of it, but 0
DEADLINE_STEPS = 4.0  # a capture lives this many mean step times past the job's latest step start or end...
# ...and at least this many seconds: a loaded host's slow step is no eval, and a traced second of a busy CPU
# backend's ops already holds hundreds of MiB of host memory.
DEADLINE_FLOOR = 0.5
ANSWER_TIMEOUT = 120.0  # the most the profiler's thread waits for the sidecar's answer
ANSWER_POLL = 0.05  # seconds between two looks for it
CLOSE_TIMEOUT = 0.2  # the most close() waits for the profiler's thread, which never waits on a native call
RECORDING_POLL = 0.0005  # seconds between two looks for a stop's end of the recording (see _Stop._lower)
RECORDING_ENDS_WITHIN = 0.5  # the most seconds those looks take: a stop begun ends the recording in about one
# A stop's nice value once the trace no longer records (see _Stop). $TPUSCOPE_PROFILE_NICE is for a machine shared
# with busier processes, where a stop at 19 may not end in time.
NICE_ENV = "TPUSCOPE_PROFILE_NICE"
DEFAULT_NICE = 19

# Every open profiler: whoever takes JAX's profiler lock first ends their capture (see _GivingWayLock).
_open: weakref.WeakSet[DeviceProfiler] = weakref.WeakSet()
# The process's one profiler and (a weak reference to) its owner: see claim().
_claim_lock = threading.Lock()
_claimed: tuple[Callable[[], object | None], DeviceProfiler] | None = None
_refused: weakref.WeakSet[Any] = weakref.WeakSet()  # the owners told that another holds it (told once)
_jax_state: Any = None  # JAX's _profile_state, once its lock is wrapped
_stopping: set[_Stop] = set()  # sessions being stopped: a user's call waits for each (see _GivingWayLock)
# Set by an exit handler, which the interpreter runs once it has waited for its threads: a thread started from then
# on is not waited for (see _Stop).
_exiting = False
_exit_watched = False  # whether that handler is registered (by the first profiler: see claim)


def _at_exit() -> None:
    global _exiting
    _exiting = True


def _forget_in_forked_child() -> None:
    """A forked child's profiler is its parent's (its session and thread did not survive): forgotten, and JAX's
    lock given back, or a new one if the parent's profiler thread held it at the fork (it would stay held)."""
    global _claimed
    _claimed = None
    _open.clear()
    _refused.clear()
    _stopping.clear()
    if _jax_state is not None and isinstance(lock := _jax_state.lock, _GivingWayLock):
        _jax_state.lock = threading.Lock() if lock.locked() else lock.lock


os.register_at_fork(after_in_child=_forget_in_forked_child)


def parse_period(value: float | str | None) -> float | None:
    """Seconds between captures from ``Hooks.profile_period`` or the environment; None: profiles are off."""
    if value is None:
        value = os.environ.get(PERIOD_ENV, "") or DEFAULT_PERIOD
    if isinstance(value, str):
        if value.strip().lower() in ("off", "0", "false", "no", "none"):
            return None
        value = durations.parse(value)
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"a profile period must be a duration or 'off', not {value!r}")
    return float(value) or None


def worker_nice() -> int:
    """A stop's nice value: ``$TPUSCOPE_PROFILE_NICE`` (0 to 19), else :data:`DEFAULT_NICE`; never raises."""
    value = os.environ.get(NICE_ENV, "").strip()
    if not value:
        return DEFAULT_NICE
    try:
        nice = int(value)
        if not 0 <= nice <= 19:
            raise ValueError
    except ValueError:
        log.warning(
            "tpuscope: $%s=%r is not a nice value from 0 to 19: a trace's stop runs at %d",
            NICE_ENV,
            value,
            DEFAULT_NICE,
        )
        return DEFAULT_NICE
    return nice


def claim(owner: object, period: float, socket_path: str | os.PathLike[str]) -> DeviceProfiler | None:
    """The process's device profiler, for ``owner`` (a Monitor) to drive until it calls :func:`release` (or is
    garbage); None while another owner holds it. A refusal is said once per claimant, which may ask again at each
    step (a dict look-up and a lock). ``socket_path``: the owner's sidecar, whose spool takes the traces."""
    global _claimed
    with _claim_lock:
        if _claimed is not None:
            holder_ref, held = _claimed
            holder = holder_ref()
            if holder is owner:
                return held
            if holder is not None:
                if _once(_refused, owner):
                    return None
                log.info(
                    "tpuscope: device profiles are %s's: a process has one profiler (JAX allows one profiling "
                    "session), so %s takes none",
                    _name(holder),
                    _name(owner),
                )
                return None
            held.close()  # its owner is gone without releasing it
        workload = getattr(owner, "workload", "")
        profiler = DeviceProfiler(period, socket_path, workload if isinstance(workload, str) else "")
        global _exit_watched
        if not _exit_watched:
            atexit.register(_at_exit)
            _exit_watched = True
        _claimed = (_reference(owner), profiler)
    log.info("tpuscope: device profiles in this process are %s's (every %g s of steps)", _name(owner), period)
    return profiler


def release(owner: object) -> None:
    """End ``owner``'s profiler (a capture under way is discarded, its thread ended); a later claim gets a new one."""
    global _claimed
    with _claim_lock:
        if _claimed is None or _claimed[0]() is not owner:
            return
        profiler = _claimed[1]
        _claimed = None
    profiler.close()


def _once(told: weakref.WeakSet[Any], owner: object) -> bool:
    """Whether ``owner`` was told already (and from now on it was)."""
    try:
        if owner in told:
            return True
        told.add(owner)
    except TypeError:  # no weak references: told each time
        pass
    return False


def _reference(owner: object) -> Callable[[], object | None]:
    try:
        return weakref.ref(owner)
    except TypeError:  # an owner without weak references: held until released
        return lambda: owner


def _name(owner: object) -> str:
    workload = getattr(owner, "workload", None)
    return f"workload {workload}" if isinstance(workload, str) else repr(owner)


@dataclass(eq=False)
class _Capture:
    """One capture, from the step that asks for it until its answer (or its end) is counted."""

    first: int  # the step that asked for it
    allowance: float  # seconds the job may go without a step before the capture is discarded
    deadline: float  # time.monotonic(): pushed forward by each step the job starts or ends
    busy: str = ""  # why it may not start, known on the training thread (PGLE is on)
    session: Any = None  # our profiler session, while it runs (set and cleared under DeviceProfiler._lock)
    stop: _Stop | None = None  # its stop, once begun (set under DeviceProfiler._lock)
    begun: int = 0  # steps begun inside the session, the lead-in's included
    annotated: int = 0  # steps annotated inside the session (and ended)
    done: threading.Event = field(default_factory=threading.Event)  # its steps are traced, or it must end now
    yielded: bool = False  # ended for a user's trace


class DeviceProfiler:
    """Decides which steps to trace, traces them, and hands the sidecar's split to the next step's event.

    The Monitor's step calls :meth:`step_started` when the step number is a multiple of ``every`` (K) or
    ``watching`` is set, and :meth:`step_ended` when ``watching`` is set: while K is not chosen yet, while a
    capture traces its steps and while a profile waits for the next step's event. Neither method raises.

    ``history``: what the profiler's thread did lately, ``(what, began, ended)`` in ``time.perf_counter``
    seconds, ``what`` one of ``session`` (ours ran), ``stop`` (stopping and serializing it), ``handoff``
    (writing it to the spool and waiting for the sidecar's answer): benchmarks classify steps by it.
    """

    def __init__(self, period: float, socket_path: str | os.PathLike[str] | None = None, workload: str = "") -> None:
        self.period = period
        self.workload = workload  # whose traces: the sidecar serves them for it (none: the job's steps carry them)
        self.socket_path = os.fspath(socket_path if socket_path is not None else events.default_socket_path())
        self.spool = events.profile_spool(self.socket_path)
        self.nice = worker_nice()  # read here, so that a bad value is said when the Monitor starts
        self.every = NEVER  # K, once the step time is known
        self.watching = True  # whether the next step's end concerns the profiler (see the class's docstring)
        self.captures: dict[str, int] = dict.fromkeys(events.PROFILE_RESULTS, 0)
        self.handed_over = 0  # traces written into the spool: the sidecar serves each, whether or not the job waits
        self.history: collections.deque[tuple[str, float, float]] = collections.deque(maxlen=64)
        self._seen = 0  # steps timed so far, until K is chosen
        self._step_time = 0.0  # wall seconds per step: the warm steps' mean, then measured between two captures
        self._step_seconds = 0.0  # a step's own duration, smoothed: a capture's deadline follows it
        self._last_request: tuple[int, float] | None = None  # the latest capture's first step and when it began
        self._jax: _Jax | None = None
        self._off = False  # captures are off for good in this process (this JAX lacks what they need)
        self._closed = False
        self._capture: _Capture | None = None
        self._ready: events.DeviceProfile | None = None
        self._handoff = threading.Lock()  # _ready and watching: set by the worker, taken by the training thread
        self._lock = threading.Lock()  # a capture's session: the worker and a user's trace
        self._requests: queue.SimpleQueue[_Capture | None] = queue.SimpleQueue()
        self._wake = threading.Event()  # set by close(): the worker stops waiting
        self._worker: threading.Thread | None = None
        self._said: set[str] = set()
        # Names this process's traces in the spool: the pid, and a token (two containers' jobs may both be pid 1).
        self._job = f"{os.getpid()}-{os.urandom(4).hex()}"  # os.urandom, not secrets: the import path stays light
        self._sequence = itertools.count()

    # --- the training thread ---------------------------------------------------------------
    def step_started(self, number: int) -> Any:
        """Ask for a capture at the steps that begin one, and annotate the steps its session traces; returns
        the step annotation to exit, or None."""
        try:
            capture = self._capture
            if capture is None:
                if not (self.every == NEVER or number % self.every or self._off or self._closed):
                    self._request(number)
                return None
            if capture.session is None or capture.done.is_set() or self._jax is None:
                return None
            capture.deadline = time.monotonic() + capture.allowance
            capture.begun += 1
            if capture.begun <= LEAD_IN_STEPS:
                return None
            annotation = self._jax.annotation(events.STEP_ANNOTATION, step_num=number)
            annotation.__enter__()
            return annotation
        except Exception as e:
            self._say("annotate", f"a device-profile capture failed to start: {type(e).__name__}: {e}")
        return None

    def step_ended(self, number: int, seconds: float, annotation: Any) -> events.DeviceProfile | None:
        """End a traced step's annotation; returns a finished capture's profile, once."""
        try:
            capture = self._capture
            if annotation is not None:
                annotation.__exit__(None, None, None)
                self._step_seconds += STEP_TIME_SMOOTHING * (seconds - self._step_seconds)
                if capture is not None:
                    capture.annotated += 1
                    if capture.annotated >= CAPTURED_STEPS:
                        capture.done.set()
            if capture is not None:
                capture.deadline = time.monotonic() + capture.allowance
            if self.every == NEVER:
                self._warm_step(seconds)
        except Exception as e:
            self._say("annotate", f"a device-profile capture failed: {type(e).__name__}: {e}")
        return self.take()

    def take(self) -> events.DeviceProfile | None:
        """The latest finished capture's profile, once."""
        with self._handoff:
            ready, self._ready = self._ready, None
            capture = self._capture
            self.watching = (capture is not None and not capture.done.is_set()) or (
                self.every == NEVER and not self._off
            )
        return ready

    def _warm_step(self, seconds: float) -> None:
        """K from the mean time of this process's warm steps: counted, not read from step numbers, since a
        resumed job's first step (which compiles) may be numbered 5000."""
        self._seen += 1
        if self._seen <= WARMUP_STEPS:
            return
        if not self._step_time:
            self._step_time = self._step_seconds = seconds
        self._step_time += STEP_TIME_SMOOTHING * (seconds - self._step_time)
        self._step_seconds = self._step_time
        if self._seen >= 2 * WARMUP_STEPS:
            self.every = self._steps_per(self.period)

    def _steps_per(self, seconds: float) -> int:
        """K for a period: a power of two, at least twice the steps a capture spans: a capture asked for while the
        last one still waits for its answer is skipped, and the period the job says would be half the one it keeps."""
        floor = 1 << math.ceil(math.log2(2 * (1 + LEAD_IN_STEPS + CAPTURED_STEPS)))
        return max(floor, 1 << max(0, round(math.log2(seconds / max(self._step_time, 1e-6)))))

    def _request(self, number: int) -> None:
        """Begin a capture at step ``number``: the profiler's thread starts the session."""
        jax = self._jax_api()  # here, once: the worker and this thread would race to make it
        if jax is None:
            return
        now = time.perf_counter()
        if self._last_request is not None and number > self._last_request[0]:  # the step time as it is now
            self._step_time = (now - self._last_request[1]) / (number - self._last_request[0])
        self._last_request = (number, now)
        allowance = max(DEADLINE_FLOOR, DEADLINE_STEPS * self._step_seconds)
        capture = _Capture(number, allowance, time.monotonic() + allowance)
        if jax.pgle():  # read here: a job may turn it on for its own thread only
            capture.busy = "JAX's PGLE is on (jax_enable_pgle): its sessions must find none of ours"
        self._capture = capture
        self.watching = True
        if self._worker is None:
            self._worker = threading.Thread(target=self._run, name="tpuscope-profiles", daemon=True)
            self._worker.start()
        self._requests.put(capture)

    # --- a user's trace, on whichever thread starts or stops it ------------------------------
    def give_way(self) -> None:
        """JAX's profiler lock is being taken by a user's call: a session of ours still tracing is stopped now and
        discarded (see the module's docstring). The worker holds ``_lock`` only to start a session or to hand it to
        its stop, never across a native call that takes long."""
        capture = self._capture
        if capture is None:
            return
        with self._lock:
            session, capture.session = capture.session, None
            if session is not None and self._jax is not None:
                capture.yielded = True
                # On a thread started here, of this thread's priority: not the lowest, the user waits for it.
                capture.stop = _Stop(self._jax, session, None, nice=None)
        capture.done.set()

    # --- the profiler's thread ----------------------------------------------------------------
    def _run(self) -> None:
        # At the job's priority: this thread only starts sessions and waits; each stop lowers its own (see _Stop).
        while (capture := self._requests.get()) is not None:
            try:
                self._capture_one(capture)
            except Exception as e:
                self._count("error", events.DeviceProfile(result="error"))
                self._say("error", f"a device-profile capture failed: {type(e).__name__}: {e}")
            finally:
                with self._handoff:
                    if self._capture is capture:
                        self._capture = None

    def _capture_one(self, capture: _Capture) -> None:
        """Start the session, wait for its steps or its deadline, have it stopped and handed over, count the answer."""
        jax = self._jax
        assert jax is not None
        if not self.spool.is_dir():
            self._say(
                "spool",
                f"no device-profile captures while the sidecar at {self.socket_path} parses none (no {self.spool}: "
                "none runs, or an older one)",
                logging.INFO,
            )
            return
        began = time.perf_counter()
        busy = capture.busy
        with self._lock:
            if capture.yielded or self._closed:  # a user's trace began before ours could
                busy = busy or "it gave way to a user's trace"
            elif not jax.lock.acquire(blocking=False):
                # A call of the user's holds JAX's lock (and may be waiting for this one): let it go first.
                busy = busy or "a jax.profiler call of the user's was under way"
            else:
                try:  # JAX's own lock: no user's session can start between the look and ours
                    busy = busy or jax.busy()
                    if not busy:
                        capture.session = jax.start()
                finally:
                    jax.lock.release()
        if busy:
            if not self._closed:
                self._skipped(busy)
            return
        started = time.perf_counter()
        expired = False
        while not capture.done.wait(max(0.0, capture.deadline - time.monotonic())):
            if time.monotonic() >= capture.deadline:
                expired = True
                break
        # Handed to its stop under the lock a user's trace takes first (give_way): the session is ours or theirs.
        stem = f"{self._job}-{next(self._sequence)}"
        with self._lock:
            session, capture.session = capture.session, None
            if session is not None:
                keep = None if expired or self._closed else _Handover(self, stem, started - began)
                capture.stop = _Stop(jax, session, keep, self.nice)
        stop = capture.stop
        if stop is None:  # the capture never began (it gave way before its session started)
            return
        stop.done.wait()  # a wait in Python: this thread is never inside the stop (see the module's docstring)
        self.history.append(("session", started, stop.began))
        self.history.append(("stop", stop.began, stop.ended))
        cost = started - began + stop.ended - stop.began
        if (self._closed or _exiting) and not capture.yielded:  # discarded, or answered to the sidecar: counted by none
            return
        if capture.yielded:
            self._skipped("it gave way to a user's trace")
        elif stop.failed:
            self._count("error", events.DeviceProfile(result="error", capture_s=cost, trace_bytes=stop.trace_bytes))
            self._say(stop.failed, f"a device-profile capture failed: {stop.failure}")
        elif expired:
            self._count("error", events.DeviceProfile(result="error", capture_s=cost))
            self._say(
                "expired",
                f"a device-profile capture was discarded: no step began or ended for {capture.allowance:.1f} s "
                "(the job left its step loop: an eval, a checkpoint, its end); counted as error",
                logging.INFO,
            )
        else:
            self._answered(stem, cost, stop.trace_bytes, stop.ended)

    def _answered(self, stem: str, cost: float, trace_bytes: int, written: float) -> None:
        """Wait for the sidecar's answer to a trace in the spool, and count it."""
        answer = self._wait_answer(stem)
        self.history.append(("handoff", written, time.perf_counter()))
        if answer is None:
            return
        profile = msgspec.structs.replace(answer, capture_s=cost, trace_bytes=trace_bytes)
        if profile.result == "ok":
            self._widen(cost)  # before it is counted: its event says the period the next capture follows
        self._count(profile.result, profile)
        if profile.result != "ok":
            self._say("empty", "the sidecar found no traced step or device op in a device-profile capture (error)")

    def _widen(self, cost: float) -> None:
        """The period's wall time is K steps; a capture dearer than its budget of it doubles K."""
        if cost > COST_BUDGET * self.every * max(self._step_time, 1e-6):
            self.every *= 2
            log.info("tpuscope: a device-profile capture cost %.3f s; capturing every %d steps", cost, self.every)

    def aimed_period(self) -> float:
        """The wall seconds the job now aims at between two captures: K steps at the step time measured between
        the latest two (K's widening included), or, until K is chosen, the configured period. Clamped to what
        an event may carry: a longer one would have the sidecar reject the whole step."""
        aimed = self.every * self._step_time if self.every != NEVER and self._step_time > 0 else self.period
        return min(aimed, events.MAX_SECONDS)

    def _wait_answer(self, stem: str) -> events.DeviceProfile | None:
        """The sidecar's answer to the trace ``stem`` in its spool; None when there is none (counted). Once the
        profiler is closed the trace is left there: the sidecar serves its answer without the job."""
        trace = self.spool / (stem + events.PROFILE_TRACE_SUFFIX)
        answer = self.spool / (stem + events.PROFILE_ANSWER_SUFFIX)
        deadline = time.monotonic() + ANSWER_TIMEOUT
        looks = 0
        while True:
            try:
                data = answer.read_bytes()
                break
            except FileNotFoundError:
                pass
            if self._closed:
                return None
            looks += 1
            gone = looks % 20 == 0 and not self.spool.is_dir()  # about once a second: the sidecar stopped
            if gone or time.monotonic() > deadline:
                for taken_back in (trace, trace.with_suffix(events.PROFILE_HEADER_SUFFIX)):
                    with contextlib.suppress(OSError):
                        taken_back.unlink()
                self._count("error", events.DeviceProfile(result="error"))
                why = "stopped" if gone else f"did not answer within {ANSWER_TIMEOUT:g} s"
                self._say("answer", f"the sidecar {why} for a device-profile capture (error)")
                return None
            self._wake.wait(ANSWER_POLL)
        with contextlib.suppress(OSError):
            answer.unlink()
        try:
            return msgspec.json.decode(data, type=events.DeviceProfile)
        except msgspec.DecodeError as e:
            self._count("error", events.DeviceProfile(result="error"))
            self._say("answer", f"the sidecar's answer for a device-profile capture is unreadable: {e} (error)")
            return None

    def _skipped(self, why: str) -> None:
        self._count("busy", events.DeviceProfile(result="busy"))
        self._say(f"busy {why}", f"a device-profile capture was skipped: {why} (counted as busy)", logging.INFO)

    def _count(self, result: str, profile: events.DeviceProfile) -> None:
        self.captures[result] += 1
        profile = msgspec.structs.replace(profile, period_s=self.aimed_period())
        with self._handoff:
            self._ready = profile
            self.watching = True

    def close(self) -> None:
        """Discard a capture under way and end the profiler's thread, at once: a stop under way runs on (see the
        module's docstring) and, once the process's last profiler is closed and its last stop done, JAX gets its
        own profiler lock back. What was measured is kept for :meth:`take`."""
        self._closed = True
        self._wake.set()
        if (capture := self._capture) is not None:
            with self._lock:  # here, not on the worker: JAX's lock is not given back while a stop may yet begin
                session, capture.session = capture.session, None
                if session is not None and self._jax is not None:
                    capture.stop = _Stop(self._jax, session, None, self.nice)
            capture.done.set()
        if self._worker is not None:
            self._requests.put(None)
            if capture is None or capture.stop is None or capture.stop.done.is_set():  # else it waits for the stop
                self._worker.join(timeout=CLOSE_TIMEOUT)
        _open.discard(self)
        _give_lock_back_if_idle()

    # --- JAX ------------------------------------------------------------------------------------
    def _jax_api(self) -> _Jax | None:
        if self._jax is None and not self._off:
            try:
                self._jax = _Jax()
            except Exception as e:  # a JAX without one of the parts used: no captures, the job as before
                self._off = True
                self.watching = False
                log.warning(
                    "tpuscope: device profiles are off: this JAX lacks what they use (%s: %s)", type(e).__name__, e
                )
                return None
            _open.add(self)
        return self._jax

    def _say(self, key: str, message: str, level: int = logging.WARNING) -> None:
        if key not in self._said:
            self._said.add(key)
            log.log(level, "tpuscope: %s", message)


def _give_lock_back_if_idle() -> None:
    """JAX's own profiler lock back, once no profiler is open and no session of ours is being stopped."""
    if not _open and not _stopping and _jax_state is not None and isinstance(_jax_state.lock, _GivingWayLock):
        _jax_state.lock = _jax_state.lock.lock


@dataclass(eq=False)
class _Handover:
    """What a stop does with a trace it keeps: the sidecar's spool gets it, as ``stem``, with its handover."""

    profiler: DeviceProfiler
    stem: str
    start_cost: float  # seconds the session took to start

    def write(self, trace: bytes, stop_cost: float) -> str:
        """Write the trace and its handover into the spool; "" or why not (a key of the profiler's messages)."""
        if len(trace) > events.PROFILE_MAX_BYTES:
            return "large"
        profiler, spool = self.profiler, self.profiler.spool
        if profiler.workload:  # the sidecar serves it for this workload (tpuscope.exporter.profiles)
            handover = events.ProfileHandover(
                profiler.workload, self.start_cost + stop_cost, len(trace), profiler.aimed_period()
            )
            _write_whole(spool / (self.stem + events.PROFILE_HEADER_SUFFIX), msgspec.json.encode(handover))
        _write_whole(spool / (self.stem + events.PROFILE_TRACE_SUFFIX), trace)
        profiler.handed_over += 1
        return ""


class _Stop:
    """A session's end: its ``stop()`` and a kept trace's write into the spool, on a thread the interpreter waits
    for (see the module's docstring). Once the interpreter has stopped waiting for threads (an exit handler's close,
    a daemon thread that woke then), the session is dropped where it is, holding the GIL: nothing of the job runs
    any more, and no thread of ours is left inside a native call that gives the GIL up."""

    def __init__(self, jax: _Jax, session: Any, keep: _Handover | None, nice: int | None) -> None:
        self.stopped = threading.Event()  # the native profiler has let the session go
        self.done = threading.Event()  # and the trace is in the spool, or thrown away
        self.began = self.ended = time.perf_counter()  # the stop's
        self.trace_bytes = 0
        self.failed = ""  # why not kept (a key of the profiler's messages), said as failure
        self.failure = ""
        self._work: tuple[_Jax, Any, _Handover | None] | None = (jax, session, keep)
        if not _exiting:
            _stopping.add(self)
            with contextlib.suppress(RuntimeError):  # "can't create new thread at interpreter shutdown"
                thread = threading.Thread(target=self._run, name="tpuscope-profile-stop", daemon=False)
                thread.start()
                if nice is not None:
                    self._lower(thread, jax, nice)
                return
            _stopping.discard(self)
        self._work = None
        del session  # unstopped, at exit
        self.failed, self.failure = "exit", "the interpreter was exiting"
        self.stopped.set()
        self.done.set()

    def _lower(self, thread: threading.Thread, jax: _Jax, nice: int) -> None:
        """Lower the stop's priority once the trace no longer records (the steps beside a stop run slower at 0:
        docs/performance.md). Begun at the lowest on busy cores, the stop would wait for a share of them while the
        session records on; and an unprivileged thread may lower a priority but never raise it again: hence this
        thread's few looks."""
        deadline = time.monotonic() + RECORDING_ENDS_WITHIN
        while jax.recording() and not self.stopped.is_set() and time.monotonic() < deadline:
            time.sleep(RECORDING_POLL)
        with contextlib.suppress(AttributeError, OSError, TypeError):  # not Linux; the thread already gone
            os.setpriority(os.PRIO_PROCESS, thread.native_id, nice)  # type: ignore[arg-type]

    def _run(self) -> None:
        assert self._work is not None
        (jax, session, keep), self._work = self._work, None
        trace = None
        try:
            self.began = time.perf_counter()
            trace = jax.stop(session)
        except Exception as e:
            self.failed, self.failure = "stop", f"{type(e).__name__}: {e}"
        finally:
            del session  # stopped: its destructor has nothing left to collect
            self.ended = time.perf_counter()
            _stopping.discard(self)
            self.stopped.set()
            _give_lock_back_if_idle()
        try:
            if trace is not None and keep is not None:
                self.trace_bytes = len(trace)
                if why := keep.write(trace, self.ended - self.began):
                    self.failed, self.failure = why, f"a trace of {len(trace)} bytes is too large to hand over"
        except OSError as e:  # the sidecar went away (its spool with it), a full disk
            self.failed, self.failure = "write", f"it could not be handed to the sidecar: {e}"
        finally:
            self.done.set()


def _write_whole(path: Path, data: bytes) -> None:
    """Write ``data`` beside ``path`` and rename it there: a reader finds the whole file or none. Readable by
    the sidecar, which may run as another user of the socket's group."""
    partial = path.with_name(path.name + events.PROFILE_PARTIAL_SUFFIX)
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), 0o644)
            f.write(data)
        os.rename(partial, path)
    except BaseException:
        with contextlib.suppress(OSError):
            partial.unlink()
        raise


class _GivingWayLock:
    """JAX's profiler lock, as whoever starts or stops a trace takes it: first, every capture of ours ends.

    ``start_trace``, ``stop_trace`` and ``trace()`` read ``_profile_state.lock`` at each call, so this works
    however the user imported them (``from jax.profiler import start_trace`` at the top of a module
    included). The user's call then finds no session of ours and runs as without tpuscope."""

    def __init__(self, lock: Any) -> None:
        self.lock = lock

    @staticmethod
    def _give_way() -> None:
        for profiler in list(_open):
            try:
                profiler.give_way()
            except Exception:  # JAX's lock is held by now: nothing may leave it so
                log.debug("tpuscope: a capture failed to give way", exc_info=True)
        for stop in list(_stopping):  # until the native profiler is free: a session made before would be dead
            stop.stopped.wait()

    # JAX's lock first, then ours give way: no capture can start in between (the profiler's thread only tries
    # JAX's lock, never waits for it while it holds its own, so the two orders cannot deadlock).
    def __enter__(self) -> Any:
        entered = self.lock.__enter__()
        self._give_way()
        return entered

    def __exit__(self, *exc: object) -> Any:
        return self.lock.__exit__(*exc)

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        acquired = bool(self.lock.acquire(blocking, timeout))
        if acquired:
            self._give_way()
        return acquired

    def release(self) -> None:
        self.lock.release()

    def locked(self) -> bool:
        return bool(self.lock.locked())


class _Jax:
    """The parts of JAX's profiler a capture uses, most of them private: looked up once, each required (a
    JAX without one: no captures), and JAX's profiler lock wrapped (see :class:`_GivingWayLock`).

    The session is ``jax._src.lib._profiler.ProfilerSession``, held in memory: its ``stop()`` returns the
    serialized XSpace, as JAX's own PGLE uses it."""

    def __init__(self) -> None:
        import jax
        from jax._src import profiler as jax_profiler
        from jax._src.lib import _profiler

        self._module = jax_profiler
        self._state: Any = jax_profiler._profile_state
        for name in ("profile_session", "lock"):
            getattr(self._state, name)
        jax_profiler._profiler_server  # noqa: B018 - it must exist: a server's session would collide with ours
        self._session = _profiler.ProfilerSession
        self.recording = _profiler.TraceMe.is_enabled  # whether the native profiler records (a session runs)
        self._options = _profiler.ProfileOptions
        self.annotation = jax.profiler.StepTraceAnnotation
        self._config = jax.config
        self._cpu = jax.default_backend() == "cpu"
        global _jax_state
        wrapped: Any = self._state.lock
        if not isinstance(wrapped, _GivingWayLock):
            wrapped = _GivingWayLock(wrapped)
            self._state.lock = wrapped
            _jax_state = self._state
        self.lock = wrapped.lock  # JAX's own, which the profiler's thread takes as start_trace does

    def busy(self) -> str:
        """Why a capture cannot start now ("" when it can); called holding :attr:`lock`."""
        if self._state.profile_session is not None:
            return "a profiling session of the user's (jax.profiler.start_trace or trace) is active"
        if getattr(self._module, "_profiler_server", None) is not None:
            return "a profiler server (jax.profiler.start_server) is running"
        return ""

    def pgle(self) -> bool:
        """Whether JAX's PGLE may start a session of its own, in any jitted call (as JAX decides it)."""
        return bool(getattr(self._config, "jax_enable_pgle", False)) and (
            getattr(self._config, "jax_pgle_profiling_runs", 1) > 0
        )

    def start(self) -> Any:
        options = self._options()
        if hasattr(options, "python_tracer_level"):
            options.python_tracer_level = 0  # the devices' ops, not every Python call
        if self._cpu and hasattr(options, "enable_hlo_proto"):
            # Nor the programs' HLO, which the parse does not read: on the CPU backend a large share of the bytes
            # and of the stop's cost. (Left on elsewhere, where its share is unknown.)
            options.enable_hlo_proto = False
        return self._session(options)

    @staticmethod
    def stop(session: Any) -> bytes:
        return bytes(session.stop())
