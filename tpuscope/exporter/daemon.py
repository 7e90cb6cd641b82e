"""``tpuscope serve``: wire the event socket, the aggregator and /metrics together."""

from __future__ import annotations

import logging
import signal
import sys
import threading
from types import FrameType

from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    disable_created_metrics,
)

from tpuscope.exporter.aggregator import Aggregator
from tpuscope.exporter.config import ServeConfig
from tpuscope.exporter.http import MetricsServer
from tpuscope.exporter.ingest import IngestLoop, SocketError

log = logging.getLogger("tpuscope.exporter")


def build_registry() -> CollectorRegistry:
    """Our catalogue plus the sidecar's own process_* and python_* metrics."""
    # `_created` series would double the series count and show up as stray gauges
    # in the text format Prometheus scrapes; nothing downstream uses them.
    disable_created_metrics()  # type: ignore[no-untyped-call]
    registry = CollectorRegistry(auto_describe=True)
    for collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
        registry.register(collector)
    return registry


def serve(config: ServeConfig) -> int:
    logging.basicConfig(level=config.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    registry = build_registry()
    aggregator = Aggregator(registry)
    try:
        ingest = IngestLoop(config.socket, config.socket_mode, aggregator)
    except SocketError as e:
        print(f"tpuscope serve: {e}", file=sys.stderr)
        return 1
    try:
        http = MetricsServer(config.listen_host, config.listen_port, registry)
    except OSError as e:
        ingest.stop()
        print(
            f"tpuscope serve: cannot listen on {config.listen_host}:{config.listen_port}: {e.strerror}", file=sys.stderr
        )
        return 1

    stop = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        log.info("received %s, shutting down", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    ingest.start()
    http.start()
    # One line on stdout that people and tests can read: where to look, where to send.
    print(f"tpuscope serve: metrics at {http.url}, events at {config.socket}", flush=True)
    while not stop.wait(1.0):
        pass
    http.stop()
    ingest.stop()
    log.info("stopped")
    return 0
