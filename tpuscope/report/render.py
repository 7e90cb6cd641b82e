"""Draw a :class:`~tpuscope.report.model.Report`: a PNG per chart, and one HTML page that holds them all.

The page is self-contained (styles inline, the charts as ``data:`` images, no
script), so it can be attached to a ticket, mailed, or opened on a host with no
network; the PNGs beside it are the same images, for pasting one into a chat or
a post-mortem document.
"""

from __future__ import annotations

import base64
import html
import io
import itertools
import json
import math
from collections.abc import Callable, Iterable
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path

import matplotlib.dates as mdates
from matplotlib.axes import Axes
from matplotlib.figure import Figure  # without pyplot: no global state, no display, nothing to close
from matplotlib.ticker import PercentFormatter

from tpuscope import __version__, events
from tpuscope.durations import human as duration
from tpuscope.report.model import Incident, Mark, Profile, Report, Series, StalledCores, StuckPosition
from tpuscope.report.window import utc
from tpuscope.stats import percentile

PHASE_COLOURS = {"compute": "#2ca02c", "sync": "#b04fc0", "io": "#e5ae00", "other": "#9a9a9a"}
CATEGORY_COLOURS = {
    "productive": "#2ca02c",
    "compile": "#8c6bd1",
    "io_wait": "#e5ae00",
    "checkpoint": "#3b7dd8",
    "init": "#9a9a9a",
    "lost": "#d62728",
    "other": "#c7c7c7",
    "downtime": "#7f0000",
}
# The custom badput categories (Monitor.badput), in the order the report lists them.
CUSTOM_COLOURS = ("#17becf", "#e377c2", "#bcbd22", "#8c564b", "#ff7f0e", "#1f77b4", "#9467bd", "#7f7f7f", "#393b79")
SEVERITY_COLOURS = {"critical": "#d62728", "warning": "#ff9f1c", "info": "#3b7dd8"}
QUANTILE_COLOURS = {"p50": "#1f77b4", "p95": "#ff7f0e", "p99": "#d62728"}
WIDTH, HEIGHT, DPI = 11.0, 3.4, 110
UNIX_EPOCH = float(mdates.date2num(datetime.fromtimestamp(0, UTC)))  # type: ignore[no-untyped-call]
LOG_SPREAD = 10  # the step-time chart turns logarithmic when its largest value is this many times its smallest
SMALL_COMPILE_SECONDS = 0.1  # backend compiles shorter than this are counted apart in the summary
TABLE_ROWS = 12  # the longest compiles, the failed checkpoints: a page, not a log


def write(report: Report, out: Path) -> list[Path]:
    """``out/index.html``, a PNG per chart and ``out/report.json`` (the data, for scripts); their paths."""
    out.mkdir(parents=True, exist_ok=True)
    sections = []
    written = []
    for name, title, what, draw, table in _sections(report):
        png, path = _png(draw, report) if draw else b"", out / f"{name}.png"
        if png:
            path.write_bytes(png)
            written.append(path)
        else:
            path.unlink(missing_ok=True)  # an earlier report's, in the same directory
        sections.append(_section(name, title, what, png, table))
    page = out / "index.html"
    page.write_text(_page(report, sections))
    data = out / "report.json"
    data.write_text(json.dumps(asdict(report), indent=1, default=str) + "\n")
    return [page, *written, data]


# --- what the page shows, in order --------------------------------------------------------------------------
Draw = Callable[[Axes, Report], None]


def _sections(report: Report) -> Iterable[tuple[str, str, str, Draw | None, str]]:
    """(file name, title, what to look for, how to draw it, a table under it) for each chart."""
    yield (
        "step-time",
        "Step time",
        "Wall time of a training step: p50, p95 and p99 of the steps in each interval"
        + (" (the dots are every step)." if _each_step(report) else ", estimated from the step histogram.")
        + " A p99 that rises while the p50 stays flat is a few slow steps (a stall, a straggler, an input "
        "hiccup); both rising is a regression: see where the time went, below.",
        _step_time,
        "",
    )
    yield (
        "phases",
        "Host-timed phases: where a step's time goes",
        "Each phase's share of the step time in each interval, stacked to 100%, as the job times every step on "
        "the host. A growing io band is an input-bound job; a growing sync band, slow collectives or a "
        "straggler; other is what no phase claims. A step jitted whole runs its collectives inside compute "
        "(sync 0): the device profile, where the job sampled one, splits them.",
        _phases,
        "",
    )
    if report.profile is not None:
        yield (
            "device-profile",
            "Device profile: where the step's device time went",
            "Sampled, not timed on every step: from the device traces the job took of a few steps every so often, "
            "the mean over the measured steps of the captures in the window (from Prometheus, of each worker's). "
            "Compute is the union of "
            "the non-collective ops, exposed collective the collective ops no compute hid (waiting for the "
            "other devices and hosts: a straggler, the interconnect, the sharding), idle the time with no op "
            "at all (waiting for the host, the input, the next dispatch, and where a host has more devices than "
            "free cores, one device's ops waiting for CPU threads the others hold). Unlike the host-timed phases "
            "above, "
            "this splits one fused program.",
            None,
            _profile_table(report.profile),
        )
    yield (
        "goodput",
        "Wall time by category",
        "Seconds booked to each category since the window's start, stacked (summed over the workload's workers). "
        "Step time becomes productive when a checkpoint covers it; a failure or a restore from an older "
        "checkpoint turns the work since the last save into lost.",
        _goodput,
        "",
    )
    yield (
        "compiles",
        "Compiles",
        "Each XLA compilation by stage and how long it took. Compiles belong at the start; later ones are "
        "recompiles (a new shape, a new function), and each one stalls the step that waits for it.",
        _compiles,
        _marks_table(sorted(report.compiles, key=lambda m: -m.seconds), "stage", "the longest", "function"),
    )
    yield (
        "checkpoints",
        "Checkpoints",
        "Each checkpoint save and restore and how long it took; failed ones in red. Saves that fail leave the "
        "work since the last good one at risk.",
        _checkpoints,
        _marks_table([m for m in report.checkpoints if not m.ok], "operation", "the failed", "step"),
    )
    if report.stalled_cores:
        yield (
            "stalled-cores",
            "Where the TPU cores sat while the workload stalled",
            "The workload's sidecars ask the TPU runtime where each core is once the workload has made no progress "
            "for the stall threshold: the program (its fingerprint) and the HLO location, and how long the cores "
            "stayed there (the longest in the window, counted from the first time the sidecar asked). In a hung "
            "job every worker's cores wait at the same collective but one's: the workers in red had their cores "
            "elsewhere than most of their peers', likely the one the others waited for.",
            None,
            _stalled_cores_table(report.stalled_cores),
        )
    if report.stuck_positions:
        yield (
            "stuck-positions",
            STUCK_ROW,
            "Each worker's sidecar reads where its job process is (the step, the phase) and, once it has stayed there "
            "past its limit, serves the position with the top Python frames of the thread that runs the steps. In a "
            "hung job every worker waits at the same place but one: the workers in red were stuck elsewhere than most "
            "of the stuck workers, likely the one the others waited for. Every thread's whole stacks are in the "
            "sidecars' logs, after the pods are gone too: tpuscope hangs reads them.",
            None,
            _stuck_table(report.stuck_positions),
        )
    yield (
        "alerts",
        "Alerts and incidents",
        report.incidents_note,
        _incidents if report.incidents else None,
        _incidents_table(report.incidents),
    )


# --- the charts ---------------------------------------------------------------------------------------------
def _each_step(report: Report) -> Series | None:
    return next((s for s in report.step_time if s.name == "each step"), None)


def _step_time(ax: Axes, report: Report) -> None:
    values = [v for s in report.step_time for v in s.values]
    each = _each_step(report)
    if each:
        ax.scatter(_dates(each.times), each.values, s=6, color="#555555", alpha=0.6, label="each step", lw=0)
    for line in report.step_time:
        if line is not each and line.times:
            times, values = _with_gaps(line.times, line.values, report.resolution, math.nan)
            colour = QUANTILE_COLOURS.get(line.name)
            ax.plot(_dates(times), values, label=line.name, color=colour, lw=1.4, marker="o", ms=2.5)  # dots: alone
    if values and min(values) > 0 and max(values) / min(values) > LOG_SPREAD:
        ax.set_yscale("log")  # a compile of seconds beside steps of milliseconds would flatten them to a line
    _seconds_axis(ax)
    _legend(ax)


def _phases(ax: Axes, report: Report) -> None:
    """Each phase's share of the step time: seconds stacked would let one compile step flatten every other."""
    times = sorted({t for s in report.phases for t in s.times})
    if times:
        stacks = [dict(zip(s.times, s.values, strict=True)) for s in report.phases]
        times, _ = _with_gaps(times, times, report.resolution, 0.0)  # no steps: nothing stacked
        totals = [sum(stack.get(t, 0.0) for stack in stacks) or 1.0 for t in times]
        ax.stackplot(
            _dates(times),
            [[stack.get(t, 0.0) / total for t, total in zip(times, totals, strict=True)] for stack in stacks],
            labels=[s.name for s in report.phases],
            colors=[PHASE_COLOURS[s.name] for s in report.phases],
            alpha=0.85,
        )
    ax.set_ylabel("share of step time")
    ax.set_ylim(0, 1)
    ax.yaxis.set_major_formatter(PercentFormatter(1.0))
    _legend(ax)


def _goodput(ax: Axes, report: Report) -> None:
    shown = [s for s in report.goodput if s.values and max(s.values) > 0]
    if shown:
        ax.stackplot(
            _dates(shown[0].times),
            [s.values for s in shown],
            labels=[s.name for s in shown],
            colors=_category_colours([s.name for s in shown]),
            alpha=0.85,
        )
    _seconds_axis(ax)
    _legend(ax)


def _category_colours(categories: list[str]) -> list[str]:
    custom = itertools.cycle(CUSTOM_COLOURS)
    return [CATEGORY_COLOURS.get(category) or next(custom) for category in categories]


def _compiles(ax: Axes, report: Report) -> None:
    stages = sorted({m.kind for m in report.compiles})
    for stage, colour in zip(stages, ("#8c6bd1", "#17becf", "#e377c2"), strict=False):
        marks = [m for m in report.compiles if m.kind == stage]
        ax.vlines(_dates([m.time for m in marks]), 0, [m.seconds for m in marks], color=colour, alpha=0.4, lw=1)
        ax.scatter(_dates([m.time for m in marks]), [m.seconds for m in marks], s=16, color=colour, label=stage)
    _seconds_axis(ax)
    _legend(ax)


def _checkpoints(ax: Axes, report: Report) -> None:
    for operation, marker in (("save", "o"), ("restore", "D")):
        for ok, colour, outcome in ((True, "#2ca02c", "ok"), (False, "#d62728", "failed")):
            marks = [m for m in report.checkpoints if m.kind == operation and m.ok == ok]
            if marks:
                times, seconds = _dates([m.time for m in marks]), [m.seconds for m in marks]
                ax.vlines(times, 0, seconds, color=colour, alpha=0.4, lw=1)
                ax.scatter(times, seconds, marker=marker, s=22, color=colour, label=f"{operation} {outcome}")
    _seconds_axis(ax)
    _legend(ax)


def _incidents(ax: Axes, report: Report) -> None:
    rows = sorted({i.name for i in report.incidents}, reverse=True)
    minimum = (report.end - report.start) / 300  # an instant still shows as a sliver
    for incident in report.incidents:
        start, end = _dates([incident.start, max(incident.end, incident.start + minimum)])
        ax.barh(
            rows.index(incident.name),
            end - start,
            left=start,
            height=0.6,
            color=SEVERITY_COLOURS.get(incident.severity, "#7f7f7f"),
        )
    ax.set_yticks(range(len(rows)), rows)
    ax.set_ylim(-0.8, max(len(rows), 1) - 0.2)
    if not rows:
        ax.set_yticks([])


# --- drawing helpers ----------------------------------------------------------------------------------------
def _png(draw: Draw, report: Report) -> bytes:
    rows = len({i.name for i in report.incidents}) if draw is _incidents else 0
    figure = Figure(figsize=(WIDTH, max(HEIGHT, 1.2 + 0.4 * rows)), dpi=DPI, layout="tight")
    ax = figure.add_subplot()
    draw(ax, report)
    if not ax.has_data():
        ax.text(0.5, 0.5, "nothing in this window", transform=ax.transAxes, ha="center", va="center")
    _time_axis(ax, report)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    return buffer.getvalue()


def _with_gaps(times: list[float], values: list[float], resolution: float, fill: float) -> tuple[list[float], ...]:
    """Where no point came for longer than two intervals (no step then), ``fill`` just after the last point
    and just before the next, so a line breaks (NaN) or a stack drops (0) instead of bridging the gap."""
    out_times, out_values = times[:1], values[:1]
    for before, t, v in zip(times, times[1:], values[1:], strict=False):
        if t - before > 2 * resolution:
            out_times += [before + resolution / 2, t - resolution / 2]
            out_values += [fill, fill]
        out_times.append(t)
        out_values.append(v)
    return out_times, out_values


def _dates(times: list[float]) -> list[float]:
    """Unix seconds as matplotlib's dates (days since its epoch), without a datetime for each point."""
    return [UNIX_EPOCH + t / 86400.0 for t in times]


def _time_axis(ax: Axes, report: Report) -> None:
    start, end = _dates([report.start, report.end])
    ax.set_xlim(start, end)
    ax.xaxis.set_major_locator(mdates.AutoDateLocator(tz=UTC, maxticks=10))  # type: ignore[no-untyped-call]
    # Every tick in one plain form: a concise formatter's "50 55 18:05 05 10" reads as anything but a clock.
    span = report.end - report.start
    form = "%H:%M:%S" if span < 600 else "%H:%M" if span < 86400 else "%b %d %H:%M"
    ax.xaxis.set_major_formatter(mdates.DateFormatter(form, tz=UTC))  # type: ignore[no-untyped-call]
    ax.set_xlabel(f"UTC, {datetime.fromtimestamp(report.start, UTC):%Y-%m-%d}" if span < 86400 else "UTC")
    ax.grid(True, alpha=0.3)


def _seconds_axis(ax: Axes) -> None:
    ax.set_ylabel("seconds")
    if ax.get_yscale() == "linear":
        ax.set_ylim(bottom=0)


def _legend(ax: Axes) -> None:
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="lower left", bbox_to_anchor=(0, 1), fontsize=8, ncols=6, frameon=False)  # above: hides nothing


# --- the page -----------------------------------------------------------------------------------------------
STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 24px auto; max-width: 1240px; color: #1d1d1f; padding: 0 16px; }
h1 { font-size: 22px; margin-bottom: 4px; } h2 { font-size: 17px; margin: 28px 0 4px; }
.meta { color: #555; } .what { color: #444; margin: 2px 0 8px; max-width: 980px; }
img { width: 100%; max-width: 1210px; border: 1px solid #ddd; }
table { border-collapse: collapse; margin: 8px 0; }
td, th { padding: 3px 12px 3px 0; text-align: left; vertical-align: top; }
th { color: #555; font-weight: 600; } tr + tr td { border-top: 1px solid #eee; }
.bad { color: #c62828; font-weight: 600; } .good { color: #2e7d32; }
"""


def _page(report: Report, sections: list[str]) -> str:
    e = html.escape
    title = f"tpuscope report: {report.workload}, {utc(report.start)} to {utc(report.end)}"
    made = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{e(title)}</title>
<style>{STYLE}</style>
</head>
<body>
<h1>tpuscope report: workload {e(report.workload)}</h1>
<p class="meta">{e(utc(report.start))} to {e(utc(report.end))} ({e(duration(report.end - report.start))}),
from {e(report.source)}; a point of the charts is {e(duration(report.resolution))}.
Made by tpuscope {e(__version__)} on {e(made)}.</p>
<h2>Summary</h2>
{_summary(report)}
{"".join(sections)}
</body>
</html>
"""


def _section(name: str, title: str, what: str, png: bytes, table: str) -> str:
    image = f'<img alt="{html.escape(title)}" src="data:image/png;base64,{base64.b64encode(png).decode()}">'
    return (
        f'<section id="{name}"><h2>{html.escape(title)}</h2><p class="what">{html.escape(what)}</p>'
        f"{image if png else ''}{table}</section>\n"
    )


Row = tuple[str, ...]


def _table(header: Row, rows: Iterable[Row], bad: Callable[[Row], bool] = lambda row: False) -> str:
    """A table; the rows ``bad`` picks in red."""
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join(
        ('<tr class="bad">' if bad(row) else "<tr>") + "".join(f"<td>{html.escape(v)}</td>" for v in row) + "</tr>"
        for row in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def _summary(report: Report) -> str:
    """The window in figures; the rows that say something went wrong in red."""
    t = report.totals
    per_second = t.step_count / (report.end - report.start)
    rows: list[Row] = [("Steps", f"{t.step_count:,.0f} ({per_second:.2f} steps/s over the window)")]
    wrong: set[str] = set()
    if t.step_quantiles:
        how = "of every step" if t.exact_quantiles else "estimated from the step histogram's buckets"
        quantiles = ", ".join(f"p{q * 100:g} {duration(v)}" for q, v in t.step_quantiles.items())
        rows.append(("Step time", f"{quantiles} ({how})"))
    if phase_total := sum(t.phase_seconds.values()):
        shares = ", ".join(f"{p} {t.phase_seconds.get(p, 0.0) / phase_total:.1%}" for p in events.PHASES)
        rows.append(("Where the time went (host-timed phases)", f"{shares} of every step, timed on the host"))
    if report.profile is not None:
        rows.append((PROFILE_ROW, _profile_summary(report.profile, report)))
        if report.profile.share("exposed_collective") > report.thresholds.sync_share:  # as TpuscopeSyncBound reads it
            wrong.add(PROFILE_ROW)
    booked = {s.name: s.values[-1] if s.values else 0.0 for s in report.goodput}
    if total := sum(booked.values()):
        badput = ", ".join(f"{c} {s / total:.1%}" for c, s in booked.items() if c != "productive" and s)
        productive = (
            f"{booked['productive'] / total:.1%} productive (objective {report.thresholds.goodput_objective:.0%})"
        )
        rows.append(("Goodput", productive + (f"; badput: {badput}" if badput else "")))
        if booked["productive"] / total < report.thresholds.goodput_objective:
            wrong.add("Goodput")
    backend = [m for m in report.compiles if m.kind == "backend"]
    small = sum(m.count for m in backend if m.seconds < SMALL_COMPILE_SECONDS)
    compiles = f"{sum(m.count for m in backend)} backend compiles"
    if small:  # Orbax alone compiles dozens of tiny array-copy programs: not the recompiles to worry about
        compiles += f" ({small} of them small programs under {SMALL_COMPILE_SECONDS * 1000:.0f} ms each)"
    compiles += f", {sum(m.seconds * m.count for m in report.compiles):.1f} s in all stages"
    if t.cache:
        hits, misses = t.cache.get(True, 0.0), t.cache.get(False, 0.0)
        compiles += f"; compilation cache {hits:.0f} hits, {misses:.0f} misses ({hits / (hits + misses):.0%} hit)"
    rows.append(("Compiles", compiles))
    rows.append(("Checkpoints", _checkpoint_summary(report.checkpoints)))
    if any(not m.ok for m in report.checkpoints):
        wrong.add("Checkpoints")
    lifecycle = [
        f"{n:.0f} {kind} ({reason})"
        for kind, counts in (("failures", t.failures), ("restarts", t.restarts))
        for reason, n in counts.items()
        if n
    ]
    rows.append(("Failures and restarts", ", ".join(lifecycle) or "none"))
    if any(t.failures.values()):
        wrong.add("Failures and restarts")
    rows.append(("Model FLOPs utilization", f"{t.mfu:.1%}" if t.mfu is not None else "not reported"))
    if report.stalled_cores:
        rows.append((STALLED_ROW, _stalled_summary(report.stalled_cores)))
        if any(core.elsewhere for core in report.stalled_cores):
            wrong.add(STALLED_ROW)
    if report.stuck_positions:  # a process stuck past its limit is wrong wherever it is
        rows.append((STUCK_ROW, _stuck_summary(report.stuck_positions)))
        wrong.add(STUCK_ROW)
    rows.append(("Alerts and incidents", f"{len(report.incidents)} (below)" if report.incidents else "none"))
    if report.incidents:
        wrong.add("Alerts and incidents")
    return _table(("measure", "in the window"), rows, lambda row: row[0] in wrong)


PROFILE_ROW = "Where the device time went (sampled device profiles)"
STALLED_ROW = "Where the TPU cores sat while it stalled"
STUCK_ROW = "Where the workers were stuck"


def _stalled_summary(cores: list[StalledCores]) -> str:
    odd = [core for core in cores if core.elsewhere]
    if not odd:
        return f"every worker's cores at the same place as most of its peers' ({len(cores)} places, below)"
    return "; ".join(
        f"worker {core.worker} (slice {core.slice}) at {core.hlo_location} for {duration(core.seconds)}, elsewhere "
        "than most of its peers'"
        for core in odd
    )


def _stuck_summary(stuck: list[StuckPosition]) -> str:
    workers = len({(p.slice, p.worker) for p in stuck})
    said = f"{workers} worker{'s' if workers != 1 else ''} stuck past their limit"
    if odd := [p for p in stuck if p.elsewhere]:
        return f"{said}; " + "; ".join(
            f"worker {p.worker} (slice {p.slice}) at {_stuck_at(p)}, in {p.frames}, elsewhere than most" for p in odd
        )
    places = {(p.step, p.phase) for p in stuck}
    if len(places) == 1:
        return f"{said}, all at {_stuck_at(stuck[0])}"
    return f"{said}, at {len(places)} places (below)"


def _stuck_at(p: StuckPosition) -> str:
    return f"step {p.step}, {p.phase}" if p.step else f"no step yet, {p.phase}"


def _part(part: str) -> str:
    return part.replace("_", " ")


def _profile_summary(profile: Profile, report: Report) -> str:
    others = f"{profile.busy} busy (another profiler was running), {profile.errors} failed"
    if not profile.captures:
        return f"no capture measured anything: {others}"
    split = ", ".join(f"{_part(part)} {profile.share(part):.1%}" for part in profile.part_seconds)
    text = f"{split} of a {duration(profile.step_seconds)} profiled step"
    ratios = []
    if profile.overlap is not None:
        ratios.append(f"collective overlap {profile.overlap:.0%}")
    if profile.imbalance is not None:
        ratios.append(f"device imbalance {profile.imbalance:.2f}")
    if ratios:
        text += f"; {', '.join(ratios)}"
    text += f"; over the steps of {profile.captures} captures"
    if profile.latest is not None:
        text += f", the latest at {utc(profile.latest)}"
    text += f" ({others})"
    cost = profile.capture_seconds / (report.end - report.start)
    text += f"; the captures cost {duration(profile.capture_seconds)} ({cost:.2%} of the window's wall time)"
    if profile.trace_bytes:
        text += f", {profile.trace_bytes / 1e6:.1f} MB of trace each"
    return text


def _profile_table(profile: Profile) -> str:
    if not profile.captures:
        return ""
    rows = [
        (_part(part), duration(seconds), f"{profile.share(part):.1%}") for part, seconds in profile.part_seconds.items()
    ]
    rows.append(("the profiled step", duration(profile.step_seconds), "100%"))
    return _table(("part", "seconds per step", "share of the profiled step"), rows)


def _checkpoint_summary(marks: list[Mark]) -> str:
    parts = []
    for operation in ("save", "restore"):
        ok = [m for m in marks if m.kind == operation and m.ok]
        failed = sum(m.count for m in marks if m.kind == operation and not m.ok)
        if ok or failed:
            seconds = [m.seconds for m in ok for _ in range(m.count)]
            took = ", ".join(["", *(f"p{q * 100:g} {duration(percentile(seconds, q))}" for q in (0.5, 0.95))])
            took = took if seconds else ""
            parts.append(f"{operation}: {sum(m.count for m in ok)} ok, {failed} failed{took}")
    return "; ".join(parts) or "none in the window"


def _marks_table(marks: list[Mark], kind: str, which: str, detail: str) -> str:
    if not marks:
        return ""
    rows = [(utc(m.time), m.kind, duration(m.seconds), str(m.count), m.detail) for m in marks[:TABLE_ROWS]]
    table = _table(("time", kind, "seconds each", "count", detail), rows)
    if len(marks) > TABLE_ROWS:
        table += f"<p class='meta'>{len(marks) - TABLE_ROWS} more not shown (report.json has them all).</p>"
    return f"<p class='meta'>{html.escape(which.capitalize())}:</p>{table}"


def _stalled_cores_table(cores: list[StalledCores]) -> str:
    rows = [
        (
            core.slice,
            core.worker,
            core.instance,
            core.fingerprint,
            core.hlo_location,
            duration(core.seconds),
            "elsewhere than most of its peers" if core.elsewhere else "",
        )
        for core in cores[:TABLE_ROWS]
    ]
    header = ("slice", "worker", "host", "program", "HLO location", "there for", "")
    table = _table(header, rows, lambda row: bool(row[-1]))
    if len(cores) > TABLE_ROWS:
        table += f"<p class='meta'>{len(cores) - TABLE_ROWS} more not shown (report.json has them all).</p>"
    return table


def _stuck_table(stuck: list[StuckPosition]) -> str:
    rows = [
        (
            p.slice,
            p.worker,
            p.instance,
            p.step or "none yet",
            p.phase,
            p.frames,
            utc(p.first),
            utc(p.last),
            "elsewhere than most" if p.elsewhere else "",
        )
        for p in stuck[:TABLE_ROWS]
    ]
    header = ("slice", "worker", "host", "step", "phase", "top frames (innermost first)", "first seen", "last seen", "")
    table = _table(header, rows, lambda row: bool(row[-1]))
    if len(stuck) > TABLE_ROWS:
        table += f"<p class='meta'>{len(stuck) - TABLE_ROWS} more not shown (report.json has them all).</p>"
    return table


def _incidents_table(incidents: list[Incident]) -> str:
    if not incidents:
        return "<p class='good'>None in the window.</p>"
    rows = [
        (
            i.name,
            i.severity,
            utc(i.start),
            duration(i.end - i.start) if i.end > i.start else "once",
            ", ".join(f"{k}={v}" for k, v in sorted(i.labels.items())),
        )
        for i in incidents
    ]
    return _table(("alert", "severity", "from", "for", "labels"), rows, lambda row: row[1] == "critical")
