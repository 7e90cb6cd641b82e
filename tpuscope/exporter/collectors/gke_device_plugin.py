"""``gke-device-plugin``: the per-chip metrics GKE's TPU device plugin serves on every TPU node.

GKE runs a device plugin on each TPU node that serves Prometheus text at ``:2112/metrics`` on the node's network
(``hostNetwork``; a pod reaches it at the node's IP, which the generated manifests pass down as ``$(HOST_IP)``). It
is open source (ai-on-gke/tpu-device-plugin); what follows is from its ``pkg/metrics/`` at 4626a9f, and
``tpuscope/testing/fake_device_plugin.py`` says where each part comes from.

Its per-chip gauges are percentages for the ratios: ``duty_cycle``, ``memory_used`` and ``memory_total``, which it
reads from libtpu's metrics service at the TPU container's pod IP, and ``tensorcore_utilization`` and
``memory_bandwidth_utilization``, which it reads from the host's PCI metrics. Each comes once per TPU container
(with ``pod``, ``namespace`` and ``container``) and once per node (``*_node``), labelled ``accelerator_id``
(``<GCE instance id>-<id>``), ``make``, ``model`` and ``tpu_topology``. It also serves libtpu's megascale latency
histograms, per container, in microseconds.

What is served, and why:

- **One chip, one device.** The two kinds of gauge number chips differently: the libtpu ones by the runtime's
  device id (slice-wide on a multi-host slice: 404, 405, 412, 413), the host ones by the chip's index on the host
  (0 to 3). ``device`` is the index on the host for both, as from every other source (:mod:`.chips`), so duty
  cycle, HBM and TensorCore utilization name the same chips.
- **One value per chip, never two**: the ``*_node`` value where there is one, else the per-container one.
- **This pod's chips**: where the sidecar knows its pod (``POD_NAME`` and ``POD_NAMESPACE`` from the downward API),
  the chips the libtpu of its pod reports under its name, which are what the plugin allocated to it. The host
  families cannot say: the plugin writes every chip of the node under each TPU container. With no container's
  chips known (no job holds chips yet, or no pod is known: a TPU VM), every chip of the node.
- **No gap at the plugin's reset.** Once a minute the plugin resets its host families and sets them again; a
  scrape in between sees none. A family missing from a page that still has others is served as last seen, for
  :data:`HOLD_SECONDS` at most: the plugin's own refill comes within one of its 10 s ticks.
- **libtpu wins where both answer**: while the TPU runtime's metrics service listens at ``--libtpu-address``, the
  libtpu collector reads the duty cycle, HBM, bandwidth and megascale (finer: it also has per-core idle time, HLO
  queues, histograms, core state, its own interval), and this collector serves only what libtpu has not:
  TensorCore utilization. Where libtpu is not reachable from the sidecar, the plugin's copies of duty cycle, HBM
  and megascale latency are served instead.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from tpuscope import catalog
from tpuscope.accelerators import accelerator_name
from tpuscope.exporter.collectors.base import (
    DEADLINE,
    INVALID_RESPONSE,
    UNAVAILABLE,
    UNKNOWN_METRICS,
    Collector,
    CollectorError,
    Settings,
)
from tpuscope.exporter.collectors.chips import HostChips
from tpuscope.exporter.collectors.libtpu import RUNTIME_METRICS
from tpuscope.exporter.samples import Histogram, Sample
from tpuscope.otel import K8S_VARIABLES

log = logging.getLogger("tpuscope.collectors")

NAME = SOURCE = catalog.GKE_DEVICE_PLUGIN
DEFAULT_PORT = 2112  # GKE's documented port for the TPU device plugin's metrics
DEFAULT_ADDRESS = f"localhost:{DEFAULT_PORT}"
NODE_SUFFIX = "_node"
# A device plugin's page is a few kilobytes; more means something else answers on the port.
MAX_BYTES = 4 << 20
# How long ``auto`` waits, at start, for the endpoint to say whether it is there.
PROBE_SECONDS = 1.0
# The plugin is on this node: never through an HTTP proxy the pod's environment names for the outside world.
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


RUNTIME, HOST = "runtime", "host"  # how a family numbers its chips: the runtime's device id, or the host's index


@dataclass(frozen=True)
class PluginMetric:
    """One of the device plugin's per-chip gauges (its per-node twin is ``name + "_node"``) and ours."""

    name: str
    metric: catalog.Metric
    numbered_by: str  # RUNTIME or HOST: what the accelerator_id's last part is
    per_unit: float = 1.0  # 100: a percentage that becomes a ratio


PLUGIN_METRICS = (
    PluginMetric("duty_cycle", catalog.DUTY_CYCLE, RUNTIME, 100),
    PluginMetric("memory_used", catalog.DEVICE_MEMORY_USED, RUNTIME),
    PluginMetric("memory_total", catalog.DEVICE_MEMORY_LIMIT, RUNTIME),
    PluginMetric("tensorcore_utilization", catalog.TENSORCORE_UTILIZATION, HOST, 100),
    PluginMetric("memory_bandwidth_utilization", catalog.MEMORY_BANDWIDTH_UTILIZATION, HOST, 100),
)
BY_NAME = {m.name: m for m in PLUGIN_METRICS} | {m.name + NODE_SUFFIX: m for m in PLUGIN_METRICS}
# The plugin's megascale histograms (prom_metrics.go), in microseconds: its name -> our operation, and the label
# that holds the size. Several series per size (each transport, each kind of collective) are summed, as the libtpu
# collector sums them.
HISTOGRAMS = {
    "dcn_transfer_latencies_microsecond": ("dcn_transfer", "buffer_size"),
    "dcn_inbound_transfer_latencies_microsecond": ("dcn_inbound_transfer", "buffer_size"),
    "host_to_device_transfer_latencies_microsecond": ("host_to_device", "buffer_size"),
    "device_to_host_transfer_latencies_microsecond": ("device_to_host", "buffer_size"),
    "collective_end_to_end_latencies_microsecond": ("collective_end_to_end", "input_size"),
    "compute_latencies_microsecond": ("host_compute", "buffer_size"),
    "grpc_tcp_min_round_trip_times_microsecond": ("tcp_min_rtt", ""),
}
MICROSECONDS = 1e6
# What the libtpu collector reads too: while the runtime's metrics service listens, those are its.
LIBTPU_READS = frozenset(m.metric for m in RUNTIME_METRICS) | {catalog.TPU_CHIP_INFO}
# A family missing from a page that has others is served as last seen for this long: the plugin resets its host
# families once a minute and sets them again within one of its 10 s ticks.
HOLD_SECONDS = 30.0

# The device plugin's label names (its format, not ours).
CHIP, MODEL, TOPOLOGY, POD, NAMESPACE = "accelerator_id", "model", "tpu_topology", "pod", "namespace"


SeriesKey = tuple[str, tuple[str, str] | None, str]  # a reading's family, holder and chip


@dataclass(frozen=True)
class Reading:
    """One sample of one of our gauges on the page, and what it says about its chip."""

    metric: PluginMetric
    per_node: bool
    chip: str  # the accelerator_id's last part: a runtime device id or a host index, as metric.numbered_by says
    value: float
    labels: Mapping[str, str]

    @property
    def key(self) -> SeriesKey:
        """Which series it is: its family, the container it is written under (None: the node's), its chip."""
        return (self.metric.name, self.held_by(), self.chip)

    def held_by(self) -> tuple[str, str] | None:
        """(namespace, pod) of the container it is written under; None for a per-node one."""
        return None if self.per_node else (self.labels.get(NAMESPACE, ""), self.labels.get(POD, ""))


@dataclass(frozen=True)
class Latency:
    """One megascale histogram series on the page: our operation and size, whose it is, its distribution."""

    operation: str
    size: str
    holder: tuple[str, str]
    histogram: Histogram


@dataclass(frozen=True)
class Page:
    readings: list[Reading]
    latencies: list[Latency]


def metrics_url(address: str) -> str:
    return f"http://{address}/metrics"


def fetch(address: str, timeout: float) -> str:
    """The page at ``address``, or a CollectorError saying why not."""
    try:
        with _DIRECT.open(metrics_url(address), timeout=timeout) as response:
            body: bytes = response.read(MAX_BYTES + 1)
    except urllib.error.HTTPError as e:
        raise CollectorError(INVALID_RESPONSE, f"{address}: HTTP {e.code}") from None
    except TimeoutError:
        raise CollectorError(DEADLINE, f"{address}: no answer in {timeout:.2g} s") from None
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        if isinstance(reason, TimeoutError):
            raise CollectorError(DEADLINE, f"{address}: no answer in {timeout:.2g} s") from None
        raise CollectorError(UNAVAILABLE, f"{address}: {reason}") from None
    if len(body) > MAX_BYTES:
        raise CollectorError(INVALID_RESPONSE, f"{address}: more than {MAX_BYTES} bytes: not a device plugin")
    try:
        return body.decode()
    except UnicodeDecodeError:
        raise CollectorError(INVALID_RESPONSE, f"{address}: not text") from None


def parse(text: str) -> Page:
    """Our gauges' samples and the megascale histograms on a device plugin page; anything else there (the TCP
    counters, the Go runtime, promhttp) is ignored."""
    readings, latencies = [], []
    try:
        for family in text_string_to_metric_families(text):
            if family.name in HISTOGRAMS:
                latencies += _latencies(family.name, family.samples)
                continue
            for sample in family.samples:
                if (known := BY_NAME.get(sample.name)) is None or CHIP not in sample.labels:
                    continue
                chip = sample.labels[CHIP].rpartition("-")[2]
                if not chip.isdigit():
                    continue
                per_node = sample.name.endswith(NODE_SUFFIX)
                value = float(sample.value) / known.per_unit
                readings.append(Reading(known, per_node, chip, value, sample.labels))
    except ValueError as e:
        raise CollectorError(INVALID_RESPONSE, f"not Prometheus text: {e}") from None
    return Page(readings, latencies)


def _latencies(name: str, samples: Iterable[Any]) -> list[Latency]:
    """A histogram family's series, each as one distribution in seconds."""
    operation, size_label = HISTOGRAMS[name]
    series: dict[tuple[tuple[str, str], ...], dict[str, Any]] = {}
    for sample in samples:
        labels = tuple(sorted((k, v) for k, v in sample.labels.items() if k != "le"))
        parts = series.setdefault(labels, {"buckets": []})
        if sample.name.endswith("_bucket"):
            parts["buckets"].append((float(sample.labels["le"]) / MICROSECONDS, float(sample.value)))
        elif sample.name.endswith("_sum"):
            parts["sum"] = float(sample.value) / MICROSECONDS
    found = []
    for labels, parts in series.items():
        named = dict(labels)
        buckets = tuple(sorted(parts["buckets"]))
        if buckets and buckets[-1][0] == math.inf:
            holder = (named.get(NAMESPACE, ""), named.get(POD, ""))
            size = named.get(size_label, "") if size_label else ""
            found.append(Latency(operation, size, holder, Histogram(buckets, parts.get("sum", 0.0))))
    return found


def topology(readings: Iterable[Reading]) -> str | None:
    """The slice's topology (``4x4``) as the plugin labels its chips, if it does, and with one value."""
    found = {r.labels[TOPOLOGY] for r in readings if r.labels.get(TOPOLOGY)}
    return found.pop() if len(found) == 1 else None


def topology_from(address: str, timeout: float = PROBE_SECONDS) -> str | None:
    """What the device plugin at ``address`` says the topology is; None where nothing (readable) answers."""
    try:
        return topology(parse(fetch(address, timeout)).readings)
    except CollectorError:
        return None


def this_pod(environ: Mapping[str, str] = os.environ) -> tuple[str, str] | None:
    """(namespace, pod) of the sidecar's pod, from the downward API variables the resource attributes use too."""
    found = [
        next((environ[n] for n in K8S_VARIABLES[attribute] if environ.get(n)), "")
        for attribute in ("k8s.namespace.name", "k8s.pod.name")
    ]
    return (found[0], found[1]) if all(found) else None


def numbering(readings: list[Reading]) -> HostChips:
    """The node's chips as the page numbers them: the runtime ids its libtpu families report, and as many chips as
    its host families index."""
    indexes = {r.chip for r in readings if r.metric.numbered_by == HOST}
    chips = HostChips(len(indexes) or None)
    chips.see(int(r.chip) for r in readings if r.metric.numbered_by == RUNTIME)
    return chips


def device_of(reading: Reading, chips: HostChips) -> int:
    """The chip's index on the host, whichever numbering its family uses."""
    number = int(reading.chip)
    return chips.index(number) if reading.metric.numbered_by == RUNTIME else number


def our_chips(readings: list[Reading], pod: tuple[str, str] | None, chips: HostChips) -> tuple[set[int], str]:
    """The chips to serve (by index on the host), and whose they are: this pod's, where the plugin writes the chips
    of each pod's libtpu under its name and the pod is known; else every chip of the node."""
    allocated = [r for r in readings if r.metric.numbered_by == RUNTIME and not r.per_node and r.labels.get(POD)]
    if pod is None or not allocated:
        return {device_of(r, chips) for r in readings}, "the node's"
    return {device_of(r, chips) for r in allocated if r.held_by() == pod}, f"pod {'/'.join(pod)}'s"


def chip_values(
    readings: list[Reading], devices: set[int], chips: HostChips
) -> dict[tuple[PluginMetric, int], Reading]:
    """One reading per (metric, device): the per-node one where there is one, else the per-container one."""
    chosen: dict[tuple[PluginMetric, int], Reading] = {}
    for r in readings:
        device = device_of(r, chips)
        if device not in devices:
            continue
        key = (r.metric, device)
        if key not in chosen or (r.per_node and not chosen[key].per_node):
            chosen[key] = r
    return chosen


def megascale(latencies: list[Latency], pod: tuple[str, str] | None) -> list[Sample]:
    """The megascale histograms of this pod (the plugin shows the last collected container's), summed per operation
    and size."""
    summed: dict[tuple[str, str], Histogram] = {}
    for latency in latencies:
        if pod is not None and latency.holder != pod:
            continue
        key = (latency.operation, latency.size)
        summed[key] = summed[key] + latency.histogram if key in summed else latency.histogram
    return [Sample(catalog.MEGASCALE_LATENCY, key, histogram) for key, histogram in summed.items()]


def accelerator_label(model: str) -> str:
    """GKE's node-pool spelling (``tpu-v5-lite-podslice``, ``tpu-v6e-slice``, ``tpu7x``) as our ``accelerator``."""
    return accelerator_name(model.replace("-", " ")) or model or "tpu"


def listening(addresses: Iterable[str], timeout: float = 0.2) -> str | None:
    """The first of ``addresses`` that accepts a connection (the TPU runtime's metrics service is up), or None."""
    for address in addresses:
        host, _, port = address.rpartition(":")
        try:
            with socket.create_connection((host.strip("[]") or "localhost", int(port)), timeout=timeout):
                return address
        except (OSError, ValueError):
            continue
    return None


class GkeDevicePluginCollector(Collector):
    name = NAME

    @classmethod
    def unavailable_here(cls, settings: Settings) -> str | None:
        # The plugin answers before any TPU pod can start on the node (the pod is scheduled on the chips it
        # advertises), so one look at start is a fair test of "a GKE TPU node".
        address = settings.device_plugin_address or DEFAULT_ADDRESS
        try:
            if not parse(fetch(address, PROBE_SECONDS)).readings:
                return f"{metrics_url(address)} serves none of the TPU device plugin's metrics"
        except CollectorError as e:
            return f"no TPU device plugin at {metrics_url(address)} ({e})"
        return None

    def __init__(self, settings: Settings) -> None:
        self.address = settings.device_plugin_address or DEFAULT_ADDRESS
        self._libtpu = settings.libtpu_addresses
        self._pod = this_pod()
        self._seen: dict[SeriesKey, tuple[float, Reading]] = {}  # each reading, and when it was last seen
        self._state: tuple[str | None, str | None, str] | None = None  # (libtpu listening, topology, chips) logged

    def collect(self, timeout: float) -> list[Sample]:
        page = parse(fetch(self.address, timeout * 0.8))
        if not page.readings:
            raise CollectorError(UNKNOWN_METRICS, f"{metrics_url(self.address)} serves none of the plugin's metrics")
        readings = self._held(page.readings)
        chips = numbering(readings)
        devices, whose = our_chips(readings, self._pod, chips)
        libtpu = listening(self._libtpu)
        self._log_changes(libtpu, topology(readings), f"{len(devices)} of {whose} chips")
        model = next((r.labels.get(MODEL, "") for r in readings), "")
        accelerator = accelerator_label(model)
        samples = [
            Sample(known.metric, (str(device), accelerator, SOURCE), reading.value)
            for (known, device), reading in chip_values(readings, devices, chips).items()
            if not (libtpu and known.metric in LIBTPU_READS)
        ]
        if not libtpu:
            samples += megascale(page.latencies, self._pod)
            samples += [s for s in chips.info(accelerator, SOURCE) if int(s.labels[0]) in devices]
        return samples

    def _held(self, readings: list[Reading]) -> list[Reading]:
        """The page's readings, and those of the last pages it lacks, for :data:`HOLD_SECONDS` at most."""
        now = time.monotonic()
        self._seen = {
            key: (seen, reading) for key, (seen, reading) in self._seen.items() if now - seen < HOLD_SECONDS
        } | {r.key: (now, r) for r in readings}
        return [reading for _, reading in self._seen.values()]

    def _log_changes(self, libtpu: str | None, slice_topology: str | None, chips: str) -> None:
        """One line when what decides the series changes, not one per collection."""
        state = (libtpu, slice_topology, chips)
        if state == self._state:
            return
        self._state = state
        log.info(
            "device plugin at %s: %s, topology %s; %s",
            self.address,
            chips,
            slice_topology or "unknown",
            f"libtpu answers at {libtpu}, so only what it lacks (TensorCore utilization) comes from here"
            if libtpu
            else "libtpu's metrics service is not listening, so every metric comes from here",
        )
