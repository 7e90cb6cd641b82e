"""A child process's output, read line by line as it comes on a thread of its own, each line with when it came."""

from __future__ import annotations

import threading
import time
from typing import IO


class Lines:
    """Reads ``stream`` (a text pipe) to its end: :attr:`lines` is ``(time.time() it arrived, line)``."""

    def __init__(self, stream: IO[str] | None) -> None:
        self.lines: list[tuple[float, str]] = []
        self._stream = stream
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        if self._stream is None:
            return
        for line in self._stream:
            self.lines.append((time.time(), line.rstrip("\n")))

    def texts(self) -> list[str]:
        return [line for _, line in list(self.lines)]

    def when(self, text: str) -> float | None:
        """When the first line containing ``text`` arrived; None before it has."""
        return next((t for t, line in list(self.lines) if text in line), None)

    def join(self, timeout: float = 10.0) -> None:
        """Wait until the stream has ended (its process gone) and every line is read."""
        self._reader.join(timeout)
