"""What a run report holds, whichever source it was read from.

Prometheus (:mod:`tpuscope.report.prometheus`) and a recording of the job's
events (:mod:`tpuscope.report.recording`) each fill one :class:`Report`; one
renderer (:mod:`tpuscope.report.render`) draws it. So the two reports of the
same run look alike and can be compared figure by figure.
"""

from __future__ import annotations

from dataclasses import dataclass, field

QUANTILES = (0.5, 0.95, 0.99)


@dataclass
class Series:
    """One line of a chart: ``values[i]`` at Unix time ``times[i]``."""

    name: str
    times: list[float] = field(default_factory=list)
    values: list[float] = field(default_factory=list)

    def add(self, time: float, value: float) -> None:
        self.times.append(time)
        self.values.append(value)


@dataclass
class Mark:
    """A compile or a checkpoint on a timeline: ``count`` of them (1 in a recording; Prometheus sees
    every one that ended in an interval together), ``seconds`` each on average."""

    time: float
    kind: str  # the compile's stage, or the checkpoint's operation
    seconds: float
    ok: bool = True
    count: int = 1
    detail: str = ""  # the compiled function, the checkpoint's step


@dataclass
class Incident:
    """An alert that fired in the window (from Prometheus), or what a recording shows went wrong."""

    name: str
    severity: str
    start: float
    end: float
    labels: dict[str, str] = field(default_factory=dict)


@dataclass
class Totals:
    """The window's figures, for the summary table."""

    step_count: float = 0.0
    step_quantiles: dict[float, float] = field(default_factory=dict)  # q -> seconds
    exact_quantiles: bool = False  # from every step (a recording), or estimated from the histogram's buckets
    phase_seconds: dict[str, float] = field(default_factory=dict)
    cache: dict[bool, float] = field(default_factory=dict)  # hit -> look-ups
    failures: dict[str, float] = field(default_factory=dict)  # reason -> count
    restarts: dict[str, float] = field(default_factory=dict)
    mfu: float | None = None


@dataclass
class Report:
    workload: str
    source: str  # where it was read from, in words
    start: float
    end: float
    resolution: float  # seconds a point of the charts stands for
    step_time: list[Series]  # p50 / p95 / p99, and each step where a recording has them
    phases: list[Series]  # mean seconds per step in each phase
    goodput: list[Series]  # wall seconds by category, cumulative from the window's start
    compiles: list[Mark]
    checkpoints: list[Mark]
    incidents: list[Incident]
    incidents_note: str  # what the incident list covers (alerts from Prometheus, or the recording's own)
    totals: Totals


class ReportError(RuntimeError):
    """Why no report could be made, in words for the command line."""
