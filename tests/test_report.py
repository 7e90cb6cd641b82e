"""``tpuscope report`` of a real run, from a real Prometheus and from the job's recording, opened in Chromium.

The run: the JAX workload crashes halfway, runs again and resumes from its
checkpoint, now with every save failing; a sidecar serves it, a Prometheus with
tpuscope's rules scrapes it (the crash fires TpuscopeWorkloadFailed, the saves
TpuscopeCheckpointFailing), and the job records its events. Both reports must
tell the same story, and open in headless Chromium with nothing in red.
"""

from __future__ import annotations

import json
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import pytest
from chromium import Chromium
from conftest import require
from dashboard_helpers import Fleet, backfilled

from tpuscope import alerts, catalog, events
from tpuscope.conventions import AlertName
from tpuscope.generator_config import GeneratorConfig
from tpuscope.report import from_recording, prometheus, render
from tpuscope.report.model import StalledCores, StuckPosition
from tpuscope.report.window import Window, parse_time
from tpuscope.testing import bench as testing_bench
from tpuscope.testing.prometheus import PrometheusServer, target_of
from tpuscope.testing.waiting import wait_for
from tpuscope.thresholds import Thresholds
from tpuscope.tracing import Monitor, read_records
from tpuscope.workload import synthetic
from tpuscope.workload.sidecar import SidecarProcess

pytestmark = pytest.mark.long

WORKLOAD = "report"
EXPECTED_ALERTS = {AlertName.WORKLOAD_FAILED, AlertName.CHECKPOINT_FAILING}


@dataclass
class Run:
    prometheus: str
    recording: Path
    started: float
    records: list[tuple[float, events.AnyEvent]]
    directory: Path


def bench(sidecar: SidecarProcess, directory: Path, *faults: str) -> subprocess.CompletedProcess[str]:
    return testing_bench.run(
        *faults,
        workload=WORKLOAD,
        steps=60,
        checkpoint_every=20,
        socket=sidecar.socket,
        run_dir=directory / "run",
        record=directory / "events.jsonl",
    )


@pytest.fixture(scope="module")
def run(module_tmp: Path) -> Iterator[Run]:
    require("prometheus")
    rules = module_tmp / "rules.yml"
    rules.write_text(alerts.rules_file(GeneratorConfig()))
    with (
        SidecarProcess(module_tmp / "s.sock", "127.0.0.1:0", "--collectors=host") as sidecar,
        PrometheusServer(module_tmp / "prom", [target_of(sidecar.url)], rule_files=[rules]) as prom,
    ):
        started = time.time()
        crashed = bench(sidecar, module_tmp, "--inject=crash=30")
        assert crashed.returncode == 3, crashed.stdout[-2000:] + crashed.stderr[-3000:]
        resumed = bench(sidecar, module_tmp, "--inject=ckpt-fail")
        assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-3000:]

        def fired() -> bool:
            firing = prom.query(f'ALERTS{{alertstate="firing", workload="{WORKLOAD}"}}')
            return {a["metric"]["alertname"] for a in firing} >= EXPECTED_ALERTS

        # WorkloadFailed waits a minute (for: 1m) for a preemption's verdict before it fires.
        wait_for(fired, 150, "fired", detail=lambda: prom.query("ALERTS"))
        prom.catch_up()  # one more scrape: the last events are in Prometheus
        recording = module_tmp / "events.jsonl"
        yield Run(prom.url, recording, started, read_records(recording), module_tmp)


def report(*flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tpuscope", "report", *flags], capture_output=True, text=True, timeout=120
    )


def made(run: Run, source: str, *flags: str) -> tuple[Path, dict[str, Any]]:
    """The report's directory and its data, made by the command."""
    out = run.directory / f"report-{source}"
    since = f"--since={time.time() - run.started + 5:.0f}s"
    result = report(*flags, f"--workload={WORKLOAD}", since, f"--out={out}")
    assert result.returncode == 0, result.stderr
    assert f"wrote {out / 'index.html'}" in result.stdout
    data: dict[str, Any] = json.loads((out / "report.json").read_text())
    return out, data


def in_chromium(out: Path, screenshot: Path) -> str:
    """Open the page as a person would; it must show no error, need nothing from outside and show every chart.
    The page's text, for what it must say."""
    pngs = sorted(out.glob("*.png"))
    with Chromium() as browser:
        visit = browser.open(out / "index.html")
        assert not visit.errors(), visit.errors()
        outside = [url for url in visit.requests if not url.startswith(("file:", "data:"))]
        assert not outside, f"the page is not self-contained: {outside}"
        images = browser.evaluate("Array.from(document.images).map(i => [i.complete, i.naturalWidth, i.alt])")
        assert len(images) == len(pngs) >= 5, images
        assert all(complete and width > 1000 for complete, width, _ in images), images
        text: str = browser.evaluate("document.body.innerText")
        browser.screenshot(screenshot)
    width, height = struct.unpack(">II", screenshot.read_bytes()[16:24])  # the PNG's IHDR
    assert width == 1280 and height > 2000, (width, height)
    print(f"screenshot: {screenshot}")
    return text


def test_a_report_from_prometheus_shows_the_run_and_its_alerts(run: Run, tmp_path: Path) -> None:
    out, data = made(run, "prometheus", f"--prometheus={run.prometheus}")
    steps = sum(isinstance(e, events.Step) for _, e in run.records)
    assert data["totals"]["step_count"] == steps
    assert {i["name"] for i in data["incidents"]} >= EXPECTED_ALERTS
    assert all(i["labels"].get("workload") in (WORKLOAD, None) for i in data["incidents"])
    assert any(not mark["ok"] for mark in data["checkpoints"]), "the failed saves are on the timeline"
    lost = next(s for s in data["goodput"] if s["name"] == "lost")
    assert max(lost["values"]) > 0, "the crash lost the steps after the last checkpoint"
    assert {s["name"] for s in data["phases"] if s["values"]} >= {"compute", "io"}
    text = in_chromium(out, tmp_path / "prometheus.png")
    assert f"tpuscope report: workload {WORKLOAD}" in text and AlertName.WORKLOAD_FAILED in text
    assert "estimated from the step histogram" in text


def test_a_report_from_the_recording_tells_the_same_story_without_prometheus(run: Run, tmp_path: Path) -> None:
    out, data = made(run, "recording", f"--recording={run.recording}")
    _, prometheus = made(run, "prometheus", f"--prometheus={run.prometheus}")
    assert data["totals"]["step_count"] == prometheus["totals"]["step_count"] > 0
    assert data["totals"]["failures"] == prometheus["totals"]["failures"] == {"other": 1}
    assert data["totals"]["restarts"] == prometheus["totals"]["restarts"] == {"resumed": 1}

    def failed_saves(report: dict[str, Any]) -> int:
        return sum(m["count"] for m in report["checkpoints"] if m["kind"] == "save" and not m["ok"])

    def backend_compiles(report: dict[str, Any]) -> int:
        return sum(m["count"] for m in report["compiles"] if m["kind"] == "backend")

    assert failed_saves(data) == failed_saves(prometheus) > 0
    assert backend_compiles(data) == backend_compiles(prometheus) > 0
    each_step = next(s for s in data["step_time"] if s["name"] == "each step")
    assert len(each_step["values"]) == data["totals"]["step_count"]
    names = {i["name"] for i in data["incidents"]}
    assert {"workload failure", "workload restart", "checkpoint saves failing"} <= names
    booked = {s["name"]: s["values"][-1] for s in data["goodput"]}
    assert booked["lost"] > 0 and booked["productive"] > 0
    text = in_chromium(out, tmp_path / "recording.png")
    assert "of every step" in text and "checkpoint saves failing" in text


def test_the_run_is_judged_by_the_teams_thresholds_from_the_config_the_generators_take(
    run: Run, short_tmp: Path
) -> None:
    """The same --config file as `tpuscope alerts` and `dashboards`: a team whose objective is 95 % gets a page
    that says 95 %, not the built-in 90 %."""
    team = short_tmp / "team.yaml"
    team.write_text("thresholds:\n  goodput_objective: 0.95\n")
    built_in = GeneratorConfig().thresholds.goodput_objective
    for source, flags, objective in (
        ("team", [f"--config={team}"], 0.95),
        ("built-in", [], built_in),
    ):
        out, _ = made(run, source, f"--recording={run.recording}", *flags)
        page = (out / "index.html").read_text()
        assert f"(objective {objective:.0%})" in page, f"{source}: {page[:2000]}"
    assert built_in != 0.95  # else the page could not tell the two apart

    wrong = short_tmp / "wrong.yaml"
    wrong.write_text("thresholds:\n  goodput_objective: 95\n")
    refused = report(f"--recording={run.recording}", f"--config={wrong}", f"--out={short_tmp / 'wrong'}")
    assert refused.returncode == 2 and f"tpuscope report: {wrong}: goodput_objective" in refused.stderr, refused.stderr
    assert not (short_tmp / "wrong").exists(), "nothing is written with a wrong config"


def test_bad_input_gets_a_clear_error(run: Run, short_tmp: Path) -> None:
    down = report("--prometheus=http://127.0.0.1:9", f"--workload={WORKLOAD}", f"--out={short_tmp / 'a'}")
    assert down.returncode == 1 and "cannot read Prometheus at http://127.0.0.1:9" in down.stderr, down.stderr
    unknown = report(f"--prometheus={run.prometheus}", "--workload=nobody", "--since=1h", f"--out={short_tmp}")
    assert unknown.returncode == 1 and f"workloads it has then: {WORKLOAD}" in unknown.stderr, unknown.stderr
    missing = report(f"--recording={short_tmp / 'none.jsonl'}")
    assert missing.returncode == 1 and "cannot read the recording" in missing.stderr
    assert report(f"--recording={run.recording}", "--since=soon").returncode == 2
    assert not list(short_tmp.glob("**/index.html")), "no report is written when the input is wrong"


def test_a_cut_line_in_a_recording_is_left_out_and_said(run: Run, short_tmp: Path) -> None:
    cut = short_tmp / "cut.jsonl"
    cut.write_text(run.recording.read_text() + '{"time": 1, "type": "step", "work')  # killed mid-write
    out = short_tmp / "out"
    made_it = report(f"--recording={cut}", f"--out={out}")
    assert made_it.returncode == 0, made_it.stderr
    data = json.loads((out / "report.json").read_text())
    assert data["totals"]["step_count"] == sum(isinstance(e, events.Step) for _, e in run.records)
    assert "1 line(s) of the recording could not be read" in data["incidents_note"]
    assert f"line {len(run.records) + 1}:" in data["incidents_note"]


def test_the_window_reads_rfc_3339_and_unix_times_and_fills_what_is_left_open() -> None:
    assert parse_time("2026-11-23T03:10:00Z") == parse_time("2026-11-23T03:10:00") == 1795403400.0
    assert parse_time("2026-11-23T04:10:00+01:00") == 1795403400.0
    assert parse_time("1795403400") == 1795403400.0
    with pytest.raises(ValueError, match="RFC 3339"):
        parse_time("yesterday")
    recording = Window()  # a recording's whole span
    assert recording.resolve(first=100.0, last=700.0) == (100.0, 700.0, 2.0)
    last_hour = Window.parse("1h", "1795403400")
    assert last_hour.resolve(first=0.0, last=1.0) == (1795403400.0 - 3600, 1795403400.0, 12.0)
    with pytest.raises(ValueError):
        Window.parse("0", None)


def test_a_workload_on_two_hosts_is_summed_and_a_restart_counted_once(short_tmp: Path) -> None:
    """Two sidecars (workers 0 and 1) of one workload: each step once, not twice; each restart once; the
    wall time of both workers booked."""
    require("prometheus")
    profile = synthetic.Profile(step_seconds=0.01, checkpoint_every=10, checkpoint_seconds=0)
    with (
        SidecarProcess(short_tmp / "w0.sock", "127.0.0.1:0", "--collectors=none", "--worker=0") as first,
        SidecarProcess(short_tmp / "w1.sock", "127.0.0.1:0", "--collectors=none", "--worker=1") as second,
        PrometheusServer(short_tmp / "prom", [target_of(first.url), target_of(second.url)]) as prom,
    ):
        started = time.time()
        for sidecar in (first, second):
            with Monitor("pair", socket=sidecar.socket, traces=False) as mon:
                mon.lifecycle("restart", reason="preemption")
                synthetic.run(mon, 40, profile)
        wait_for(
            lambda: len(prom.query(f'{catalog.STEPS.name}{{workload="pair"}} == 40')) == 2,
            30,
            "both ranks' 40 steps in Prometheus",
        )
        prom.catch_up()  # one more scrape: every last event is in Prometheus, not only the steps
        out = short_tmp / "out"
        result = report(
            f"--prometheus={prom.url}", "--workload=pair", f"--since={time.time() - started + 5:.0f}s", f"--out={out}"
        )
    assert result.returncode == 0, result.stderr
    data = json.loads((out / "report.json").read_text())
    assert data["totals"]["step_count"] == 40
    assert data["totals"]["restarts"] == {"preemption": 1}
    booked = sum(s["values"][-1] for s in data["goodput"])
    each_worker = 40 * 0.01
    assert booked > 2 * each_worker * 0.9, f"both workers' wall time is booked ({booked:.2f} s)"


# --- the device profiles, beside the host-timed phases -------------------------------------------------------
def profile(
    step: float, compute: float, exposed: float, overlapped: float, slowest: float, cost: float, size: int
) -> events.DeviceProfile:
    """A capture that measured ``step`` s a step: ``compute``, ``exposed`` collective and 0.01 s of idle."""
    return events.DeviceProfile(
        "ok", 2, 8, step, compute, exposed, overlapped, step - compute - exposed, slowest, cost, size
    )


def recorded(path: Path, profiles: dict[int, events.DeviceProfile]) -> Path:
    """20 steps of 100 ms a second apart, all compute as the host times them (one fused program); the steps
    ``profiles`` names carry a capture."""
    lines = [
        events.to_record(events.Step("fused", n, 0.1, compute_s=0.1, profile=profiles.get(n)), 1_795_000_000.0 + n)
        for n in range(20)
    ]
    path.write_bytes(b"".join(msgspec.json.encode(line) + b"\n" for line in lines))
    return path


def test_a_recording_with_device_profiles_reports_the_profiled_split_beside_the_phases(tmp_path: Path) -> None:
    """The mean of the two captures that measured (a busy one and a failed one counted, not averaged): a 110 ms
    step of 60 ms compute, 40 ms exposed collective and 10 ms idle, though the host timed it all as compute."""
    captures = {
        5: profile(0.10, 0.06, 0.03, overlapped=0.03, slowest=0.066, cost=0.3, size=1_000_000),
        9: events.DeviceProfile("busy"),
        12: events.DeviceProfile("error", capture_s=0.2),
        15: profile(0.12, 0.06, 0.05, overlapped=0.0, slowest=0.06, cost=0.5, size=2_000_000),
    }
    report = from_recording.build(recorded(tmp_path / "events.jsonl", captures), None, Window(), Thresholds())
    assert report.profile is not None
    p = report.profile
    assert (p.captures, p.busy, p.errors) == (2, 1, 1)
    assert p.step_seconds == pytest.approx(0.11)
    assert p.part_seconds == pytest.approx({"compute": 0.06, "exposed_collective": 0.04, "idle": 0.01})
    assert p.share("exposed_collective") == pytest.approx(0.04 / 0.11)
    # Ratios of sums over the four profiled steps, as the sidecar serves them (tpuscope.utilization).
    assert p.overlap == pytest.approx(0.06 / (0.06 + 0.16)) and p.imbalance == pytest.approx(0.252 / 0.24)
    assert p.capture_seconds == pytest.approx(1.0) and p.trace_bytes == 1_500_000
    assert p.latest == 1_795_000_015.0
    assert report.totals.phase_seconds["sync"] == 0  # the host-timed phases stay as the host timed them

    render.write(report, tmp_path / "out")
    page = (tmp_path / "out" / "index.html").read_text()
    assert "Where the time went (host-timed phases)</td><td>compute 100.0%, sync 0.0%" in page
    row = "Where the device time went (sampled device profiles)</td><td>"
    row += "compute 54.5%, exposed collective 36.4%, idle 9.1%"
    assert f'<tr class="bad"><td>{row} of a 110 ms profiled step' in page, "over the sync bound: in red"
    assert "collective overlap 27%, device imbalance 1.05; over the steps of 2 captures" in page
    assert "1 busy (another profiler was running), 1 failed" in page and "1.5 MB of trace each" in page
    assert '<section id="device-profile"><h2>Device profile: where the step&#x27;s device time went' in page
    assert "<h2>Host-timed phases: where a step&#x27;s time goes</h2>" in page


def test_a_recording_without_device_profiles_shows_none(tmp_path: Path) -> None:
    report = from_recording.build(recorded(tmp_path / "events.jsonl", {}), None, Window(), Thresholds())
    assert report.profile is None
    render.write(report, tmp_path / "out")
    page = (tmp_path / "out" / "index.html").read_text()
    assert "device-profile" not in page and "sampled device profiles" not in page
    assert "Where the time went (host-timed phases)" in page


def test_where_a_stalled_workloads_cores_sat_is_shown_the_odd_worker_in_red(tmp_path: Path) -> None:
    """From Prometheus a report holds each worker's TPU cores at each place while the workload stalled (the
    end-to-end run: tests/test_core_state.py); the page lists them, the worker elsewhere than its peers first and
    in red, and says so in the summary."""
    report = from_recording.build(recorded(tmp_path / "events.jsonl", {}), None, Window(), Thresholds())
    render.write(report, tmp_path / "calm")
    assert "stalled-cores" not in (tmp_path / "calm" / "index.html").read_text(), "no stall asked about, no section"

    def worker(w: str, hlo_location: str) -> StalledCores:
        elsewhere = hlo_location == "fusion.7"
        return StalledCores("0", w, f"h{w}:9478", "9c1f5e2a7b3d4c60", hlo_location, 300.0, elsewhere)

    report.stalled_cores = [worker("2", "fusion.7"), *(worker(w, "all-reduce.42") for w in ("0", "1", "3"))]
    render.write(report, tmp_path / "out")
    page = (tmp_path / "out" / "index.html").read_text()
    assert '<section id="stalled-cores"><h2>Where the TPU cores sat while the workload stalled</h2>' in page
    odd = "<td>0</td><td>2</td><td>h2:9478</td><td>9c1f5e2a7b3d4c60</td><td>fusion.7</td><td>5 min</td>"
    assert f'<tr class="bad">{odd}' in page
    assert page.count("<td>all-reduce.42</td>") == 3
    summary = "Where the TPU cores sat while it stalled</td><td>worker 2 (slice 0) at fusion.7 for 5 min"
    assert f'<tr class="bad"><td>{summary}' in page


SPIN = "fixup (job/fixup.py:12) < step (job/train.py:44)"
WAIT = "block_until_ready (jax/_src/api.py:2900) < step (job/train.py:40)"


def test_where_the_workers_were_stuck_is_shown_the_odd_worker_in_red(tmp_path: Path) -> None:
    """From Prometheus a report holds each position a worker's process was stuck at (below, from a Prometheus);
    the page lists them, the worker elsewhere than most first and in red, and the summary row is red: a process
    stuck past its limit is wrong wherever it is."""
    report = from_recording.build(recorded(tmp_path / "events.jsonl", {}), None, Window(), Thresholds())
    render.write(report, tmp_path / "calm")
    calm = (tmp_path / "calm" / "index.html").read_text()
    assert "stuck-positions" not in calm and "Where the workers were stuck" not in calm, "none stuck, no section"

    def worker(w: str, phase: str, frames: str) -> StuckPosition:
        t = 1_795_000_000.0
        return StuckPosition("0", w, f"h{w}:9478", "1200", phase, frames, t, t + 600, elsewhere=phase == "compute")

    report.stuck_positions = [worker("1", "compute", SPIN), *(worker(w, "sync", WAIT) for w in ("0", "2", "3"))]
    render.write(report, tmp_path / "out")
    page = (tmp_path / "out" / "index.html").read_text()
    assert '<section id="stuck-positions"><h2>Where the workers were stuck</h2>' in page
    odd = "<td>0</td><td>1</td><td>h1:9478</td><td>1200</td><td>compute</td><td>fixup (job/fixup.py:12) &lt; step"
    assert f'<tr class="bad">{odd}' in page
    assert page.count("<td>sync</td>") == 3 and "tpuscope hangs reads them" in page
    summary = "Where the workers were stuck</td><td>4 workers stuck past their limit; worker 1 (slice 0) at step 1200, "
    assert f'<tr class="bad"><td>{summary}compute, in fixup (job/fixup.py:12)' in page

    report.stuck_positions = [worker(w, "sync", WAIT) for w in ("0", "1")]
    render.write(report, tmp_path / "together")
    together = (tmp_path / "together" / "index.html").read_text()
    assert "2 workers stuck past their limit, all at step 1200, sync</td>" in together
    assert together.count('<tr class="bad"><td>0</td>') == 0, "nobody elsewhere: no row in red"


def test_a_report_from_prometheus_reads_where_the_workers_were_stuck(short_tmp: Path) -> None:
    """Four workers' sidecars: worker 3 stuck alone a while at step 1100 (nobody to compare with), later all four
    stuck at step 1200, worker 1 in compute while the others wait in sync: it alone is elsewhere than most."""
    at = (int(time.time()) // 3600 - 1) * 3600
    fleet = Fleet(at)
    for worker in range(4):
        labels = {**fleet.sidecar(f"w{worker}:9478", {}, "0", str(worker), -3600, 0), "workload": "hung"}
        fleet.counter(catalog.STEPS.name, labels, -3600, 0, {-3600: 1})
        odd = worker == 1
        where = {"step": "1200", "phase": "compute" if odd else "sync", "frames": SPIN if odd else WAIT}
        fleet.series(catalog.STUCK_POSITION.name, {**labels, **where}, -1790 if odd else -1800, -600, lambda t: 1)
        if worker == 3:
            alone = {"step": "1100", "phase": "io", "frames": "next (data.py:7)"}
            fleet.series(catalog.STUCK_POSITION.name, {**labels, **alone}, -3000, -2800, lambda t: 1)
    with backfilled(short_tmp, fleet) as api:
        report = prometheus.build(api.url, "hung", Window(3600, at), Thresholds())
    stuck = [(p.worker, p.step, p.phase, p.frames, p.elsewhere) for p in report.stuck_positions]
    assert stuck == [
        ("1", "1200", "compute", SPIN, True),
        ("3", "1100", "io", "next (data.py:7)", False),
        *((w, "1200", "sync", WAIT, False) for w in ("0", "2", "3")),
    ]
    first = report.stuck_positions[0]
    assert (first.instance, first.first) == ("w1:9478", at - 1785)  # the first point of the grid after it began
    assert at - 600 <= first.last <= at - 300  # its last sample, held for the lookback (no stale marker backfilled)


def serve_profiles(fleet: Fleet, labels: dict[str, str], figures: dict[int, dict[str, float]]) -> None:
    """A sidecar's profile gauges and counters from the first capture on: ``figures`` at each capture's time,
    0.3 s and 1 MB a capture."""
    first = min(figures)

    def latest(t: int) -> dict[str, float]:
        return figures[max(k for k in figures if k <= t)]

    def gauge(metric: catalog.Metric, value: Callable[[int], float], **extra: str) -> None:
        fleet.series(metric.name, {**labels, **extra}, first, 0, value)

    for part in catalog.PROFILE_PARTS:
        gauge(catalog.PROFILE_TIME, lambda t, part=part: latest(t)[part], part=part)
    gauge(catalog.PROFILE_STEP, lambda t: sum(latest(t)[part] for part in catalog.PROFILE_PARTS))
    gauge(catalog.PROFILE_OVERLAP, lambda t: latest(t)["overlap"])
    gauge(catalog.PROFILE_IMBALANCE, lambda t: latest(t)["imbalance"])
    gauge(catalog.PROFILE_LAST_CAPTURE, lambda t: fleet.at + max(k for k in figures if k <= t))
    ok = {k: n for n, k in enumerate(sorted(figures), 1)}
    fleet.counter(catalog.PROFILE_CAPTURES.name, {**labels, "result": "ok"}, first, 0, ok)
    fleet.counter(catalog.PROFILE_CAPTURE_SECONDS.name, labels, first, 0, {k: 0.3 * n for k, n in ok.items()})
    fleet.counter(catalog.PROFILE_CAPTURE_BYTES.name, labels, first, 0, {k: 1e6 * n for k, n in ok.items()})


def test_a_report_from_prometheus_reads_each_capture_of_each_worker_once(short_tmp: Path) -> None:
    """Two workers' sidecars served their profile gauges for two hours: a capture before the window (left out)
    and two in it, each read once though its gauges hold for 10 and 30 minutes; worker 0 also skipped one
    (busy). The mean of the 4 captures: 60 ms compute, 30 ms exposed collective, 10 ms idle of 100 ms."""
    at = (int(time.time()) // 3600 - 1) * 3600
    fleet = Fleet(at)
    before = {"compute": 0.1, "exposed_collective": 0.08, "idle": 0.02, "overlap": 0.9, "imbalance": 2.0}
    workers = [  # worker -> capture time -> figures
        {-2400: {"compute": 0.06, "exposed_collective": 0.03, "overlap": 0.5, "imbalance": 1.1}},
        {-2400: {"compute": 0.05, "exposed_collective": 0.04, "overlap": 0.4, "imbalance": 1.0}},
    ]
    workers[0][-600] = {"compute": 0.07, "exposed_collective": 0.02, "overlap": 0.6, "imbalance": 1.2}
    workers[1][-600] = {"compute": 0.06, "exposed_collective": 0.03, "overlap": 0.5, "imbalance": 1.1}
    for worker, captures in enumerate(workers):
        labels = {**fleet.sidecar(f"w{worker}:9478", {}, "0", str(worker), -7200, 0), "workload": "fused"}
        fleet.counter(catalog.STEPS.name, labels, -7200, 0, {-7200: 1})
        serve_profiles(fleet, labels, {-4000: before} | {t: {**f, "idle": 0.01} for t, f in captures.items()})
        if worker == 0:
            fleet.counter(catalog.PROFILE_CAPTURES.name, {**labels, "result": "busy"}, -1200, 0, {-1200: 1})
    with backfilled(short_tmp, fleet) as api:
        report = prometheus.build(api.url, "fused", Window(3600, at), Thresholds())
    p = report.profile
    assert p is not None
    assert (p.captures, p.busy, p.errors) == (4, 1, 0)
    assert p.step_seconds == pytest.approx(0.1)
    assert p.part_seconds == pytest.approx({"compute": 0.06, "exposed_collective": 0.03, "idle": 0.01})
    assert p.overlap == pytest.approx(0.5) and p.imbalance == pytest.approx(1.1)
    assert p.capture_seconds == pytest.approx(0.6), "the costliest worker's two captures in the window"
    assert p.trace_bytes == pytest.approx(1e6)
    assert p.latest == at - 600


def test_a_rollback_moves_the_steps_it_threw_away_from_productive_to_lost(tmp_path: Path) -> None:
    """Steps 0 to 7 of a second each, saves at 3 and 5, then a restore of step 3 after step 7: the recording's report
    books steps 4 and 5 (durable at the save of 5) as lost, as the recording rules do, and 6 and 7 as any restore."""
    t0 = 1_795_000_000.0
    records: list[tuple[float, events.AnyEvent]] = [(t0, events.Lifecycle("diverging", "start"))]
    for n in range(8):
        records.append((t0 + n + 1, events.Step("diverging", n, 1.0, compute_s=1.0)))
        if n in (3, 5):
            records.append((t0 + n + 1, events.Checkpoint("diverging", "save", 0.0, True, step=n, blocking_s=0.0)))
    records += [
        (t0 + 9, events.Checkpoint("diverging", "restore", 0.0, True, step=3)),
        (t0 + 10, events.Lifecycle("diverging", "stop")),
    ]
    path = tmp_path / "events.jsonl"
    path.write_bytes(b"".join(msgspec.json.encode(events.to_record(e, t)) + b"\n" for t, e in records))
    report = from_recording.build(path, None, Window(), Thresholds())
    final = {series.name: series.values[-1] for series in report.goodput}
    assert final["productive"] == pytest.approx(4.0) and final["lost"] == pytest.approx(4.0), final


def test_a_recording_with_custom_badput_lists_it_beside_the_fixed_categories(tmp_path: Path) -> None:
    """An eval of 4 s marked between steps 9 and 10 and a 1 s check marked after the last step: the report's goodput
    holds both, at 0 before their first booking, and the categories still add up to the wall time."""
    t0 = 1_795_000_000.0
    timeline: list[tuple[float, events.AnyEvent]] = [(t0, events.Lifecycle("marked", "start"))]
    for n in range(20):
        marked = (events.Badput("eval", 4.0),) if n == 10 else ()
        timeline.append((t0 + 1.0 + n + (4.0 if n >= 10 else 0.0), events.Step("marked", n, 1.0, 1.0, badput=marked)))
    timeline.append((t0 + 26.0, events.Lifecycle("marked", "stop", badput=(events.Badput("data_check", 1.0),))))
    path = tmp_path / "events.jsonl"
    path.write_bytes(b"".join(msgspec.json.encode(events.to_record(e, t)) + b"\n" for t, e in timeline))
    report = from_recording.build(path, None, Window(), Thresholds())
    booked = {series.name: series.values[-1] for series in report.goodput}
    expected = {"productive": 20.0, "eval": 4.0, "data_check": 1.0, "other": 1.0}  # other: the 1 s left at the end
    assert booked == pytest.approx({**dict.fromkeys(booked, 0.0), **expected})
    assert sum(booked.values()) == pytest.approx(26.0)
    eval_series = next(series for series in report.goodput if series.name == "eval")
    assert eval_series.times == report.goodput[0].times and eval_series.values[0] == 0.0
    render.write(report, tmp_path / "out")
    page = (tmp_path / "out" / "index.html").read_text()
    assert "eval 15.4%, data_check 3.8%" in page, "the Goodput row names them"
