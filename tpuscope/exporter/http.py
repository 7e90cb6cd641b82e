"""The HTTP side: ``/metrics`` (Prometheus text or OpenMetrics, by the Accept
header; gzip when Accept-Encoding asks), ``/healthz``, and a landing page, as exporters have."""

from __future__ import annotations

import gzip
import logging
import re
import socket
import ssl
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import ThreadingWSGIServer

from tpuscope.exporter.exposition import OPENMETRICS, TEXT, Writer
from tpuscope.exporter.webconfig import REALM, LiveWebConfig

log = logging.getLogger("tpuscope.exporter")
Socket = socket.socket  # for annotations inside a class whose attribute is named socket

WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]

LANDING_PAGE = b"""<!doctype html><html><head><title>tpuscope</title></head><body>
<h1>tpuscope sidecar</h1><p><a href="/metrics">/metrics</a> &middot; <a href="/healthz">/healthz</a></p>
</body></html>
"""


# --- content negotiation (RFC 9110, 12.5): Accept and Accept-Encoding -------------------------------------
# The versions of each format whose parsers read what the writer writes: OpenMetrics 0.0.1 is 1.0.0's draft,
# and the text format's 1.0.0 differs from 0.0.4 only in quoted UTF-8 names, which the catalogue has none of.
OPENMETRICS_VERSIONS = frozenset({"0.0.1", "1.0.0"})
TEXT_VERSIONS = frozenset({"0.0.4", "1.0.0"})

_QVALUE = re.compile(r"0(?:\.\d{0,3})?|1(?:\.0{0,3})?")


@dataclass(frozen=True)
class Preference:
    """One element of an Accept or Accept-Encoding list: a media range or a content coding, lower case."""

    value: str
    parameters: Mapping[str, str]  # q left out
    q: float


def split_outside_quotes(text: str, separator: str) -> list[str]:
    """``text`` split at ``separator`` where it is not inside a quoted string (one character at a time: a regular
    expression over quotes backtracks, and a client picks the header)."""
    if '"' not in text:
        return text.split(separator)
    parts, start, quoted, escaped = [], 0, False, False
    for index, char in enumerate(text):
        if escaped:
            escaped = False
        elif quoted and char == "\\":
            escaped = True
        elif char == '"':
            quoted = not quoted
        elif char == separator and not quoted:
            parts.append(text[start:index])
            start = index + 1
    parts.append(text[start:])
    return parts


def preferences(header: str) -> list[Preference]:
    """The header's elements, in order; an element whose q is no qvalue is left out, as one we cannot read."""
    found = []
    for element in split_outside_quotes(header, ","):
        value, *pairs = (part.strip() for part in split_outside_quotes(element, ";"))
        if not value:
            continue
        parameters = {}
        for pair in pairs:
            name, _, parameter = pair.partition("=")
            parameters[name.strip().lower()] = parameter.strip().strip('"')
        q = parameters.pop("q", "1")
        if _QVALUE.fullmatch(q):
            found.append(Preference(value.lower(), parameters, float(q)))
    return found


def media_quality(accepted: list[Preference], media_type: str, versions: frozenset[str]) -> tuple[float, int]:
    """The q the most specific matching media range gives ``media_type`` in any of ``versions``, and how specific
    it was: 3 the type with a version we write, 2 the type, 1 its ``type/*``, 0 ``*/*``; (0, -1) when none does."""
    major = media_type.partition("/")[0]
    best_q, best = 0.0, -1
    for p in accepted:
        if p.value == media_type:
            version = p.parameters.get("version")
            if version is not None and version not in versions:
                continue  # a version we do not write
            specificity = 2 if version is None else 3
        elif p.value == f"{major}/*":
            specificity = 1
        elif p.value == "*/*":
            specificity = 0
        else:
            continue
        if specificity > best or (specificity == best and p.q > best_q):
            best_q, best = p.q, specificity
    return best_q, best


def wants_openmetrics(accept: str) -> bool:
    """OpenMetrics when the client ranks it above the text format, or as high and names it: a bare ``*/*``
    (curl, a browser) or no Accept at all gets the text format, Prometheus' list gets OpenMetrics."""
    accepted = preferences(accept)
    openmetrics, named = media_quality(accepted, "application/openmetrics-text", OPENMETRICS_VERSIONS)
    text, _ = media_quality(accepted, "text/plain", TEXT_VERSIONS)
    return openmetrics > text or (openmetrics == text > 0 and named >= 2)


def coding_quality(accepted: list[Preference], coding: str) -> float | None:
    """The q the list gives a content coding: its own element's, else ``*``'s; None when neither is there."""
    own = [p.q for p in accepted if p.value == coding or (coding == "gzip" and p.value == "x-gzip")]
    anything = [p.q for p in accepted if p.value == "*"]
    return max(own) if own else max(anything) if anything else None


def wants_gzip(accept_encoding: str) -> bool:
    """gzip when the client accepts it (q > 0) and does not rank the uncompressed body (identity) higher."""
    accepted = preferences(accept_encoding)
    gzip_q = coding_quality(accepted, "gzip") or 0.0
    return gzip_q > 0 and gzip_q >= (coding_quality(accepted, "identity") or 0.0)


class _Body(list[bytes]):
    """A response body whose ``close()``, which the WSGI server calls once it has written the response, says so."""

    def __init__(self, body: bytes, written: Callable[[], None]) -> None:
        super().__init__([body])
        self._written = written

    def close(self) -> None:
        self._written()


def make_app(
    registry: CollectorRegistry,
    host_labels: Mapping[str, str] | None = None,
    on_scraped: Callable[[float], None] | None = None,
) -> WSGIApp:
    """``on_scraped``: called once a scrape of /metrics has been written, with the monotonic time it began."""
    writer = Writer(registry, host_labels)
    lock = threading.Lock()  # one scrape renders at a time: the writer's cache is not shared-safe

    def metrics(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        begun = time.monotonic()
        openmetrics = wants_openmetrics(environ.get("HTTP_ACCEPT", ""))
        with lock:
            body = writer.render(openmetrics)
        headers = [("Content-Type", OPENMETRICS if openmetrics else TEXT)]
        if wants_gzip(environ.get("HTTP_ACCEPT_ENCODING", "")):
            body = gzip.compress(body, compresslevel=1)  # a scrape's text compresses 10x even at level 1
            headers.append(("Content-Encoding", "gzip"))
        start_response("200 OK", headers)
        return [body] if on_scraped is None else _Body(body, lambda: on_scraped(begun))

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


def secure(app: WSGIApp, web: LiveWebConfig) -> WSGIApp:
    """``app`` behind the web config's basic auth, answering with its extra headers. Every path is
    protected, /healthz too, as the toolkit does."""

    def secured(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        config = web.current()

        def with_headers(status: str, headers: list[tuple[str, str]], *exc_info: Any) -> Any:
            return start_response(status, headers + config.headers, *exc_info)

        if config.users and not config.users.allows(environ.get("HTTP_AUTHORIZATION", "")):
            with_headers(
                "401 Unauthorized",
                [("Content-Type", "text/plain"), ("WWW-Authenticate", f'Basic realm="{REALM}"')],
            )
            return [b"Unauthorized\n"]
        return app(environ, with_headers)

    return secured


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # scrapes every few seconds would flood the log
        pass


class _SecureHandler(_QuietHandler):
    # A client that connects and then says nothing gives up its thread after this long.
    timeout = 10.0

    def setup(self) -> None:
        super().setup()  # applies the timeout
        if isinstance(self.connection, ssl.SSLSocket):
            self.connection.do_handshake()  # here, on the connection's own thread, never in the accept loop


class _SecureServerMixin:
    """Wraps each accepted connection in the web config's TLS context of the moment, so that a
    rotated certificate is served from the next connection on."""

    web: LiveWebConfig
    socket: Socket

    def get_request(self) -> tuple[Socket, Any]:
        connection, address = self.socket.accept()
        context = self.web.current().tls
        if context is not None:
            connection = context.wrap_socket(connection, server_side=True, do_handshake_on_connect=False)
        return connection, address

    def handle_error(self, request: Any, client_address: Any) -> None:
        error = sys.exc_info()[1]
        if isinstance(error, OSError):  # a failed handshake, a timeout, a client gone: theirs, not ours
            log.debug("connection from %s: %s", client_address[0], error)
            return
        super().handle_error(request, client_address)  # type: ignore[misc]


class MetricsServer:
    """Serves the app on a thread; ``port`` is the bound port (useful with port 0)."""

    def __init__(
        self,
        host: str,
        port: int,
        registry: CollectorRegistry,
        web_config: Path | None = None,
        host_labels: Mapping[str, str] | None = None,
    ) -> None:
        """Raises ``WebConfigError`` for a ``web_config`` file it cannot use, before binding anything.
        ``host_labels``: added to every series served (slice and worker)."""
        self.last_scrape = 0.0  # monotonic time the latest scrape of /metrics written began; 0: none yet
        app = make_app(registry, host_labels, self._scraped)
        bases: tuple[type, ...] = (ThreadingWSGIServer,)
        handler: type[WSGIRequestHandler] = _QuietHandler
        web = None
        if web_config is not None:  # without one, the server is exactly the plain one: scrapes stay as fast
            web = LiveWebConfig(web_config)
            app, bases, handler = secure(app, web), (_SecureServerMixin, ThreadingWSGIServer), _SecureHandler
        server_class = type(
            "Server", bases, {"address_family": socket.AF_INET6 if ":" in host else socket.AF_INET, "web": web}
        )
        self._server: WSGIServer = make_server(host, port, app, server_class, handler_class=handler)
        self.host = host
        self.port: int = self._server.server_port
        self.tls = web is not None and web.config.tls is not None
        self._thread = threading.Thread(target=self._server.serve_forever, name="tpuscope-http", daemon=True)

    def _scraped(self, begun: float) -> None:
        self.last_scrape = max(self.last_scrape, begun)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    @property
    def url(self) -> str:
        host = "localhost" if self.host in ("0.0.0.0", "::", "") else self.host
        return f"{'https' if self.tls else 'http'}://{'[' + host + ']' if ':' in host else host}:{self.port}/metrics"
