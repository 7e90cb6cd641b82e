"""Where the Monitor's events go. A sink takes a finished event and must never
block or raise; the Monitor hands every event to each of its sinks in turn.

``SocketSink`` sends to the sidecar; ``RecordSink`` appends to a recording (JSON lines, read back by
:func:`tpuscope.events.read_records`). Spans are not a sink: the Monitor hands its events to
:mod:`tpuscope.tracing.spans` itself, which samples steps before any span exists.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
from pathlib import Path
from typing import Protocol

import msgspec

from tpuscope import events

log = logging.getLogger("tpuscope")

# While events are being lost, how often to say so again: the first loss is said at once, a job pointed at
# the wrong socket should not learn it from one line at exit. It is also the most often a loss is said at all:
# a sidecar that falls behind now and then (losses, a recovery, losses) is not said twice a flap.
REMIND_SECONDS = 60.0
# How long to wait before trying to reach an absent sidecar again. Until then
# events are dropped at the cost of one clock read, not a system call.
RECONNECT_SECONDS = 1.0
# Ask for a big send buffer: it is where events wait while the sidecar is
# busy. The kernel caps it at net.core.wmem_max.
SEND_BUFFER_BYTES = 4 << 20
_NOSIGNAL = socket.MSG_NOSIGNAL  # a sidecar gone away is an error to count, never a SIGPIPE in the job


class Sink(Protocol):
    def emit(self, event: events.AnyEvent) -> None: ...

    def close(self) -> None: ...


class SocketSink:
    """One message per event to the sidecar's Unix socket, without ever waiting.

    The connection is made lazily and remade after the sidecar restarts. A send
    that would block (the sidecar is behind and the buffer is full), or that
    finds no sidecar, is dropped and counted; the job never sees the error. The
    count of drops not yet reported rides along on the next step event, so the
    sidecar exports the job's losses too.
    """

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        self.path = os.fspath(path if path is not None else events.default_socket_path())
        self.sent = 0
        self.dropped = 0
        self.unreported_drops = 0
        self.last_error = ""
        self._sock: socket.socket | None = None
        self._next_connect = 0.0
        self._connect_error = "no sidecar"
        self._closed = False
        self._losing_since: float | None = None  # monotonic time of the first loss of the current run of losses
        self._run_said = False  # whether the current run of losses was said (and so its end will be)
        self._next_say = 0.0  # monotonic time before which no loss is said

    def emit(self, event: events.AnyEvent) -> None:
        if self.unreported_drops and isinstance(event, events.Step):
            event = msgspec.structs.replace(event, dropped=self.unreported_drops)  # rare: only after a drop
        sock = self._sock
        if sock is None and (sock := self._connect()) is None:
            self.drop(self._connect_error)
            return
        try:
            sock.send(events.encode(event), _NOSIGNAL)
        except BlockingIOError:
            self.drop("sidecar busy: send buffer full")
            return
        except OSError as e:  # the sidecar went away: reconnect on a later event
            self._disconnect()
            self.drop(f"{type(e).__name__}: {e}")
            return
        except (TypeError, ValueError, OverflowError) as e:  # a field the Monitor did not check: counted
            self.drop(f"invalid {type(event).__name__}: {type(e).__name__}: {e}")
            return
        self.sent += 1
        if self.unreported_drops and isinstance(event, events.Step):
            self.unreported_drops = 0
        if self._losing_since is not None:
            self._losing_since = None
            if self._run_said:
                log.warning("tpuscope: events reach the sidecar at %s again (%d lost in all)", self.path, self.dropped)

    def _connect(self) -> socket.socket | None:
        now = time.monotonic()
        if self._closed or now < self._next_connect:
            return None
        self._next_connect = now + RECONNECT_SECONDS
        try:  # out of file descriptors, socket() itself fails
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        except OSError as e:
            self._connect_error = f"cannot open a socket: {e.strerror}"
            return None
        # Non-blocking before the connect: a stopped sidecar (SIGSTOP, a debugger) with a full listen backlog
        # would hold a blocking connect, and with it Monitor() or the step that reconnects, for ever.
        sock.setblocking(False)
        try:
            sock.connect(self.path)
        except BlockingIOError:
            sock.close()
            self._connect_error = f"the sidecar at {self.path} does not accept connections (its backlog is full)"
            return None
        except OSError as e:
            sock.close()
            self._connect_error = f"no sidecar at {self.path}: {e.strerror}"
            return None
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER_BYTES)
        self._sock = sock
        return sock

    def _disconnect(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def drop(self, why: str) -> None:
        """Count an event that was not delivered."""
        self.dropped += 1
        self.unreported_drops += 1
        self.last_error = why
        if self._closed:
            return  # the close says what was lost
        now = time.monotonic()
        if self._losing_since is None:
            self._losing_since, self._run_said = now, False
        if now < self._next_say:
            return
        self._next_say = now + REMIND_SECONDS
        if not self._run_said:
            self._run_said = True
            log.warning(
                "tpuscope: events are not reaching the sidecar (%s); the job goes on, counting them, and this is "
                "said again every %g s while it lasts",
                why,
                REMIND_SECONDS,
            )
        else:
            log.warning(
                "tpuscope: still no events reaching the sidecar after %.0f s: %d lost so far (last: %s)",
                now - self._losing_since,
                self.dropped,
                why,
            )

    def close(self) -> None:
        self._closed = True
        self._connect_error = "the Monitor was closed"
        self._disconnect()


class RecordSink:
    """Appends every event as a JSON line (``tpuscope workload --record``): replayable without any sidecar."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self._file = open(path, "a", buffering=1)  # noqa: SIM115 - kept open for the Monitor's lifetime
        self._encoder = msgspec.json.Encoder()

    def emit(self, event: events.AnyEvent) -> None:
        self._file.write(self._encoder.encode(events.to_record(event, time.time())).decode() + "\n")

    def close(self) -> None:
        self._file.close()
