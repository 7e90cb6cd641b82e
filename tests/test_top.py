"""``tpuscope top`` against a real sidecar (and a real Prometheus for the alerts), read off the screen."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import require
from rich.console import Console

from tpuscope import catalog, top
from tpuscope.conventions import DEFAULT_PORT
from tpuscope.scrape import Scrape
from tpuscope.testing.fake_tpu import Chip, FakeTpuRuntime, FakeTpuServer, default_megascale
from tpuscope.testing.prometheus import PrometheusServer, free_port
from tpuscope.testing.waiting import scrape_until, wait_for
from tpuscope.tracing import Monitor
from tpuscope.workload import synthetic
from tpuscope.workload.sidecar import SidecarProcess

PROFILE = synthetic.Profile(step_seconds=0.01, checkpoint_every=10, checkpoint_seconds=0)


@pytest.fixture
def sidecar(short_tmp: Path) -> Iterator[SidecarProcess]:
    """A sidecar reading a TPU runtime of two chips at 30 % duty cycle, as worker 3 of slice 1."""
    chips = [Chip(d, duty_cycle_percent=30.0) for d in range(2)]
    with (
        FakeTpuServer(FakeTpuRuntime(chips, default_megascale())) as tpu,
        SidecarProcess(
            short_tmp / "top.sock",
            "127.0.0.1:0",
            "--collectors=libtpu",
            f"--libtpu-address={tpu.address}",
            "--collector-interval=0.2",
            "--slice=1",
            "--worker=3",
        ) as process,
    ):
        wait_for(
            lambda: Scrape.fetch(process.url).has(catalog.DUTY_CYCLE.name),
            20,
            "Scrape.fetch(process.url).has(catalog.DUTY_CYCLE.name)",
        )
        yield process


def screen(*renderables: object) -> str:
    """What a 160-column terminal shows."""
    console = Console(record=True, width=160, force_terminal=True, color_system="truecolor")
    for renderable in renderables:
        console.print(renderable)
    return console.export_text()


def top_once(*where: str) -> subprocess.CompletedProcess[str]:
    """``tpuscope top --once [WHERE]``, as a user types it, on a 160-column terminal."""
    return subprocess.run(
        [sys.executable, "-m", "tpuscope", "top", "--once", "--refresh=0.5", *where],
        capture_output=True,
        text=True,
        timeout=60,
        env={"COLUMNS": "160", "PATH": "/usr/bin:/bin"},
    )


def row_of(workload: str, text: str) -> list[str]:
    line = next(line for line in text.splitlines() if line.startswith(f"│ {workload} "))
    return [cell.strip() for cell in line.split("│")[1:-1]]


@pytest.mark.parametrize("form", ["url", "host:port", "localhost:port"])
def test_once_prints_devices_workloads_and_where_the_host_is(form: str, sidecar: SidecarProcess) -> None:
    port = sidecar.url.removesuffix("/metrics").rsplit(":", 1)[1]
    where = {"url": sidecar.url, "host:port": f"127.0.0.1:{port}", "localhost:port": f"localhost:{port}"}[form]
    with Monitor("llm", socket=sidecar.socket, traces=False) as mon:
        synthetic.run(mon, 30, PROFILE)
    wait_for(
        lambda: Scrape.fetch(sidecar.url).value(catalog.STEPS.name, workload="llm") == 30,
        20,
        'Scrape.fetch(sidecar.url).value(catalog.STEPS.name, workload="llm") == 30',
    )
    out = top_once(where)
    assert out.returncode == 0, out.stdout + out.stderr
    text = out.stdout
    assert float(row_of("llm", text)[1]) == 0, text  # a rate from two scrapes: the job has finished
    assert "slice 1  worker 3" in text
    libtpu_rows = [line for line in text.splitlines() if "libtpu" in line]
    assert len(libtpu_rows) == 2 and all("30%" in row for row in libtpu_rows), text  # the chips' duty cycle
    llm = next(line for line in text.splitlines() if line.startswith("│ llm"))
    assert " ms " in llm and "ago" in llm, llm  # step time, last checkpoint
    assert "compute" in text and "sync" in text and "io" in text
    assert "Alerts: not shown" in text
    assert "used / limit" in text  # every column of the devices table says what it is


def test_once_with_no_address_reads_the_default_port(short_tmp: Path) -> None:
    """Bare `tpuscope top`, the README's command: the sidecar's default --listen is localhost:9478."""
    socket = short_tmp / "default.sock"
    with (
        SidecarProcess(socket, f"localhost:{DEFAULT_PORT}", "--collectors=none"),  # serve's own default
        Monitor("bare", socket=socket, traces=False) as mon,
    ):
        done = threading.Event()

        def steps() -> None:
            n = 0
            while not done.is_set():
                with mon.step(n):
                    time.sleep(0.01)
                n += 1

        stepping = threading.Thread(target=steps)
        stepping.start()
        try:
            out = top_once()  # both scrapes while the job steps: a rate above 0
        finally:
            done.set()
            stepping.join()
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"tpuscope top — http://localhost:{DEFAULT_PORT}/metrics" in out.stdout
    assert float(row_of("bare", out.stdout)[1]) > 0, out.stdout


def test_the_live_view_rates_steps_and_says_when_the_sidecar_goes_away(sidecar: SidecarProcess) -> None:
    source, alerts = top.Source(sidecar.url), top.Alerts()
    frames = top.frames(source, alerts, refresh=0.5)
    with Monitor("live", socket=sidecar.socket, traces=False) as mon:
        before_first = time.time()
        first = screen(next(frames))
        after_first = time.time()
        synthetic.run(mon, 40, PROFILE)
        scrape_until(sidecar.url, lambda s: s.value(catalog.STEPS.name, workload="live") == 40)
        before_second = time.time()
        second = screen(next(frames))
        after_second = time.time()
    # One scrape gives no rate. (The row is there or not, as the Monitor's first event beat the scrape or not.)
    assert all(line.split("│")[2].strip() == "-" for line in first.splitlines() if line.startswith("│ live"))
    row = next(line for line in second.splitlines() if line.startswith("│ live"))
    steps_per_second = float(row.split("│")[2])
    # 40 steps between the two scrapes, taken within the test's own stamps (the rate is shown to 0.1).
    assert 40 / (after_second - before_first) - 0.05 <= steps_per_second <= 40 / (before_second - after_first) + 0.05
    sidecar.stop()
    third = screen(next(frames))
    assert "SIDECAR UNREACHABLE" in third
    assert "old" in third and "│ live" in third, "the last figures stay on screen, marked with their age"


def test_a_sidecar_that_never_answered_exits_1_with_a_clear_line(short_tmp: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "tpuscope", "top", "--once", f"127.0.0.1:{free_port()}"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 1
    assert "SIDECAR UNREACHABLE" in out.stdout and "No data yet" in out.stdout


def test_firing_tpuscope_alerts_come_from_prometheus(sidecar: SidecarProcess, short_tmp: Path) -> None:
    require("prometheus")
    rules = short_tmp / "rules.yml"
    rules.write_text(
        "groups:\n- name: t\n  rules:\n"
        "  - alert: TpuscopeStraggler\n    expr: vector(1)\n    labels: {severity: warning, worker: '3'}\n"
        "  - alert: SomeoneElses\n    expr: vector(1)\n"
    )
    with PrometheusServer(short_tmp / "prom", [], rule_files=[rules]) as prom:
        alerts = top.Alerts(prom.url)

        def firing() -> bool:
            alerts.read(2.0)
            return bool(alerts.firing)

        wait_for(firing, 30, "firing")
        text = screen(top.alerts_view(alerts))
    assert "Alerts firing: 1" in text and "TpuscopeStraggler" in text and "worker=3" in text
    assert "SomeoneElses" not in text
    alerts.read(1.0)  # Prometheus is gone now
    assert "Prometheus unreachable" in screen(top.alerts_view(alerts))
