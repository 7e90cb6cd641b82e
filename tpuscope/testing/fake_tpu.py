"""A stand-in for libtpu's runtime metrics service, for tests and benchmarks on machines without a TPU.

It implements the real gRPC service from the tpu-info package's generated
stubs and answers with scripted values in the shapes libtpu uses: gauges keyed
by an integer ``device-id`` attribute, HLO metrics keyed by a ``device_ordinal``
in a key/value list, megascale distributions keyed by ``buffer-size``, all
distributions with exponential buckets. tpu-info's own client reads it (see
tests/test_libtpu.py), which is what makes it a fair stand-in.

``GetTpuRuntimeStatus`` answers each core's state as tpu_telemetry.proto's
``CurrentCoreStateSummary`` defines it: its identity, its sequencers (the HLO
location and detailed info only when ``include_hlo_info`` asks for them, as
libtpu, for whom they are costly), the program it runs, the programs queued
behind it and any error. Each chip's :class:`CoreState` is settable, so a test
can make one worker's cores sit somewhere else than its peers'.

Faults, for the collector's tests: :attr:`FakeTpuRuntime.mode` ``hang`` holds
every call until released, ``unknown_names`` offers only metrics nobody knows;
:attr:`FakeTpuRuntime.newer_metrics` lists metrics a newer runtime offers beside
ours; :attr:`FakeTpuRuntime.status_unimplemented` answers GetTpuRuntimeStatus as
a runtime without it does; :meth:`FakeTpuServer.stop` and
:meth:`~FakeTpuServer.start` take the server away and bring it back on the same
port.

    python -m tpuscope.testing.fake_tpu --port 8431 --devices 8
"""

from __future__ import annotations

import argparse
import threading
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any

import grpc
from tpu_info.proto import tpu_metric_service_pb2 as pb
from tpu_info.proto import tpu_metric_service_pb2_grpc as pb_grpc
from tpu_info.proto import tpu_telemetry_pb2 as telemetry

from tpuscope.exporter.collectors.libtpu import RUNTIME_METRICS

# The runtime's names, as tpuscope's collector knows them (one list, not typed twice).
DUTY_CYCLE, HBM_USED, HBM_TOTAL, HBM_BANDWIDTH, IDLE, QUEUE, HLO_TIMING = (m.name for m in RUNTIME_METRICS[:7])
MEGASCALE = tuple(m.name for m in RUNTIME_METRICS[7:])
UNKNOWN_NAMES = ("tpu.runtime.renamed.dutycycle.pct", "tpu.runtime.renamed.hbm.used")
# A metric libtpu serves (tpu-info reads it) that tpuscope's collector does not: what a newer runtime adds.
DELIVERY_RATE = "megascale.grpc_tcp_delivery_rate.Mbps.cumulative.distribution"


@dataclass
class Distribution:
    """Exponential buckets as libtpu sends them: counts[0] is below ``scale``, the last is the overflow."""

    counts: list[int]
    scale: float = 1.0
    growth: float = 2.0
    mean: float = 0.0

    @property
    def num_finite(self) -> int:
        return len(self.counts) - 2

    def to_proto(self) -> Any:
        options = pb.Distribution.BucketOptions(
            exponential_buckets=pb.Distribution.BucketOptions.Exponential(
                num_finite_buckets=self.num_finite, growth_factor=self.growth, scale=self.scale
            )
        )
        return pb.Distribution(
            count=sum(self.counts), mean=self.mean, bucket_options=options, bucket_counts=self.counts
        )


@dataclass
class QueuedProgram:
    """A program queued on a core behind the one it runs (tpu_telemetry.proto's QueuedProgramInfo)."""

    run_id: int
    launch_id: int
    fingerprint: bytes

    def to_proto(self) -> Any:
        return telemetry.QueuedProgramInfo(
            run_id=self.run_id, launch_id=self.launch_id, program_fingerprint=self.fingerprint
        )


@dataclass
class CoreState:
    """Where a chip's TensorCores are: the program they run, the HLO their sequencer is at, what waits behind it.

    A hung collective leaves every worker's cores at the same all-reduce; the worker that never got there
    (its input stuck, its host slow) sits somewhere else: ``CoreState(hlo_location="fusion.7", ...)``.
    """

    fingerprint: bytes = bytes.fromhex("9c1f5e2a7b3d4c60a1b2c3d4e5f60718")
    launch_id: int = 1
    run_id: int = 1
    program_id: int = 3
    pc: int = 4096
    tracemark: int = 17
    hlo_location: str = "all-reduce.42"
    hlo_detailed_info: str = ""  # "": the instruction's text, made up from hlo_location
    queued: list[QueuedProgram] = field(default_factory=list)
    error_message: str | None = None

    def to_proto(self, global_core: int, chip: int, index: int, include_hlo_info: bool) -> Any:
        sequencer = telemetry.SequencerInfo(
            sequencer_type=telemetry.TPU_SEQUENCER_TYPE_TENSOR_CORE_SEQUENCER,
            sequencer_index=0,
            pc=self.pc,
            tag=0,
            tracemark=self.tracemark,
            program_id=self.program_id,
            run_id=self.run_id,
        )
        if include_hlo_info:  # optional fields: absent unless asked for, as libtpu sends them
            sequencer.hlo_location = self.hlo_location
            op = self.hlo_location.rsplit(".", 1)[0]
            sequencer.hlo_detailed_info = self.hlo_detailed_info or (
                f'%{self.hlo_location} = f32[8192]{{0}} {op}(f32[8192]{{0}} %param.1), metadata={{op_name="jit(step)"}}'
            )
        summary = telemetry.CurrentCoreStateSummary(
            core_id=telemetry.TpuCoreIdentifier(
                global_core_id=global_core,
                chip_id=chip,
                core_on_chip=telemetry.TpuCoreOnChipProto(type=telemetry.TPU_CORE_TYPE_TENSOR_CORE, index=index),
            ),
            sequencer_info=[sequencer],
            xdb_server_running=False,
            program_fingerprint=self.fingerprint,
            launch_id=self.launch_id,
            queued_program_info=[q.to_proto() for q in self.queued],
        )
        if self.error_message is not None:
            summary.error_message = self.error_message
        return summary


@dataclass
class Chip:
    """What one device reports (in the runtime's units: percent, bytes, seconds, microseconds)."""

    device: int
    duty_cycle_percent: float = 50.0
    hbm_used: int = 8 << 30
    hbm_total: int = 16 << 30
    hbm_bandwidth_percent: float = 30.0
    idle_seconds: float = 0.0
    queue_size: int = 1
    hlo_timing: Distribution = field(default_factory=lambda: Distribution([0, 3, 10, 5, 1, 0], 100.0, 2.0, 450.0))
    state: CoreState = field(default_factory=CoreState)  # each of its TensorCores'
    tensor_cores: int = 1  # 2 on a v4 or v5p chip (one device to JAX: megacore)


def default_megascale(buffer_sizes: tuple[str, ...] = ("1MB", "8MB", "64MB")) -> dict[str, dict[str, Distribution]]:
    """A distribution per megascale metric and buffer size, 24 buckets each (about what libtpu sends)."""
    counts = [0, 1, 4, 9, 16, 25, 16, 9, 4, 1, 1] + [0] * 13
    return {name: {size: Distribution(list(counts), 10.0, 1.5, 120.0) for size in buffer_sizes} for name in MEGASCALE}


class FakeTpuRuntime(pb_grpc.RuntimeMetricServiceServicer):  # type: ignore[misc]
    def __init__(self, chips: list[Chip], megascale: dict[str, dict[str, Distribution]] | None = None) -> None:
        self.chips = chips
        self.megascale = megascale if megascale is not None else {}
        self.mode = "ok"  # or "hang", "unknown_names"
        # Per metric name, a way to answer it wrongly: "not_found" (listed, then NOT_FOUND, as an older
        # runtime does), "wrong_type" (a distribution where a gauge belongs).
        self.broken: dict[str, str] = {}
        self.release = threading.Event()  # ends a hang
        self.calls = 0
        self.newer_metrics: list[str] = []  # listed beside ours, as a newer libtpu would (e.g. DELIVERY_RATE)
        self.status_unimplemented = False  # GetTpuRuntimeStatus answers UNIMPLEMENTED, as an older runtime's
        self.host_name = "fake-tpu-host"
        self.status_requests: list[bool] = []  # each GetTpuRuntimeStatus call's include_hlo_info

    def _hang(self) -> None:
        self.calls += 1
        if self.mode == "hang":
            self.release.wait(60)

    def _offered(self) -> list[str]:
        if self.mode == "unknown_names":
            return list(UNKNOWN_NAMES)
        return [DUTY_CYCLE, HBM_USED, HBM_TOTAL, HBM_BANDWIDTH, IDLE, QUEUE, HLO_TIMING, *self.megascale, *self.newer]

    @property
    def newer(self) -> list[str]:
        return [name for name in self.newer_metrics if name not in self.megascale]

    def ListSupportedMetrics(self, request: Any, context: Any) -> Any:
        # The request's filter has no documented syntax; tpu-info and tpuscope send none, and it is ignored.
        self._hang()
        return pb.ListSupportedMetricsResponse(
            supported_metric=[pb.SupportedMetric(metric_name=name) for name in self._offered()]
        )

    def GetRuntimeMetric(self, request: Any, context: Any) -> Any:
        self._hang()
        name = request.metric_name
        if name not in self._offered() or self.broken.get(name) == "not_found":
            context.abort(grpc.StatusCode.NOT_FOUND, f"metric {name} not found")
        values = self._values(name)
        if self.broken.get(name) == "wrong_type":
            values = [pb.Metric(attribute=v.attribute, distribution=Distribution([1, 1]).to_proto()) for v in values]
        return pb.MetricResponse(metric=pb.TPUMetric(name=name, description="fake", metrics=values))

    def GetTpuRuntimeStatus(self, request: Any, context: Any) -> Any:
        """Every TensorCore's state, keyed by its global core id (numbered chip by chip, as on a host)."""
        self._hang()
        self.status_requests.append(request.include_hlo_info)
        if self.status_unimplemented:
            context.abort(grpc.StatusCode.UNIMPLEMENTED, "Method not implemented!")
        states: dict[int, Any] = {}
        for chip in self.chips:
            for index in range(chip.tensor_cores):
                core = len(states)
                states[core] = chip.state.to_proto(core, chip.device, index, request.include_hlo_info)
        return pb.GetTpuRuntimeStatusResponse(host_name=self.host_name, core_states=states)

    def _values(self, name: str) -> list[Any]:
        if name in self.newer:  # a distribution per buffer size, as libtpu's megascale ones
            return [
                pb.Metric(attribute=_kvlist(("buffer-size", size)), distribution=Distribution([1, 2, 1]).to_proto())
                for size in ("1MB", "8MB")
            ]
        if name in self.megascale:
            return [
                pb.Metric(attribute=_kvlist(("buffer-size", size)), distribution=dist.to_proto())
                for size, dist in self.megascale[name].items()
            ]
        if name in (QUEUE, HLO_TIMING):  # newer keys: a key/value list with a string ordinal
            return [
                pb.Metric(
                    attribute=_kvlist(("device_ordinal", str(c.device)), ("core_type", "tensor_core")),
                    **(
                        {"gauge": pb.Gauge(as_int=c.queue_size)}
                        if name == QUEUE
                        else {"distribution": c.hlo_timing.to_proto()}
                    ),
                )
                for c in self.chips
            ]
        gauges = {
            DUTY_CYCLE: lambda c: pb.Gauge(as_double=c.duty_cycle_percent),
            HBM_USED: lambda c: pb.Gauge(as_int=c.hbm_used),
            HBM_TOTAL: lambda c: pb.Gauge(as_int=c.hbm_total),
            HBM_BANDWIDTH: lambda c: pb.Gauge(as_double=c.hbm_bandwidth_percent),
            IDLE: lambda c: pb.Gauge(as_double=c.idle_seconds),
        }
        return [
            pb.Metric(
                attribute=pb.Attribute(key="device-id", value=pb.AttrValue(int_attr=c.device)), gauge=gauges[name](c)
            )
            for c in self.chips
        ]


def _kvlist(*items: tuple[str, str]) -> Any:
    attributes = [pb.Attribute(key=k, value=pb.AttrValue(string_attr=v)) for k, v in items]
    return pb.Attribute(value=pb.AttrValue(kvlist_attr=pb.KeyValueList(attributes=attributes)))


class FakeTpuServer:
    """Serves a :class:`FakeTpuRuntime` on 127.0.0.1 with local credentials, as libtpu does."""

    def __init__(self, runtime: FakeTpuRuntime, port: int = 0) -> None:
        self.runtime = runtime
        self.port = port
        self._server: Any = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> FakeTpuServer:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
        pb_grpc.add_RuntimeMetricServiceServicer_to_server(self.runtime, server)
        self.port = server.add_secure_port(f"127.0.0.1:{self.port}", grpc.local_server_credentials())
        server.start()
        self._server = server
        return self

    def stop(self) -> None:
        """Gone at once, open calls cut off, as when the process dies."""
        if self._server is not None:
            self.runtime.release.set()
            self._server.stop(grace=None).wait()
            self._server = None
            self.runtime.release.clear()

    def __enter__(self) -> FakeTpuServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--port", type=int, default=8431)
    parser.add_argument("--devices", type=int, default=8)
    args = parser.parse_args()
    runtime = FakeTpuRuntime([Chip(d, duty_cycle_percent=10.0 * d) for d in range(args.devices)], default_megascale())
    server = FakeTpuServer(runtime, args.port).start()
    print(f"fake TPU runtime metrics on {server.address} ({args.devices} devices); Ctrl-C stops", flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        server.stop()


if __name__ == "__main__":
    main()
