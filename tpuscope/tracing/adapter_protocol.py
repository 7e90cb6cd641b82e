"""What the adapters may call on a Monitor: the compile watcher (tracing/jax_compiles.py) and the Orbax wrapper
(tracing/orbax_checkpoints.py) type against these protocols, never against the Monitor itself.

The Monitor imports the adapters (lazily, once jax is imported or ``mon.orbax(...)`` is called); were they to
import it back, the room's imports would go in a circle. So each adapter names here the handful of the Monitor's
methods it calls, and mypy proves that the Monitor has them (tracing/monitor.py, at its end).
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Literal, Protocol

from tpuscope import events


class CompilePosition(Protocol):
    """The process's position as the compile watcher moves it: a backend compile under way, then over."""

    def compiling(self) -> None: ...

    def compiled(self) -> None: ...


class CompileReporter(Protocol):
    """What JAX's compile watcher reports to (tracing/jax_compiles.py)."""

    @property
    def _whereabouts(self) -> CompilePosition: ...

    def compile(self, stage: events.CompileStage, seconds: float, function: str = "") -> None: ...

    def compile_cache(self, hit: bool) -> None: ...

    def recompile(self, cause: str) -> None: ...

    def compile_failed(self, exc: BaseException) -> None: ...


class CheckpointReporter(Protocol):
    """What the Orbax wrapper reports to (tracing/orbax_checkpoints.py)."""

    @property
    def compile_seconds(self) -> float: ...

    def position_at(self, operation: Literal["save", "restore"]) -> AbstractContextManager[None]: ...

    def compiled_since(self, before: float, within: float) -> float: ...

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
    ) -> None: ...
