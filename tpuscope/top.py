"""``tpuscope top``: a live terminal view of one sidecar, for a host without Grafana at hand.

It reads the sidecar's ``/metrics`` (a URL, local or through an ssh tunnel) every
``--refresh`` seconds and draws the whole picture: each device's duty cycle and
HBM use, each workload's step time and where it went (io, compute, sync, other),
compile time, checkpoint age and goodput, while a workload stalls each TPU
core's program and HLO location (the sidecar asks the runtime only then), and,
given a Prometheus, the firing tpuscope alerts. Rates come from the difference between two scrapes, as
Prometheus' would. When a source cannot be read the view says so, and keeps the
last figures it had, marked with their age, rather than going blank.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from tpuscope import catalog as c
from tpuscope import events
from tpuscope.conventions import ALERT_PREFIX, DEFAULT_PORT
from tpuscope.durations import human as duration
from tpuscope.prometheus_api import PrometheusAPI, PrometheusError
from tpuscope.scrape import Scrape

PHASE_STYLES = {"io": "yellow", "compute": "green", "sync": "magenta", "other": "bright_black"}
BAR_WIDTH = 20


@dataclass
class Source:
    """A URL read each frame: its latest good scrape, when that was, and why the last read failed."""

    url: str
    latest: Scrape | None = None
    previous: Scrape | None = None
    read_at: float = 0.0
    previous_at: float = 0.0
    error: str = ""

    def read(self, timeout: float) -> None:
        try:
            scrape = Scrape.fetch(self.url, timeout)
        except Exception as e:  # down, refused, timed out, not /metrics: shown, never raised
            self.error = f"{type(e).__name__}: {getattr(e, 'reason', e)}"
            return
        self.previous, self.previous_at = self.latest, self.read_at
        self.latest, self.read_at, self.error = scrape, time.time(), ""


@dataclass
class Alerts:
    """Firing tpuscope alerts from a Prometheus, when one is given."""

    prometheus: str = ""
    firing: list[dict[str, str]] = field(default_factory=list)
    error: str = ""

    def read(self, timeout: float) -> None:
        if not self.prometheus:
            return
        try:
            alerts = PrometheusAPI(self.prometheus, timeout).get("alerts")["alerts"]
        except Exception as e:  # PrometheusError says why; anything else is an answer that is not Prometheus'
            self.error = str(e) if isinstance(e, PrometheusError) else f"{type(e).__name__}: {e}"
            return
        self.error = ""
        self.firing = [
            a["labels"] for a in alerts if a["state"] == "firing" and a["labels"]["alertname"].startswith(ALERT_PREFIX)
        ]


def bar(share: float, style: str, width: int = BAR_WIDTH) -> Text:
    """``share`` (0..1) of ``width`` cells filled, then the percentage."""
    share = min(max(share, 0.0), 1.0)
    filled = round(share * width)
    return Text("█" * filled, style=style) + Text("░" * (width - filled), style="bright_black") + f" {share:4.0%}"


def phase_bar(seconds: dict[str, float], width: int = BAR_WIDTH * 2) -> Text:
    """One bar split by phase in proportion, a letter per phase under its colour's legend."""
    total = sum(seconds.values()) or 1.0
    text = Text()
    for phase in events.PHASES:
        cells = round(seconds.get(phase, 0.0) / total * width)
        text.append("█" * cells, style=PHASE_STYLES.get(phase, "white"))
    return text


def size(value: float) -> str:
    if abs(value) < 1024:
        return f"{value:.0f} B"
    for unit in ("KiB", "MiB", "GiB"):
        value /= 1024
        if abs(value) < 1024:
            return f"{value:.1f} {unit}"
    return f"{value / 1024:.1f} TiB"


def _delta(source: Source, name: str, **labels: str) -> float:
    """How much a counter grew between the last two scrapes (the whole value on the first)."""
    assert source.latest is not None
    # A counter not yet born (a phase never entered, a first scrape) has counted nothing: 0, not "unknown".
    now = source.latest.value(name, **labels) or 0.0
    before = (source.previous.value(name, **labels) or 0.0) if source.previous else 0.0
    return now - before if now >= before else now  # a restarted sidecar counts from 0


def devices_table(source: Source) -> Table:
    table = Table(title="Devices", title_justify="left", expand=False)
    for column in ("device", "accelerator", "source", "duty cycle", "HBM used", "used / limit"):
        table.add_column(column)
    assert source.latest is not None
    rows: dict[tuple[str, ...], dict[str, float]] = {}
    for metric in (c.DUTY_CYCLE, c.DEVICE_MEMORY_USED, c.DEVICE_MEMORY_LIMIT):
        for sample in source.latest.find(metric.name):
            key = tuple(sample.labels.get(label, "") for label in ("device", "accelerator", "source"))
            rows.setdefault(key, {})[metric.name] = sample.value
    for (device, accelerator, origin), values in sorted(rows.items()):
        duty = values.get(c.DUTY_CYCLE.name)
        used, limit = values.get(c.DEVICE_MEMORY_USED.name), values.get(c.DEVICE_MEMORY_LIMIT.name)
        memory = bar(used / limit, "cyan") if used is not None and limit else Text("-")
        amounts = f"{size(used)} / {size(limit)}" if used is not None and limit else ""
        table.add_row(device, accelerator, origin, bar(duty, "green") if duty is not None else "-", memory, amounts)
    if not rows:
        table.add_row("no device series yet", "", "", "", "", "")
    return table


def workloads_table(source: Source) -> Table:
    table = Table(title="Workloads", title_justify="left")
    columns = ("workload", "steps/s", "step time", " · ".join(events.PHASES), "compile", "last checkpoint")
    for column in (*columns, "goodput"):
        table.add_column(column)
    assert source.latest is not None
    interval = source.read_at - source.previous_at if source.previous else 0.0
    names = sorted({s.labels["workload"] for s in source.latest.find(c.STEPS.name)})
    for workload in names:
        w = {"workload": workload}
        steps = _delta(source, c.STEPS.name, **w)
        seconds = _delta(source, c.STEP_DURATION.series("sum"), **w)
        phases = {p: _delta(source, c.STEP_PHASE_DURATION.series("sum"), phase=p, **w) for p in events.PHASES}
        compiled = source.latest.value(c.COMPILE_DURATION.series("sum"), stage="backend", **w)
        saved = source.latest.value(c.CHECKPOINT_LAST_SUCCESS.name, **w)
        productive = source.latest.value(c.GOODPUT.name, category="productive", **w)
        wall = source.latest.value(c.GOODPUT_WALL.name, **w)
        shares = " ".join(f"{p} {phases[p] / (sum(phases.values()) or 1):.0%}" for p in events.PHASES)
        table.add_row(
            workload,
            f"{steps / interval:.1f}" if interval else "-",
            duration(seconds / steps) if steps else "no steps",
            Group(phase_bar(phases), Text(shares, style="bright_black")),
            duration(compiled) if compiled is not None else "-",
            # Absent, or the 0 of a gauge no checkpoint has set yet: nothing was saved.
            duration(time.time() - saved) + " ago" if saved else "never",
            bar(productive / wall, "green") if productive is not None and wall else Text("-"),
        )
    if not names:
        table.add_row("no workload has reported yet", "", "", "", "", "", "")
    return table


def cores_table(source: Source) -> Table | None:
    """Where each TPU core is, served only while a workload on the host stalls (None otherwise): its program,
    its HLO location and how long it has been there."""
    assert source.latest is not None
    cores = {
        (s.labels.get("device", ""), s.labels.get("core", "")): s.labels for s in source.latest.find(c.CORE_STATE.name)
    }
    if not cores:
        return None
    table = Table(title="Cores of the stalled workload (the TPU runtime's word)", title_justify="left")
    for column in ("device", "core", "program", "HLO location", "there for"):
        table.add_column(column)
    for (device, core), labels in sorted(cores.items(), key=lambda item: (_number(item[0][0]), item[0][1])):
        there = source.latest.find(c.CORE_LOCATION_AGE.name, device=device, core=core)
        seconds = next((s.value for s in there), None)
        table.add_row(
            device,
            core,
            labels.get("fingerprint", ""),
            labels.get("hlo_location", ""),
            duration(seconds) if seconds is not None else "-",
        )
    return table


def _number(text: str) -> float:
    """A device label as a number, for ordering (device 10 after device 9); one that is not: after them all."""
    try:
        return float(text)
    except ValueError:
        return float("inf")


def alerts_view(alerts: Alerts) -> RenderableType:
    if not alerts.prometheus:
        return Text("Alerts: not shown (give --prometheus URL)", style="bright_black")
    if alerts.error:
        return Text(f"Alerts: Prometheus unreachable ({alerts.error})", style="bold red")
    if not alerts.firing:
        return Text("Alerts: none firing", style="green")
    lines = [Text(f"Alerts firing: {len(alerts.firing)}", style="bold red")]
    for labels in alerts.firing:
        where = ", ".join(f"{k}={v}" for k, v in sorted(labels.items()) if k not in ("alertname", "severity"))
        lines.append(Text(f"  {labels.get('severity', ''):8} {labels['alertname']}  {where}"))
    return Group(*lines)


def frame(source: Source, alerts: Alerts) -> RenderableType:
    """Everything on screen for one refresh."""
    header = Text(f"tpuscope top — {source.url}", style="bold")
    if source.latest is not None:
        first = source.latest.samples[0].labels if source.latest.samples else {}
        header.append("   " + "  ".join(f"{label} {first.get(label, '?')}" for label in c.HOST_LABELS))
    parts: list[RenderableType] = [header]
    if source.error:
        since = f"; figures below are {duration(time.time() - source.read_at)} old" if source.latest else ""
        parts.append(Text(f"SIDECAR UNREACHABLE: {source.error}{since}", style="bold red"))
    if source.latest is None:
        parts.append(Text("No data yet: is `tpuscope serve` running at this URL?", style="yellow"))
    else:
        parts += [devices_table(source), workloads_table(source)]
        if (cores := cores_table(source)) is not None:
            parts.append(cores)
    parts.append(alerts_view(alerts))
    return Group(*parts)


def read_and_draw(source: Source, alerts: Alerts, timeout: float) -> RenderableType:
    source.read(timeout)
    alerts.read(timeout)
    return frame(source, alerts)


def frames(source: Source, alerts: Alerts, refresh: float) -> Iterator[RenderableType]:
    timeout = max(0.5, min(refresh, 5.0))
    while True:
        yield read_and_draw(source, alerts, timeout)
        time.sleep(refresh)


def metrics_url(text: str) -> str:
    """A URL as given, or ``HOST:PORT`` (as ``tpuscope serve --listen`` takes it) made the sidecar's /metrics URL.

    ``urlparse("localhost:9478")`` reads ``localhost`` as a scheme, so the test is for ``://`` itself.
    """
    return text if "://" in text else f"http://{text}/metrics"


def run(url: str, prometheus: str, refresh: float, once: bool, console: Console | None = None) -> int:
    console = console or Console()
    source, alerts = Source(metrics_url(url)), Alerts(prometheus)
    if once:
        source.read(5.0)
        if source.latest is not None:  # a second scrape, for the rates
            time.sleep(refresh)
        console.print(read_and_draw(source, alerts, 5.0))
        return 0 if source.latest is not None else 1
    try:
        with Live(console=console, auto_refresh=False, screen=console.is_terminal) as live:
            for view in frames(source, alerts, refresh):
                live.update(view, refresh=True)
    except KeyboardInterrupt:
        pass
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Draw a sidecar's /metrics in the terminal, refreshed: each device's duty cycle and HBM, each workload's "
        "steps/s, step time and phase breakdown, compile time, checkpoint age and goodput, while a workload stalls "
        "each TPU core's program and HLO location, and with --prometheus the firing tpuscope alerts. Over ssh: run "
        "it on the host, or tunnel the port."
    )
    parser.add_argument(
        "url",
        nargs="?",
        default=f"localhost:{DEFAULT_PORT}",
        help="the sidecar's /metrics URL, or HOST:PORT as tpuscope serve --listen takes it (default %(default)s)",
    )
    parser.add_argument(
        "--refresh", type=float, default=2.0, help="seconds between refreshes, and --once's two scrapes (default 2)"
    )
    parser.add_argument("--prometheus", default="", help="a Prometheus URL, to show the firing tpuscope alerts")
    parser.add_argument(
        "--once",
        action="store_true",
        help="print one frame, its rates from two scrapes --refresh apart, and exit (1 if the sidecar is unreachable)",
    )


def main(args: argparse.Namespace) -> int:
    if args.refresh <= 0:
        print("tpuscope top: --refresh must be a positive number of seconds", file=sys.stderr)
        return 2
    return run(args.url, args.prometheus, args.refresh, args.once)
