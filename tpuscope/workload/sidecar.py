"""Run ``tpuscope serve`` as a child process and learn where it listens.

Used by ``tpuscope workload`` (which starts a sidecar when none is running) and by
the tests, which need real sidecar processes.
"""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

from tpuscope import events

READY = re.compile(r"^tpuscope serve: metrics at (?P<url>\S+), events at (?P<socket>.+)$")
# How a sidecar is started by default: this interpreter's tpuscope.
THIS_TPUSCOPE = (sys.executable, "-m", "tpuscope")


class SidecarProcess:
    """``with SidecarProcess(socket, listen="127.0.0.1:0") as sidecar: sidecar.url``

    ``env`` is added to this process's environment, or, with ``inherit_env=False``, is the whole of it; ``command``
    runs tpuscope (another installation's: a wheel's venv), from ``cwd``."""

    def __init__(
        self,
        socket: Path,
        listen: str = "127.0.0.1:0",
        *extra: str,
        timeout: float = 20.0,
        env: Mapping[str, str] | None = None,
        inherit_env: bool = True,
        command: Sequence[str] = THIS_TPUSCOPE,
        cwd: Path | None = None,
    ) -> None:
        self.socket = socket
        # The log goes to a file beside the socket: a pipe nobody reads would
        # block the sidecar once it filled.
        self.log_path = socket.with_name(socket.name + ".log")
        socket.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        if not any(arg.startswith("--shutdown-linger") for arg in extra):
            # Whoever started it reads it before stopping it: no scrape to wait for.
            extra = (*extra, "--shutdown-linger", "0")
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(
                [*command, "serve", "--listen", listen, "--socket", os.fspath(socket), *extra],
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
                env=({**os.environ, **env} if inherit_env else dict(env)) if env is not None else None,
                cwd=cwd,
            )
        self.url = self._wait_ready(timeout)

    def _wait_ready(self, timeout: float) -> str:
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.proc.stdout], [], [], 0.1)
            if ready:
                line = self.proc.stdout.readline()
                if match := READY.match(line.strip()):
                    return match["url"]
            if self.proc.poll() is not None:
                raise RuntimeError(f"tpuscope serve exited with {self.proc.returncode}: {self.log().strip()}")
        self.proc.kill()
        raise RuntimeError(f"tpuscope serve did not start within {timeout}s")

    def stop(self, timeout: float = 20.0) -> int:
        """SIGTERM, then wait (a sidecar on a machine loaded by JAX compiles can take seconds to join its threads);
        returns the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stdout:
            self.proc.stdout.close()
        return self.proc.returncode

    def log(self) -> str:
        return self.log_path.read_text()

    def __enter__(self) -> SidecarProcess:
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()


@contextmanager
def sidecar_for(socket: Path, listen: str, env: Mapping[str, str] | None = None) -> Iterator[str | None]:
    """Use the sidecar listening on ``socket``, or start one (with ``env`` added to its environment) for as long
    as the block runs; yields its /metrics URL if known."""
    try:
        running = socket.exists() and events.has_listener(socket)
    except OSError:  # cannot tell: start our own, whose bind says plainly what is wrong
        running = False
    if running:
        print(f"tpuscope workload: sending events to the sidecar already listening on {socket}")
        yield None
        return
    with SidecarProcess(socket, listen, env=env) as sidecar:
        print(
            f"tpuscope workload: started a sidecar; metrics at {sidecar.url} until the run ends "
            f"(--linger SECONDS keeps it serving after; log {sidecar.log_path})"
        )
        yield sidecar.url
