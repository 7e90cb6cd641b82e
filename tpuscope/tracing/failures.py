"""Why the job failed, in one word of :data:`tpuscope.failures.FAILURE_VALUES`, read from the exception.

Two sources, the first that speaks wins:

1. Where the exception came from, marked on it as it passed (:func:`mark`): a backend compile (JAX's own
   error-handler hook, tracing/jax_compiles.py), a checkpoint restore (the Monitor's and the Orbax wrapper's),
   the input phase of a step (``with s.phase("io")``), a SIGTERM (:class:`Preempted`). An out-of-memory
   anywhere still reads as out_of_memory: a restore that ran out of memory is a memory problem first.
2. What the exception is: its type, and for XLA's runtime errors the status code their message starts with.

``failure_reason(exc)`` is the whole mapping, for a job's own ``except`` (``mon.close(failed=exc)`` uses it).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import sys
import threading
import urllib.request
from collections.abc import Mapping
from typing import Any

from tpuscope import failures

_MARK = "_tpuscope_failure"  # the attribute a mark is kept under, on the exception itself
_COUNTED = "_tpuscope_compile_counted"  # set once an exception is counted as a failed compile
# XLA's status codes, as its runtime errors' messages begin ("RESOURCE_EXHAUSTED: Out of memory ...").
_STATUS = re.compile(r"^\s*(?:[A-Za-z.]+Error: )?([A-Z_]{5,})\b")
# Runtime and driver initialisation, as JAX, libtpu and CUDA word it when a backend does not come up.
_INIT = re.compile(
    r"Unable to initialize backend|Unknown backend|No visible \w+ devices|Backend '\w+' failed to initialize|"
    r"TPU initialization failed|TPU is already in use|libtpu\.so .*in use|jaxlib version .*incompatible|"
    r"driver version is insufficient|CUDA driver version|CUDA_ERROR_NO_DEVICE|CUDA_ERROR_NOT_INITIALIZED|"
    r"no supported devices found|Backend '\w+' is not in the list",
    re.IGNORECASE,
)
# XLA's own runtime errors, by class name: a device's, never the input pipeline's, wherever they are raised.
_XLA_ERRORS = ("JaxRuntimeError", "XlaRuntimeError")
# JAX's tracing errors (a Python branch or conversion on a traced value): a compile that failed at tracing.
_TRACING_ERRORS = (
    "ConcretizationTypeError",
    "TracerBoolConversionError",
    "TracerIntegerConversionError",
    "TracerArrayConversionError",
    "UnexpectedTracerError",
    "NonConcreteBooleanIndexError",
)
# Input pipelines' own errors, by class name (tf.data, Grain, datasets): no import of any of them.
_DATA_ERRORS = ("DataLossError", "DatasetGenerationError", "DataError")
# Exit status of a process that ends on SIGTERM's account, as a shell reports one killed by it.
SIGTERM_EXIT = 128 + signal.SIGTERM


class Preempted(SystemExit):
    """Raised in the main thread at a SIGTERM (the Monitor's handler): the job unwinds, its ``finally`` blocks
    and context managers run, and it exits with status 143, as a process killed by SIGTERM reads to a shell."""

    def __init__(self, reason: str | None = None) -> None:
        super().__init__(SIGTERM_EXIT)
        self._reason = reason

    @property
    def reason(self) -> str:
        """preemption or maintenance: the VM's metadata server is asked when the reason is first read (as the
        Monitor closes), not in the signal handler, so the job's own unwinding goes first."""
        return self._reason or sigterm.reason() or "preemption"


def mark(exc: BaseException | None, reason: str, *, stage: str | None = None) -> None:
    """Say where ``exc`` came from, unless something nearer its origin said so already (the first mark stays)."""
    # Not a SIGTERM's or a Ctrl-C's: they end the job wherever they land (an io phase is not a data error).
    if not isinstance(exc, Exception) or getattr(exc, _MARK, None) is not None:
        return
    if reason == "data_error" and type(exc).__name__ in _XLA_ERRORS:  # a device failing the copy to it
        return
    with contextlib.suppress(AttributeError, TypeError):  # a type with __slots__ goes by its type alone
        setattr(exc, _MARK, (reason, stage))


def uncounted_compile_failure(exc: BaseException) -> tuple[str, str] | None:
    """The (stage, reason) of the failed compile ``exc`` is or wraps, the first time it is asked; None after, or
    for any other exception. A compile error passes through a step's exit and the Monitor's, and may be wrapped
    on its way: it is one failed compile."""
    chain = _chain(exc)
    if any(getattr(link, _COUNTED, False) for link in chain) or (stage := compile_stage(exc)) is None:
        return None
    for link in chain:
        with contextlib.suppress(AttributeError, TypeError):
            setattr(link, _COUNTED, True)
    return stage, compile_failure_reason(exc)


def compile_stage(exc: BaseException) -> str | None:
    """The compile stage ``exc`` failed at, if it is a compile failure."""
    for link in _chain(exc):
        found = getattr(link, _MARK, None)
        if found is not None and found[0] == "compile_error":
            return str(found[1] or "backend")
        name = type(link).__name__
        if name in _TRACING_ERRORS:
            return "tracing"
        if isinstance(link, NotImplementedError) and "MLIR translation rule" in str(link):
            return "lowering"
    return None


def failure_reason(exc: BaseException) -> str:
    """The reason ``exc`` ends the job for: a value of :data:`tpuscope.failures.FAILURE_VALUES`."""
    chain = _chain(exc)
    if any(_out_of_memory(link) for link in chain):
        return "out_of_memory"
    for link in chain:
        if isinstance(link, Preempted):
            return link.reason
        # Before the marks: a driver or ptxas that does not match surfaces at the first compile.
        if isinstance(link, RuntimeError) and _INIT.search(str(link)[:1000]):
            return "runtime_init"
    for link in chain:
        if (found := getattr(link, _MARK, None)) is not None:
            return str(found[0])
    if compile_stage(exc) is not None:
        return "compile_error"
    if any(type(link).__name__ in _DATA_ERRORS for link in chain):
        return "data_error"
    return failures.OTHER


def compile_failure_reason(exc: BaseException) -> str:
    """Why a compile failed: a value of :data:`tpuscope.failures.COMPILE_FAILURE_VALUES`."""
    exc = next((link for link in _chain(exc) if getattr(link, _MARK, (None,))[0] == "compile_error"), exc)
    status = _status(exc)
    if _out_of_memory(exc):
        return "out_of_memory"
    if isinstance(exc, NotImplementedError) or status in ("UNIMPLEMENTED", "NOT_FOUND"):
        return "unsupported"
    if type(exc).__name__ in _TRACING_ERRORS or status in ("INVALID_ARGUMENT", "FAILED_PRECONDITION"):
        return "invalid_program"
    if status == "INTERNAL":
        return "internal"
    return "other"


# An allocation refused, as XLA ("RESOURCE_EXHAUSTED: Out of memory allocating ..."), its TPU ("Ran out of memory
# in memory space hbm") and GPU allocators and CUDA ("CUDA_ERROR_OUT_OF_MEMORY: out of memory") word it. A bare
# RESOURCE_EXHAUSTED is not enough: gRPC says it of quotas and message sizes too.
_MEMORY = re.compile(r"\bOOM\b|memory exhausted|failed to allocate|allocat\w* .*bytes|\bHBM\b", re.IGNORECASE)


def _out_of_memory(exc: BaseException) -> bool:
    if isinstance(exc, MemoryError):
        return True
    message = str(exc)[:300]
    if "out of memory" in message.lower():
        return True
    return _status(exc) == "RESOURCE_EXHAUSTED" and bool(_MEMORY.search(message))


def _status(exc: BaseException) -> str | None:
    match = _STATUS.match(str(exc)[:100])
    return match[1] if match else None


def _chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and what caused it (``raise ... from``, or raised while handling), nearest first, once each."""
    chain: list[BaseException] = []
    link: BaseException | None = exc
    while link is not None and link not in chain and len(chain) < 16:
        chain.append(link)
        link = link.__cause__ or link.__context__
    return chain


# --- SIGTERM -----------------------------------------------------------------------------------------------
# Where the VM's metadata server is (Compute Engine and Cloud TPU VMs): GCE_METADATA_HOST as Google's own
# clients read it, which is also how a test points it at a server of its own.
METADATA_HOST_ENV = "GCE_METADATA_HOST"
_METADATA_HOST = "169.254.169.254"  # the server's address, not its name: no DNS look-up, which no timeout bounds
_MAINTENANCE_PATH = "/computeMetadata/v1/instance/maintenance-event"
_METADATA_TIMEOUT_S = 0.5  # out of the scheduler's grace period


def sigterm_reason(environ: Mapping[str, str] = os.environ) -> str:
    """preemption, or maintenance when the VM's metadata server says a host maintenance event is under way.

    Asked only where there is a metadata server: GCE_METADATA_HOST set, or a Google Compute Engine VM (its DMI
    product name says so); anywhere else the SIGTERM is the scheduler's."""
    host = environ.get(METADATA_HOST_ENV) or (_METADATA_HOST if _on_google_vm() else None)
    if not host:
        return "preemption"
    request = urllib.request.Request(f"http://{host}{_MAINTENANCE_PATH}", headers={"Metadata-Flavor": "Google"})
    try:
        with urllib.request.urlopen(request, timeout=_METADATA_TIMEOUT_S) as response:
            event = response.read(256).decode("ascii", "replace").strip()
    except Exception:  # no answer in time: the scheduler's SIGTERM is the likelier
        return "preemption"
    return "maintenance" if event and event != "NONE" else "preemption"


def _on_google_vm() -> bool:
    try:
        with open("/sys/class/dmi/id/product_name") as product:
            return "Google" in product.read(64)
    except OSError:
        return False


def native_handler_installed(signum: int) -> bool:
    """Whether native code (not Python) handles ``signum``: JAX's preemption notifier in a jax.distributed
    job installs one for SIGTERM, and a Python handler in its place would silence it."""
    if sys.platform != "linux" or signal.getsignal(signum) not in (signal.SIG_DFL, None):
        return False
    try:
        import ctypes

        class _Sigaction(ctypes.Structure):  # glibc's struct sigaction on Linux: the handler comes first
            _fields_ = [("handler", ctypes.c_void_p), ("rest", ctypes.c_byte * 256)]

        libc = ctypes.CDLL(None, use_errno=True)
        current = _Sigaction()
        if libc.sigaction(signum, None, ctypes.byref(current)) != 0:
            return False
        return current.handler not in (None, 0, 1)  # SIG_DFL is 0, SIG_IGN 1
    except Exception:  # no libc to ask: assume Python's view is the whole truth
        return False


# How long a job that had no SIGTERM handler of its own may take to unwind after one (its finally blocks, the
# Monitor's last events) before the signal is delivered again with its default action: a job that swallows
# Preempted (a bare except) or waits on a thread that never ends still ends, as SIGTERM used to end it.
UNWIND_SECONDS = 10.0


class SigtermWatch:
    """Turns the first SIGTERM into :class:`Preempted` in the main thread, or, when the job had a Python handler
    of its own, notes it and calls that handler. Installed once per process, by the first Monitor in the main
    thread. After that first SIGTERM the job's previous handling is back: a second one does what it always did."""

    def __init__(self) -> None:
        self.received = False
        self._reason: str | None = None
        self._previous: Any = None
        self._pid = 0  # the process that installed it: a forked child inherits the handler, not the job's role
        self.installed = False

    def install(self) -> None:
        if self.installed or not _in_main_thread():
            return
        self.installed = True
        previous = signal.getsignal(signal.SIGTERM)
        if previous is signal.SIG_IGN or native_handler_installed(signal.SIGTERM):
            return  # the job chose to ignore it, or JAX's notifier owns it (docs: mon.close(failed="preemption"))
        self._previous = previous if previous is not None else signal.SIG_DFL
        self._pid = os.getpid()
        signal.signal(signal.SIGTERM, self._on_sigterm)

    def reason(self) -> str | None:
        """preemption or maintenance once a SIGTERM came (asking the VM's metadata server once), else None."""
        if self.received and self._reason is None:
            self._reason = sigterm_reason()
        return self._reason

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        signal.signal(signal.SIGTERM, self._previous)  # from now on, as before the Monitor
        if os.getpid() != self._pid:  # a forked child (a data loader's worker): it ends as it would have
            if callable(self._previous):
                self._previous(signum, frame)
            else:
                os.kill(os.getpid(), signal.SIGTERM)
            return
        self.received = True
        if callable(self._previous):  # the job's own handler decides what happens next
            self._previous(signum, frame)
            return
        watchdog = threading.Timer(UNWIND_SECONDS, os.kill, (os.getpid(), signal.SIGTERM))
        watchdog.daemon = True
        watchdog.start()
        raise Preempted()


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


sigterm = SigtermWatch()
