"""The wall time no sidecar booked, as ``tpuscope report`` recovers it from Prometheus (report/unbooked.py)."""

from __future__ import annotations

import pytest

from tpuscope.report.unbooked import Worker

GRID = [float(t) for t in range(0, 101, 10)]


def test_the_stretch_between_two_sidecars_is_unbooked() -> None:
    """Started at 5, served by a sidecar until 30 (its pod went), by the next one from 52 (the job's start
    there), ended cleanly at 80: 22 s nobody booked, counted where they fell."""
    worker = Worker(first_start=5, covers=[(5, 30), (52, 80)], ended=80)
    assert worker.unbooked(GRID, since=0, memory=3600) == pytest.approx([0, 0, 0, 0, 10, 20, 22, 22, 22, 22, 22])


def test_a_worker_that_ended_cleanly_books_nothing_after_its_end() -> None:
    """Its pod and sidecar went after the clean end: an end is not a gap."""
    assert Worker(first_start=0, covers=[(0, 50)], ended=50).unbooked(GRID, since=0, memory=3600)[-1] == 0


def test_one_that_never_comes_back_is_down_until_it_is_forgotten() -> None:
    """Gone at 30, never back: down until ``memory`` after its last sidecar, each of its 2 processes."""
    worker = Worker(first_start=0, covers=[(0, 30)], processes=2)
    assert worker.unbooked(GRID, since=0, memory=40)[-1] == pytest.approx(2 * 40)


def test_only_the_window_counts() -> None:
    worker = Worker(first_start=0, covers=[(0, 30), (70, 100)])
    assert worker.unbooked(GRID, since=60, memory=3600)[-1] == pytest.approx(10)
