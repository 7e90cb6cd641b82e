"""How well the job used its devices: one arithmetic for the sidecar's gauges, the report and the workload's summary.

Two figures, each a ratio of sums over steps, never a mean of per-step or per-capture ratios (those weigh a short
step like a long one, and a step without collectives, which has no overlap, would drop out of one mean and not the
other):

- A device profile's summary over its measured steps: each part's mean and spread, the collective **overlap**
  (overlapped over overlapped plus exposed collective time) and the device **imbalance** (the busiest local
  device's compute over the devices' mean). A ratio with nothing to divide is None: no series, rather than a 0
  that reads "nothing hidden".
- **MFU**: the steps' model FLOPs over their seconds and the devices' peak FLOP/s, at most 1 (a CPU's peak is an
  estimate, and one read low under load must not show more than 100 %). The sidecar's gauge tallies its last
  :data:`~tpuscope.catalog.MFU_STEPS` steps; a report tallies every step of its window.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from tpuscope import events
from tpuscope.catalog import PROFILE_PARTS


def overlap(overlapped_s: float, exposed_s: float) -> float | None:
    collective = overlapped_s + exposed_s
    return overlapped_s / collective if collective > 0 else None


def imbalance(slowest_compute_s: float, compute_s: float) -> float | None:
    return slowest_compute_s / compute_s if compute_s > 0 else None


def measured_steps(p: events.DeviceProfile) -> tuple[events.ProfiledStep, ...]:
    """The capture's steps one by one; from a parser too old to send them, ``steps`` steps each equal to its
    means (they weigh as many steps in the mean, and add no spread)."""
    if p.per_step:
        return p.per_step
    mean = events.ProfiledStep(
        p.step_s, p.compute_s, p.exposed_collective_s, p.overlapped_collective_s, p.idle_s, p.slowest_compute_s
    )
    return (mean,) * max(p.steps, 1)


@dataclass(frozen=True)
class ProfileSummary:
    """The measured steps of some captures: their mean, each part's spread, and the two ratios."""

    steps: int
    step_s: float
    parts: dict[str, float]  # catalog.PROFILE_PARTS -> the mean seconds per step
    stddev: dict[str, float]  # catalog.PROFILE_PARTS -> the population standard deviation, in seconds
    overlap: float | None
    imbalance: float | None

    @classmethod
    def of(cls, steps: Iterable[events.ProfiledStep]) -> ProfileSummary:
        steps = list(steps)
        # each part is the step's field of its name: compute -> compute_s
        by_part = {part: [getattr(step, f"{part}_s") for step in steps] for part in PROFILE_PARTS}
        return cls(
            steps=len(steps),
            step_s=statistics.fmean(step.step_s for step in steps),
            parts={part: statistics.fmean(values) for part, values in by_part.items()},
            stddev={part: statistics.pstdev(values) for part, values in by_part.items()},
            overlap=overlap(
                math.fsum(step.overlapped_collective_s for step in steps), math.fsum(by_part["exposed_collective"])
            ),
            imbalance=imbalance(math.fsum(step.slowest_compute_s for step in steps), math.fsum(by_part["compute"])),
        )


class Mfu:
    """The model FLOPs and seconds of the steps that reported FLOPs: the last ``steps`` of them, or all."""

    def __init__(self, steps: int | None = None) -> None:
        # Two flat deques, summed where they lie: the sidecar adds a step and reads the ratio at every step event.
        self._flops: deque[float] = deque(maxlen=steps)
        self._seconds: deque[float] = deque(maxlen=steps)

    def add(self, flops: float, seconds: float) -> None:
        if flops > 0 and seconds > 0 and math.isfinite(flops / seconds):  # one absurd step must not hold the window
            self._flops.append(flops)
            self._seconds.append(seconds)

    def of(self, peak_flops_per_second: float) -> float | None:
        """None before a step with FLOPs, without a peak, or with a peak that makes no number."""
        flops, seconds = math.fsum(self._flops), math.fsum(self._seconds)
        if not (flops and seconds and peak_flops_per_second):
            return None
        achieved = flops / seconds / peak_flops_per_second
        return min(achieved, 1.0) if math.isfinite(achieved) else None
