"""The report's charts read at a glance: a compile step flattens nothing, the clock reads as a clock, every
column is named. Drawn from a report built here, as the page draws it, and the page itself read back."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from tpuscope.report import render
from tpuscope.report.model import Mark, Report, Series, Totals
from tpuscope.thresholds import Thresholds

START = 1_795_000_000.0  # 2026-11-18 09:46:40 UTC


def report(minutes: float) -> Report:
    """A run of 150 ms steps with one 3.5 s compile step at the start, and the compiles a small Orbax job has."""
    times = [START + i for i in range(int(minutes * 60))]
    p50 = Series("p50", times, [3.5] + [0.15] * (len(times) - 1))  # 23 times: flat on a linear axis
    phases = [
        Series("io", times, [0.1] + [0.005] * (len(times) - 1)),
        Series("compute", times, [3.3] + [0.04] * (len(times) - 1)),
        Series("sync", times, [0.05] + [0.004] * (len(times) - 1)),
        Series("other", times, [0.05] + [0.001] * (len(times) - 1)),
    ]
    compiles = [Mark(START, "backend", 1.8, detail="train_step")] + [
        Mark(START + 5 + i, "backend", 0.01, detail="copy") for i in range(50)
    ]
    return Report(
        workload="glance",
        source="a test",
        start=START,
        end=START + minutes * 60,
        resolution=1.0,
        step_time=[p50],
        phases=phases,
        goodput=[],
        compiles=compiles,
        checkpoints=[Mark(START + 30, "save", 2.0, ok=False, detail="step 30")],
        incidents=[],
        incidents_note="",
        totals=Totals(step_count=len(times)),
        thresholds=Thresholds(),
    )


def drawn(draw: render.Draw, shown: Report) -> Axes:
    figure = Figure(figsize=(render.WIDTH, render.HEIGHT), dpi=render.DPI)
    ax = figure.add_subplot()
    draw(ax, shown)
    render._time_axis(ax, shown)
    figure.canvas.draw()  # tick labels exist only once drawn
    return ax


def test_a_compile_step_does_not_flatten_the_step_time() -> None:
    assert drawn(render._step_time, report(5)).get_yscale() == "log"


def test_phases_are_shares_of_the_step_so_a_compile_step_flattens_none() -> None:
    ax = drawn(render._phases, report(5))
    assert ax.get_ylim() == (0, 1)
    tops = [vertex[1] for area in ax.collections for path in area.get_paths() for vertex in path.vertices]
    assert max(tops) == pytest.approx(1.0)  # every interval stacks to 100%, the compile step's too
    assert "share" in ax.get_ylabel()


@pytest.mark.parametrize(("minutes", "clock"), [(5, r"\d\d:\d\d:\d\d"), (120, r"\d\d:\d\d")])
def test_the_time_axis_reads_as_a_clock(minutes: float, clock: str) -> None:
    ax = drawn(render._step_time, report(minutes))
    labels = [t.get_text() for t in ax.get_xticklabels() if t.get_text()]
    assert len(labels) >= 3 and all(re.fullmatch(clock, label) for label in labels), labels
    assert ax.get_xlabel() == "UTC, 2026-11-18"


def test_every_table_column_is_named_and_small_compiles_are_said_apart(tmp_path: Path) -> None:
    render.write(report(5), tmp_path)
    page = (tmp_path / "index.html").read_text()
    assert "<th></th>" not in page
    assert "<th>function</th>" in page and "<th>step</th>" in page
    assert "51 backend compiles (50 of them small programs under 100 ms each)" in page
