"""What a workload's reported training values say: the last of each, how many were non-finite and from which step
on, and how far the loss is above its recent baseline.

The job reports a step's loss, gradient norm and its own value before the reduction (``local``) once the device
has computed them (tpuscope.tracing.training_values). Per workload, this keeps:

- each value's latest reading, NaN and infinities as they are;
- a count of its non-finite readings, and the step of the latest onset (a non-finite reading after a finite one,
  or the first reading): the rules compare the onsets of ``local`` across workers to name the first to go, whose
  peers were still finite at that step (silent data corruption shows there first, before the all-reduce spreads it);
- the loss's deviation from its baseline, the median and MAD of the latest finite losses that were not spikes
  (catalog.LOSS_BASELINE_STEPS of them): robust to the noisy batch, and blind to the spike itself (nothing joins it
  until the loss has been back under the bound for CALM_STEPS steps), so a loss that stays up keeps reading as a
  spike until it comes down, which is what TpuscopeLossSpike asks.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass, field

from tpuscope import catalog

# A normal distribution's standard deviation is 1.4826 times its MAD: the deviation reads in standard deviations.
MAD_TO_STDDEV = 1.4826
# The least spread a baseline is given, relative to its median: a loss that has not moved in 100 steps (a constant
# batch) must not read every rounding error as a spike.
RELATIVE_FLOOR = 1e-3
# A spike is over once the loss has been back under the bound this many steps in a row; until then nothing joins
# the baseline. A spike is noisy: without this, its readings that dip under the bound would join the baseline one
# by one and raise it until the spike read as the new normal.
CALM_STEPS = 10


class LossBaseline:
    """The latest finite losses that were not spikes, and the deviation of a new one from them."""

    def __init__(self, size: int = catalog.LOSS_BASELINE_STEPS) -> None:
        self._losses: deque[float] = deque(maxlen=size)
        self._calm = CALM_STEPS  # readings under the bound since the last spike

    def deviation(self, loss: float) -> float | None:
        """How far ``loss`` (finite) is above the baseline, in robust standard deviations; None until the baseline
        holds enough losses. A loss that is no spike joins the baseline, once the last spike is over."""
        losses = self._losses
        if len(losses) < catalog.LOSS_BASELINE_MIN_STEPS:
            losses.append(loss)
            return None
        median = statistics.median(losses)
        mad = statistics.median([abs(value - median) for value in losses])
        spread = max(MAD_TO_STDDEV * mad, RELATIVE_FLOOR * abs(median), 1e-12)
        deviation = (loss - median) / spread
        if not math.isfinite(deviation):  # losses near the float's limits: no reading, nothing learnt
            return None
        if deviation > catalog.LOSS_SPIKE_DEVIATION:
            self._calm = 0
        else:
            self._calm += 1
            if self._calm > CALM_STEPS:
                losses.append(loss)
        return deviation


@dataclass
class TrainingHealth:
    """One workload's training values, as the sidecar keeps them between its events."""

    baseline: LossBaseline = field(default_factory=LossBaseline)
    finite: dict[str, bool] = field(default_factory=dict)  # value -> whether its latest reading was finite

    def onset(self, value: str, finite: bool) -> bool:
        """Whether a reading of ``value``, ``finite`` or not, is an onset: non-finite, after a finite reading or as
        the first."""
        was = self.finite.get(value, True)
        self.finite[value] = finite
        return was and not finite
