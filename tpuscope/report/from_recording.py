"""A report from a recording of the job's own events (``tpuscope workload --record``, or a Monitor with a
:class:`~tpuscope.tracing.RecordSink`): no Prometheus, no sidecar.

A recording holds every step, so the step-time chart shows each one and the
quantiles are exact, and every device profile the job sampled (each rides on a
step). Goodput is booked by the sidecar's own ledger
(:class:`~tpuscope.goodput.WorkloadGoodput`), fed the whole recording so that work
pending before the window is still booked right inside it. Alert state lives in
Prometheus, not in a recording: the incidents listed are what the events
themselves say went wrong.
"""

from __future__ import annotations

import os
from collections import defaultdict
from dataclasses import dataclass, field

from tpuscope import events
from tpuscope.durations import human as duration
from tpuscope.goodput import CATEGORIES, WorkloadGoodput, rolled_back
from tpuscope.report.model import QUANTILES, Incident, Mark, Profile, Report, ReportError, Series, Totals
from tpuscope.report.window import Window
from tpuscope.stats import percentile
from tpuscope.thresholds import Thresholds
from tpuscope.utilization import Mfu, ProfileSummary, measured_steps

# What resets the stall clock: a step, a checkpoint save or restore ending, a compile stage ending (the
# sidecar's tpuscope_last_progress_timestamp_seconds).
PROGRESS = (events.Step, events.Checkpoint, events.Compile)


@dataclass
class _Bin:
    """The steps that ended in one interval of the charts."""

    durations: list[float] = field(default_factory=list)
    phases: dict[str, float] = field(default_factory=lambda: dict.fromkeys(events.PHASES, 0.0))


def build(path: str | os.PathLike[str], workload: str | None, window: Window, thresholds: Thresholds) -> Report:
    unreadable: list[str] = []
    try:
        records = events.read_records(path, unreadable)
    except OSError as e:
        raise ReportError(f"cannot read the recording {path}: {e.strerror or e}") from None
    workload = _one_workload(records, workload, path)
    mine = sorted(((t, e) for t, e in records if e.workload == workload), key=lambda record: record[0])
    start, end, resolution = window.resolve(first=mine[0][0], last=mine[-1][0])
    if not any(start <= t <= end for t, _ in mine):
        raise ReportError(
            f"the recording has no event of {workload} between {window.describe(start, end)}; "
            f"it covers {window.describe(mine[0][0], mine[-1][0])}"
        )

    ledger = WorkloadGoodput()
    booked = dict.fromkeys(CATEGORIES, 0.0)
    goodput = [Series(category) for category in CATEGORIES]
    bins: dict[int, _Bin] = defaultdict(_Bin)
    each_step = Series("each step")
    totals = Totals(exact_quantiles=True, phase_seconds=dict.fromkeys(events.PHASES, 0.0))
    compiles: list[Mark] = []
    checkpoints: list[Mark] = []
    incidents: list[Incident] = []
    profiles: list[tuple[float, events.DeviceProfile]] = []
    mfu, peak = Mfu(), 0.0  # every step of the window, at the latest peak the job said
    last_step_at: float | None = None

    def bin_end(index: int) -> float:
        return min(end, start + (index + 1) * resolution)

    def book_goodput(index: int) -> None:
        """The cumulative goodput as it stood at the end of interval ``index``."""
        for series in goodput:
            series.add(bin_end(index), booked[series.name])

    booked_bin = -1
    for t, event in mine:
        if t > end:
            break
        thrown_away = ledger.rollbacks.seconds
        increments = ledger.observe(event, t)  # before the window too: the ledger's state carries over
        increments += rolled_back(ledger.rollbacks.seconds - thrown_away)
        if isinstance(event, PROGRESS):  # as TpuscopeWorkloadStalled counts progress
            if t >= start and last_step_at is not None and t - last_step_at > thresholds.stall_seconds:
                gap = f"no step, checkpoint or compile for {duration(t - last_step_at)}"
                incidents.append(Incident(gap, "critical", last_step_at, t))
            last_step_at = t
        elif isinstance(event, events.Lifecycle):
            # A stall counts from the start, as TpuscopeWorkloadStalled does; a job that ended is not stalled.
            last_step_at = t if event.state in ("start", "restart") else None
        if isinstance(event, events.Hardware):  # said once at the start, maybe before the window
            peak = event.peak_flops_per_second
        if t < start:
            continue
        index = int((t - start) // resolution)
        if index != booked_bin:
            if booked_bin >= 0:
                book_goodput(booked_bin)
            booked_bin = index
        for category, seconds in increments:
            if category not in booked:  # a custom badput category (Monitor.badput): 0 up to its first booking
                booked[category] = 0.0
                goodput.append(Series(category, list(goodput[0].times), [0.0] * len(goodput[0].times)))
            booked[category] += seconds

        if isinstance(event, events.Step):
            each_step.add(t, event.duration_s)
            interval = bins[index]
            interval.durations.append(event.duration_s)
            for phase, seconds in event.phase_seconds():
                interval.phases[phase] += seconds
                totals.phase_seconds[phase] += seconds
            mfu.add(event.flops, event.duration_s)
            if event.profile is not None:
                profiles.append((t, event.profile))
        elif isinstance(event, events.Compile):
            compiles.append(Mark(t, event.stage, event.duration_s, detail=event.function))
        elif isinstance(event, events.CompileCache):
            totals.cache[event.hit] = totals.cache.get(event.hit, 0) + 1
        elif isinstance(event, events.Checkpoint):
            checkpoints.append(Mark(t, event.operation, event.duration_s, event.ok, detail=f"step {event.step}"))
        elif isinstance(event, events.Lifecycle) and event.state in ("failure", "restart"):
            counts = totals.failures if event.state == "failure" else totals.restarts
            counts[event.reason] = counts.get(event.reason, 0) + 1
            severity = "warning" if event.state == "failure" else "info"
            incidents.append(Incident(f"workload {event.state}", severity, t, t, {"reason": event.reason}))
    if booked_bin >= 0:
        for category, seconds in ledger.tick(end):  # a job still down at the window's end: its downtime so far
            booked[category] += seconds
        book_goodput(booked_bin)
    incidents += _failing_saves(checkpoints)

    quantiles = [Series(f"p{q * 100:g}") for q in QUANTILES]
    phases = [Series(phase) for phase in events.PHASES]
    for index in sorted(bins):
        interval, t = bins[index], bin_end(index)
        for q, series in zip(QUANTILES, quantiles, strict=True):
            series.add(t, percentile(interval.durations, q))
        for series in phases:
            series.add(t, interval.phases[series.name] / len(interval.durations))
    steps = each_step.values
    totals.step_count = len(steps)
    totals.step_quantiles = {q: percentile(steps, q) for q in QUANTILES} if steps else {}
    totals.mfu = mfu.of(peak)

    note = (
        f"What the recording itself shows went wrong: failures, restarts, failing checkpoint saves, and no step, "
        f"checkpoint or compile for more than {duration(thresholds.stall_seconds)}. Alerts live in Prometheus: make "
        "the report with --prometheus for the alerts that fired."
    )
    if unreadable:
        note += f" {len(unreadable)} line(s) of the recording could not be read and were left out ({unreadable[0]})."
    return Report(
        workload=workload,
        source=f"the recording {os.fspath(path)}",
        start=start,
        end=end,
        resolution=resolution,
        step_time=[each_step, *quantiles],
        phases=phases,
        goodput=goodput,
        compiles=compiles,
        checkpoints=checkpoints,
        incidents=sorted(incidents, key=lambda incident: incident.start),
        incidents_note=note,
        totals=totals,
        thresholds=thresholds,
        profile=_profile(profiles),
    )


def _profile(captures: list[tuple[float, events.DeviceProfile]]) -> Profile | None:
    """The captures that measured something, summed up over their steps as the sidecar sums its latest
    (:class:`~tpuscope.utilization.ProfileSummary`); None when the job sampled none in the window."""
    if not captures:
        return None
    ok = [profile for _, profile in captures if profile.result == "ok"]
    profile = Profile(
        captures=len(ok),
        busy=sum(p.result == "busy" for _, p in captures),
        errors=sum(p.result == "error" for _, p in captures),
        capture_seconds=sum(p.capture_s for _, p in captures),
        latest=max((t for t, p in captures if p.result == "ok"), default=None),
    )
    if ok:
        summary = ProfileSummary.of(step for p in ok for step in measured_steps(p))
        profile.step_seconds = summary.step_s
        profile.part_seconds = summary.parts
        profile.trace_bytes = sum(p.trace_bytes for p in ok) / len(ok)
        profile.overlap = summary.overlap
        profile.imbalance = summary.imbalance
    return profile


def _one_workload(records: list[tuple[float, events.AnyEvent]], workload: str | None, path: object) -> str:
    names = sorted({event.workload for _, event in records})
    if not names:
        raise ReportError(f"the recording {path} holds no event")
    if workload is None:
        if len(names) > 1:
            raise ReportError(f"the recording {path} holds several workloads; pick one with --workload: {names}")
        return names[0]
    if workload not in names:
        raise ReportError(f"the recording {path} has no event of workload {workload!r}; it has: {', '.join(names)}")
    return workload


def _failing_saves(checkpoints: list[Mark]) -> list[Incident]:
    """Each run of failed saves with no good save between them, as one incident."""
    incidents: list[Incident] = []
    run: list[Mark] = []
    for mark in [*checkpoints, None]:
        if mark is not None and mark.kind == "restore":
            continue
        if mark is not None and not mark.ok:
            run.append(mark)
            continue
        if run:
            labels = {"failed saves": str(len(run))}
            incidents.append(Incident("checkpoint saves failing", "warning", run[0].time, run[-1].time, labels))
            run = []
    return incidents
