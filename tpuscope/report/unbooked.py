"""The wall time no sidecar booked, from what Prometheus holds (docs/goodput.md).

A preemption deletes the pod, sidecar and all: nobody books the workload's downtime from then until the next
pod's sidecar sees the job start again. Prometheus still has each worker's start times (the first start each
of its sidecars saw), the stretch each sidecar served, and whether the worker ended cleanly: the worker's run,
less what its sidecars covered, is time it was down that no counter holds.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Worker:
    """One worker of a workload, as its successive sidecars served it."""

    first_start: float = float("inf")  # the earliest start any of its sidecars saw (Unix time)
    covers: list[tuple[float, float]] = field(default_factory=list)  # each sidecar's stretch: [from, to]
    ended: float | None = None  # when it ended cleanly, if it did (its end time, served until its sidecar went)
    processes: float = 1.0  # the most it had connected at once: each is a second of wall time a second

    @property
    def last_served(self) -> float:
        return max(to for _, to in self.covers)

    def unbooked(self, grid: list[float], since: float, memory: float) -> list[float]:
        """Seconds of its run that no sidecar covered, from ``since`` up to each point of ``grid``,
        cumulative. A worker no sidecar has served for ``memory`` seconds is forgotten (the sidecar's
        workload expiry): its gap ends there."""
        if not self.covers or self.first_start == float("inf"):
            return [0.0] * len(grid)
        covers = _merged(self.covers)
        end = min(self.ended if self.ended is not None else float("inf"), covers[-1][1] + memory)
        begin = max(self.first_start, since)
        out: list[float] = []
        for t in grid:
            until = min(t, end)
            run = max(0.0, until - begin)
            covered = sum(max(0.0, min(b, until) - max(a, begin)) for a, b in covers)
            out.append(max((run - covered) * self.processes, out[-1] if out else 0.0))
        return out


def _merged(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[tuple[float, float]] = []
    for a, b in sorted(intervals):
        if merged and a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], b))
        else:
            merged.append((a, b))
    return merged
