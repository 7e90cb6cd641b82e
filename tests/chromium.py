"""Headless Chromium (Debian's ``chromium``) driven over the DevTools protocol, for tests of pages we write.

The protocol runs on a pipe (``--remote-debugging-pipe``: Chromium reads commands
on its fd 3 and answers on fd 4, one JSON message per NUL-terminated chunk), so
no port, no websocket library and nothing but Chromium itself is needed. A page
is opened with the console, the runtime's exceptions, the browser's own log
(failed loads, blocked resources) and every network request recorded, as a
person opening it with the developer tools would see them.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self


class ChromiumError(RuntimeError):
    pass


@dataclass
class PageVisit:
    """What opening a page showed: console messages, errors and the URLs it requested."""

    console: list[tuple[str, str]] = field(default_factory=list)  # (level, text) from console.* calls
    exceptions: list[str] = field(default_factory=list)  # uncaught script errors
    log: list[tuple[str, str]] = field(default_factory=list)  # (level, text) from the browser: failed loads...
    requests: list[str] = field(default_factory=list)

    def errors(self) -> list[str]:
        """Everything the developer tools' console would show in red."""
        return (
            [f"console.{level}: {text}" for level, text in self.console if level in ("error", "assert")]
            + [f"exception: {text}" for text in self.exceptions]
            + [f"log {level}: {text}" for level, text in self.log if level == "error"]
        )


class Chromium:
    """``with Chromium() as browser: visit = browser.open(path); browser.screenshot(png)``"""

    def __init__(self, width: int = 1280, height: int = 900) -> None:
        binary = shutil.which("chromium")
        if binary is None:
            raise ChromiumError("chromium is not installed: `make test` installs Debian's chromium package")
        self.profile = Path(tempfile.mkdtemp(prefix="ts-chromium-"))
        to_browser_read, self._to_browser = os.pipe()
        self._from_browser, from_browser_write = os.pipe()
        # Out of the way of 3 and 4 first, or moving one end there could close the other.
        to_browser_read, from_browser_write = (_above_4(fd) for fd in (to_browser_read, from_browser_write))
        # A shell puts the two pipe ends on fds 3 and 4, where Chromium looks for them.
        wiring = f'exec "$@" 3<&{to_browser_read} 4>&{from_browser_write} {to_browser_read}<&- {from_browser_write}>&-'
        self.log_path = self.profile / "chromium.log"
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(
                [
                    "bash",  # dash takes fd numbers of one digit only
                    "-c",
                    wiring,
                    "bash",
                    binary,
                    "--headless",
                    "--no-sandbox",  # root in a container has no user namespaces for the sandbox
                    "--disable-gpu",
                    "--no-first-run",
                    "--remote-debugging-pipe",
                    f"--user-data-dir={self.profile}",
                    f"--window-size={width},{height}",
                    "about:blank",
                ],
                pass_fds=(to_browser_read, from_browser_write),
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        os.close(to_browser_read)
        os.close(from_browser_write)
        self._buffer = b""
        self._next_id = 0
        self._events: list[dict[str, Any]] = []
        self.width, self.height = width, height
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]

    # --- the protocol ------------------------------------------------------------------------------------
    def call(self, method: str, session: str | None = None, timeout: float = 30.0, **params: Any) -> dict[str, Any]:
        """Send one command and wait for its answer; events that arrive meanwhile are kept."""
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params}
        if session:
            message["sessionId"] = session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            answer = self._receive(deadline)
            if answer.get("id") == self._next_id:
                if "error" in answer:
                    raise ChromiumError(f"{method}: {answer['error']}")
                return dict(answer.get("result", {}))
            self._events.append(answer)

    def page(self, method: str, **params: Any) -> dict[str, Any]:
        """A command to the page's session."""
        return self.call(method, session=self.session, **params)

    def _receive(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            if time.monotonic() > deadline:
                raise ChromiumError(f"no answer from Chromium; its log: {self.log_path.read_text()[-2000:]}")
            chunk = os.read(self._from_browser, 1 << 16)
            if not chunk:
                raise ChromiumError(f"Chromium closed the pipe; its log: {self.log_path.read_text()[-2000:]}")
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return dict(json.loads(message))

    def wait_for(self, method: str, timeout: float = 30.0) -> dict[str, Any]:
        """The first event ``method`` received (now, or already)."""
        deadline = time.monotonic() + timeout
        while True:
            for event in self._events:
                if event.get("method") == method:
                    self._events.remove(event)
                    return event
            self._events.append(self._receive(deadline))

    # --- what the tests use --------------------------------------------------------------------------------
    def open(self, path: Path) -> PageVisit:
        """Load ``path`` and wait for its load event; what the page logged and requested on the way."""
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.page(f"{domain}.enable")
        self._events.clear()
        self.page("Page.navigate", url=path.resolve().as_uri())
        self.wait_for("Page.loadEventFired")
        self.page("Runtime.evaluate", expression="1")  # a round trip: events of the load are in by now
        visit = PageVisit()
        for event in self._events:
            params = event.get("params", {})
            match event.get("method"):
                case "Runtime.consoleAPICalled":
                    text = " ".join(str(a.get("value", a.get("description", ""))) for a in params["args"])
                    visit.console.append((params["type"], text))
                case "Runtime.exceptionThrown":
                    details = params["exceptionDetails"]
                    visit.exceptions.append(details.get("exception", {}).get("description", details["text"]))
                case "Log.entryAdded":
                    visit.log.append((params["entry"]["level"], params["entry"]["text"]))
                case "Network.requestWillBeSent":
                    visit.requests.append(params["request"]["url"])
        self._events.clear()
        return visit

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page."""
        result = self.page("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in result:
            raise ChromiumError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def screenshot(self, path: Path) -> Path:
        """The whole page, top to bottom, as a PNG at ``path``."""
        height = int(self.evaluate("document.documentElement.scrollHeight"))
        self.page(
            "Emulation.setDeviceMetricsOverride", width=self.width, height=height, deviceScaleFactor=1, mobile=False
        )
        shot = self.page("Page.captureScreenshot", format="png", captureBeyondViewport=True)
        path.write_bytes(base64.b64decode(shot["data"]))
        return path

    def close(self) -> None:
        with contextlib.suppress(ChromiumError):
            self.call("Browser.close", timeout=5)
        os.close(self._to_browser)
        os.close(self._from_browser)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def _above_4(fd: int) -> int:
    """``fd`` moved to a number above 4."""
    moved = fcntl.fcntl(fd, fcntl.F_DUPFD, 10)
    os.close(fd)
    return moved
