"""Run a real Alertmanager (Debian's ``prometheus-alertmanager``) on loopback, and a webhook that records.

The end-to-end alerting test routes a real page through them; fleet simulations can too.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from tpuscope.bench.prometheus import PrometheusError, free_port


class AlertmanagerServer:
    """``with AlertmanagerServer(workdir, config_text) as am: am.address``"""

    def __init__(self, workdir: Path, config: str, binary: str = "prometheus-alertmanager") -> None:
        path = shutil.which(binary)
        if path is None:
            raise PrometheusError(f"{binary} not found: install Debian's prometheus-alertmanager (`make test` does)")
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / "alertmanager.yml").write_text(config)
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.log_path = workdir / "alertmanager.log"
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(
                [
                    path,
                    f"--config.file={workdir / 'alertmanager.yml'}",
                    f"--storage.path={workdir / 'data'}",
                    f"--web.listen-address={self.address}",
                    "--cluster.listen-address=",  # one instance: no gossip port
                    "--log.level=warn",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise PrometheusError(f"alertmanager exited: {self.log_path.read_text()}")
            try:
                with urllib.request.urlopen(f"http://{self.address}/-/ready", timeout=1):
                    return
            except (urllib.error.URLError, ConnectionError):
                time.sleep(0.1)
        raise PrometheusError("alertmanager not ready after 30 s")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self) -> AlertmanagerServer:
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()


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
