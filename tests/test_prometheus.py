"""A real Prometheus scrapes a real sidecar while an instrumented loop runs; promtool lints /metrics."""

from __future__ import annotations

import socket
import subprocess
import threading
import urllib.request
from pathlib import Path

import pytest
from conftest import require
from otlp import Receiver

from tpuscope import catalog, events
from tpuscope.testing import prometheus as prometheus_harness
from tpuscope.testing.fake_device_plugin import FakeDevicePlugin, v5p_host
from tpuscope.testing.fake_nvml import FakeGpu, FakeNvmlState, environment
from tpuscope.testing.fake_tpu import Chip, FakeTpuRuntime, FakeTpuServer, default_megascale, hang_detected, slice_error
from tpuscope.testing.prometheus import PrometheusServer, target_of
from tpuscope.testing.waiting import scrape_until, wait_for
from tpuscope.tracing import Monitor
from tpuscope.workload import synthetic
from tpuscope.workload.sidecar import SidecarProcess

PROFILE = synthetic.Profile(step_seconds=0.04, checkpoint_every=20, checkpoint_seconds=0.02)


def test_prometheus_sees_the_step_rate_and_phases_that_add_up(sidecar: SidecarProcess, short_tmp: Path) -> None:
    require("prometheus")
    w = 'workload="e2e"'
    step_rate = f"sum(rate({catalog.STEPS.name}{{{w}}}[5s]))"
    phase_sum = f"sum by (phase) (rate({catalog.STEP_PHASE_DURATION.series('sum')}{{{w}}}[10s]))"
    step_sum = f"sum(rate({catalog.STEP_DURATION.series('sum')}{{{w}}}[10s]))"
    with PrometheusServer(short_tmp / "prom", [target_of(sidecar.url)]) as prom:
        with Monitor("e2e", socket=sidecar.socket) as monitor:
            stop = threading.Event()
            loop = threading.Thread(target=synthetic.run, args=(monitor, 1500, PROFILE), kwargs={"stop": stop})
            loop.start()

            def shares_adding_up() -> dict[str, float]:
                """Each phase's share of the step time, once Prometheus has a step rate and all four add up."""
                assert loop.is_alive(), "the loop ended before Prometheus saw its phases add up"
                total = prom.scalar(step_sum)
                if not prom.scalar(step_rate) or not total:
                    return {}
                shares = {r["metric"]["phase"]: float(r["value"][1]) / total for r in prom.query(phase_sum)}
                return shares if len(shares) == 4 and abs(sum(shares.values()) - 1) < 0.05 else {}

            try:
                # A query a second, as often as Prometheus scrapes: a tighter loop would only take the job's CPU.
                shares = wait_for(shares_adding_up, 60, "a step rate, and phases that add up", interval=1)
                assert prom.scalar('up{job="tpuscope"}') == 1
            finally:
                stop.set()
                loop.join()
        # Each phase lands under its own label: the shares are those the loop slept for.
        assert abs(shares["compute"] - PROFILE.compute_share) < 0.05, shares
        assert abs(shares["sync"] - PROFILE.sync_share) < 0.05, shares
        assert abs(shares["io"] - PROFILE.io_share) < 0.05, shares


def test_metrics_pass_promtool_check_metrics_with_every_collector_on(short_tmp: Path, fake_nvml_lib: Path) -> None:
    promtool = require("promtool")
    nvml = FakeNvmlState(short_tmp / "nvml.state", gpus=[FakeGpu(), FakeGpu()])
    nvml.xid(0, 79)
    nvml.write()
    receiver = Receiver()  # for the OTLP push, whose health is in the catalogue too
    otlp = {"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": receiver.endpoint, "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL": "grpc"}
    with (
        FakeTpuServer(
            FakeTpuRuntime([Chip(d) for d in range(8)], default_megascale(), {**hang_detected(), **slice_error()})
        ) as runtime,
        # GKE's TPU device plugin beside libtpu: libtpu's series win, the plugin adds TensorCore utilization.
        FakeDevicePlugin(v5p_host()) as device_plugin,
        SidecarProcess(
            short_tmp / "s.sock",
            "127.0.0.1:0",
            "--collectors=libtpu,gke-device-plugin,nvml,host",
            f"--libtpu-address={runtime.address}",
            f"--device-plugin-address={device_plugin.address}",
            # The job below stops stepping while connected: after a second the runtime is asked for its cores.
            "--core-state-after=1s",
            "--collector-interval=0.2",
            "--otlp-metrics=on",
            # Where this host is in a multi-host job, as a TPU VM says it: TPU_WORKER_ID before an Indexed
            # Job's completion index.
            env={
                **environment(fake_nvml_lib, nvml),
                **otlp,
                "MEGASCALE_SLICE_ID": "1",
                "TPU_WORKER_ID": "3",
                "JOB_COMPLETION_INDEX": "9",
            },
        ) as sidecar,
        Monitor("lint", socket=sidecar.socket) as mon,
    ):
        synthetic.run(mon, 12, synthetic.Profile(step_seconds=0.002, checkpoint_every=5, checkpoint_seconds=0))
        mon.compile_cache(hit=True)
        mon.lifecycle("restart", reason="preemption")
        mon.lifecycle("failure", reason="crash")
        mon.inference_batch(4, queue_depth=1, request_seconds=[0.01])
        mon.model_loaded("v7")
        mon.recompile("input_types")
        mon.emit(events.CompileFailure("lint", "backend", "unsupported"))
        # A step carrying a device profile, as the Monitor sends one after a capture (tests/test_profiles.py).
        profile = events.DeviceProfile("ok", 2, 8, 0.03, 0.015, 0.005, 0.002, 0.01, 0.02, 0.3, 250_000, period_s=600.0)
        mon.emit(events.Step("lint", 13, 0.03, compute_s=0.03, profile=profile))
        # Steps' losses, as s.loss sends them: enough for a baseline, and a local value gone NaN.
        losses = tuple(events.StepValues(n, 2.0 + n / 100, 1.0, 1.0 if n < 20 else "nan") for n in range(21))
        mon.emit(events.Step("lint", 14, 0.03, compute_s=0.03, values=losses))
        mon.lifecycle("stop")  # ended cleanly: its end time
        Monitor("lint-down", socket=sidecar.socket).close(failed=True)  # down since its failure
        # Every family of the catalogue has samples, so promtool sees every metric.
        scrape = scrape_until(sidecar.url, lambda s: all(f"\n{m.name}" in s.text for m in catalog.CATALOG))
        for collector in ("libtpu", "gke-device-plugin", "nvml", "host"):
            assert scrape.value(catalog.COLLECTOR_UP.name, collector=collector) == 1, sidecar.log()
        with urllib.request.urlopen(sidecar.url) as r:
            exposition = r.read()
    receiver.stop()
    # Every series carries the host's slice and worker, the sidecar's own process_* and python_* too.
    assert scrape.samples and all(
        (sample.labels.get("slice"), sample.labels.get("worker")) == ("1", "3") for sample in scrape.samples
    )
    for metric in catalog.CATALOG:
        assert f"\n{metric.name}".encode() in exposition, metric.name
    result = subprocess.run([promtool, "check", "metrics"], input=exposition, capture_output=True, timeout=30)
    assert result.returncode == 0 and not result.stdout.strip() and not result.stderr.strip(), (
        result.stdout.decode() + result.stderr.decode()
    )


def test_a_server_whose_port_was_taken_before_it_bound_starts_on_another(
    short_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The harness asks for a free port, then starts the server on it: a process beside may take it between the two.
    Here the first port it is given is held; Prometheus cannot bind it, and the harness starts it on the next."""
    require("prometheus")
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        ports = iter([taken, prometheus_harness.free_port()])
        monkeypatch.setattr(prometheus_harness, "free_port", lambda: next(ports))
        with PrometheusServer(short_tmp / "prom", []) as prom:
            assert prom.port != taken
            assert prom.query("vector(1)")[0]["value"][1] == "1"
