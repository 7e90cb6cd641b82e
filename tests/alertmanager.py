"""Run a real Alertmanager (Debian's ``prometheus-alertmanager``) on loopback, and a webhook that records.

The end-to-end alerting test routes a real page through them; the routing tests post alerts straight to its
API v2, as Prometheus does, and read back which it holds inhibited.
"""

from __future__ import annotations

import json
import threading
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from tpuscope.testing.prometheus import ServerProcess


class AlertmanagerServer(ServerProcess):
    """``with AlertmanagerServer(workdir, config_text) as am: am.address``"""

    def __init__(self, workdir: Path, config: str, binary: str = "prometheus-alertmanager") -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / "alertmanager.yml").write_text(config)
        flags = [
            f"--config.file={workdir / 'alertmanager.yml'}",
            f"--storage.path={workdir / 'data'}",
            "--cluster.listen-address=",  # one instance: no gossip port
        ]
        super().__init__(binary, "prometheus-alertmanager", flags, workdir)

    def post_alerts(self, alerts: list[dict[str, Any]]) -> None:
        """Send ``alerts`` as Prometheus does (POST /api/v2/alerts): each with labels, annotations, startsAt."""
        request = urllib.request.Request(
            f"{self.url}/api/v2/alerts",
            data=json.dumps(alerts).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            response.read()

    def alerts_status(self) -> list[dict[str, Any]]:
        """Every alert it holds (GET /api/v2/alerts), with its ``status``: its state (active, suppressed) and
        the fingerprints of the alerts that inhibit it (``inhibitedBy``), worked out as it answers."""
        with urllib.request.urlopen(f"{self.url}/api/v2/alerts", timeout=10) as response:
            alerts: list[dict[str, Any]] = json.load(response)
        return alerts


class Webhook:
    """An HTTP server on loopback that keeps every notification POSTed to it, by path."""

    def __init__(self) -> None:
        self.received: list[tuple[str, dict[str, Any]]] = []
        received = self.received

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # the name http.server calls
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                received.append((self.path, json.loads(body)))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *_: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
