"""A fake of GKE's TPU device plugin's metrics endpoint, written from its published format (GKE's "TPU metrics",
and expositions captured from ``tpu-device-plugin`` on v6e and tpu7x nodes): gauges per chip, percentages for the
ratios, labelled ``accelerator_id`` (``<node id>-<chip index>``), ``make``, ``model`` and ``tpu_topology``; each once
per container holding the chip (with ``pod``, ``namespace``, ``container``) and once per chip of the node
(``*_node``), some metrics only in one of the two, and the Go runtime's own series beside them.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

NODE_ID = "7265209851243518202"
MODEL, TOPOLOGY = "tpu-v5p-slice", "2x2x4"  # GKE's names: a v5p slice of 16 chips, 4 hosts of 4
HOLDER = ("ml", "train-0", "train")  # namespace, pod, container: the pod the sidecar runs in
OTHER = ("ml", "eval-0", "eval")
GIB = 2**30


@dataclass(frozen=True)
class PluginChip:
    """One chip as the plugin reports it; ``holder`` the container it is allocated to, if any."""

    index: int
    duty_percent: float
    tensorcore_percent: float
    hbm_used: float
    hbm_total: float
    bandwidth_percent: float
    holder: tuple[str, str, str] | None = HOLDER


def chips(n: int = 4, holder: tuple[str, str, str] | None = HOLDER, first: int = 0) -> list[PluginChip]:
    """Distinct values per chip, so a value under the wrong device fails the test."""
    return [
        PluginChip(i, 10.0 + 20 * (i % 4), 5.0 + 10 * (i % 4), (i + 1) * GIB, 95 * GIB, 2.5 * (i + 1), holder)
        for i in range(first, first + n)
    ]


# name -> (help, per container, per node): which variants this plugin version serves (tensorcore_utilization
# per node only, as on tpu7x; memory_bandwidth_utilization per container only, as in the v6e sample).
FAMILIES = {
    "duty_cycle": ("Percent of time when the TPU was actively processing", True, True),
    "memory_total": ("Total memory available on the TPU in bytes", True, True),
    "memory_used": ("Allocated TPU memory in bytes", True, True),
    "memory_bandwidth_utilization": ("Memory bandwidth utilization of the TPU device", True, False),
    "tensorcore_utilization": ("Tensorcore percent utilization of the TPU device", False, True),
}


def value_of(chip: PluginChip, family: str) -> float:
    return {
        "duty_cycle": chip.duty_percent,
        "memory_total": chip.hbm_total,
        "memory_used": chip.hbm_used,
        "memory_bandwidth_utilization": chip.bandwidth_percent,
        "tensorcore_utilization": chip.tensorcore_percent,
    }[family]


def page(node: list[PluginChip], model: str = MODEL, topology: str = TOPOLOGY) -> str:
    """The plugin's /metrics: its families in client_golang's layout (labels sorted), then the Go runtime's."""
    lines = []
    for family, (help_text, per_container, per_node) in FAMILIES.items():
        for name, scoped in ((family, per_container), (family + "_node", per_node)):
            if not scoped:
                continue
            lines += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge"]
            for chip in node:
                labels = {"accelerator_id": f"{NODE_ID}-{chip.index}", "make": "cloud-tpu", "model": model}
                labels["tpu_topology"] = topology
                if name == family:  # per container: only the chips a container holds
                    if chip.holder is None:
                        continue
                    labels |= dict(zip(("namespace", "pod", "container"), chip.holder, strict=True))
                text = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
                lines.append(f"{name}{{{text}}} {value_of(chip, family):.17g}")
    lines += [
        "# HELP go_goroutines Number of goroutines that currently exist.",
        "# TYPE go_goroutines gauge",
        "go_goroutines 41",
        "# HELP promhttp_metric_handler_requests_total Total number of scrapes by HTTP status code.",
        "# TYPE promhttp_metric_handler_requests_total counter",
        'promhttp_metric_handler_requests_total{code="200"} 1873',
    ]
    return "\n".join(lines) + "\n"


class FakeDevicePlugin:
    """The plugin's metrics endpoint: answers ``page`` with ``status``; :meth:`stop` and :meth:`start` take it away
    and bring it back on the same port. ``requests`` counts the pages asked for."""

    def __init__(self, text: str) -> None:
        self.page = text
        self.status = 200
        self.requests = 0
        self.port = 0
        self._server: ThreadingHTTPServer | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> FakeDevicePlugin:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                fake.requests += 1
                body = fake.page.encode()
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
