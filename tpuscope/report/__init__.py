"""``tpuscope report``: a run's story for a post-mortem or a ticket, as a self-contained HTML page and PNGs.

Read from Prometheus (:mod:`.prometheus`) or from a recording of the job's events
with no Prometheus at all (:mod:`.recording`), into one :class:`~.model.Report`,
drawn by :mod:`.render`: step time, where it went by phase, wall time by goodput
category, the compile and checkpoint timelines, and the alerts in the window.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tpuscope.generator_config import GeneratorConfig
from tpuscope.report import from_recording, prometheus
from tpuscope.report.model import Report, ReportError
from tpuscope.report.window import Window
from tpuscope.thresholds import Thresholds

__all__ = ["Report", "ReportError", "Window", "add_arguments", "build", "main", "run"]


def build(
    prometheus_url: str | None,
    recording_path: Path | None,
    workload: str | None,
    window: Window,
    thresholds: Thresholds,
) -> Report:
    """The report of ``workload`` in ``window``, judged by ``thresholds``, from a recording if one is given, else
    from Prometheus."""
    if recording_path is not None:
        return from_recording.build(recording_path, workload, window, thresholds)
    if not prometheus_url or not workload:
        raise ReportError("give --prometheus URL and --workload NAME, or --recording FILE")
    return prometheus.build(prometheus_url, workload, window, thresholds)


def run(
    prometheus_url: str | None,
    recording_path: Path | None,
    workload: str | None,
    window: Window,
    out: Path | None,
    thresholds: Thresholds,
) -> int:
    try:
        report = build(prometheus_url, recording_path, workload, window, thresholds)
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


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Write a self-contained HTML page (and each chart as a PNG, and the data as JSON) of one workload over a "
        "window: step time, where it went by phase, wall time by goodput category, the compile and checkpoint "
        "timelines, and the alerts that fired. From Prometheus, or with no Prometheus at all from a recording of "
        "the job's events (tpuscope workload --record, or a Monitor with a RecordSink)."
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--prometheus", metavar="URL", help="read the workload's series and alerts from Prometheus")
    source.add_argument("--recording", type=Path, metavar="FILE", help="read a recording of the job's events")
    parser.add_argument("--workload", help="the workload (needed with --prometheus; a recording of one may omit it)")
    parser.add_argument(
        "--since",
        help="how far back the window reaches, e.g. 30m, 6h, 2d (default: from Prometheus 6h; the whole recording)",
    )
    parser.add_argument(
        "--until",
        help="when the window ends: RFC 3339 (2026-11-23T03:10:00Z) or Unix seconds (default: now, or the "
        "recording's end)",
    )
    parser.add_argument("--out", type=Path, help="directory to write into (default ./tpuscope-report-WORKLOAD)")
    parser.add_argument(
        "--config",
        type=Path,
        help="YAML: the thresholds the run is judged by (the goodput objective, the sync share, the stall time); "
        "the same file as for tpuscope alerts and dashboards",
    )


def main(args: argparse.Namespace) -> int:
    try:
        window = Window.parse(args.since, args.until)
        config = GeneratorConfig.load(args.config)
    except ValueError as e:
        print(f"tpuscope report: {e}", file=sys.stderr)
        return 2
    return run(args.prometheus, args.recording, args.workload, window, args.out, config.thresholds)
