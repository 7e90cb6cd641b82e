"""``libtpu``: the TPU runtime's own metrics service, over gRPC, as the ``tpu-info`` CLI reads it.

libtpu serves ``tpu.monitoring.runtime.RuntimeMetricService`` on each port in
``TPU_RUNTIME_METRICS_PORTS`` (one per process on multi-process hosts; 8431
when unset) with local channel credentials. Each collection asks every port
which metrics it offers, then fetches all of ours it offers at once, so one
collection costs two round trips whatever the number of metrics. A metric a
runtime does not offer (megascale on a single slice) is simply absent; a
runtime that offers none of ours is down with ``unknown_metrics``, which is
what a renamed metric in a new libtpu looks like. The metrics a runtime lists
that tpuscope does not read are counted (``collector_unknown_metrics``) and
logged by name, so a newer libtpu's additions are noticed, not silently missing.

While a workload on the host stalls, each collection also asks every port for
its cores' state (:mod:`.core_state`), in the same round trip as the listing.

Distributions keep the runtime's own bucket bounds: bucket 0 is the underflow
below the first bound and the last is the overflow, as in Cloud Monitoring's
``Distribution``; they become Prometheus ``le`` bounds in seconds.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tpuscope import catalog
from tpuscope.accelerators import accelerator_name
from tpuscope.conventions import LIBTPU_COLLECTOR
from tpuscope.exporter.collectors import core_state
from tpuscope.exporter.collectors.base import (
    DEADLINE,
    ERROR,
    INVALID_RESPONSE,
    NOT_SUPPORTED,
    UNAVAILABLE,
    UNKNOWN_METRICS,
    Collector,
    CollectorError,
    Settings,
)
from tpuscope.exporter.samples import Histogram, Sample

if TYPE_CHECKING:
    import grpc

log = logging.getLogger("tpuscope.collectors")

DEFAULT_PORT = 8431
SOURCE = "libtpu"


@dataclass(frozen=True)
class RuntimeMetric:
    """One of the runtime's metrics and where it goes in our catalogue."""

    name: str
    metric: catalog.Metric
    # Runtime units per base unit: 100 (percent -> ratio), 1e6 (microseconds -> seconds). Dividing,
    # rather than multiplying by 1e-6, keeps bounds such as 100 us at 0.0001 s exactly.
    per_unit: float = 1.0
    operation: str = ""  # megascale only: the `operation` label


_MEGASCALE = "megascale.{}_latencies.microsecond.cumulative.distribution"
RUNTIME_METRICS = (
    RuntimeMetric("tpu.runtime.tensorcore.dutycycle.percent", catalog.DUTY_CYCLE, 100),
    RuntimeMetric("tpu.runtime.hbm.memory.usage.bytes", catalog.DEVICE_MEMORY_USED),
    RuntimeMetric("tpu.runtime.hbm.memory.total.bytes", catalog.DEVICE_MEMORY_LIMIT),
    RuntimeMetric("tpu.runtime.hbm.utilization.percent", catalog.MEMORY_BANDWIDTH_UTILIZATION, 100),
    RuntimeMetric("tpu.runtime.tensorcore.idle_duration.seconds", catalog.TENSORCORE_IDLE),
    RuntimeMetric("hlo.queue.size.gauge", catalog.HLO_QUEUE_SIZE),
    RuntimeMetric("hlo.execution.timing.distribution.microseconds", catalog.HLO_EXECUTION_DURATION, 1e6),
    *(
        RuntimeMetric(_MEGASCALE.format(name), catalog.MEGASCALE_LATENCY, 1e6, operation)
        for name, operation in (
            ("dcn_transfer", "dcn_transfer"),
            ("dcn_inbound_transfer", "dcn_inbound_transfer"),
            ("host_to_device_transfer", "host_to_device"),
            ("device_to_host_transfer", "device_to_host"),
            ("collective_end_to_end", "collective_end_to_end"),
            ("mxla_compute", "host_compute"),
        )
    ),
    RuntimeMetric(
        "megascale.grpc_tcp_min_rtt.microsecond.cumulative.distribution", catalog.MEGASCALE_LATENCY, 1e6, "tcp_min_rtt"
    ),
)
BY_NAME = {m.name: m for m in RUNTIME_METRICS}
Key = tuple[catalog.Metric, tuple[str, ...]]

# Attribute keys that name a device (older runtimes: an int attribute; newer: a key/value list).
_DEVICE_KEYS = ("device_ordinal", "device-id", "device_id")
_BUFFER_SIZE_KEYS = ("buffer-size", "buffer_size")


def addresses_from_environment(environ: Mapping[str, str] = os.environ) -> tuple[str, ...]:
    """``TPU_RUNTIME_METRICS_PORTS=8431,8432`` -> ``localhost:8431``, ``localhost:8432``."""
    ports = [p.strip() for p in environ.get("TPU_RUNTIME_METRICS_PORTS", "").split(",") if p.strip()]
    return tuple(f"localhost:{port}" for port in ports) or (f"localhost:{DEFAULT_PORT}",)


def accelerator_from_environment() -> str:
    """The chip model, from the TPU VM's metadata variable or the PCI devices, else plain ``tpu``."""
    if name := accelerator_name(os.environ.get("TPU_ACCELERATOR_TYPE", "")):
        return name
    try:
        from tpu_info import device

        chip, count = device.get_local_chips()
    except Exception:  # no sysfs, no permission: the label is a nicety, never a reason to fail
        return "tpu"
    return (accelerator_name(chip.value.name) if chip and count else None) or "tpu"


def _stubs() -> tuple[Any, Any, Any]:
    """gRPC and tpu-info's generated stubs, loaded when a collector is made: a sidecar on a host without a TPU,
    and every other tpuscope command (whose --help lists this collector), never pay for them."""
    try:
        import grpc
        from tpu_info.proto import tpu_metric_service_pb2, tpu_metric_service_pb2_grpc
    except ImportError:
        raise CollectorError(
            NOT_SUPPORTED, "the tpu-info package is not installed (pip install 'tpuscope[tpu]')"
        ) from None
    return grpc, tpu_metric_service_pb2, tpu_metric_service_pb2_grpc


class LibtpuCollector(Collector):
    name = LIBTPU_COLLECTOR

    @classmethod
    def unavailable_here(cls, settings: Settings) -> str | None:
        if os.environ.get("TPU_RUNTIME_METRICS_PORTS"):
            return None
        try:
            from tpu_info import device

            if device.get_local_chips()[1]:
                return None
        except Exception:  # tpu-info missing or sysfs unreadable
            pass
        return "no TPU chips on this host and TPU_RUNTIME_METRICS_PORTS is not set"

    def __init__(self, settings: Settings) -> None:
        self._rpc, self._pb, self._grpc = _stubs()
        self.addresses = settings.libtpu_addresses
        self.accelerator = accelerator_from_environment()
        self._channels: dict[str, tuple[grpc.Channel, Any]] = {}
        self._missing: dict[str, frozenset[str]] = {}  # per address: our metrics it does not offer (logged once)
        self._unknown: dict[str, frozenset[str]] = {}  # per address: what it offers that we do not read
        self.stall = core_state.StallTrigger(settings.workload_progress, settings.core_state_after)
        self._clock = core_state.CoreClock()
        self._without_status: set[str] = set()  # addresses whose runtime has no GetTpuRuntimeStatus
        self._stalled: list[str] = []  # the stalled workloads of the last collection (a change is logged)
        self._status_failed: dict[str, str] = {}  # per address: why its cores' state did not come (logged once)

    def _stub(self, address: str) -> Any:
        if address not in self._channels:
            channel = self._rpc.secure_channel(address, self._rpc.local_channel_credentials())
            self._channels[address] = (channel, self._grpc.RuntimeMetricServiceStub(channel))
        return self._channels[address][1]

    def _reset(self, address: str) -> None:
        """Drop a failed connection: the next try dials again now, not on gRPC's own reconnect schedule."""
        if entry := self._channels.pop(address, None):
            entry[0].close()

    def close(self) -> None:
        for address in list(self._channels):
            self._reset(address)

    def collect(self, timeout: float) -> list[Sample]:
        start = time.monotonic()
        end = start + timeout * 0.9  # leave the runner's deadline some room
        # Both stages go to every port at once and are then awaited: two round trips in all. The
        # listing gets 40% of the time, so a port that hangs there leaves the others time to answer.
        listings = {
            a: self._stub(a).ListSupportedMetrics.future(self._pb.ListSupportedMetricsRequest(), timeout=timeout * 0.4)
            for a in self.addresses
        }
        statuses = self._ask_core_state(timeout * 0.8)
        failures: list[CollectorError] = []
        requests: dict[str, dict[str, Any]] = {}
        for address, listing in listings.items():
            try:
                offered = self._offered(address, listing)
            except CollectorError as e:
                failures.append(e)
                continue
            stub = self._stub(address)
            left = max(0.01, end - time.monotonic())
            requests[address] = {
                name: stub.GetRuntimeMetric.future(self._pb.MetricRequest(metric_name=name), timeout=left)
                for name in offered
            }
        readings: dict[Key, tuple[str, float | Histogram]] = {}  # -> (the port it came from, value)
        for address, futures in requests.items():
            answered = 0
            for name, future in futures.items():
                try:
                    self._read(BY_NAME[name], self._answer(address, future), address, readings)
                    answered += 1
                except CollectorError as e:
                    if e.reason == UNKNOWN_METRICS:  # NOT_FOUND: a runtime that does not have this one
                        continue
                    failures.append(e)
                    if e.reason in (UNAVAILABLE, DEADLINE):
                        break  # the port is gone; the rest of its answers would say the same
            else:
                if not answered:
                    failures.append(CollectorError(UNKNOWN_METRICS, f"{address} answered none of our metrics"))
        result = [Sample(metric, labels, value) for (metric, labels), (_, value) in readings.items()]
        result.append(self._unknown_count())
        result += self._core_state(statuses)
        if failures:
            raise CollectorError(failures[0].reason, "; ".join(str(f) for f in failures), partial=result)
        return result

    def _offered(self, address: str, listing: Any) -> list[str]:
        """Our metrics that the runtime at ``address`` offers."""
        try:
            listed = {m.metric_name for m in self._answer(address, listing).supported_metric}
        except CollectorError as e:
            if "UNIMPLEMENTED" not in str(e):
                raise
            listed = set(BY_NAME)  # an older runtime without the listing: ask for everything
        self._note_unknown(address, frozenset(listed) - frozenset(BY_NAME))
        offered = [name for name in BY_NAME if name in listed]
        if not offered:
            sample = ", ".join(sorted(listed)[:5]) or "nothing"
            raise CollectorError(
                UNKNOWN_METRICS, f"{address} offers none of the metrics tpuscope reads (it lists {sample})"
            )
        missing = frozenset(BY_NAME) - set(offered)
        if self._missing.get(address) != missing:
            self._missing[address] = missing
            if missing:
                log.info(
                    "libtpu at %s does not offer %d of our metrics: %s",
                    address,
                    len(missing),
                    ", ".join(sorted(missing)),
                )
        return offered

    def _note_unknown(self, address: str, unknown: frozenset[str]) -> None:
        """Remember what the runtime at ``address`` offers that we do not read; log the names when they change."""
        if self._unknown.get(address, frozenset()) != unknown and unknown:
            log.info(
                "libtpu at %s offers %d metrics tpuscope does not read (a newer runtime?): %s",
                address,
                len(unknown),
                ", ".join(sorted(unknown)),
            )
        self._unknown[address] = unknown

    def _unknown_count(self) -> Sample:
        """How many metrics the runtimes offer that we do not read: each name once, whatever the ports."""
        names = frozenset().union(*self._unknown.values())
        return Sample(catalog.COLLECTOR_UNKNOWN_METRICS, (self.name,), float(len(names)))

    def _ask_core_state(self, timeout: float) -> dict[str, Any]:
        """While a workload stalls, every port's cores' state, asked now and awaited after the metrics."""
        stalled = self.stall.stalled()
        if stalled != self._stalled:
            self._stalled = stalled
            if stalled:
                log.info(
                    "workload %s: no progress for %g s; asking the TPU runtime where its cores are",
                    ", ".join(stalled),
                    self.stall.after,
                )
        if not stalled:
            self._clock.forget()
            return {}
        request = self._pb.GetTpuRuntimeStatusRequest(include_hlo_info=True)
        return {
            address: self._stub(address).GetTpuRuntimeStatus.future(request, timeout=timeout)
            for address in self.addresses
            if address not in self._without_status
        }

    def _core_state(self, statuses: dict[str, Any]) -> list[Sample]:
        """The cores' state from every port that answered; a port that did not costs only its cores (logged), never
        the collection: the metrics are what the collector is up for."""
        found: dict[tuple[str, str], core_state.CoreAt] = {}
        for address, future in statuses.items():
            try:
                response = self._answer(address, future)
            except CollectorError as e:
                if "UNIMPLEMENTED" in str(e):  # an older runtime: asking again would only cost it
                    self._without_status.add(address)
                if self._status_failed.get(address) != e.reason:
                    log.info("libtpu at %s did not say where its cores are: %s", address, e)
                self._status_failed[address] = e.reason
                continue
            self._status_failed.pop(address, None)
            for core in core_state.cores(response):
                found.setdefault(core.key, core)  # a core two ports both report is counted once
        return self._clock.samples(list(found.values())[: core_state.MAX_CORES]) if statuses else []

    def _answer(self, address: str, future: Any) -> Any:
        """The RPC's response, or the failure as a CollectorError with its reason."""
        try:
            return future.result()
        except self._rpc.RpcError as e:
            code = e.code()
            detail = e.details()
        reason = {
            self._rpc.StatusCode.UNAVAILABLE: UNAVAILABLE,
            self._rpc.StatusCode.DEADLINE_EXCEEDED: DEADLINE,
            self._rpc.StatusCode.NOT_FOUND: UNKNOWN_METRICS,
        }.get(code, ERROR)
        if reason in (UNAVAILABLE, DEADLINE):
            self._reset(address)
        raise CollectorError(reason, f"{address}: {code.name}: {detail}")

    def _read(self, runtime: RuntimeMetric, response: Any, address: str, into: dict[Key, tuple[str, Any]]) -> None:
        """Fold one response's values (one per device, or per buffer size) into ``into``.

        A value that cannot be used is left out and reported; the response's other values still count.
        """
        if response.metric.name and response.metric.name != runtime.name:
            raise CollectorError(INVALID_RESPONSE, f"{address}: asked for {runtime.name}, got {response.metric.name}")
        problems = []
        for value in response.metric.metrics:
            try:
                labels = self._labels(runtime, value.attribute)
                reading = _value(value, runtime.per_unit)
                if isinstance(reading, Histogram) != (runtime.metric.kind is catalog.Kind.HISTOGRAM):
                    raise ValueError("a gauge where a distribution belongs, or the other way round")
                key = (runtime.metric, labels)
                if key in into:
                    origin, previous = into[key]
                    if runtime.metric is not catalog.MEGASCALE_LATENCY or origin == address:
                        # A device has one value: two for the same device id cannot both be right.
                        raise ValueError(f"device {labels[0]} reported by both {origin} and {address}")
                    reading = previous + reading  # megascale is per process: the ports' counts add up
            except ValueError as e:
                problems.append(str(e))
                continue
            into[key] = (address, reading)
        if problems:
            raise CollectorError(INVALID_RESPONSE, f"{address}: {runtime.name}: {'; '.join(sorted(set(problems)))}")

    def _labels(self, runtime: RuntimeMetric, attribute: Any) -> tuple[str, ...]:
        if runtime.metric is catalog.MEGASCALE_LATENCY:
            return (runtime.operation, _attribute(attribute, _BUFFER_SIZE_KEYS) or "")
        device = _attribute(attribute, _DEVICE_KEYS)
        if device is None:
            raise ValueError("a value without a device attribute")
        return (device, self.accelerator, SOURCE)


def _attribute(attribute: Any, keys: tuple[str, ...]) -> str | None:
    """The value of the first of ``keys`` in a runtime attribute (a plain value or a key/value list)."""
    value = attribute.value
    kind = value.WhichOneof("attr")
    if kind == "kvlist_attr":
        for item in value.kvlist_attr.attributes:
            if item.key in keys:
                return _scalar(item.value)
        return None
    if attribute.key in keys or not attribute.key:
        return _scalar(value)
    return None


def _scalar(value: Any) -> str:
    kind = value.WhichOneof("attr")
    if kind not in ("int_attr", "string_attr"):
        raise ValueError(f"unexpected attribute type {kind}")
    return str(getattr(value, kind))


def _value(metric: Any, per_unit: float) -> float | Histogram:
    kind = metric.WhichOneof("measure")
    if kind == "gauge":
        number = metric.gauge.WhichOneof("value")
        if number not in ("as_double", "as_int"):
            raise ValueError(f"a gauge holding {number}")
        return float(getattr(metric.gauge, number)) / per_unit
    if kind == "distribution":
        return _histogram(metric.distribution, per_unit)
    raise ValueError(f"unexpected measure {kind}")


def _histogram(distribution: Any, per_unit: float) -> Histogram:
    """A runtime distribution as a Prometheus histogram: cumulative counts at the runtime's own upper bounds."""
    bounds = [b / per_unit for b in _bounds(distribution.bucket_options)]
    counts = list(distribution.bucket_counts)
    # len(bounds) finite buckets (the first is the underflow) plus the overflow; trailing
    # empty buckets may be left out of bucket_counts.
    if len(counts) > len(bounds) + 1:
        raise ValueError(f"{len(counts)} bucket counts for {len(bounds)} bounds")
    counts += [0] * (len(bounds) + 1 - len(counts))
    if any(c < 0 for c in counts) or bounds != sorted(set(bounds)):
        raise ValueError("negative counts or unsorted bounds")
    cumulative: list[tuple[float, float]] = []
    total = 0
    for bound, count in zip([*bounds, float("inf")], counts, strict=True):
        total += count
        cumulative.append((bound, float(total)))
    return Histogram(tuple(cumulative), distribution.mean * total / per_unit)


def _bounds(options: Any) -> list[float]:
    kind = options.WhichOneof("options")
    if kind == "exponential_buckets":
        e = options.exponential_buckets
        return [e.scale * e.growth_factor**i for i in range(e.num_finite_buckets + 1)]
    if kind == "linear_buckets":
        lin = options.linear_buckets
        return [lin.offset + lin.width * i for i in range(lin.num_finite_buckets + 1)]
    if kind == "explicit_buckets":
        return list(options.explicit_buckets.bounds)
    raise ValueError(f"unsupported bucket layout {kind}")
