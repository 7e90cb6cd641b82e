"""The interval algebra a device profile's split is made of (tpuscope.exporter.profiles.intervals): examples, and
properties against a brute-force count of the unit cells that integer intervals cover."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from tpuscope.exporter.profiles.intervals import clip, overlap, subtract, total, union

raw_intervals = st.lists(st.tuples(st.integers(0, 40), st.integers(0, 40)), max_size=12)


def cells(intervals: list[tuple[float, float]]) -> set[int]:
    """The unit cells [i, i+1) that integer intervals cover: the brute-force reading."""
    return {i for start, end in intervals for i in range(int(start), int(end))}


def is_sorted_disjoint(intervals: list[tuple[float, float]]) -> bool:
    return all(s < e for s, e in intervals) and all(a[1] < b[0] for a, b in itertools.pairwise(intervals))


def test_union_merges_overlapping_and_touching_and_drops_empty() -> None:
    assert union([(5, 7), (1, 3), (2, 4), (4, 4.5), (9, 9), (8, 6)]) == [(1, 4.5), (5, 7)]
    assert union([]) == []


def test_clip_cuts_intervals_at_the_window_edges() -> None:
    merged = [(0.0, 2.0), (3.0, 5.0), (6.0, 8.0), (9.0, 10.0)]
    assert clip(merged, 1.0, 7.0) == [(1.0, 2.0), (3.0, 5.0), (6.0, 7.0)]
    assert clip(merged, 2.0, 3.0) == []  # touching a window is not being in it
    assert clip(merged, 5.0, 6.0) == []
    assert clip(merged, 3.5, 4.0) == [(3.5, 4.0)]  # one op covering the whole window
    assert clip(merged, 4.0, 4.0) == []  # an empty window
    assert clip([], 0.0, 1.0) == []


def test_subtract_leaves_what_the_cover_does_not_reach() -> None:
    assert subtract([(0.0, 10.0)], [(1.0, 2.0), (4.0, 5.0), (9.0, 12.0)]) == [(0.0, 1.0), (2.0, 4.0), (5.0, 9.0)]
    assert subtract([(0.0, 1.0), (2.0, 3.0)], [(0.5, 2.5)]) == [(0.0, 0.5), (2.5, 3.0)]
    assert subtract([(0.0, 1.0)], []) == [(0.0, 1.0)]
    assert subtract([(1.0, 2.0)], [(0.0, 3.0)]) == []


def test_total_and_overlap_measure_lengths() -> None:
    assert total([(0, 2), (5, 6)]) == 3
    assert total([]) == 0
    # Collective time [0, 10) under compute [2, 4) and [8, 12): 4 of it hidden.
    assert overlap([(0, 10)], [(2, 4), (8, 12)]) == 4
    assert overlap([(0, 10)], []) == 0
    assert overlap([(1, 2)], [(0, 3)]) == 1


@given(raw_intervals)
def test_union_covers_the_same_cells(raw: list[tuple[float, float]]) -> None:
    merged = union(raw)
    assert is_sorted_disjoint(merged)
    assert cells(merged) == cells(raw)
    assert total(merged) == len(cells(raw))


@given(raw_intervals, st.integers(0, 40), st.integers(0, 40))
def test_clip_keeps_the_cells_inside_the_window(raw: list[tuple[float, float]], low: int, high: int) -> None:
    clipped = clip(union(raw), low, high)
    assert is_sorted_disjoint(clipped)
    assert cells(clipped) == {i for i in cells(raw) if low <= i < high}


@given(raw_intervals, raw_intervals)
def test_subtract_keeps_the_cells_not_covered(raw: list[tuple[float, float]], cover: list[tuple[float, float]]) -> None:
    left = subtract(union(raw), union(cover))
    assert is_sorted_disjoint(left)
    assert cells(left) == cells(raw) - cells(cover)


@given(raw_intervals, raw_intervals)
def test_overlap_counts_the_cells_both_cover(raw: list[tuple[float, float]], cover: list[tuple[float, float]]) -> None:
    assert overlap(union(raw), union(cover)) == len(cells(raw) & cells(cover))
