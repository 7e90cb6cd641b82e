"""``tpuscope report``: a run's story for a post-mortem or a ticket, as a self-contained HTML page and PNGs.

Read from Prometheus (:mod:`.prometheus`) or from a recording of the job's events
with no Prometheus at all (:mod:`.recording`), into one :class:`~.model.Report`,
drawn by :mod:`.render`: step time, where it went by phase, wall time by goodput
category, the compile and checkpoint timelines, and the alerts in the window.
"""

from __future__ import annotations

import sys
from pathlib import Path

from tpuscope.report import prometheus, recording
from tpuscope.report.model import Report, ReportError
from tpuscope.report.window import Window

__all__ = ["Report", "ReportError", "Window", "build", "run"]


def build(prometheus_url: str | None, recording_path: Path | None, workload: str | None, window: Window) -> Report:
    """The report of ``workload`` in ``window``, from a recording if one is given, else from Prometheus."""
    if recording_path is not None:
        return recording.build(recording_path, workload, window)
    if not prometheus_url or not workload:
        raise ReportError("give --prometheus URL and --workload NAME, or --recording FILE")
    return prometheus.build(prometheus_url, workload, window)


def run(
    prometheus_url: str | None, recording_path: Path | None, workload: str | None, window: Window, out: Path | None
) -> int:
    try:
        report = build(prometheus_url, recording_path, workload, window)
    except ReportError as e:
        print(f"tpuscope report: {e}", file=sys.stderr)
        return 1
    try:
        from tpuscope.report import render
    except ImportError as e:
        print(f"tpuscope report: the charts need matplotlib: pip install 'tpuscope[report]' ({e})", file=sys.stderr)
        return 1

    for path in render.write(report, out or Path(f"tpuscope-report-{report.workload}")):
        print(f"wrote {path}")
    return 0
