"""A stand-in for libtpu's runtime metrics service, for tests and benchmarks on machines without a TPU.

It implements the real gRPC service from the tpu-info package's generated stubs and answers in the shapes the two
real clients of libtpu read, each behaviour from their source (nothing of theirs is copied here):

- per-chip gauges keyed by the runtime's device id, an ``int_attr`` whose key the clients ignore (``device-id``):
  tpu-info 0.14.2 ``tpu_info/metrics.py`` ``get_chip_usage`` (AI-Hypercomputer/cloud-accelerator-diagnostics
  87975f8), the device plugin's ``collectRuntimeMetricsDouble``/``Int64`` and ``buildRuntimeResponse`` in
  ``pkg/metrics/metrics.go`` and ``metrics_test.go`` (ai-on-gke/tpu-device-plugin 4626a9f). Duty cycle is an
  ``as_double`` and HBM an ``as_int``: the plugin reads each only as that one. On a multi-host slice the ids are
  slice-wide: :data:`V5P_HOST` is one v5p host of an 8x8x16, as GKE's device plugin recorded it (404, 405, 412,
  413 in ``../shared/reference/gke-device-plugin/axlearn_sample_metrics.txt``); tpu-info's README shows 8, 9, 12, 13
  on a v6e host the same way;
- the HLO metrics keyed by ``device_ordinal``, a digit string (``int_attr`` from older runtimes) beside
  ``core_type`` in a key/value list: tpu-info's ``get_hlo_queue_size``/``get_hlo_exec_timing``. The ordinal is the
  process's own: the k-th of the chips its port reports;
- megascale distributions several per size, a key/value list under the attribute key ``megascale``: ``buffer_size``
  and ``type`` (the transport) for the DCN transfers, ``input_size`` and ``collective_type`` for
  ``collective_end_to_end``, ``buffer_size`` alone for host compute and the host/device transfers, none for the TCP
  round trip (the plugin's ``histCollector.UpdateValues`` labels in ``prom_metrics.go``, and ``buildMXLAAttribute``
  in its tests); sizes spelled ``512B+``, ``1MB+``, ``8MB+``. Exponential buckets: underflow, the finite buckets,
  overflow (``exponentialBuckets``, ``validateDistributionInfo``). tpu-info's ``get_transfer_latency`` groups them by
  size (the first attribute, when no ``buffer-size`` key) and sums their counts;
- the runtime's error detectors, gauges over key/value lists: ``megascale.error.detected.gauge`` (``error_type``
  ``HANG_DETECTED``, ``host_name``, ``launch_id``, ``start_time``) and ``slice.error.detected.gauge``
  (``error_message``, ``session_id``, ``type``, ``topology``): the plugin's ``hangDetected`` and
  ``sliceErrorDetected``, which set the node conditions ``MegascaleHangDetected`` and ``SliceErrorDetected``;
- ``ListSupportedMetrics`` lists what a runtime has (megascale only on a multislice job), and a metric it lacks is
  ``NOT_FOUND`` (tpu-info's ``cli_helper`` treats that code as "not offered"); loopback only, local credentials, as
  tpu-info dials it.

``GetTpuRuntimeStatus`` answers each core's state as tpu_telemetry.proto's ``CurrentCoreStateSummary`` defines it,
in a map keyed by the global core id (tpu-info's ``get_tpuz_info`` takes the id from the key): its identity, its
sequencers (the HLO location and detailed info only when ``include_hlo_info`` asks for them, as libtpu, for whom
they are costly), the program it runs, the programs queued behind it and any error. Neither client says which chip
numbering ``chip_id`` uses; here it is the runtime's device id, as its gauges use. Each chip's :class:`CoreState`
is settable, so a test can make one worker's cores sit somewhere else than its peers'.

Faults, for the collector's tests: :attr:`FakeTpuRuntime.mode` ``hang`` holds every call until released,
``unknown_names`` offers only metrics nobody knows; :attr:`FakeTpuRuntime.newer_metrics` lists metrics a newer
runtime offers beside ours; :attr:`FakeTpuRuntime.status_unimplemented` answers GetTpuRuntimeStatus as a runtime
without it does; :meth:`FakeTpuServer.stop` and :meth:`~FakeTpuServer.start` take the server away and bring it
back on the same port.

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

# The runtime's metric names, typed here from tpu-info's and the device plugin's source (not taken from the
# collector that reads them: a name the collector got wrong must fail its tests against this fake).
DUTY_CYCLE = "tpu.runtime.tensorcore.dutycycle.percent"
HBM_USED = "tpu.runtime.hbm.memory.usage.bytes"
HBM_TOTAL = "tpu.runtime.hbm.memory.total.bytes"
HBM_BANDWIDTH = "tpu.runtime.hbm.utilization.percent"
IDLE = "tpu.runtime.tensorcore.idle_duration.seconds"
QUEUE = "hlo.queue.size.gauge"
HLO_TIMING = "hlo.execution.timing.distribution.microseconds"
MEGASCALE = (
    *(
        f"megascale.{name}_latencies.microsecond.cumulative.distribution"
        for name in (
            "dcn_transfer",
            "dcn_inbound_transfer",
            "host_to_device_transfer",
            "device_to_host_transfer",
            "collective_end_to_end",
            "mxla_compute",
        )
    ),
    "megascale.grpc_tcp_min_rtt.microsecond.cumulative.distribution",
)
MEGASCALE_HANG = "megascale.error.detected.gauge"
SLICE_ERROR = "slice.error.detected.gauge"
UNKNOWN_NAMES = ("tpu.runtime.renamed.dutycycle.pct", "tpu.runtime.renamed.hbm.used")
# A metric libtpu serves (tpu-info and the plugin read it) that tpuscope's collector does not: what a newer runtime
# adds, from tpuscope's point of view.
DELIVERY_RATE = "megascale.grpc_tcp_delivery_rate.Mbps.cumulative.distribution"
# One v5p host of an 8x8x16 slice: its chips' runtime ids, as GKE's device plugin recorded them.
V5P_HOST = (404, 405, 412, 413)
# The sizes libtpu spells its megascale buckets with (the plugin's tests; tpu-info's README: 8MB+, 4MB+).
MEGASCALE_SIZES = ("512B+", "1MB+", "8MB+")
# Each megascale family's attributes beside its size: (size key, kind key, kinds), as the plugin labels them.
_MEGASCALE_KINDS: dict[str, tuple[str | None, str | None, tuple[str, ...]]] = {
    "dcn_transfer": ("buffer_size", "type", ("grpc", "rdma")),
    "dcn_inbound_transfer": ("buffer_size", "type", ("grpc", "rdma")),
    "collective_end_to_end": ("input_size", "collective_type", ("ALL_REDUCE", "ALL_GATHER")),
    "mxla_compute": ("buffer_size", None, ("",)),
    "host_to_device_transfer": ("buffer_size", None, ("",)),
    "device_to_host_transfer": ("buffer_size", None, ("",)),
    "grpc_tcp_min_rtt": (None, None, ("",)),
}


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
class MegascaleValue:
    """One of a megascale family's distributions: its attributes (size, kind) and its counts."""

    attributes: dict[str, str]
    distribution: Distribution

    def to_proto(self) -> Any:
        return pb.Metric(attribute=_kvlist("megascale", self.attributes), distribution=self.distribution.to_proto())


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
    """What one chip reports (in the runtime's units: percent, bytes, seconds, microseconds). ``device`` is the
    runtime's device id: the host's index on a single-host slice, a slice-wide id on a multi-host one."""

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


def megascale_counts(seed: int = 0) -> list[int]:
    """24 buckets, about what libtpu sends: underflow, 22 finite, overflow; ``seed`` shifts the mass."""
    counts = [0, 1, 4, 9, 16, 25, 16, 9, 4, 1, 1] + [0] * 13
    return counts[-seed:] + counts[:-seed] if seed else counts


def default_megascale(sizes: tuple[str, ...] = MEGASCALE_SIZES) -> dict[str, list[MegascaleValue]]:
    """Every megascale family as a multislice job's runtime answers it: per size, one distribution per kind
    (transport or collective), each with its own counts."""
    families: dict[str, list[MegascaleValue]] = {}
    for name in MEGASCALE:
        size_key, kind_key, kinds = _MEGASCALE_KINDS[name.split(".")[1].removesuffix("_latencies")]
        values = []
        for size in sizes if size_key else ("",):
            for n, kind in enumerate(kinds):
                attributes = {size_key: size} if size_key else {}
                if kind_key:
                    attributes[kind_key] = kind
                values.append(MegascaleValue(attributes, Distribution(megascale_counts(n), 10.0, 1.5, 120.0 + n)))
        families[name] = values
    return families


class FakeTpuRuntime(pb_grpc.RuntimeMetricServiceServicer):  # type: ignore[misc]
    """One process's runtime: its chips (the ones its port reports) and, on a multislice job, megascale."""

    def __init__(
        self,
        chips: list[Chip],
        megascale: dict[str, list[MegascaleValue]] | None = None,
        errors: dict[str, list[tuple[dict[str, str], int]]] | None = None,
    ) -> None:
        self.chips = chips
        self.megascale = megascale if megascale is not None else {}
        # The error detectors' entries: (attributes, value) per gauge name (MEGASCALE_HANG, SLICE_ERROR); a name
        # absent is a runtime that does not offer it.
        self.errors = errors if errors is not None else {}
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
        gauges = [DUTY_CYCLE, HBM_USED, HBM_TOTAL, HBM_BANDWIDTH, IDLE, QUEUE, HLO_TIMING]
        return [*gauges, *self.megascale, *self.errors, *self.newer]

    @property
    def newer(self) -> list[str]:
        return [name for name in self.newer_metrics if name not in self.megascale]

    def ListSupportedMetrics(self, request: Any, context: Any) -> Any:
        # The request's filter is a regular expression (the proto's comment); tpu-info, the plugin and tpuscope
        # send none, and it is ignored.
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
        if name in self.newer:  # no attributes, as the plugin's TCP families
            return [pb.Metric(attribute=_kvlist("megascale", {}), distribution=Distribution([1, 2, 1]).to_proto())]
        if name in self.megascale:
            return [value.to_proto() for value in self.megascale[name]]
        if name in self.errors:
            return [
                pb.Metric(attribute=_kvlist("megascale", attributes), gauge=pb.Gauge(as_int=value))
                for attributes, value in self.errors[name]
            ]
        if name in (QUEUE, HLO_TIMING):  # the process's ordinal, a digit string, in a key/value list
            return [
                pb.Metric(
                    attribute=_kvlist("", {"device_ordinal": str(ordinal), "core_type": "tensor_core"}),
                    **(
                        {"gauge": pb.Gauge(as_int=c.queue_size)}
                        if name == QUEUE
                        else {"distribution": c.hlo_timing.to_proto()}
                    ),
                )
                for ordinal, c in enumerate(sorted(self.chips, key=lambda chip: chip.device))
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


def hang_detected(detected: bool = True, host: str = "fake-tpu-host") -> dict[str, list[tuple[dict[str, str], int]]]:
    """The megascale detector's answer, as the plugin's tests mock it, with one other error type beside it."""
    hang = {"error_type": "HANG_DETECTED", "host_name": host, "launch_id": "7", "start_time": "2026-11-28 09:00:00 UTC"}
    other = {"error_type": "OTHER_ERROR", "host_name": host}
    return {MEGASCALE_HANG: [(other, 1), (hang, int(detected))]}


def slice_error(message: str = "", topology: str = "8x8x16") -> dict[str, list[tuple[dict[str, str], int]]]:
    """The slice's error detector: an entry with a value of 1 and the runtime's message where ``message`` is set."""
    attributes = {"error_message": message, "session_id": "123", "type": "ici", "topology": topology}
    return {SLICE_ERROR: [(attributes, 1 if message else 0)]}


def _kvlist(key: str, items: dict[str, str]) -> Any:
    attributes = [pb.Attribute(key=k, value=pb.AttrValue(string_attr=v)) for k, v in items.items()]
    return pb.Attribute(key=key, value=pb.AttrValue(kvlist_attr=pb.KeyValueList(attributes=attributes)))


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
