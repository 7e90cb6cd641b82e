"""``--otlp-metrics on``: the sidecar pushes what /metrics serves to real OTLP receivers (gRPC and HTTP)."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.resources import Resource
from otlp import HttpReceiver, Receiver, as_prometheus
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily

from tpuscope import catalog
from tpuscope.exporter.otlp_push import StartTimes, metrics_data
from tpuscope.scrape import Scrape
from tpuscope.testing.fake_tpu import Chip, Distribution, FakeTpuRuntime, FakeTpuServer, default_megascale
from tpuscope.testing.waiting import scrape_until, wait_for
from tpuscope.tracing import Monitor
from tpuscope.workload.sidecar import SidecarProcess

PUSHES = catalog.OTLP_PUSHES.name
# Series that change between a scrape and the next push even when nothing happens.
CHANGING = {PUSHES, catalog.COLLECTOR_DURATION.name}


def push_env(protocol: str, **endpoint: str) -> dict[str, str]:
    """The standard variables for a push every 200 ms; ``endpoint`` names the endpoint variable to set."""
    return {
        **endpoint,
        "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL": protocol,
        "OTEL_METRIC_EXPORT_INTERVAL": "200",
        "OTEL_EXPORTER_OTLP_METRICS_TIMEOUT": "1",
        "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment.name=test",
    }


def pushing_sidecar(tmp: Path, protocol: str, *flags: str, **endpoint: str) -> SidecarProcess:
    """A sidecar pushing every 200 ms; ``flags`` default to no collectors."""
    flags = flags or ("--collectors", "none")
    return SidecarProcess(
        tmp / "events.sock", "127.0.0.1:0", "--otlp-metrics", "on", *flags, env=push_env(protocol, **endpoint)
    )


def run_job(sidecar: SidecarProcess) -> None:
    with Monitor("pushed", socket=sidecar.socket, traces=False) as mon:
        for step in range(20):
            with mon.step(step) as s:
                with s.phase("io"):
                    time.sleep(0.001)
                with s.phase("compute"):
                    time.sleep(0.002 if step != 7 else 0.03)
        with mon.checkpoint("save", step=19) as ckpt:
            ckpt.bytes = 4096
        for stage in ("tracing", "lowering", "backend"):
            mon.compile(stage, 0.02, function="train_step")


def tpuscope_samples(scrape: Scrape) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """The scrape's own series (not prometheus_client's process_*/python_*), with ``le`` as a float's repr."""
    samples = {}
    for s in scrape.samples:
        if s.name.startswith(catalog.PREFIX) and not any(s.name.startswith(c) for c in CHANGING):
            labels = {k: repr(float(v)) if k == "le" else v for k, v in s.labels.items()}
            samples[(s.name, frozenset(labels.items()))] = s.value
    return samples


def the_push_after(receiver: Any) -> Any:
    """The first request that began after the scrape (two pushes on: one may have straddled it)."""
    count = len(receiver.metrics_requests)
    wait_for(lambda: len(receiver.metrics_requests) >= count + 2, 20, "two more pushes")
    return receiver.metrics_requests[count + 1]


def test_grpc_push_carries_exactly_what_is_scraped_including_sampled_histograms(short_tmp: Path) -> None:
    receiver = Receiver()
    chip = Chip(0, duty_cycle_percent=40.0, hlo_timing=Distribution([1, 4, 0, 2], scale=100.0, growth=2.0, mean=300.0))
    with (
        FakeTpuServer(FakeTpuRuntime([chip], default_megascale())) as tpu,
        pushing_sidecar(
            short_tmp,
            "grpc",
            "--collectors=libtpu",
            "--collector-interval=0.2",
            f"--libtpu-address={tpu.address}",
            "--slice=2",
            "--worker=5",
            OTEL_EXPORTER_OTLP_METRICS_ENDPOINT=receiver.endpoint,
        ) as sidecar,
    ):
        run_job(sidecar)
        scrape = scrape_until(
            sidecar.url,
            lambda s: (
                s.value(catalog.CHECKPOINT_BYTES.name) == 4096
                and (s.value(catalog.COMPILE_DURATION.series("count")) or 0) >= 3
                and s.value(catalog.COLLECTOR_UP.name, collector="libtpu") == 1
                # The job has gone, and the sidecar knows it: a loaded machine can scrape before the sidecar sees
                # the connection close, and push after (a fresh-clone CI saw its process count scraped, not pushed).
                and not s.has(catalog.WORKLOAD_PROCESSES.name, workload="pushed")
            ),
        )
        request = the_push_after(receiver)
    receiver.stop()

    resource, pushed = as_prometheus(request)
    assert resource["service.name"] == "tpuscope"
    assert resource["service.instance.id"].endswith(":" + sidecar.url.split(":")[-1].split("/")[0])
    assert resource["deployment.environment.name"] == "test"  # OTEL_RESOURCE_ATTRIBUTES is honoured
    expected = tpuscope_samples(scrape)
    # Every point carries the host's slice and worker, as every scraped series does.
    assert expected[(catalog.STEPS.name, frozenset({("workload", "pushed"), ("slice", "2"), ("worker", "5")}))] == 20
    assert any(name == catalog.HLO_EXECUTION_DURATION.series("bucket") for name, _ in expected)  # sampled, too
    missing = {k: v for k, v in expected.items() if k not in pushed}
    assert not missing, f"scraped but not pushed: {sorted(missing)[:5]}"
    different = {k: (v, pushed[k]) for k, v in expected.items() if pushed[k] != v}
    assert not different, f"scraped vs pushed: {different}"

    # OTLP's own types and units, which a collector maps back to the same Prometheus names.
    metrics = {m.name: m for scope in request.resource_metrics[0].scope_metrics for m in scope.metrics}
    steps = metrics[catalog.STEPS.name]
    assert steps.sum.is_monotonic and steps.sum.aggregation_temporality == 2  # CUMULATIVE
    duration = metrics[catalog.STEP_DURATION.name]
    assert duration.unit == "s" and duration.histogram.aggregation_temporality == 2
    assert list(duration.histogram.data_points[0].explicit_bounds) == list(catalog.STEP_DURATION.buckets)
    assert metrics[catalog.CHECKPOINT_BYTES.name].unit == "By"
    assert (
        metrics[catalog.DUTY_CYCLE.name].unit == "1" and metrics[catalog.DUTY_CYCLE.name].WhichOneof("data") == "gauge"
    )
    # Cumulative points start when the sidecar did, before every point's time.
    point = steps.sum.data_points[0]
    assert 0 < point.start_time_unix_nano < point.time_unix_nano


def test_http_push_uses_the_standard_path_and_counts_its_results(short_tmp: Path) -> None:
    receiver = HttpReceiver()
    with pushing_sidecar(short_tmp, "http/protobuf", OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint) as sidecar:
        run_job(sidecar)
        scrape = scrape_until(sidecar.url, lambda s: (s.value(PUSHES, result="ok") or 0) >= 3)
        sidecar.stop()
    receiver.stop()
    assert scrape.present(PUSHES, result="error") == 0
    assert set(receiver.paths) == {"/v1/metrics"}  # the signal's path, appended to the base endpoint
    # The push made at shutdown holds the whole job, whatever the interval had reached.
    _, last = as_prometheus(receiver.metrics_requests[-1])
    # A sidecar told nothing of its place is slice 0, worker 0.
    assert last[(catalog.STEPS.name, frozenset({("workload", "pushed"), ("slice", "0"), ("worker", "0")}))] == 20


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_an_absent_collector_is_counted_logged_once_and_retried_until_it_appears(short_tmp: Path) -> None:
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    with pushing_sidecar(short_tmp, "grpc", OTEL_EXPORTER_OTLP_METRICS_ENDPOINT=endpoint) as sidecar:
        failing = scrape_until(sidecar.url, lambda s: (s.value(PUSHES, result="error") or 0) >= 2)
        assert failing.present(PUSHES, result="error") >= 2 and failing.present(PUSHES, result="ok") == 0
        receiver = Receiver(port)  # the collector comes up where the sidecar was told to look
        try:
            recovered = scrape_until(sidecar.url, lambda s: (s.value(PUSHES, result="ok") or 0) >= 1)
            assert recovered.present(PUSHES, result="ok") >= 1
            wait_for(lambda: len(receiver.metrics_requests) >= 1, 20, "push after the recovery")
        finally:
            sidecar.stop()
            receiver.stop()
        log = sidecar.log()
    assert log.count("OTLP metrics push failing") == 1, log  # one line per change of state, not per push
    assert log.count("OTLP metrics push working") == 1, log


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        ({"OTEL_METRIC_EXPORT_INTERVAL": "soon"}, "OTEL_METRIC_EXPORT_INTERVAL"),
        ({"OTEL_EXPORTER_OTLP_METRICS_PROTOCOL": "http/json"}, "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL"),
        ({"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_EXPORTER_OTLP_TIMEOUT": "abc"}, "cannot push metrics over OTLP"),
    ],
)
def test_bad_otlp_settings_are_a_clear_error_that_leaves_nothing_behind(
    settings: dict[str, str], named: str, short_tmp: Path
) -> None:
    events_socket = short_tmp / "events.sock"
    with pytest.raises(RuntimeError) as refused:
        SidecarProcess(events_socket, "127.0.0.1:0", "--otlp-metrics", "on", env=settings, timeout=10)
    assert named in str(refused.value) and "exited with" in str(refused.value), refused.value
    assert not events_socket.exists()


def test_a_counter_that_goes_down_starts_its_series_again() -> None:
    """A job restarted (its counters from zero): the point's start moves, so deltas are never negative."""

    class Restarting:
        values = iter([5.0, 2.0, 3.0])

        def collect(self) -> Iterator[CounterMetricFamily]:
            family = CounterMetricFamily("tpuscope_restarting", "A counter whose source restarts.", labels=["pid"])
            family.add_metric(["7"], next(self.values))
            yield family

    registry = CollectorRegistry()
    registry.register(Restarting())
    starts = StartTimes(origin_ns=100)
    resource = Resource.create({})

    def start_of_push(now_ns: int) -> int:
        data = metrics_data(registry.collect(), resource, starts, now_ns)
        (metric,) = data.resource_metrics[0].scope_metrics[0].metrics
        assert metric.name == "tpuscope_restarting_total"
        return int(metric.data.data_points[0].start_time_unix_nano)

    assert start_of_push(1_000) == 100  # the sidecar's start
    assert start_of_push(2_000) == 2_000  # 5 -> 2: counting began again
    assert start_of_push(3_000) == 2_000  # 2 -> 3: the same run of the counter
