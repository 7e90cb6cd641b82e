"""Time on a timeline as intervals: the algebra a device profile's split is made of.

An interval is ``(start, end)``, its end excluded. Every function but :func:`union` takes intervals already sorted
and disjoint (what :func:`union` returns), so that each is one merge pass or a bisection: a busy device's ops are
hundreds of thousands of intervals, cut into a window per step.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from typing import TypeVar

# Integers in a parse (picoseconds: a trace's clock is epoch nanoseconds, past a float's exact integers).
N = TypeVar("N", int, float)


def union(intervals: Iterable[tuple[N, N]]) -> list[tuple[N, N]]:
    """The union of any intervals, as sorted disjoint intervals (touching ones merged, empty ones dropped)."""
    merged: list[tuple[N, N]] = []
    for start, end in sorted(intervals):
        if end <= start:
            continue
        if merged and start <= merged[-1][1]:
            if end > merged[-1][1]:
                merged[-1] = (merged[-1][0], end)
        else:
            merged.append((start, end))
    return merged


def total(intervals: Iterable[tuple[N, N]]) -> N:
    """The summed length of disjoint intervals."""
    return sum(end - start for start, end in intervals)


def clip(intervals: Sequence[tuple[N, N]], low: N, high: N) -> list[tuple[N, N]]:
    """The parts of sorted disjoint intervals inside [low, high): a bisection, so each window costs only its own."""
    if high <= low:
        return []
    first = bisect.bisect_right(intervals, low, key=lambda interval: interval[1])
    inside = list(intervals[first : bisect.bisect_left(intervals, high, key=lambda interval: interval[0])])
    if inside:  # only the first and the last can straddle an edge
        inside[0] = (max(inside[0][0], low), inside[0][1])
        inside[-1] = (inside[-1][0], min(inside[-1][1], high))
    return inside


def subtract(intervals: Sequence[tuple[N, N]], cover: Sequence[tuple[N, N]]) -> list[tuple[N, N]]:
    """The parts of sorted disjoint ``intervals`` that sorted disjoint ``cover`` leaves uncovered: one merge pass."""
    left: list[tuple[N, N]] = []
    j = 0
    for start, end in intervals:
        while j < len(cover) and cover[j][1] <= start:
            j += 1
        k, at = j, start
        while k < len(cover) and cover[k][0] < end:
            if cover[k][0] > at:
                left.append((at, cover[k][0]))
            at = max(at, cover[k][1])
            k += 1
        if at < end:
            left.append((at, end))
    return left


def overlap(intervals: Sequence[tuple[N, N]], cover: Sequence[tuple[N, N]]) -> N:
    """How much of sorted disjoint ``intervals`` sorted disjoint ``cover`` covers: the length they share."""
    return total(intervals) - total(subtract(intervals, cover))
