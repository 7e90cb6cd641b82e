"""Small statistics shared by the run summary, the benchmarks and the reports."""

from __future__ import annotations

import math
from collections.abc import Sequence


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank percentile: the smallest value with at least ``q`` of the values at or below it (the p99 of
    1..100 is 99, the p50 is 50, the p100 the largest); 0 for no values."""
    ordered = sorted(values)
    if not ordered:
        return 0.0
    # Rounded first: q * n in floating point may land a hair above a whole rank (0.07 * 100 = 7.000000000000001).
    rank = math.ceil(round(q * len(ordered), 9))
    return ordered[min(max(rank, 1), len(ordered)) - 1]
