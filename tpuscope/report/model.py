"""What a run report holds, whichever source it was read from.

Prometheus (:mod:`tpuscope.report.prometheus`) and a recording of the job's
events (:mod:`tpuscope.report.from_recording`) each fill one :class:`Report`; one
renderer (:mod:`tpuscope.report.render`) draws it. So the two reports of the
same run look alike and can be compared figure by figure.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tpuscope.thresholds import Thresholds

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
class Profile:
    """Where a step's device time went, from the device profiles the job sampled in the window: the mean over the
    steps of the captures that measured something (``captures``; from Prometheus, each worker's own), beside the
    host-timed phases of every step (:attr:`Totals.phase_seconds`), which cannot split one fused program."""

    captures: int  # that measured something (result ok); from Prometheus, each worker's counted apart
    busy: int = 0  # skipped: a profiler of the user's was running
    errors: int = 0  # failed: the capture or its parse
    step_seconds: float = 0.0  # a profiled step on the devices; the parts add up to it
    part_seconds: dict[str, float] = field(default_factory=dict)  # compute, exposed_collective, idle
    overlap: float | None = None  # the share of the collective ops' time that compute covered
    imbalance: float | None = None  # the busiest local device's compute over the devices' mean
    capture_seconds: float = 0.0  # what the captures cost one process (from Prometheus, the costliest worker)
    trace_bytes: float = 0.0  # serialized trace per capture that measured something
    latest: float | None = None  # when the latest capture that measured something arrived

    def share(self, part: str) -> float:
        return self.part_seconds.get(part, 0.0) / self.step_seconds if self.step_seconds else 0.0


@dataclass
class StalledCores:
    """Where one worker's TPU cores sat while the workload stalled (from Prometheus: its sidecars ask the TPU
    runtime only while it stalls): a program and HLO location, the longest any of the worker's cores stayed
    there, and whether that was elsewhere than most of its peers' (the likely one the others waited for)."""

    slice: str
    worker: str
    instance: str
    fingerprint: str
    hlo_location: str
    seconds: float
    elsewhere: bool


@dataclass
class StuckPosition:
    """Where one worker's job process was stuck (from Prometheus: its sidecar serves the position while the
    process stays there past its limit): the step, the phase and its top Python frames, when it was first and last
    served in the window, and whether that was elsewhere than most of the stuck workers' at some point (the likely
    one the others waited for). The whole stacks are in the sidecar's log: ``tpuscope hangs`` reads them."""

    slice: str
    worker: str
    instance: str
    step: str  # empty: before the first step
    phase: str
    frames: str
    first: float
    last: float
    elsewhere: bool


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
    thresholds: Thresholds  # what the run is judged by: the team's (`--config`), as its alerts and boards are
    profile: Profile | None = None  # None: no device profile in the window (the job did not sample any)
    stalled_cores: list[StalledCores] = field(default_factory=list)  # none: no stall the runtime was asked about
    stuck_positions: list[StuckPosition] = field(default_factory=list)  # none: no process stuck in the window


class ReportError(RuntimeError):
    """Why no report could be made, in words for the command line."""
