"""``gke-device-plugin``: the per-chip metrics GKE's TPU device plugin serves on every TPU node.

GKE runs a device plugin on each TPU node that serves Prometheus text at
``localhost:2112/metrics`` on the node's network (a pod with ``hostNetwork``
reaches it there; others at the node's IP, which the generated manifests pass
down as ``$(HOST_IP)``). It is there whether or not the job set
``TPU_RUNTIME_METRICS_PORTS``, which is why it is worth reading: on GKE most
TPU pods never set that variable, and libtpu's metrics service is then off.

Its series are gauges per chip, percentages for the ratios: ``duty_cycle``,
``tensorcore_utilization``, ``memory_used``, ``memory_total`` and
``memory_bandwidth_utilization``, labelled ``accelerator_id``
(``<node id>-<chip index>``), ``make``, ``model`` and ``tpu_topology``. Each
comes twice: once per container that holds the chip (with ``pod``,
``namespace`` and ``container``) and once per chip of the node, ``*_node``,
which also covers chips no container holds. Plugin versions differ in which
metrics have which variant (some serve bandwidth and TensorCore utilization
only per node).

What is served, and why:

- **One value per chip, never two**: the ``*_node`` value where there is one
  (every chip has it, bound or not), else the per-container one.
- **This pod's chips**: where the sidecar knows its pod (``POD_NAME`` and
  ``POD_NAMESPACE`` from the downward API) and the plugin attributes chips to
  pods, only the chips it attributes to this pod; two TPU pods sharing a node
  then do not both report the whole node. Where it attributes none (no job
  holds chips yet, or no pod is known: a TPU VM), every chip of the node.
- **libtpu wins where both answer**: while the TPU runtime's metrics service
  listens at ``--libtpu-address``, the libtpu collector reads the duty cycle,
  HBM and bandwidth per chip (finer: it also has per-core idle time, HLO
  queues, histograms, and its own interval), and this collector serves only
  what libtpu has not: TensorCore utilization. The two number chips
  differently (libtpu by device id, the plugin by its node-wide index), so the
  rule is per host, not per chip; a chip counted twice would double fleet
  totals such as the chip count.
"""

from __future__ import annotations

import logging
import os
import socket
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

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
from tpuscope.exporter.collectors.libtpu import RUNTIME_METRICS
from tpuscope.exporter.samples import Sample
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


@dataclass(frozen=True)
class PluginMetric:
    """One of the device plugin's per-chip gauges (its per-node twin is ``name + "_node"``) and ours."""

    name: str
    metric: catalog.Metric
    per_unit: float = 1.0  # 100: a percentage that becomes a ratio


PLUGIN_METRICS = (
    PluginMetric("duty_cycle", catalog.DUTY_CYCLE, 100),
    PluginMetric("tensorcore_utilization", catalog.TENSORCORE_UTILIZATION, 100),
    PluginMetric("memory_used", catalog.DEVICE_MEMORY_USED),
    PluginMetric("memory_total", catalog.DEVICE_MEMORY_LIMIT),
    PluginMetric("memory_bandwidth_utilization", catalog.MEMORY_BANDWIDTH_UTILIZATION, 100),
)
BY_NAME = {m.name: m for m in PLUGIN_METRICS} | {m.name + NODE_SUFFIX: m for m in PLUGIN_METRICS}
# What the libtpu collector reads too: while the runtime's metrics service listens, those are its.
LIBTPU_READS = frozenset(m.metric for m in RUNTIME_METRICS)

# The device plugin's label names (its format, not ours).
CHIP, MODEL, TOPOLOGY, POD, NAMESPACE = "accelerator_id", "model", "tpu_topology", "pod", "namespace"


@dataclass(frozen=True)
class Reading:
    """One sample of one of our metrics from the page, and what it says about its chip."""

    metric: PluginMetric
    per_node: bool
    chip: str
    value: float
    labels: Mapping[str, str]


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


def parse(text: str) -> list[Reading]:
    """Our metrics' samples on a device plugin page; anything else there (Go runtime, promhttp) is ignored."""
    readings = []
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if (known := BY_NAME.get(sample.name)) is None or CHIP not in sample.labels:
                    continue
                per_node = sample.name.endswith(NODE_SUFFIX)
                value = float(sample.value) / known.per_unit
                readings.append(Reading(known, per_node, sample.labels[CHIP], value, sample.labels))
    except ValueError as e:
        raise CollectorError(INVALID_RESPONSE, f"not Prometheus text: {e}") from None
    return readings


def topology(readings: Iterable[Reading]) -> str | None:
    """The slice's topology (``4x4``) as the plugin labels its chips, if it does, and with one value."""
    found = {r.labels[TOPOLOGY] for r in readings if r.labels.get(TOPOLOGY)}
    return found.pop() if len(found) == 1 else None


def topology_from(address: str, timeout: float = PROBE_SECONDS) -> str | None:
    """What the device plugin at ``address`` says the topology is; None where nothing (readable) answers."""
    try:
        return topology(parse(fetch(address, timeout)))
    except CollectorError:
        return None


def this_pod(environ: Mapping[str, str] = os.environ) -> tuple[str, str] | None:
    """(namespace, pod) of the sidecar's pod, from the downward API variables the resource attributes use too."""
    found = [
        next((environ[n] for n in K8S_VARIABLES[attribute] if environ.get(n)), "")
        for attribute in ("k8s.namespace.name", "k8s.pod.name")
    ]
    return (found[0], found[1]) if all(found) else None


def our_chips(readings: list[Reading], pod: tuple[str, str] | None) -> tuple[set[str], str]:
    """The chips to serve, and whose they are: this pod's, where the plugin attributes chips to pods and the pod
    is known; else every chip of the node."""
    held: dict[str, tuple[str, str]] = {
        r.chip: (r.labels.get(NAMESPACE, ""), r.labels[POD]) for r in readings if not r.per_node and r.labels.get(POD)
    }
    if pod is None or not held:
        return {r.chip for r in readings}, "the node's"
    return {chip for chip, holder in held.items() if holder == pod}, f"pod {'/'.join(pod)}'s"


def chip_values(readings: list[Reading], chips: set[str]) -> dict[tuple[PluginMetric, str], Reading]:
    """One reading per (metric, chip): the per-node one where there is one, else the per-container one."""
    chosen: dict[tuple[PluginMetric, str], Reading] = {}
    for r in readings:
        if r.chip not in chips:
            continue
        key = (r.metric, r.chip)
        if key not in chosen or (r.per_node and not chosen[key].per_node):
            chosen[key] = r
    return chosen


def device_label(chip: str) -> str:
    """``1234567890-3`` -> ``3``: the chip's index on the node. The prefix names the node, which the
    ``instance`` and ``worker`` labels already do; keeping it would only lengthen every series."""
    return chip.rpartition("-")[2] or chip


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
            if not parse(fetch(address, PROBE_SECONDS)):
                return f"{metrics_url(address)} serves none of the TPU device plugin's metrics"
        except CollectorError as e:
            return f"no TPU device plugin at {metrics_url(address)} ({e})"
        return None

    def __init__(self, settings: Settings) -> None:
        self.address = settings.device_plugin_address or DEFAULT_ADDRESS
        self._libtpu = settings.libtpu_addresses
        self._pod = this_pod()
        self._state: tuple[str | None, str | None, str] | None = None  # (libtpu listening, topology, chips) logged

    def collect(self, timeout: float) -> list[Sample]:
        readings = parse(fetch(self.address, timeout * 0.8))
        if not readings:
            raise CollectorError(UNKNOWN_METRICS, f"{metrics_url(self.address)} serves none of the plugin's metrics")
        chips, whose = our_chips(readings, self._pod)
        libtpu = listening(self._libtpu)
        self._log_changes(libtpu, topology(readings), f"{len(chips)} of {whose} chips")
        samples = []
        for (known, chip), reading in chip_values(readings, chips).items():
            if libtpu and known.metric in LIBTPU_READS:
                continue
            labels = (device_label(chip), accelerator_label(reading.labels.get(MODEL, "")), SOURCE)
            samples.append(Sample(known.metric, labels, reading.value))
        return samples

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
