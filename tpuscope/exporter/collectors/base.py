"""The one small interface every collector implements, and how a collection fails."""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from tpuscope.catalog import (
    COLLECTOR_ERRORS,
    DEADLINE,
    ERROR,
    INVALID_RESPONSE,
    NOT_SUPPORTED,
    PROCESS_GONE,
    UNAVAILABLE,
    UNKNOWN_METRICS,
    Label,
)
from tpuscope.exporter.samples import Sample
from tpuscope.thresholds import Thresholds

__all__ = [
    "DEADLINE",
    "ERROR",
    "INVALID_RESPONSE",
    "NOT_SUPPORTED",
    "PROCESS_GONE",
    "REASONS",
    "UNAVAILABLE",
    "UNKNOWN_METRICS",
    "Collector",
    "CollectorError",
    "Settings",
]

# Why a collection failed: the `reason` label of collector_errors_total, a closed set the catalogue holds (and says
# what each means); the collectors raise with these names.
REASONS = COLLECTOR_ERRORS.values(Label.REASON)


class CollectorError(Exception):
    """A failed collection: ``reason`` is one of REASONS; ``partial`` is what could still be read."""

    def __init__(self, reason: str, message: str, partial: Sequence[Sample] = ()) -> None:
        assert reason in REASONS, reason
        super().__init__(message)
        self.reason = reason
        self.partial = list(partial)


@dataclass(frozen=True)
class Settings:
    """What collectors may need from the sidecar's configuration."""

    libtpu_addresses: tuple[str, ...] = ("localhost:8431",)
    device_plugin_address: str = ""  # GKE's TPU device plugin; empty: its collector's default
    pids: tuple[int, ...] = ()
    pid_file: Path | None = None
    # The job processes connected to the event socket: pid -> workload (from the socket's peer credentials).
    job_pids: Callable[[], dict[int, str]] = field(default=dict)
    # Each workload with a process connected -> the Unix time of its last progress (the aggregator's), and how long
    # one may go without before the libtpu collector asks the runtime what its cores are doing.
    workload_progress: Callable[[], Mapping[str, float]] = field(default=dict)
    core_state_after: float = Thresholds.stall_seconds
    # The workloads whose processes on this host are stuck (exporter/hangs.py): asked about at once, so that the
    # cores' place joins the hang verdict.
    stuck_workloads: Callable[[], frozenset[str]] = field(default=frozenset)


class Collector(abc.ABC):
    """Reads one source. The runner calls :meth:`collect` every interval on its own thread."""

    name: ClassVar[str]
    default_interval: ClassVar[float] = 5.0

    @classmethod
    def unavailable_here(cls, settings: Settings) -> str | None:
        """Why this collector has nothing to read on this host (so ``auto`` leaves it off), or None."""
        return None

    @abc.abstractmethod
    def __init__(self, settings: Settings) -> None:
        """Connect to the source; raise CollectorError if it cannot be reached (the runner retries)."""

    @abc.abstractmethod
    def collect(self, timeout: float) -> list[Sample]:
        """Everything the source says now; raise CollectorError, within ``timeout`` seconds, if it cannot."""

    def close(self) -> None:  # noqa: B027 - most collectors hold nothing to release
        """Release the source's resources."""
