"""Run a real Alertmanager (Debian's ``prometheus-alertmanager``) on loopback, and a webhook that records.

The end-to-end alerting test routes a real page through them.
"""

from __future__ import annotations

import json
import threading
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
