"""A stand-in for libtpu's runtime metrics service, for tests and benchmarks on machines without a TPU.

It implements the real gRPC service from the tpu-info package's generated
stubs and answers with scripted values in the shapes libtpu uses: gauges keyed
by an integer ``device-id`` attribute, HLO metrics keyed by a ``device_ordinal``
in a key/value list, megascale distributions keyed by ``buffer-size``, all
distributions with exponential buckets. tpu-info's own client reads it (see
tests/test_libtpu.py), which is what makes it a fair stand-in.

Faults, for the collector's tests: :attr:`FakeTpuRuntime.mode` ``hang`` holds
every call until released, ``unknown_names`` offers only metrics nobody knows;
:meth:`FakeTpuServer.stop` and :meth:`~FakeTpuServer.start` take the server
away and bring it back on the same port.

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

from tpuscope.exporter.collectors.libtpu import RUNTIME_METRICS

# The runtime's names, as tpuscope's collector knows them (one list, not typed twice).
DUTY_CYCLE, HBM_USED, HBM_TOTAL, HBM_BANDWIDTH, IDLE, QUEUE, HLO_TIMING = (m.name for m in RUNTIME_METRICS[:7])
MEGASCALE = tuple(m.name for m in RUNTIME_METRICS[7:])
UNKNOWN_NAMES = ("tpu.runtime.renamed.dutycycle.pct", "tpu.runtime.renamed.hbm.used")


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

    def _hang(self) -> None:
        self.calls += 1
        if self.mode == "hang":
            self.release.wait(60)

    def _offered(self) -> list[str]:
        if self.mode == "unknown_names":
            return list(UNKNOWN_NAMES)
        return [DUTY_CYCLE, HBM_USED, HBM_TOTAL, HBM_BANDWIDTH, IDLE, QUEUE, HLO_TIMING, *self.megascale]

    def ListSupportedMetrics(self, request: Any, context: Any) -> Any:
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

    def _values(self, name: str) -> list[Any]:
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
