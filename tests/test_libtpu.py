"""The libtpu collector against a real gRPC server speaking the TPU runtime's metrics protocol.

The server (tpuscope.testing.fake_tpu) is built on tpu-info's generated stubs;
tpu-info's own client reads it first, so the collector is tested against what
the real runtime's reference client accepts, not against our own idea of it.
"""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.openmetrics.exposition import generate_latest
from tpu_info import device as tpu_device
from tpu_info import metrics as tpu_metrics
from tpu_info.proto import tpu_metric_service_pb2 as pb

from tpuscope import catalog
from tpuscope.exporter.collectors import libtpu
from tpuscope.exporter.collectors.base import CollectorError, Settings
from tpuscope.exporter.samples import Histogram, Sample, SampleStore
from tpuscope.scrape import Scrape
from tpuscope.testing.fake_tpu import (
    DELIVERY_RATE,
    DUTY_CYCLE,
    HBM_USED,
    MEGASCALE,
    MEGASCALE_SIZES,
    UNKNOWN_NAMES,
    V5P_HOST,
    Chip,
    Distribution,
    FakeTpuRuntime,
    FakeTpuServer,
    MegascaleValue,
    default_megascale,
    hang_detected,
    slice_error,
)
from tpuscope.testing.waiting import scrape_until
from tpuscope.workload.sidecar import SidecarProcess

UP = catalog.COLLECTOR_UP.name
ERRORS = catalog.COLLECTOR_ERRORS.name


def chips(first: int, n: int) -> list[Chip]:
    """Distinct values per device, so a value under the wrong device label fails the test."""
    return [
        Chip(
            d,
            duty_cycle_percent=5.0 + 10 * d,
            hbm_used=(d + 1) << 30,
            hbm_total=16 << 30,
            hbm_bandwidth_percent=2.0 * d,
            idle_seconds=0.5 * d,
            queue_size=d,
            hlo_timing=Distribution([d, 1, 2, 3, 0], scale=100.0, growth=2.0, mean=300.0),
        )
        for d in range(first, first + n)
    ]


@pytest.fixture
def two_ports() -> Iterator[tuple[FakeTpuServer, FakeTpuServer]]:
    """A multi-process host: devices 0-3 on one port, 4-7 on another, megascale on both."""
    with (
        FakeTpuServer(FakeTpuRuntime(chips(0, 4), default_megascale())) as a,
        FakeTpuServer(FakeTpuRuntime(chips(4, 4), default_megascale())) as b,
    ):
        yield a, b


def libtpu_sidecar(socket: Path, *addresses: str) -> SidecarProcess:
    return SidecarProcess(
        socket,
        "127.0.0.1:0",
        "--collectors=libtpu",
        f"--libtpu-address={','.join(addresses)}",
        "--collector-interval=0.2",
        "--collector-deadline=0.5",
        "--log-level=debug",
    )


def test_the_fake_runtime_answers_tpu_infos_own_client(two_ports: tuple[FakeTpuServer, FakeTpuServer]) -> None:
    for server in two_ports:
        scripted = server.runtime.chips
        usage = tpu_metrics.get_chip_usage(tpu_device.TpuChip.V5E, server.address)
        assert [(u.device_id, u.memory_usage, u.total_memory, u.duty_cycle_pct) for u in usage] == [
            (c.device, c.hbm_used, c.hbm_total, c.duty_cycle_percent) for c in scripted
        ]
        assert tpu_metrics.get_runtime_hbm_utilization(server.address) == [
            (c.device, c.hbm_bandwidth_percent) for c in scripted
        ]
        assert tpu_metrics.get_tensorcore_idle_duration(server.address) == [
            (c.device, c.idle_seconds) for c in scripted
        ]
        # The HLO metrics carry the process's own device ordinal: the second port's chips 4 to 7 are its 0 to 3.
        queues = tpu_metrics.get_hlo_queue_size(tpu_device.TpuChip.V5E, server.address)
        assert [(q.device_id, q.queue_size) for q in queues] == [(n, c.queue_size) for n, c in enumerate(scripted)]
        timings = tpu_metrics.get_hlo_exec_timing(tpu_device.TpuChip.V5E, server.address)
        assert [(t.device_id, t.mean) for t in timings] == [(n, 300.0) for n, _ in enumerate(scripted)]
        # tpu-info groups a megascale family's values by size (the first attribute, where no `buffer-size` key
        # is) and sums the kinds of a size: one row per size, as tpuscope serves them.
        latencies = tpu_metrics.get_transfer_latency("collective_e2e_latency", server.address)
        assert sorted(d.transfer_size for d in latencies) == sorted(MEGASCALE_SIZES)
        assert all(0 < d.p50 <= d.p90 <= d.p999 for d in latencies)


def test_every_runtime_metric_reaches_metrics_per_device(
    two_ports: tuple[FakeTpuServer, FakeTpuServer], short_tmp: Path
) -> None:
    a, b = two_ports
    with libtpu_sidecar(short_tmp / "s.sock", a.address, b.address) as sidecar:
        scrape = scrape_until(sidecar.url, lambda s: s.value(UP, collector="libtpu") == 1)
        assert scrape.value(UP, collector="libtpu") == 1, sidecar.log()
    source = {"source": "libtpu"}
    for chip in [*a.runtime.chips, *b.runtime.chips]:
        d = {"device": str(chip.device)}
        assert scrape.value(catalog.DUTY_CYCLE.name, **d, **source) == pytest.approx(chip.duty_cycle_percent / 100)
        assert scrape.value(catalog.DEVICE_MEMORY_USED.name, **d, **source) == chip.hbm_used
        assert scrape.value(catalog.DEVICE_MEMORY_LIMIT.name, **d, **source) == chip.hbm_total
        bandwidth = scrape.value(catalog.MEMORY_BANDWIDTH_UTILIZATION.name, **d, **source)
        assert bandwidth == pytest.approx(chip.hbm_bandwidth_percent / 100)
        assert scrape.value(catalog.TENSORCORE_IDLE.name, **d) == chip.idle_seconds
        assert scrape.value(catalog.HLO_QUEUE_SIZE.name, **d) == chip.queue_size
        # The runtime's own bounds (100 us, doubling), in seconds; counts cumulative; the underflow below 100 us.
        buckets = {s.labels["le"]: s.value for s in scrape.find(catalog.HLO_EXECUTION_DURATION.series("bucket"), **d)}
        n = chip.device
        assert buckets == {
            "0.0001": n,
            "0.0002": n + 1,
            "0.0004": n + 3,
            "0.0008": n + 6,
            "+Inf": n + 6,
        }
        assert scrape.value(catalog.HLO_EXECUTION_DURATION.series("count"), **d) == n + 6
        assert scrape.value(catalog.HLO_EXECUTION_DURATION.series("sum"), **d) == pytest.approx(300e-6 * (n + 6))
    # Megascale comes per host, not per device: every value of a size (each kind, each port) adds up.
    operations = {s.labels["operation"] for s in scrape.find(catalog.MEGASCALE_LATENCY.series("count"))}
    assert len(operations) == len(MEGASCALE) == 7
    values = [v for v in default_megascale()[MEGASCALE[0]] if v.attributes["buffer_size"] == "8MB+"]
    assert len(values) == 2, "grpc and rdma"
    count = catalog.MEGASCALE_LATENCY.series("count")
    assert scrape.value(count, operation="dcn_transfer", buffer_size="8MB+") == 2 * sum(
        sum(v.distribution.counts) for v in values
    )
    le = scrape.find(catalog.MEGASCALE_LATENCY.series("bucket"), operation="dcn_transfer", buffer_size="8MB+")
    bounds = [s.labels["le"] for s in le]
    assert bounds[0] == "1e-05" and bounds[-1] == "+Inf" and len(bounds) == values[0].distribution.num_finite + 2


def wait_state(url: str, up: int, reason: str | None = None, after: float = 0.0) -> Scrape:
    """Until collector_up is `up` (and, going down, the reason's error count has passed `after`)."""

    def reached(s: Scrape) -> bool:
        errors_ok = reason is None or s.present(ERRORS, collector="libtpu", reason=reason) > after
        return s.value(UP, collector="libtpu") == up and errors_ok

    scrape = scrape_until(url, reached)
    assert reached(scrape), f"libtpu never reached up={up} ({reason})"
    return scrape


def test_faults_mark_the_collector_down_with_a_reason_and_it_recovers(short_tmp: Path) -> None:
    runtime = FakeTpuRuntime(chips(0, 8), default_megascale())
    server = FakeTpuServer(runtime).start()
    port = server.port
    server.stop()  # down before the sidecar starts
    try:
        with libtpu_sidecar(short_tmp / "s.sock", server.address) as sidecar:
            # 1. Nothing listening at start: the sidecar serves anyway, libtpu down and saying why.
            scrape = wait_state(sidecar.url, 0, "unavailable")
            assert not scrape.has(catalog.DUTY_CYCLE.name)
            with urllib.request.urlopen(sidecar.url.replace("/metrics", "/healthz")) as r:
                assert r.status == 200
            server.start()
            assert server.port == port
            wait_state(sidecar.url, 1)

            # 2. Killed mid-run: down, and the device series go rather than freeze at their last values.
            errors = Scrape.fetch(sidecar.url).present(ERRORS, collector="libtpu", reason="unavailable")
            server.stop()
            # The first failed collection may have begun before the stop, and serves what it read by then (a
            # partial answer is fresh); the one after it began with the server gone.
            scrape = wait_state(sidecar.url, 0, "unavailable", after=errors + 1)
            assert not scrape.has(catalog.DUTY_CYCLE.name)
            server.start()
            assert wait_state(sidecar.url, 1).has(catalog.DUTY_CYCLE.name)

            # 3. Hanging past the deadline: down with `deadline`, while /metrics keeps answering.
            runtime.mode = "hang"
            wait_state(sidecar.url, 0, "deadline")
            runtime.mode = "ok"
            runtime.release.set()
            wait_state(sidecar.url, 1)
            runtime.release.clear()

            # 4. A runtime that offers only metrics we do not know (a renamed set in a new libtpu).
            runtime.mode = "unknown_names"
            wait_state(sidecar.url, 0, "unknown_metrics")
            runtime.mode = "ok"
            wait_state(sidecar.url, 1)
            log = sidecar.log()
    finally:
        server.stop()
    # One log line per change of state, not one per failed try.
    assert log.count("collector libtpu: down (unavailable)") == 2, log
    assert log.count("collector libtpu: down (deadline)") == 1, log
    assert log.count("collector libtpu: down (unknown_metrics)") == 1, log
    assert log.count("collector libtpu: up") == 4, log


def test_addresses_come_from_tpu_runtime_metrics_ports_else_every_port_the_device_plugin_may_set() -> None:
    assert libtpu.addresses_from_environment({"TPU_RUNTIME_METRICS_PORTS": "8431, 8432"}) == (
        "localhost:8431",
        "localhost:8432",
    )
    # GKE's TPU device plugin gives a TPU container 8431 to 8438 on an 8-chip host (acceleratorCountToMetricsPorts);
    # the sidecar holds no chips, so it gets none, and reads them all.
    assert libtpu.addresses_from_environment({}) == tuple(f"localhost:{port}" for port in range(8431, 8439))


@pytest.mark.parametrize(
    ("options", "bounds"),
    [
        ({"exponential_buckets": {"num_finite_buckets": 2, "growth_factor": 10.0, "scale": 1.0}}, [1.0, 10.0, 100.0]),
        ({"linear_buckets": {"num_finite_buckets": 2, "width": 5.0, "offset": 0.0}}, [0.0, 5.0, 10.0]),
        ({"explicit_buckets": {"bounds": [1.0, 2.0, 4.0]}}, [1.0, 2.0, 4.0]),
    ],
)
def test_distributions_keep_their_bounds_and_pad_left_out_buckets(
    options: dict[str, object], bounds: list[float]
) -> None:
    # Four buckets for three bounds: the trailing overflow bucket is left out, as Cloud Monitoring allows.
    distribution = pb.Distribution(count=6, mean=2.0, bucket_options=options, bucket_counts=[1, 2, 3])
    histogram = libtpu._histogram(distribution, per_unit=1e6)
    assert histogram.buckets == (
        (bounds[0] / 1e6, 1.0),
        (bounds[1] / 1e6, 3.0),
        (bounds[2] / 1e6, 6.0),
        (float("inf"), 6.0),
    )
    assert histogram.sum == pytest.approx(12e-6)


def test_distributions_that_cannot_be_read_are_rejected() -> None:
    too_many = pb.Distribution(bucket_options={"explicit_buckets": {"bounds": [1.0]}}, bucket_counts=[1, 1, 1])
    with pytest.raises(ValueError, match="bucket counts"):
        libtpu._histogram(too_many, 1.0)
    unsorted = pb.Distribution(bucket_options={"explicit_buckets": {"bounds": [2.0, 1.0]}}, bucket_counts=[1])
    with pytest.raises(ValueError, match="unsorted"):
        libtpu._histogram(unsorted, 1.0)
    with pytest.raises(ValueError, match="unsupported bucket layout"):
        libtpu._histogram(pb.Distribution(bucket_counts=[1]), 1.0)


def collect_in_process(*servers: FakeTpuServer) -> tuple[list[Sample], CollectorError | None, bytes]:
    """One collection, what the store would serve, and the exposition built from it (which must not fail)."""
    collector = libtpu.LibtpuCollector(Settings(libtpu_addresses=tuple(s.address for s in servers)))
    try:
        samples, error = collector.collect(2.0), None
    except CollectorError as e:
        samples, error = e.partial, e
    finally:
        collector.close()
    registry = CollectorRegistry()
    store = SampleStore()
    registry.register(store)
    store.replace("libtpu", samples)
    return samples, error, generate_latest(registry)


def test_a_metric_the_runtime_does_not_have_is_left_out_and_the_rest_read() -> None:
    runtime = FakeTpuRuntime(chips(0, 2))
    runtime.broken = {DUTY_CYCLE: "not_found"}  # listed, then NOT_FOUND, as an older runtime answers
    with FakeTpuServer(runtime) as server:
        samples, error, _ = collect_in_process(server)
    assert error is None
    read = {s.metric for s in samples}
    assert catalog.DUTY_CYCLE not in read
    assert {catalog.DEVICE_MEMORY_USED, catalog.HLO_QUEUE_SIZE, catalog.HLO_EXECUTION_DURATION} <= read


def test_a_value_of_the_wrong_type_is_an_invalid_response_not_a_broken_exposition() -> None:
    runtime = FakeTpuRuntime(chips(0, 2))
    runtime.broken = {HBM_USED: "wrong_type"}
    with FakeTpuServer(runtime) as server:
        samples, error, exposition = collect_in_process(server)
    assert error is not None and error.reason == "invalid_response", error
    assert catalog.DEVICE_MEMORY_USED not in {s.metric for s in samples}
    assert catalog.DEVICE_MEMORY_LIMIT in {s.metric for s in samples}, "one bad metric must not hide the others"
    assert catalog.DEVICE_MEMORY_LIMIT.name.encode() in exposition


def test_one_device_id_from_two_ports_is_reported_not_merged() -> None:
    with (
        FakeTpuServer(FakeTpuRuntime(chips(0, 2))) as a,
        FakeTpuServer(FakeTpuRuntime(chips(1, 2))) as b,  # device 1 on both
    ):
        samples, error, _ = collect_in_process(a, b)
    assert error is not None and error.reason == "invalid_response"
    assert "device 1 reported by both" in str(error)
    duty = {s.labels[0]: s.value for s in samples if s.metric is catalog.DUTY_CYCLE}
    assert duty == {"0": pytest.approx(0.05), "1": pytest.approx(0.15), "2": pytest.approx(0.25)}


def unknown_count(samples: list[Sample]) -> float | None:
    counts = [s.value for s in samples if s.metric is catalog.COLLECTOR_UNKNOWN_METRICS]
    assert len(counts) <= 1
    return float(counts[0]) if counts else None  # type: ignore[arg-type]


def test_what_a_newer_runtime_adds_is_counted_and_logged_and_the_rest_read(caplog: pytest.LogCaptureFixture) -> None:
    """ListSupportedMetrics: every metric we know that the runtime lists is read; the ones we do not know are
    counted (each name once, whatever the ports), so a newer libtpu's additions are noticed."""
    newer = [FakeTpuRuntime(chips(0, 2), default_megascale()), FakeTpuRuntime(chips(2, 2), default_megascale())]
    for runtime in newer:
        runtime.newer_metrics = [DELIVERY_RATE, "tpu.runtime.tensorcore.mxu.utilization.percent"]
    newer[1].newer_metrics.append("tpu.runtime.ici.link.health")
    with (
        FakeTpuServer(newer[0]) as a,
        FakeTpuServer(newer[1]) as b,
        caplog.at_level("INFO", logger="tpuscope.collectors"),
    ):
        samples, error, exposition = collect_in_process(a, b)
    assert error is None
    assert unknown_count(samples) == 3
    assert f'{catalog.COLLECTOR_UNKNOWN_METRICS.name}{{collector="libtpu"}} 3.0'.encode() in exposition
    assert {s.metric for s in samples} >= {catalog.DUTY_CYCLE, catalog.MEGASCALE_LATENCY, catalog.HLO_QUEUE_SIZE}
    logged = [r.getMessage() for r in caplog.records if "does not read" in r.getMessage()]
    assert len(logged) == 2 and all(DELIVERY_RATE in line for line in logged), logged


def test_a_runtime_that_offers_only_what_we_know_counts_none_and_one_we_cannot_read_counts_its_names() -> None:
    with FakeTpuServer(FakeTpuRuntime(chips(0, 1))) as server:
        samples, error, _ = collect_in_process(server)
    assert error is None and unknown_count(samples) == 0
    renamed = FakeTpuRuntime(chips(0, 1))
    renamed.mode = "unknown_names"
    with FakeTpuServer(renamed) as server:
        samples, error, _ = collect_in_process(server)
    assert error is not None and error.reason == "unknown_metrics"
    assert unknown_count(samples) == len(UNKNOWN_NAMES), "the down collector still says how many it cannot read"


def test_a_multislice_answer_shaped_as_the_real_clients_read_it_keeps_the_collector_up_and_counts_every_value(
    short_tmp: Path,
) -> None:
    """Several distributions per size (each transport, each kind of collective), keyed as libtpu keys them: the
    collector stays up on every collection, and a size's series counts every one of its values."""
    megascale = default_megascale()
    runtime = FakeTpuRuntime(chips(0, 4), megascale)
    with FakeTpuServer(runtime) as server:
        collector = libtpu.LibtpuCollector(Settings(libtpu_addresses=(server.address,)))
        try:
            for _ in range(3):
                samples = collector.collect(2.0)  # raises where the collection fails
        finally:
            collector.close()
        served = {s.labels: s.value for s in samples if s.metric is catalog.MEGASCALE_LATENCY}
        expected: dict[tuple[str, ...], list[MegascaleValue]] = {}
        for name, values in megascale.items():
            for v in values:
                size = next((v.attributes[k] for k in ("buffer_size", "input_size") if k in v.attributes), "")
                expected.setdefault((libtpu.BY_NAME[name].operation, size), []).append(v)
        assert set(served) == set(expected)
        assert max(len(same) for same in expected.values()) == 2, "two kinds of a size: the case that broke"
        for labels, same in expected.items():
            histogram = served[labels]
            assert isinstance(histogram, Histogram)
            assert histogram.count == sum(sum(v.distribution.counts) for v in same), labels
            means = sum(v.distribution.mean * sum(v.distribution.counts) for v in same)
            assert histogram.sum == pytest.approx(means / 1e6), labels

        # The sidecar: up on every collection, no error of any reason, while the runtime answers many times.
        with libtpu_sidecar(short_tmp / "s.sock", server.address) as sidecar:
            calls = runtime.calls
            scrape = scrape_until(
                sidecar.url,
                lambda s: runtime.calls >= calls + 5 * (1 + len(runtime._offered())) and s.has(UP),
            )
            assert scrape.value(UP, collector="libtpu") == 1, sidecar.log()
            errors = sum(s.value for s in scrape.find(ERRORS, collector="libtpu"))
            assert errors == 0, sidecar.log()


def test_a_multi_host_slices_chips_are_their_index_on_the_host_in_every_family_and_keep_their_runtime_ids() -> None:
    """One v5p host of an 8x8x16, two processes of two chips each: the gauges say 404/405 and 412/413, the HLO
    metrics each process's ordinals 0 and 1. Every family names the same 4 chips, 0 to 3, and the info series maps
    them back."""
    ids = list(V5P_HOST)
    first, second = FakeTpuRuntime(chips(0, 2)), FakeTpuRuntime(chips(2, 2))
    for runtime, chip_ids in ((first, ids[:2]), (second, ids[2:])):
        for chip, chip_id in zip(runtime.chips, chip_ids, strict=True):
            chip.device = chip_id
    with FakeTpuServer(first) as a, FakeTpuServer(second) as b:
        samples, error, _ = collect_in_process(a, b)
    assert error is None, error
    by_index = dict(zip(("0", "1", "2", "3"), [*first.chips, *second.chips], strict=True))
    families = {
        catalog.DUTY_CYCLE: lambda c: c.duty_cycle_percent / 100,
        catalog.DEVICE_MEMORY_USED: lambda c: c.hbm_used,
        catalog.TENSORCORE_IDLE: lambda c: c.idle_seconds,
        catalog.HLO_QUEUE_SIZE: lambda c: c.queue_size,
    }
    for metric, expected in families.items():
        served = {s.labels[0]: s.value for s in samples if s.metric is metric}
        assert served == {device: pytest.approx(expected(chip)) for device, chip in by_index.items()}, metric.name
    info = {(s.labels[0], s.labels[1]) for s in samples if s.metric is catalog.TPU_CHIP_INFO}
    assert info == {("0", "404"), ("1", "405"), ("2", "412"), ("3", "413")}


def free_address() -> str:
    """A loopback port nothing listens on: one of TPU_RUNTIME_METRICS_PORTS that no process of the job serves."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def test_a_port_no_runtime_ever_answered_on_is_unused_and_one_that_stops_answering_is_a_failure() -> None:
    runtime = FakeTpuRuntime(chips(0, 4))
    unused = free_address()
    server = FakeTpuServer(runtime).start()
    collector = libtpu.LibtpuCollector(Settings(libtpu_addresses=(server.address, unused)))
    try:
        assert {s.metric for s in collector.collect(2.0)} >= {catalog.DUTY_CYCLE}  # no error: the job uses one port
        server.stop()
        with pytest.raises(CollectorError) as stopped:
            collector.collect(2.0)
        assert stopped.value.reason == "unavailable" and server.address in str(stopped.value)
    finally:
        server.stop()
        collector.close()
    nobody = libtpu.LibtpuCollector(Settings(libtpu_addresses=(free_address(), unused)))
    try:
        with pytest.raises(CollectorError) as silent:
            nobody.collect(2.0)
    finally:
        nobody.close()
    assert silent.value.reason == "unavailable" and "nor 1 more ports" in str(silent.value), silent.value


def test_the_runtimes_error_detectors_are_served_as_0_or_1_and_absent_where_it_has_none(
    caplog: pytest.LogCaptureFixture,
) -> None:
    runtime = FakeTpuRuntime(chips(0, 2), default_megascale(), errors={**hang_detected(True), **slice_error()})
    detected = catalog.TPU_RUNTIME_ERROR
    with FakeTpuServer(runtime) as server, caplog.at_level("WARNING", logger="tpuscope.collectors"):
        samples, error, _ = collect_in_process(server)
        assert error is None
        # The other error type beside HANG_DETECTED (1 too) is not a hang: only the hang's entry counts.
        assert {s.labels: s.value for s in samples if s.metric is detected} == {
            ("megascale_hang",): 1.0,
            ("slice_error",): 0.0,
        }
        runtime.errors = {**hang_detected(False), **slice_error("ICI link 3 down")}
        samples, error, _ = collect_in_process(server)
        assert {s.labels: s.value for s in samples if s.metric is detected} == {
            ("megascale_hang",): 0.0,
            ("slice_error",): 1.0,
        }
    assert any("ICI link 3 down" in r.getMessage() for r in caplog.records), "the runtime's message, logged"
    with FakeTpuServer(FakeTpuRuntime(chips(0, 2))) as plain:
        samples, _, _ = collect_in_process(plain)
    assert detected not in {s.metric for s in samples}, "a runtime without the detectors: absent, not 0"


def test_without_tpu_infos_core_state_call_the_stall_asks_nothing_and_the_metrics_are_read(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """tpu-info before 0.7 has no GetTpuRuntimeStatus in its stubs: core state off, said once; the rest read."""
    rpc, stubs, services = libtpu._stubs()

    class Before07:
        def __getattr__(self, name: str) -> object:
            if name.startswith("GetTpuRuntimeStatus"):
                raise AttributeError(name)
            return getattr(stubs, name)

    monkeypatch.setattr(libtpu, "_stubs", lambda: (rpc, Before07(), services))
    runtime = FakeTpuRuntime(chips(0, 2))
    with FakeTpuServer(runtime) as server, caplog.at_level("WARNING", logger="tpuscope.collectors"):
        stalled = Settings(
            libtpu_addresses=(server.address,), workload_progress=lambda: {"train": 0.0}, core_state_after=1.0
        )
        collector = libtpu.LibtpuCollector(stalled)
        try:
            samples = collector.collect(2.0)
        finally:
            collector.close()
    assert runtime.status_requests == []
    assert catalog.DUTY_CYCLE in {s.metric for s in samples}
    assert [r.getMessage() for r in caplog.records if "GetTpuRuntimeStatus" in r.getMessage()], caplog.text
