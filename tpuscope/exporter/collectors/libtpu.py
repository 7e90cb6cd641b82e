"""``libtpu``: the TPU runtime's own metrics service, over gRPC, as tpu-info and GKE's TPU device plugin read it.

libtpu serves ``tpu.monitoring.runtime.RuntimeMetricService`` on the ports of ``TPU_RUNTIME_METRICS_PORTS``, which
GKE's TPU device plugin sets in every TPU container (8431, up to 8431 to 8438 on an 8-chip host: one per process a
host may run); tpu-info dials 8431. The collector reads that variable where the sidecar has it, else every port the
plugin can set: a port no process has ever answered on is one this host's job does not use, not a failure, while
one that answered and stops is. Each collection asks every port which metrics it offers, then fetches all of ours
it offers at once: two round trips whatever the number of metrics. A metric a runtime does not offer (megascale on a
single slice) is simply absent; a runtime that offers none of ours is down with ``unknown_metrics``, which is what
a renamed metric in a new libtpu looks like. The metrics a runtime lists that tpuscope does not read are counted
(``collector_unknown_metrics``) and logged by name, so a newer libtpu's additions are noticed.

How values are keyed, as both clients read them (tpu-info 0.14.2 ``metrics.py``; the plugin's
``pkg/metrics/metrics.go`` at ai-on-gke/tpu-device-plugin 4626a9f):

- per-chip gauges (duty cycle, HBM) by the runtime's device id, an integer attribute whatever its key; on a
  multi-host slice a slice-wide id. ``device`` is the chip's index on the host (:mod:`.chips`), and
  ``tpuscope_tpu_chip_info`` maps one to the other;
- the HLO metrics by ``device_ordinal`` in a key/value list: the process's own ordinal, the k-th of the chips its
  port reports;
- megascale distributions several per size: a key/value list with the size (``buffer_size``; ``input_size`` for
  ``collective_end_to_end``; ``buffer-size`` as tpu-info spells it) and what kind (``type``: the transport, grpc or
  rdma; ``collective_type``: ALL_REDUCE...). They are served summed per operation and size, as tpu-info and Cloud
  Monitoring show them: the kinds are the runtime's open set, and the question they answer is how long a transfer of
  that size takes on this host. Sizes keep the runtime's spelling (``1MB+``);
- the runtime's error detectors (the gauges behind GKE's ``MegascaleHangDetected`` and ``SliceErrorDetected`` node
  conditions) as ``tpuscope_tpu_runtime_error_detected``, which the stall diagnosis reads.

While a workload on the host stalls, each collection also asks every port for its cores' state (:mod:`.core_state`),
in the same round trip as the listing; with a tpu-info older than the call (0.7) that is off, said once, and the
rest is read.

Distributions keep the runtime's own bucket bounds: bucket 0 is the underflow below the first bound and the last is
the overflow, as in Cloud Monitoring's ``Distribution``; they become Prometheus ``le`` bounds in seconds.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable, Mapping
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
from tpuscope.exporter.collectors.chips import HostChips
from tpuscope.exporter.samples import Histogram, Sample

if TYPE_CHECKING:
    import grpc

log = logging.getLogger("tpuscope.collectors")

DEFAULT_PORT = 8431
# The ports GKE's TPU device plugin puts in TPU_RUNTIME_METRICS_PORTS: one per chip of the host, 8 at most
# (pkg/tpu/util/util.go, acceleratorCountToMetricsPorts).
PLUGIN_PORTS = tuple(range(DEFAULT_PORT, DEFAULT_PORT + 8))
SOURCE = "libtpu"


@dataclass(frozen=True)
class RuntimeMetric:
    """One of the runtime's metrics and where it goes in our catalogue."""

    name: str
    metric: catalog.Metric
    # Runtime units per base unit: 100 (percent -> ratio), 1e6 (microseconds -> seconds). Dividing,
    # rather than multiplying by 1e-6, keeps bounds such as 100 us at 0.0001 s exactly.
    per_unit: float = 1.0
    operation: str = ""  # megascale: the `operation` label; the error detectors: the `reason` label


_MEGASCALE = "megascale.{}_latencies.microsecond.cumulative.distribution"
MEGASCALE_HANG = "megascale.error.detected.gauge"
SLICE_ERROR = "slice.error.detected.gauge"
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
    RuntimeMetric(MEGASCALE_HANG, catalog.TPU_RUNTIME_ERROR, operation="megascale_hang"),
    RuntimeMetric(SLICE_ERROR, catalog.TPU_RUNTIME_ERROR, operation="slice_error"),
)
BY_NAME = {m.name: m for m in RUNTIME_METRICS}
Key = tuple[catalog.Metric, tuple[str, ...]]

# Key/value-list keys. A device: the process's ordinal (the HLO metrics), or a runtime device id.
ORDINAL_KEY = "device_ordinal"
_DEVICE_ID_KEYS = ("device-id", "device_id")
# A megascale value's size, as libtpu spells it for each family (the plugin reads buffer_size and, for
# collective_end_to_end, input_size; tpu-info reads buffer-size).
_SIZE_KEYS = ("buffer_size", "buffer-size", "input_size", "transfer_size")
# The megascale error detector: the value of its error_type that the plugin's MegascaleHangDetected is.
_ERROR_TYPE, _HANG = "error_type", "HANG_DETECTED"


def addresses_from_environment(environ: Mapping[str, str] = os.environ) -> tuple[str, ...]:
    """``TPU_RUNTIME_METRICS_PORTS=8431,8432`` -> ``localhost:8431``, ``localhost:8432``; unset, every port GKE's
    device plugin may have given the job (a sidecar gets none: it holds no chips)."""
    ports = [p.strip() for p in environ.get("TPU_RUNTIME_METRICS_PORTS", "").split(",") if p.strip()]
    return tuple(f"localhost:{port}" for port in ports or PLUGIN_PORTS)


def local_chips() -> tuple[str | None, int | None]:
    """The chip model and how many the host has, from its PCI devices (tpu-info); (None, None) where unreadable."""
    try:
        from tpu_info import device

        chip, count = device.get_local_chips()
    except Exception:  # no sysfs, no permission, no tpu-info: both are niceties, never a reason to fail
        return None, None
    return (accelerator_name(chip.value.name) if chip and count else None), (count or None)


def accelerator_from_environment() -> str:
    """The chip model, from the TPU VM's metadata variable or the PCI devices, else plain ``tpu``."""
    return accelerator_name(os.environ.get("TPU_ACCELERATOR_TYPE", "")) or local_chips()[0] or "tpu"


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


@dataclass(frozen=True)
class _Value:
    """One value of a response, before its chip is known: what it is keyed by, and the value."""

    runtime: RuntimeMetric
    keyed_by: str  # "id" (a runtime device id), "ordinal" (the process's), "size" (megascale), "error"
    key: str
    value: float | Histogram


class LibtpuCollector(Collector):
    name = LIBTPU_COLLECTOR

    @classmethod
    def unavailable_here(cls, settings: Settings) -> str | None:
        if os.environ.get("TPU_RUNTIME_METRICS_PORTS"):
            return None
        if local_chips()[1]:
            return None
        return "no TPU chips on this host and TPU_RUNTIME_METRICS_PORTS is not set"

    def __init__(self, settings: Settings) -> None:
        self._rpc, self._pb, self._grpc = _stubs()
        self.addresses = settings.libtpu_addresses
        model, count = local_chips()
        self.accelerator = accelerator_name(os.environ.get("TPU_ACCELERATOR_TYPE", "")) or model or "tpu"
        self.chips = HostChips(count)
        self._channels: dict[str, tuple[grpc.Channel, Any]] = {}
        self._answered: set[str] = set()  # the ports a runtime has answered on: the ones this host's job uses
        self._missing: dict[str, frozenset[str]] = {}  # per address: our metrics it does not offer (logged once)
        self._unknown: dict[str, frozenset[str]] = {}  # per address: what it offers that we do not read
        self.stall = core_state.StallTrigger(
            settings.workload_progress, settings.core_state_after, settings.stuck_workloads
        )
        self._clock = core_state.CoreClock()
        self._without_status: set[str] = set()  # addresses whose runtime has no GetTpuRuntimeStatus
        self._stalled: list[str] = []  # the stalled workloads of the last collection (a change is logged)
        self._status_failed: dict[str, str] = {}  # per address: why its cores' state did not come (logged once)
        self._errors_logged: dict[str, str] = {}  # per detector: the runtime's last message (logged when it changes)
        self._status_call = hasattr(self._pb, "GetTpuRuntimeStatusRequest")
        if not self._status_call:
            log.warning(
                "libtpu: this tpu-info has no GetTpuRuntimeStatus (it came in 0.7): a stalled job's cores' state "
                "is off; the runtime's metrics are read as before (pip install 'tpuscope[tpu]')"
            )

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
        failures: dict[str, CollectorError] = {}
        requests: dict[str, dict[str, Any]] = {}
        for address, listing in listings.items():
            try:
                offered = self._offered(address, listing)
            except CollectorError as e:
                failures[address] = e
                continue
            stub = self._stub(address)
            left = max(0.01, end - time.monotonic())
            requests[address] = {
                name: stub.GetRuntimeMetric.future(self._pb.MetricRequest(metric_name=name), timeout=left)
                for name in offered
            }
        values: dict[str, list[_Value]] = {}
        for address, futures in requests.items():
            values[address] = []
            for name, future in futures.items():
                try:
                    found, invalid = self._read(BY_NAME[name], self._answer(address, future), address)
                    values[address] += found
                    if invalid is not None:
                        failures.setdefault(address, invalid)
                except CollectorError as e:
                    if e.reason == UNKNOWN_METRICS:  # NOT_FOUND: a runtime that does not have this one
                        continue
                    failures.setdefault(address, e)
                    if e.reason in (UNAVAILABLE, DEADLINE):
                        break  # the port is gone; the rest of its answers would say the same
            if not values[address] and address not in failures:
                failures[address] = CollectorError(UNKNOWN_METRICS, f"{address} answered none of our metrics")
        samples, problems = self._samples(values)
        result = [*samples, self._unknown_count(), *self._core_state(statuses)]
        failed = self._failures(failures, answered=bool(requests)) + problems
        if failed:
            raise CollectorError(failed[0].reason, "; ".join(str(f) for f in failed), partial=result)
        return result

    def _failures(self, failures: dict[str, CollectorError], answered: bool) -> list[CollectorError]:
        """What fails the collection: a port that has answered before; or, where no port answers at all, the first
        failure (a port no runtime has ever answered on is one the job does not use, once another one answers)."""
        counted = [e for address, e in failures.items() if address in self._answered]
        if answered or counted or not failures:
            return counted
        (_, error), *others = failures.items()
        more = f"; nor {len(others)} more ports ({', '.join(a for a, _ in others)})" if others else ""
        return [CollectorError(error.reason, f"{error}{more}")]

    def _offered(self, address: str, listing: Any) -> list[str]:
        """Our metrics that the runtime at ``address`` offers."""
        try:
            listed = {m.metric_name for m in self._answer(address, listing).supported_metric}
        except CollectorError as e:
            if "UNIMPLEMENTED" not in str(e):
                raise
            listed = set(BY_NAME)  # an older runtime without the listing: ask for everything
        self._answered.add(address)  # a runtime is there, whatever it offers
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
        """While a workload stalls, the cores' state from every port a runtime answers on, asked now and awaited
        after the metrics."""
        stalled = self.stall.stalled()
        if stalled != self._stalled:
            self._stalled = stalled
            if stalled:
                log.info(
                    "workload %s: no progress for %g s; asking the TPU runtime where its cores are",
                    ", ".join(stalled),
                    self.stall.after,
                )
        if not stalled or not self._status_call:
            self._clock.forget()
            return {}
        request = self._pb.GetTpuRuntimeStatusRequest(include_hlo_info=True)
        used = [a for a in self.addresses if a in self._answered] or self.addresses  # before any answer, all
        return {
            address: self._stub(address).GetTpuRuntimeStatus.future(request, timeout=timeout)
            for address in used
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
            for core in core_state.cores(response, self.chips.label):
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

    def _read(self, runtime: RuntimeMetric, response: Any, address: str) -> tuple[list[_Value], CollectorError | None]:
        """One response's values, each with what it is keyed by; a value that cannot be used is left out and
        reported, and the response's other values still count."""
        if response.metric.name and response.metric.name != runtime.name:
            error = CollectorError(INVALID_RESPONSE, f"{address}: asked for {runtime.name}, got {response.metric.name}")
            return [], error
        found, problems = [], []
        for value in response.metric.metrics:
            try:
                found.append(_keyed(runtime, value))
            except _NotOurs:
                continue
            except ValueError as e:
                problems.append(str(e))
        if not problems:
            return found, None
        return found, CollectorError(INVALID_RESPONSE, f"{address}: {runtime.name}: {'; '.join(sorted(set(problems)))}")

    def _samples(self, values: dict[str, list[_Value]]) -> tuple[list[Sample], list[CollectorError]]:
        """Every port's values under their labels: chips by their index on the host, megascale summed per operation
        and size, the error detectors as 0 or 1. A chip two ports both report is an error, not a sum."""
        ids = {a: sorted({int(v.key) for v in found if v.keyed_by == "id"}) for a, found in values.items()}
        for port_ids in ids.values():
            self.chips.see(port_ids)
        readings: dict[Key, tuple[str, float | Histogram]] = {}  # -> (the port it came from, value)
        problems: list[CollectorError] = []
        for address, found in values.items():
            for v in found:
                labels = self._labels(v, ids[address])
                key = (v.runtime.metric, labels)
                if key not in readings:
                    readings[key] = (address, v.value)
                    continue
                origin, previous = readings[key]
                if v.keyed_by in ("id", "ordinal"):  # a chip has one value: two cannot both be right
                    problems.append(
                        CollectorError(
                            INVALID_RESPONSE,
                            f"{v.runtime.name}: device {labels[0]} reported by both {origin} and {address}",
                        )
                    )
                elif v.keyed_by == "error":  # detected on any port: detected on the host
                    readings[key] = (address, max(_number_of(previous), _number_of(v.value)))
                else:  # megascale: several values per size and per process, which add up
                    readings[key] = (address, previous + v.value)  # type: ignore[operator]
        self._log_detections(v for found in values.values() for v in found if v.keyed_by == "error")
        samples = [Sample(metric, labels, value) for (metric, labels), (_, value) in readings.items()]
        return samples + self.chips.info(self.accelerator, SOURCE), problems

    def _log_detections(self, detections: Iterable[_Value]) -> None:
        """The runtime's message when one of its error detectors first fires (free text: the log's, not a label's)."""
        now: dict[str, str] = {}
        for v in detections:
            if v.value:
                now[v.runtime.operation] = v.key
        for reason, message in now.items():
            if self._errors_logged.get(reason) != message:
                log.warning("libtpu reports %s on this host: %s", reason, message or "(no message)")
        self._errors_logged = now

    def _labels(self, v: _Value, port_ids: list[int]) -> tuple[str, ...]:
        if v.keyed_by == "size":
            return (v.runtime.operation, v.key)
        if v.keyed_by == "error":
            return (v.runtime.operation,)
        number = int(v.key)
        if v.keyed_by == "ordinal" and number < len(port_ids):
            number = port_ids[number]  # the process's k-th chip: the k-th of the ids its port reports
        return (self.chips.label(number), self.accelerator, SOURCE)


def _keyed(runtime: RuntimeMetric, metric: Any) -> _Value:
    """One value of a response and what it is keyed by, as tpu-info and the device plugin read it."""
    value = _value(metric, runtime.per_unit)
    if isinstance(value, Histogram) != (runtime.metric.kind is catalog.Kind.HISTOGRAM):
        raise ValueError("a gauge where a distribution belongs, or the other way round")
    attributes = _kvlist(metric.attribute)
    if runtime.metric is catalog.MEGASCALE_LATENCY:
        size = next((attributes[k] for k in _SIZE_KEYS if k in attributes), "")
        return _Value(runtime, "size", size, value)
    if runtime.metric is catalog.TPU_RUNTIME_ERROR:
        if runtime.name == MEGASCALE_HANG and attributes.get(_ERROR_TYPE) != _HANG:
            raise _NotOurs
        return _Value(runtime, "error", attributes.get("error_message", ""), 1.0 if value else 0.0)
    if ORDINAL_KEY in attributes:
        return _Value(runtime, "ordinal", _number(attributes[ORDINAL_KEY]), value)
    device = next((attributes[k] for k in _DEVICE_ID_KEYS if k in attributes), None)
    if device is None and metric.attribute.value.WhichOneof("attr") in ("int_attr", "string_attr"):
        device = _scalar(metric.attribute.value)  # the runtime's id, whatever the attribute's key
    if device is None:
        raise ValueError("a value without a device attribute")
    return _Value(runtime, "id", _number(device), value)


class _NotOurs(ValueError):
    """A value of a shared family that is not the one read (another error type of the megascale detector)."""


def _number_of(value: float | Histogram) -> float:
    assert not isinstance(value, Histogram)
    return value


def _kvlist(attribute: Any) -> dict[str, str]:
    """A key/value-list attribute's items, each value as text; {} for a plain attribute."""
    if attribute.value.WhichOneof("attr") != "kvlist_attr":
        return {}
    return {item.key: _scalar(item.value) for item in attribute.value.kvlist_attr.attributes}


def _number(text: str) -> str:
    if not text.isdigit():
        raise ValueError(f"a device {text!r} that is not a number")
    return str(int(text))


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
