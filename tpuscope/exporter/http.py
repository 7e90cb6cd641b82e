"""The HTTP side: ``/metrics`` (Prometheus text or OpenMetrics, by the Accept
header; gzip when asked), ``/healthz``, and a landing page, as exporters have."""

from __future__ import annotations

import gzip
import socket
import threading
from collections.abc import Callable, Iterable
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import ThreadingWSGIServer

from tpuscope.exporter.exposition import OPENMETRICS, TEXT, Writer

WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]

LANDING_PAGE = b"""<!doctype html><html><head><title>tpuscope</title></head><body>
<h1>tpuscope sidecar</h1><p><a href="/metrics">/metrics</a> &middot; <a href="/healthz">/healthz</a></p>
</body></html>
"""


def make_app(registry: CollectorRegistry) -> WSGIApp:
    writer = Writer(registry)
    lock = threading.Lock()  # one scrape renders at a time: the writer's cache is not shared-safe

    def metrics(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        openmetrics = "application/openmetrics-text" in environ.get("HTTP_ACCEPT", "")
        with lock:
            body = writer.render(openmetrics)
        headers = [("Content-Type", OPENMETRICS if openmetrics else TEXT)]
        if "gzip" in environ.get("HTTP_ACCEPT_ENCODING", ""):
            body = gzip.compress(body, compresslevel=1)  # a scrape's text compresses 10x even at level 1
            headers.append(("Content-Encoding", "gzip"))
        start_response("200 OK", headers)
        return [body]

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "/")
        if path == "/metrics":
            return metrics(environ, start_response)
        if path == "/healthz":
            start_response("200 OK", [("Content-Type", "text/plain")])
            return [b"ok\n"]
        if path == "/":
            start_response("200 OK", [("Content-Type", "text/html; charset=utf-8")])
            return [LANDING_PAGE]
        start_response("404 Not Found", [("Content-Type", "text/plain")])
        return [b"not found; try /metrics\n"]

    return app


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # scrapes every few seconds would flood the log
        pass


class MetricsServer:
    """Serves the app on a thread; ``port`` is the bound port (useful with port 0)."""

    def __init__(self, host: str, port: int, registry: CollectorRegistry) -> None:
        server_class = type(
            "Server",
            (ThreadingWSGIServer,),
            {"address_family": socket.AF_INET6 if ":" in host else socket.AF_INET},
        )
        self._server: WSGIServer = make_server(
            host, port, make_app(registry), server_class, handler_class=_QuietHandler
        )
        self.host = host
        self.port: int = self._server.server_port
        self._thread = threading.Thread(target=self._server.serve_forever, name="tpuscope-http", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    @property
    def url(self) -> str:
        host = "localhost" if self.host in ("0.0.0.0", "::", "") else self.host
        return f"http://{'[' + host + ']' if ':' in host else host}:{self.port}/metrics"
