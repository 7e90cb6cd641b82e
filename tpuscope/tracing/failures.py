"""Why the job failed, in one word of :data:`tpuscope.reasons.FAILURE_VALUES`, read from the exception.

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
import re

from tpuscope import reasons
from tpuscope.tracing.preemption import Preempted

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
    """The reason ``exc`` ends the job for: a value of :data:`tpuscope.reasons.FAILURE_VALUES`."""
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
    return reasons.OTHER


def compile_failure_reason(exc: BaseException) -> str:
    """Why a compile failed: a value of :data:`tpuscope.reasons.COMPILE_FAILURE_VALUES`."""
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
