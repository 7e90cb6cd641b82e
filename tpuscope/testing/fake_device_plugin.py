"""A fake of GKE's TPU device plugin's metrics endpoint (``:2112/metrics``), written from the plugin's source.

GKE's TPU device plugin is open source (ai-on-gke/tpu-device-plugin); each behaviour here comes from its
``pkg/metrics/metrics.go`` and ``prom_metrics.go`` at commit 4626a9f (nothing of it is copied), and the page is
checked against a real scrape of the plugin, ``../shared/reference/gke-device-plugin/axlearn_sample_metrics.txt``
(tests/test_gke_device_plugin.py serves that file as it is, too):

- **Two chip numberings.** ``accelerator_id`` is ``<GCE instance id>-<id>`` (``buildAccelID``). For ``duty_cycle``,
  ``memory_used`` and ``memory_total`` the id is what libtpu's metrics service says (``collectRuntimeMetrics*``):
  the runtime's device id, slice-wide on a multi-host slice (404, 405, 412, 413 in the real scrape). For
  ``tensorcore_utilization`` and ``memory_bandwidth_utilization``, read from the host's PCI metrics
  (``hostMetrics``), it is the chip's index on the host (0 to 3). The plugin holds no mapping between the two.
- **Per container and per node.** Each family comes once per TPU container (``namespace``, ``pod``, ``container``)
  and once per node (``*_node``). The runtime families hold what the libtpu at the container's pod IP, port 8431,
  reports (``runtimeMetrics``): the container's chips; the host families give every running TPU container the whole
  node's chips (``UpdateHostMetrics(ci, hmi, true)``), so with several TPU pods on a node (tpu7x with device
  spreading, the only generation that allows it) each pod is shown every chip there.
- **The host families' reset.** Once a minute they are reset and set again (``resetHostMetricsIfNeeded``): the
  ``*_node`` ones within the same call, each container's when the collection loop reaches it. :attr:`Node.host_reset`
  is that moment, when a scrape sees neither. Before the first 10 s tick after a start there is nothing but the Go
  runtime's series (:attr:`Node.ticked`).
- **Megascale histograms**, per container, without ``accelerator_id`` or a ``*_node`` twin, and only the last
  collected container's (``histCollector``): ``dcn_transfer_latencies_microsecond`` with ``buffer_size`` and
  ``type``, ``collective_end_to_end_latencies_microsecond`` with ``input_size`` and ``collective_type``, ... (the
  names and labels of ``prom_metrics.go``); libtpu's exponential buckets as ``le`` bounds in microseconds, the
  underflow at ``le`` = the scale. ``accelerator_request`` per container; the TCP counters (``*_count``).
- **Go's exposition**: families sorted by name, labels by name, values as Go's shortest form (``100``, ``6.5e+10``,
  ``1.048576e+06``), and the Go runtime's and promhttp's own series beside them.

The runtime's hang and slice-error detectors become node conditions (``MegascaleHangDetected``,
``SliceErrorDetected``) on the Node object, not series: they are not on this page.
"""

from __future__ import annotations

import decimal
import math
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

INSTANCE_ID = "2605441806135329501"  # a GCE instance id, the prefix of every accelerator_id
MODEL, TOPOLOGY = "tpu-v5p-slice", "8x8x16"  # GKE's node labels: a v5p host of a 1,024-chip slice, as in the scrape
HOLDER = ("ml", "train-0", "train")  # namespace, pod, container: the pod the sidecar runs in
OTHER = ("ml", "eval-0", "eval")
GIB = 2**30

# Each family's HELP, from prom_metrics.go; the per-node twins of the host families say "per node".
HELP = {
    "duty_cycle": "Percent of time when the TPU was actively processing",
    "memory_total": "Total memory available on the TPU in bytes",
    "memory_used": "Allocated TPU memory in bytes",
    "tensorcore_utilization": "Tensorcore percent utilization of the TPU device",
    "memory_bandwidth_utilization": "Memory bandwidth utilization of the TPU device",
}
RUNTIME_FAMILIES = ("duty_cycle", "memory_total", "memory_used")  # keyed by the runtime's device id
HOST_FAMILIES = ("tensorcore_utilization", "memory_bandwidth_utilization")  # keyed by the host's chip index
# The megascale latency histograms: the plugin's name -> (its labels beside the container's, HELP).
HISTOGRAMS = {
    "dcn_transfer_latencies_microsecond": (
        ("buffer_size", "type"),
        "Distribution of network-transfer latencies for multislice traffic",
    ),
    "collective_end_to_end_latencies_microsecond": (
        ("input_size", "collective_type"),
        "Distribution of end to end collective latency for multislice traffic",
    ),
    "compute_latencies_microsecond": (
        ("buffer_size",),
        "Host compute latency in microseconds. Measures the time it takes to compute a reduction operation in "
        "microseconds.",
    ),
    "grpc_tcp_min_round_trip_times_microsecond": (
        (),
        "Distribution of minimum network-transfer latencies per TCP connection",
    ),
}


@dataclass(frozen=True)
class PluginChip:
    """One chip of the node: its index on the host, the runtime's id for it, and what the plugin reads of it."""

    index: int
    runtime_id: int
    duty_percent: float
    tensorcore_percent: float
    hbm_used: float
    hbm_total: float
    bandwidth_percent: float


def chips(ids: Iterable[int] = (404, 405, 412, 413)) -> list[PluginChip]:
    """The node's chips, in order, with these runtime ids; distinct values per chip, so that a value under the
    wrong device fails a test."""
    return [
        PluginChip(i, runtime_id, 10.0 + 20 * i, 5.0 + 10 * i, (i + 1) * GIB, 95 * GIB, 2.5 * (i + 1))
        for i, runtime_id in enumerate(ids)
    ]


@dataclass(frozen=True)
class MegascaleSeries:
    """One histogram series: its family, its own labels (``buffer_size``...), libtpu's exponential buckets."""

    family: str
    labels: dict[str, str]
    counts: tuple[int, ...]  # underflow, finite buckets, overflow
    scale: float = 10.0
    growth: float = 2.0
    mean: float = 120.0


@dataclass
class TpuContainer:
    """A running TPU container: who it is, the chips its libtpu reports (by runtime id), its megascale series."""

    namespace: str
    pod: str
    container: str
    runtime_ids: tuple[int, ...]
    megascale: list[MegascaleSeries] = field(default_factory=list)


@dataclass
class Node:
    """What the plugin knows of its node, rendered by :func:`page` as the plugin's exposition."""

    chips: list[PluginChip]
    containers: list[TpuContainer]
    model: str = MODEL
    topology: str = TOPOLOGY
    host_reset: bool = False  # between the minute's Reset of the host families and their Set
    ticked: bool = True  # False: the first 10 s after the plugin started, before its first collection


def v5p_host(holder: tuple[str, str, str] = HOLDER, megascale: list[MegascaleSeries] | None = None) -> Node:
    """One host of a v5p 8x8x16 slice, its 4 chips held by one container (on GKE's v5p, a TPU container must take
    every chip of its node)."""
    node_chips = chips()
    return Node(node_chips, [TpuContainer(*holder, tuple(c.runtime_id for c in node_chips), megascale or [])])


def shared_tpu7x_node() -> Node:
    """A tpu7x node shared by two pods of 2 chips each (device spreading): each pod's libtpu reports its own chips,
    while the host families show both pods every chip."""
    node_chips = chips(range(4))
    halves = ((0, 1), (2, 3))
    pods = [TpuContainer(*who, ids) for who, ids in zip((HOLDER, OTHER), halves, strict=True)]
    return Node(node_chips, pods, model="tpu7x", topology="2x2x1")


def multislice_histograms() -> list[MegascaleSeries]:
    """Several series per size, as a multislice job's runtime answers: each transport, each kind of collective."""
    series = []
    for n, size in enumerate(("512B+", "1MB+", "8MB+")):
        for transport in ("grpc", "rdma"):
            counts = (0, 1 + n, 4, 9, 4, 1, 0)
            labels = {"buffer_size": size, "type": transport}
            series.append(MegascaleSeries("dcn_transfer_latencies_microsecond", labels, counts))
        for kind in ("ALL_REDUCE", "ALL_GATHER"):
            labels = {"input_size": size, "collective_type": kind}
            series.append(MegascaleSeries("collective_end_to_end_latencies_microsecond", labels, (1, 2, 3, 2, 1 + n)))
    return series


def go_float(value: float) -> str:
    """A float as Go's ``strconv.FormatFloat(v, 'g', -1, 64)`` writes it, which client_golang's text format uses."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value == 0:
        return "0"
    sign, digit_tuple, exponent = decimal.Decimal(repr(value)).normalize().as_tuple()
    digits = "".join(map(str, digit_tuple))
    point = len(digits) + int(exponent)  # where the decimal point falls in the digits
    exp10 = point - 1
    prefix = "-" if sign else ""
    if exp10 < -4 or exp10 >= 6:  # the shortest form's switch to an exponent
        mantissa = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
        return f"{prefix}{mantissa}e{'-' if exp10 < 0 else '+'}{abs(exp10):02d}"
    if point <= 0:
        return f"{prefix}0.{'0' * -point}{digits}"
    if point >= len(digits):
        return prefix + digits + "0" * (point - len(digits))
    return f"{prefix}{digits[:point]}.{digits[point:]}"


def _series(name: str, labels: dict[str, str], value: float) -> str:
    text = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return f"{name}{{{text}}} {go_float(value)}"


def page(node: Node) -> str:
    """The plugin's /metrics for ``node``: its families in client_golang's order, then the Go runtime's."""
    # name -> (type, help, {label values in label-name order: lines}): a series written twice (two containers
    # reporting one chip to a *_node family) keeps the last, as the plugin's Set does.
    families: dict[str, tuple[str, str, dict[tuple[str, ...], list[str]]]] = {}

    def add(name: str, kind: str, help_text: str, labels: dict[str, str], *lines: str) -> None:
        key = tuple(value for _, value in sorted(labels.items()))
        families.setdefault(name, (kind, help_text, {}))[2][key] = list(lines)

    common = {"make": "cloud-tpu", "model": node.model, "tpu_topology": node.topology}
    by_id = {c.runtime_id: c for c in node.chips}
    if node.ticked:
        for container in node.containers:
            who = {"namespace": container.namespace, "pod": container.pod, "container": container.container}
            for family in RUNTIME_FAMILIES:
                for runtime_id in container.runtime_ids:
                    chip = by_id[runtime_id]
                    for name, extra in ((family, who), (f"{family}_node", {})):
                        labels = {**common, **extra, "accelerator_id": f"{INSTANCE_ID}-{runtime_id}"}
                        add(name, "gauge", HELP[family], labels, _series(name, labels, _value(chip, family)))
            request = {**who, "resource_name": "google.com/tpu"}
            line = _series("accelerator_request", request, len(node.chips))
            add("accelerator_request", "gauge", "Requested TPU chip count", request, line)
            counter = {**common, **who}
            line = _series("grpc_tcp_packets_sent_count", counter, 1873)
            add("grpc_tcp_packets_sent_count", "counter", "Total count of packets TCP sends", counter, line)
        if not node.host_reset:
            scopes: list[tuple[dict[str, str], str, str]] = [({}, "_node", " per node")] + [
                ({"namespace": c.namespace, "pod": c.pod, "container": c.container}, "", "") for c in node.containers
            ]
            for family in HOST_FAMILIES:
                for extra, suffix, per in scopes:
                    for chip in node.chips:
                        labels = {**common, **extra, "accelerator_id": f"{INSTANCE_ID}-{chip.index}"}
                        name = family + suffix
                        add(name, "gauge", HELP[family] + per, labels, _series(name, labels, _value(chip, family)))
        if node.containers:  # only the last collected container's histograms
            last = node.containers[-1]
            who = {"namespace": last.namespace, "pod": last.pod, "container": last.container}
            for series in last.megascale:
                own, help_text = HISTOGRAMS[series.family]
                labels = {**common, **who, **{k: series.labels.get(k, "") for k in own}}
                add(series.family, "histogram", help_text, labels, *_histogram_lines(series, labels))
    # The Go runtime's and promhttp's own families, sorted in among the plugin's as client_golang's Gather does.
    add("go_goroutines", "gauge", "Number of goroutines that currently exist.", {}, "go_goroutines 41")
    rss = "process_resident_memory_bytes 4.2438656e+07"
    add("process_resident_memory_bytes", "gauge", "Resident memory size in bytes.", {}, rss)
    handled = 'promhttp_metric_handler_requests_total{code="200"} 1873'
    add(
        "promhttp_metric_handler_requests_total", "counter", "Total number of scrapes by HTTP status code.", {}, handled
    )
    lines = []
    for name in sorted(families):
        kind, help_text, by_labels = families[name]
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
        lines += [line for key in sorted(by_labels) for line in by_labels[key]]
    return "\n".join(lines) + "\n"


def _histogram_lines(series: MegascaleSeries, labels: dict[str, str]) -> list[str]:
    """libtpu's distribution as the plugin writes it: upper bounds scale * growth**i for the underflow and each
    finite bucket (repeated multiplication, as Go's loop), +Inf for the overflow; _sum is mean * count."""
    bounds, bound = [], series.scale
    for _ in range(len(series.counts) - 1):
        bounds.append(bound)
        bound *= series.growth
    text = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    lines, total = [], 0
    for bound, count in zip([*bounds, math.inf], series.counts, strict=True):
        total += count
        lines.append(f'{series.family}_bucket{{{text},le="{go_float(bound)}"}} {total}')
    lines.append(f"{series.family}_sum{{{text}}} {go_float(series.mean * total)}")
    lines.append(f"{series.family}_count{{{text}}} {total}")
    return lines


def _value(chip: PluginChip, family: str) -> float:
    return {
        "duty_cycle": chip.duty_percent,
        "memory_total": chip.hbm_total,
        "memory_used": chip.hbm_used,
        "memory_bandwidth_utilization": chip.bandwidth_percent,
        "tensorcore_utilization": chip.tensorcore_percent,
    }[family]


class FakeDevicePlugin:
    """The plugin's metrics endpoint: answers :attr:`page` (a :class:`Node`, rendered at each request, or a recorded
    exposition's text) with :attr:`status`; :meth:`stop` and :meth:`start` take it away and bring it back on the same
    port. ``requests`` counts the pages asked for."""

    def __init__(self, content: Node | str) -> None:
        self.page = content
        self.status = 200
        self.requests = 0
        self.port = 0
        self._server: ThreadingHTTPServer | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def text(self) -> str:
        return self.page if isinstance(self.page, str) else page(self.page)

    def start(self) -> FakeDevicePlugin:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                fake.requests += 1
                body = fake.text().encode()
                self.send_response(fake.status if self.path == "/metrics" else 404)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> FakeDevicePlugin:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
