"""The event socket: bind it safely, then accept jobs and receive, decode and aggregate their events.

The socket is a Unix ``SOCK_SEQPACKET`` socket: like a datagram socket it keeps
one event per message, but each job gets its own connection, whose buffer is
sized in bytes (hundreds to thousands of events) instead of Linux's
``net.unix.max_dgram_qlen`` (10 datagrams by default, for all senders
together). A connection also tells the sidecar when a job goes away without
saying goodbye, which is how a SIGKILL'd job is seen at all (why it went, endings.py asks the VM's
metadata server).

One thread does everything. An event's handling takes microseconds, so a
queue between receiving and aggregating would only add a place to lose
events. What the thread cannot keep up with waits in the connection's buffer;
when that is full the job's send fails at once and the job counts the drop.
The same thread expires idle workloads (:meth:`Aggregator.expire`) between
events, so expiry never races with an event's handling.

The thread polls the jobs' connections rather than sleeping until one is
readable: a job's send that finds its receiver asleep pays to wake it, more
than the send itself (4.2 against 1.9 us on this project's machine), and it
pays it on the training thread at every step. So connections are read on a
timer, as often as every :data:`MIN_POLL_SECONDS` while events come, backing off to
:data:`MAX_POLL_SECONDS` when none do; only new connections wake the thread.
An event waits at most that long, and a job's buffer holds hundreds to thousands;
one read after a wait is filed at the kernel's stamp of its send, so its time is the job's, not the
poll's.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import select
import selectors
import socket
import stat
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tpuscope import catalog, events
from tpuscope.exporter.aggregator import Aggregator
from tpuscope.exporter.endings import ANSWER_SECONDS, Endings
from tpuscope.exporter.hangs import HangWatch, sender

log = logging.getLogger("tpuscope.exporter")

# More connections than this are refused: a host runs a handful of jobs, and
# each connection costs a file descriptor.
MAX_CONNECTIONS = 256
# Events handled from one connection before looking at the others, so one busy
# job cannot starve the rest.
BATCH = 256
# Seconds between expiry checks; also the longest the thread waits in select() with no job connected.
EXPIRY_CHECK_INTERVAL = 1.0
# The kernel stamps each event as the job sends it (SO_TIMESTAMP, a struct timeval; Python names no constant for
# it, 29 on Linux): the sidecar receives it up to a poll later, but files it at the time it happened.
SO_TIMESTAMP = getattr(socket, "SO_TIMESTAMP", 29)
_TIMEVAL = struct.Struct("@ll")
_STAMP_SPACE = socket.CMSG_SPACE(_TIMEVAL.size)
# Reading the stamp costs a tenth of the ingest's throughput. After a wait shorter than this, an event read is
# that recent (or waited in a backlog, as before polling): it is filed at the sidecar's clock.
STAMPED_AFTER_SECONDS = 0.002
# How often the connections are read: the wait halves after a round that found events (down to the shortest),
# and doubles after one that found none (up to the longest): idle with jobs connected, a round is a recv per job.
MIN_POLL_SECONDS = 0.001
MAX_POLL_SECONDS = 0.05
# After a failed accept() (out of file descriptors: the pending connection stays, and the listener would read
# as ready at once again), how long to stop accepting before trying again, and how often to say so.
ACCEPT_PAUSE_SECONDS = 1.0
ACCEPT_WARN_SECONDS = 60.0


class SocketError(RuntimeError):
    """The event socket cannot be bound; the message says why and what to do."""


def _sent_at(stamps: list[tuple[int, int, bytes]]) -> float | None:
    """The Unix time the kernel stamped on a received event, or None (no stamp: the sidecar's clock then)."""
    for level, kind, data in stamps:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMP and len(data) >= _TIMEVAL.size:
            seconds, microseconds = _TIMEVAL.unpack_from(data)
            stamp: float = seconds + microseconds / 1e6
            return stamp
    return None


def bind_event_socket(path: Path, mode: int) -> socket.socket:
    """Bind and listen on a Unix socket at ``path`` with permissions ``mode``.

    A stale socket left by a dead sidecar is replaced. Anything else at the path
    (a file, a directory, a symlink, a live sidecar's socket) is left alone and
    reported, so a mistyped path can never destroy data.
    """
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        pass
    else:
        if not stat.S_ISSOCK(st.st_mode):
            raise SocketError(f"{path} exists and is not a socket; refusing to replace it (choose another --socket)")
        try:
            listening = events.has_listener(path)
        except OSError as e:
            raise SocketError(f"cannot check {path}: {e.strerror}") from None
        if listening:
            raise SocketError(f"another process is already receiving on {path} (is a tpuscope serve running?)")
        log.info("removing stale socket %s", path)
        path.unlink()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    # The umask makes the socket born with `mode`, leaving no moment at which others could connect.
    old_umask = os.umask(0o777 & ~mode)
    try:
        sock.bind(os.fspath(path))
    except OSError as e:
        sock.close()
        raise SocketError(f"cannot bind {path}: {e.strerror}") from None
    finally:
        os.umask(old_umask)
    sock.listen(64)
    sock.setblocking(False)
    return sock


@dataclass(eq=False)  # compared by identity: one per accepted socket
class Connection:
    """One job process: who it is, and what it last told us."""

    sock: socket.socket
    pid: int
    workload: str = ""
    said_goodbye: bool = False
    watching: bool = False  # a Monitor's position thread, not a sender of events (exporter/hangs.py)


class IngestLoop:
    """Owns the listening socket; :meth:`start` serves it on a thread until :meth:`stop`."""

    def __init__(self, path: Path, mode: int, aggregator: Aggregator, hangs: HangWatch | None = None) -> None:
        self.path = path
        # Where each job process is, read every second; None: no hang diagnosis. Its directory is made before
        # the socket accepts: a Monitor's position thread looks for it as it connects.
        self._hangs = hangs if hangs is None or hangs.start() else None
        self._listener = bind_event_socket(path, mode)
        self._inode = os.stat(path).st_ino
        self._aggregator = aggregator
        self._endings = Endings(aggregator)  # why a job that vanished ended: booked on this thread, asked on its own
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ, None)
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._calls: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()  # see call()
        self._selector.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._stopping = threading.Event()
        self._connections: set[Connection] = set()
        self._connections_lock = threading.Lock()  # the host collector reads them from its own thread
        self._buffer = bytearray(events.MAX_DATAGRAM_BYTES + 1)
        self._thread = threading.Thread(target=self._run, name="tpuscope-ingest", daemon=True)
        self._accepting_again = 0.0  # monotonic time to listen again after a failed accept(); 0: listening
        self._next_accept_warning = 0.0
        self.last_left = 0.0  # monotonic time a job's connection last closed, or its verdict was booked

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        next_expiry = time.monotonic() + EXPIRY_CHECK_INTERVAL
        wait = MAX_POLL_SECONDS
        while not self._stopping.is_set():
            # A verdict pending is looked at every round: it is booked as soon as the metadata server's answer is in.
            busy = self._connections or self._endings.pending
            for key, _ in self._selector.select(wait if busy else EXPIRY_CHECK_INTERVAL):
                if key.data is None:
                    self._accept()
                elif key.data == "wake":
                    self._run_calls()
            received = full = 0
            stamped = wait >= STAMPED_AFTER_SECONDS
            for conn in list(self._connections):
                try:
                    handled = self._drain(conn, stamped)
                except Exception:  # a bug of ours, or of one connection: that job's loss, not every job's
                    log.exception("job pid %d: reading its events failed; its connection is closed", conn.pid)
                    self._aggregator.connection_error(catalog.RECEIVE)
                    self._close(conn)
                    continue
                received += handled
                full += handled == BATCH
            # A job with more waiting than one batch: at once. Events in this round: sooner. None: back off.
            if full:
                wait = 0.0
            elif received:
                wait = max(wait / 2, MIN_POLL_SECONDS)
            else:
                wait = min(max(2 * wait, MIN_POLL_SECONDS), MAX_POLL_SECONDS)
            if self._endings.pending and self._endings.settle():
                self.last_left = time.monotonic()
            if self._accepting_again and time.monotonic() >= self._accepting_again:
                self._accepting_again = 0.0
                self._selector.register(self._listener, selectors.EVENT_READ, None)
            if (now := time.monotonic()) >= next_expiry:
                next_expiry = now + EXPIRY_CHECK_INTERVAL
                try:
                    self._aggregator.expire(now)
                    self._aggregator.tick()
                except Exception:  # a bug of ours must not stop the ingest of every job
                    log.exception("failed to expire idle workloads or book their wall time")
                if self._hangs is not None:
                    try:
                        self._hangs.tick(now)
                    except Exception:
                        log.exception("failed to read the jobs' positions")

    def call(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` on the ingest thread, the aggregator's one (soon: the loop is woken for it)."""
        self._calls.put(fn)
        with contextlib.suppress(OSError):  # the loop stopped: nothing is left to serve
            self._wake_w.send(b"c")

    def _run_calls(self) -> None:
        with contextlib.suppress(BlockingIOError, OSError):
            while self._wake_r.recv(4096):
                pass
        while True:
            try:
                fn = self._calls.get_nowait()
            except queue.Empty:
                return
            try:
                fn()
            except Exception:  # a bug of ours must not stop the ingest of every job
                log.exception("a call on the ingest thread failed")

    def _accept(self) -> None:
        try:
            sock, _ = self._listener.accept()
        except BlockingIOError:
            return
        except OSError as e:  # EMFILE, ENFILE, ENOBUFS: the job's connection waits in the backlog
            self._aggregator.connection_error(catalog.ACCEPT)
            if (now := time.monotonic()) >= self._next_accept_warning:
                self._next_accept_warning = now + ACCEPT_WARN_SECONDS
                log.warning(
                    "cannot accept a job's connection: %s; trying again every %g s (said again in %g s if it lasts)",
                    e.strerror or e,
                    ACCEPT_PAUSE_SECONDS,
                    ACCEPT_WARN_SECONDS,
                )
            self._selector.unregister(self._listener)
            self._accepting_again = time.monotonic() + ACCEPT_PAUSE_SECONDS
            return
        if len(self._connections) >= MAX_CONNECTIONS:
            log.warning("refusing a job connection: %d connections already open", MAX_CONNECTIONS)
            self._aggregator.connection_error(catalog.REFUSED)
            sock.close()
            return
        try:
            sock.setblocking(False)
            with contextlib.suppress(OSError):  # without it, an event is filed when it is received
                sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMP, 1)
            creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
            pid = struct.unpack("3i", creds)[0]
            conn = Connection(sock, pid)
        except OSError as e:
            log.warning("cannot take a job's connection: %s", e)
            self._aggregator.connection_error(catalog.ACCEPT)
            sock.close()
            return
        with self._connections_lock:
            self._connections.add(conn)
        log.debug("job pid %d connected", pid)

    def _drain(self, conn: Connection, stamped: bool) -> int:
        """Handle up to BATCH waiting events from one job, and return how many; close the connection at its end.
        ``stamped``: file each at the kernel's stamp of its send."""
        view = memoryview(self._buffer)
        stamps: list[tuple[int, int, bytes]] = []
        for handled in range(BATCH):
            try:
                # MSG_TRUNC: the return value is the message's real length, even past
                # the buffer, so an oversized event is recognised, not cut.
                if stamped:
                    size, stamps, _, _ = conn.sock.recvmsg_into([self._buffer], _STAMP_SPACE, socket.MSG_TRUNC)
                else:
                    size = conn.sock.recv_into(self._buffer, len(self._buffer), socket.MSG_TRUNC)
            except BlockingIOError:
                return handled
            except OSError as e:
                log.warning("job pid %d: receive failed: %s", conn.pid, e)
                self._aggregator.connection_error(catalog.RECEIVE)
                size, stamps = 0, []
            if size == 0:
                if self._hung_up(conn):
                    self._close(conn)
                    return handled
                # An empty message (SEQPACKET keeps them) reads like a hang-up: tell them apart
                # by the socket's state, and count it as the bad event it is.
                self._aggregator.reject("malformed")
                continue
            self._handle(conn, view[:size], _sent_at(stamps) if stamped else None)
        return BATCH

    @staticmethod
    def _hung_up(conn: Connection) -> bool:
        """Whether the job closed its end (or the connection failed), rather than sent an empty message."""
        poller = select.poll()
        poller.register(conn.sock, select.POLLIN | select.POLLRDHUP)
        return any(mask & (select.POLLRDHUP | select.POLLHUP | select.POLLERR) for _, mask in poller.poll(0))

    def _handle(self, conn: Connection, message: memoryview, sent_at: float | None) -> None:
        try:
            event = events.decode(message)
        except events.InvalidEvent as e:
            self._aggregator.reject(e.reason)
            log.debug("job pid %d: rejected event: %s", conn.pid, e)
            return
        if isinstance(event, events.Watch):  # a position thread's hello: the hang watch's, not the aggregator's
            if self._hangs is not None and not conn.workload:
                conn.watching = True
                self._hangs.watch(conn, sender(conn.sock), event)
            return
        if isinstance(event, events.Step) and self._hangs is not None:
            self._hangs.step(event)
        if self._endings.pending and conn.workload != event.workload:
            # A new process of a workload whose last one vanished: that one's verdict first, so the workload's
            # downtime is the gap between the two.
            self._endings.settle(workload=event.workload)
        try:
            # The workload as filed: _overflow past --max-label-values, so the per-process series stay bounded too.
            workload = self._aggregator.accept(event, sent_at, conn)
        except Exception:  # a bug of ours: count it against the event, keep serving
            log.exception("failed to aggregate %r", event)
            self._aggregator.reject("invalid_field")
            return
        if conn.workload != workload:
            if conn.workload:
                self._aggregator.process_left(conn.workload, conn)
            self._aggregator.process_joined(workload)
            conn.workload = workload
        if isinstance(event, events.Lifecycle):
            conn.said_goodbye = event.state in ("stop", "failure")

    def _close(self, conn: Connection) -> None:
        conn.sock.close()
        with self._connections_lock:
            self._connections.discard(conn)
        if conn.watching and self._hangs is not None:
            self._hangs.left(conn)
        if conn.workload and not conn.said_goodbye:
            # It sent events but never stop or failure: killed, crashed, or exited without closing its Monitor.
            log.warning("workload %s (pid %d) disconnected without a stop event", conn.workload, conn.pid)
            self._endings.vanished(conn.workload, conn)
            # Its goodput ledger is the verdict's to end (at once or soon), uncleanly, at this time.
            self._aggregator.process_left(conn.workload)
        elif conn.workload:
            self._aggregator.process_left(conn.workload, conn)
        else:
            log.debug("job pid %d disconnected", conn.pid)
        self.last_left = time.monotonic()  # after what it left is booked: a scrape from now on reads it

    def connected(self) -> bool:
        """Whether any job is connected."""
        return bool(self._connections)

    def deciding(self) -> bool:
        """Whether a job that vanished waits for its verdict (endings.py)."""
        return bool(self._endings.pending)

    def stopping(self, hurry: threading.Event) -> None:
        """The sidecar was told to stop: ask the metadata server once more why the jobs that just vanished ended,
        and wait until their verdicts are booked (at most :data:`ANSWER_SECONDS`, or until ``hurry``), so that
        the last scrape reads them."""
        self._endings.stopping()
        deadline = time.monotonic() + ANSWER_SECONDS
        while self._endings.pending and time.monotonic() < deadline and not hurry.wait(0.05):
            pass

    def job_pids(self) -> dict[int, str]:
        """The connected jobs: pid (from the socket's peer credentials) -> workload (once it has said)."""
        pids: dict[int, str] = {}
        with self._connections_lock:
            for conn in self._connections:
                # A position thread's connection is its process's second one: the events' connection names it.
                if not conn.watching and (conn.workload or conn.pid not in pids):
                    pids[conn.pid] = conn.workload
        return pids

    def stop(self) -> None:
        """Stop the thread, close every connection, and remove the socket if it is still ours."""
        self._stopping.set()
        self._wake_w.send(b"x")
        if self._thread.ident is not None:  # stopped before it started: serve failed to bind HTTP
            self._thread.join(timeout=5)
        if not self._thread.is_alive():  # the aggregator is ours now: every verdict still pending, on what is known
            self._endings.settle(everything=True)
            if self._hangs is not None:
                self._hangs.stop()
        self._endings.close()
        for key in list(self._selector.get_map().values()):
            key.fileobj.close()  # type: ignore[union-attr]
        self._selector.close()
        with self._connections_lock:
            for conn in self._connections:
                conn.sock.close()
        self._wake_w.close()
        with contextlib.suppress(OSError):
            if os.lstat(self.path).st_ino == self._inode:
                self.path.unlink()
