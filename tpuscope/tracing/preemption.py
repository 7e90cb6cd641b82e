"""The job's SIGTERM, heard through tpuscope only where the job asks: a handler that notes it, and a watchdog.

The job's signals are the job's: by default the Monitor installs nothing, a SIGTERM ends the job as it would
without tpuscope, and the sidecar books the preemption from what it sees itself. A job that opts in
(``Hooks(sigterm=True)``) gets :class:`SigtermWatch`, whose handler only sets a flag; the job then leaves at its
next step, where :class:`Preempted` is raised at a step boundary. Nothing is ever raised from the handler into
whatever the main thread was doing: inside ``Thread.join()`` that marks a running thread stopped, and an Orbax
save's ``finally: wait_until_finished()`` then waits for nothing. With a grace (``Hooks(sigterm_grace=...)``), a
watchdog armed from the signal wakeup fd ends a job that never reaches its next step, once the Monitors' last
word is sent.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from tpuscope import durations
from tpuscope.tracing import hooks

log = logging.getLogger("tpuscope")

# Exit status of a process that ends on SIGTERM's account, as a shell reports one killed by it.
SIGTERM_EXIT = 128 + signal.SIGTERM


class Preempted(SystemExit):
    """Raised at the job's next step after a SIGTERM, where the job opted in (``Hooks(sigterm=True)``, see
    :class:`SigtermWatch`): the job unwinds from a step boundary, its ``finally`` blocks and context managers
    run, and it exits with status 143, as a process killed by SIGTERM reads to a shell."""

    def __init__(self, reason: str | None = None) -> None:
        super().__init__(SIGTERM_EXIT)
        self._reason = reason

    @property
    def reason(self) -> str:
        """preemption or maintenance: the VM's metadata server is asked when the reason is first read (as the
        Monitor closes), not in the signal handler, so the job's own unwinding goes first."""
        return self._reason or sigterm.reason() or "preemption"


def sigterm_reason(environ: Mapping[str, str] = os.environ) -> str:
    """preemption, or maintenance when the VM's metadata server says a host maintenance event is under way
    (tpuscope/gce_metadata.py asks it, where there is one); preemption where none answers."""
    from tpuscope import gce_metadata  # and urllib with it: only once a SIGTERM came

    return gce_metadata.termination_reason(environ) or gce_metadata.PREEMPTION


def native_handler_installed(signum: int) -> bool:
    """Whether native code (not Python) handles ``signum``: JAX's preemption notifier in a jax.distributed
    job installs one for SIGTERM, and a Python handler in its place would silence it."""
    if signal.getsignal(signum) not in (signal.SIG_DFL, None):
        return False
    return _sigaction_handler(signum) not in (None, 0, 1)  # SIG_DFL is 0, SIG_IGN 1


def _sigaction_handler(signum: int) -> int | None:
    """The address of the C function that handles ``signum`` now, as the kernel has it; None where it cannot be
    asked (not Linux, no libc)."""
    if sys.platform != "linux":
        return None
    try:
        import ctypes

        class _Sigaction(ctypes.Structure):  # glibc's struct sigaction on Linux: the handler comes first
            _fields_ = [("handler", ctypes.c_void_p), ("rest", ctypes.c_byte * 256)]

        libc = ctypes.CDLL(None, use_errno=True)
        current = _Sigaction()
        if libc.sigaction(signum, None, ctypes.byref(current)) != 0:
            return None
        return int(current.handler or 0)
    except Exception:  # no libc to ask: assume Python's view is the whole truth
        return None


# The shortest watchdog grace taken: a platform gives a job its grace period in tens of seconds.
MIN_SIGTERM_GRACE = 5.0


def watchdog_grace(value: float | str | None) -> float | None:
    """``sigterm_grace`` from the Monitor's hooks or ``$TPUSCOPE_SIGTERM_GRACE``: seconds, or None (no watchdog).
    A bad value is said at once and means no watchdog: the Monitor never raises."""
    if value is None:
        value = os.environ.get(hooks.SIGTERM_GRACE.env, "").strip() or None
    if value is None:
        return None
    try:
        seconds = durations.parse(value) if isinstance(value, str) else float(value)
        if not seconds >= MIN_SIGTERM_GRACE:
            # "1" read as a switch would be a watchdog that kills the job's last save a second after the SIGTERM.
            raise ValueError(f"a duration of at least {MIN_SIGTERM_GRACE:g} s (the pod's grace period, less a margin)")
    except (TypeError, ValueError) as e:
        log.warning("tpuscope: no SIGTERM watchdog: sigterm_grace %r: %s", value, e)
        return None
    return seconds


# How long the watchdog's last word (the Monitor's preemption event, :attr:`SigtermWatch.before_kill`) may take
# before the process ends anyway: a hook stuck on a lock the frozen main thread holds must not keep it alive.
BEFORE_KILL_SECONDS = 2.0


class SigtermWatch:
    """The opt-in SIGTERM handler (``Hooks(sigterm=True)``): one per process, installed by the first Monitor
    that asks for it, in the main thread.

    The handler only notes the signal: :attr:`received` turns true, and the job leaves at its next step, where
    the Monitor calls :meth:`raise_once`; a loop that wants to save first reads the flag (``mon.preempted``).
    A Python handler the job installed first is called as well, and then the job's own plan decides: no
    Preempted. SIG_IGN, or a native handler (JAX's preemption notifier in a ``jax.distributed`` job), is left
    alone: nothing is installed. After the first SIGTERM the job's previous handling is back, so a second one
    does what it always did. A forked child starts with the job's own disposition (:func:`os.register_at_fork`):
    a data loader's worker ends at ``terminate()`` as it would without tpuscope.

    Nothing ends a job that never reaches its next step (a hung collective) unless ``grace_seconds`` is given:
    then a watchdog ends the process with SIGTERM's default action that long after the first SIGTERM, once
    :attr:`before_kill` (the Monitor's preemption event) has run, for at most :data:`BEFORE_KILL_SECONDS`. The
    watchdog is armed by a thread that reads the signal wakeup fd, which CPython's C-level handler writes at
    once, where the Python handler waits for the main thread to get back to bytecode: a SIGTERM that lands in a
    long device call arms it at once. (A native call that holds the GIL throughout still delays it.) On
    Kubernetes, make the grace the pod's terminationGracePeriodSeconds minus a margin of a few seconds: no
    shorter, or it cuts the job's own time to unwind (its last save); not the whole period, or the kubelet's
    SIGKILL comes first and no last event is sent.
    """

    def __init__(self) -> None:
        self._handler = self._on_sigterm  # one bound method, recognised in signal.getsignal by equality
        self._trampoline: int | None = None  # the C-level handler that came with it (CPython's, one a process)
        self._fork_hook = False  # registered with os.register_at_fork (once a process: it cannot be undone)
        self._reset()

    def _reset(self) -> None:
        self.received = False  # a SIGTERM came: read at every step, so a plain attribute
        self.installed = False
        self.before_kill: Callable[[], None] | None = None
        self._leaves_at_step = False  # no handler of the job's own: Preempted at its next step
        self._raised = False
        self._reason: str | None = None
        self._previous: Any = signal.SIG_DFL
        self._pid = 0  # the process that installed it
        self._watchdog: _Watchdog | None = None

    def install(self, grace_seconds: float | None = None) -> None:
        """Install the handler, and with ``grace_seconds`` the watchdog (installed already: the watchdog only).
        Nothing off the main thread, nor where SIGTERM is ignored or native code handles it."""
        if not _in_main_thread():
            return
        if not self.installed:
            previous = signal.getsignal(signal.SIGTERM)
            # Ours still, as Python sees it, once uninstall found native code in its place: that code owns it.
            if previous is signal.SIG_IGN or previous == self._handler or native_handler_installed(signal.SIGTERM):
                return  # the job chose to ignore it, or JAX's notifier owns it (docs: mon.close(failed="preemption"))
            self._previous = previous if previous is not None else signal.SIG_DFL
            self._leaves_at_step = not callable(self._previous)
            self._pid = os.getpid()
            signal.signal(signal.SIGTERM, self._handler)
            self._trampoline = _sigaction_handler(signal.SIGTERM)
            self.installed = True
            if not self._fork_hook:
                os.register_at_fork(after_in_child=self._forget_in_child)
                self._fork_hook = True
        if grace_seconds is not None and self._watchdog is None:
            try:
                self._watchdog = _Watchdog(grace_seconds, self._expire, self._learn_reason)
            except Exception as e:  # no fd or thread to spare: no watchdog, and never the job's error
                log.warning("tpuscope: no SIGTERM watchdog: %s: %s", type(e).__name__, e)

    def uninstall(self) -> None:
        """SIGTERM as it was before :meth:`install`, where the handler is still the one installed (native code
        may have taken it since: JAX's notifier, at ``jax.distributed.initialize``). A watchdog that a SIGTERM
        armed stays armed: it is what ends a job that does not end after its Monitor closed."""
        if not self.installed or not _in_main_thread():
            return
        if self._handles_sigterm():
            signal.signal(signal.SIGTERM, self._previous)
        if self._watchdog is not None:
            self._watchdog.stop()
            self._watchdog = None
        self.installed = False

    def raise_once(self) -> None:
        """Raise :class:`Preempted` the first time it is called after a SIGTERM that the job had no handler of
        its own for (the Monitor calls it as a step begins); None after, so that a job that catches it to save a
        last checkpoint is not interrupted again."""
        if self.received and self._leaves_at_step and not self._raised:
            self._raised = True
            raise Preempted()

    def reason(self) -> str | None:
        """preemption or maintenance once a SIGTERM came (asking the VM's metadata server once), else None."""
        if self.received and self._reason is None:
            self._learn_reason()
        return self._reason

    def _learn_reason(self) -> None:
        """Ask the metadata server now (the watchdog asks as it arms, on a thread of its own, so that its last
        word, seconds later, need not wait for the answer)."""
        if self._reason is None:
            self._reason = sigterm_reason()

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        signal.signal(signal.SIGTERM, self._previous)  # from now on, as before the Monitor
        if os.getpid() != self._pid:  # a child forked past os.register_at_fork (by native code): as it would end
            if callable(self._previous):
                self._previous(signum, frame)
            else:
                os.kill(os.getpid(), signal.SIGTERM)
            return
        self.received = True
        if self._watchdog is not None:
            self._watchdog.arm()  # armed already, unless the job took the wakeup fd after the Monitor
        if callable(self._previous):  # the job's own handler decides what happens next
            self._previous(signum, frame)

    def _handles_sigterm(self) -> bool:
        """Whether SIGTERM still comes here: Python's handler ours, and the kernel's still Python's (native code,
        JAX's notifier at ``jax.distributed.initialize``, may have taken it since without Python knowing)."""
        ours = signal.getsignal(signal.SIGTERM) == self._handler
        return ours and _sigaction_handler(signal.SIGTERM) == self._trampoline

    def _expire(self) -> None:
        """The grace is over (on the watchdog's thread): the last word first, then SIGTERM's default action."""
        if (hook := self.before_kill) is not None:
            last = threading.Thread(target=_quietly, args=(hook,), name="tpuscope-before-kill", daemon=True)
            last.start()
            last.join(BEFORE_KILL_SECONDS)
        _end_as_sigterm()

    def _forget_in_child(self) -> None:
        """A forked child starts as the job's process was before :meth:`install`: the job's disposition and wakeup
        fd, no flag, no watchdog (its thread did not survive the fork)."""
        if self.installed and self._handles_sigterm():
            with contextlib.suppress(ValueError, OSError):
                signal.signal(signal.SIGTERM, self._previous)
        if self._watchdog is not None:
            self._watchdog.forget_in_child()
        self._reset()


class _Watchdog:
    """Calls ``expire`` ``grace`` seconds after the first SIGTERM: armed by a daemon thread that reads the
    signal wakeup fd (CPython's C-level handler writes each signal's number to it as the signal lands), or by
    the Python handler, whichever comes first. A wakeup fd set before (asyncio's self-pipe, which learns its
    signals from it) is chained: every byte read is written on to it. Made in the main thread."""

    def __init__(self, grace: float, expire: Callable[[], None], armed: Callable[[], None]) -> None:
        self.grace = grace
        self._expire = expire
        self._armed = armed  # called on a thread of its own as the watchdog arms
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None
        self._read_fd = self._write_fd = self._previous_fd = -1
        self._previous_file: tuple[int, int] | None = None
        read, write = os.pipe()  # neither inherited by an exec
        os.set_blocking(write, False)  # as set_wakeup_fd demands: a full pipe loses a byte, never blocks a handler
        try:
            self._previous_fd = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
        except ValueError as e:
            os.close(read)
            os.close(write)
            log.warning("tpuscope: the SIGTERM watchdog is armed only when Python runs the handler: %s", e)
            return
        self._read_fd, self._write_fd = read, write
        self._previous_file = _file_of(self._previous_fd)
        threading.Thread(target=self._read, name="tpuscope-sigterm", daemon=True).start()

    def arm(self) -> None:
        with self._lock:
            if self._timer is None:
                self._timer = threading.Timer(self.grace, self._expire)
                self._timer.name = "tpuscope-sigterm-watchdog"
                self._timer.daemon = True
                self._timer.start()
                threading.Thread(
                    target=_quietly, args=(self._armed,), name="tpuscope-sigterm-reason", daemon=True
                ).start()

    def stop(self) -> None:
        """The wakeup fd back as it was (main thread), and the reading thread ended; a timer armed runs on."""
        if self._write_fd >= 0 and self._give_back_wakeup_fd():
            with contextlib.suppress(OSError):
                os.close(self._write_fd)  # the reading thread reads the end of the pipe and leaves
            self._write_fd = -1

    def forget_in_child(self) -> None:
        """In a forked child: the wakeup fd back as it was, and the pipe closed (no thread reads it here)."""
        if self._write_fd >= 0:
            self._give_back_wakeup_fd()
        for fd in (self._read_fd, self._write_fd):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)

    def _give_back_wakeup_fd(self) -> bool:
        """The wakeup fd that was set before ours, unless another was set since (asyncio's add_signal_handler):
        that one stays. False off the main thread, where it cannot be set: the C handler may still write ours."""
        try:
            current = signal.set_wakeup_fd(-1)
        except ValueError:
            return False
        with contextlib.suppress(ValueError, OSError):
            if current != self._write_fd:
                signal.set_wakeup_fd(current)
            elif self._previous_is_there():
                signal.set_wakeup_fd(self._previous_fd)
        return True

    def _read(self) -> None:
        try:
            while data := os.read(self._read_fd, 512):
                if self._previous_is_there():
                    with contextlib.suppress(OSError):
                        os.write(self._previous_fd, data)
                if signal.SIGTERM in data:
                    self.arm()
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                os.close(self._read_fd)

    def _previous_is_there(self) -> bool:
        """Whether the wakeup fd set before ours is still the same file: a number closed since, then reused by
        another file, gets no bytes."""
        return self._previous_fd >= 0 and _file_of(self._previous_fd) == self._previous_file


def _file_of(fd: int) -> tuple[int, int] | None:
    try:
        status = os.fstat(fd)
    except OSError:
        return None
    return status.st_dev, status.st_ino


def _quietly(hook: Callable[[], None]) -> None:
    try:
        hook()
    except Exception:
        log.exception("tpuscope: the last word before the SIGTERM watchdog ends the process failed")


def _end_as_sigterm() -> None:
    """End the process with SIGTERM's default action, from a thread where signal.signal may not be called: the
    disposition reset through libc, then the signal sent again; a 143 exit where there is no libc to ask."""
    with contextlib.suppress(Exception):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.signal.restype = ctypes.c_void_p
        libc.signal.argtypes = (ctypes.c_int, ctypes.c_void_p)
        libc.signal(signal.SIGTERM, None)  # SIG_DFL
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(1.0)  # delivered before the call returned, as a signal a thread sends its own process
    os._exit(SIGTERM_EXIT)


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


sigterm = SigtermWatch()
