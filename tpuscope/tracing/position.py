"""The job's side of hang diagnosis: its position in shared memory, and a thread that answers for its stacks.

The Monitor's timers write the process's position (step, phase, since when) into :attr:`Whereabouts.slots` at
each boundary: a store into memory, no system call, a few tens of nanoseconds each. Once the sidecar is there,
those slots are a file it maps (:mod:`tpuscope.positions`), so it reads the position while the job's threads are
blocked in a native call or spin in Python.

One daemon thread, ``tpuscope-position``, sleeps in a ``recv`` on a connection of its own to the sidecar, and
costs nothing while the job is healthy. When the sidecar suspects a hang it asks, and the thread writes every
thread's Python stacks beside the record (``sys._current_frames``: it needs the GIL, which a thread blocked in
a native call releases, and which a thread spinning in Python hands over every switch interval, 5 ms). A C
extension that holds the GIL for good keeps the thread from answering: the sidecar then says the stacks are
unknown, and why. Nothing else is captured, ever. With ``exit_on_hang``, the sidecar's second request ends the
process once its stacks are out: the Monitor reports a failure of reason ``hang``, then the process exits with
:data:`tpuscope.positions.EXIT_STATUS`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import mmap
import os
import secrets
import socket
import sys
import sysconfig
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol, cast

from tpuscope import events, positions

log = logging.getLogger("tpuscope")

RECONNECT_SECONDS = (1.0, 30.0)  # the first wait for an absent sidecar, and the longest, doubling between
# Where a frame is a library's, not the job's: the standard library's, installed packages', and the Monitor's own.
_LIBRARY = tuple(
    {sysconfig.get_path(name) for name in ("stdlib", "platstdlib", "purelib", "platlib")} | {str(Path(__file__).parent)}
)


class Slots(Protocol):
    """The record's doubles, as a memoryview of them reads and writes (typeshed types its items as int)."""

    def __getitem__(self, index: int) -> float: ...

    def __setitem__(self, index: int, value: float) -> None: ...


def _doubles(buffer: Any) -> Slots:
    return cast(Slots, memoryview(buffer).cast("d"))


def _anonymous() -> Slots:
    """Slots no one else sees: until the sidecar's directory exists, and in a forked child."""
    slots = _doubles(bytearray(positions.RECORD_BYTES))
    slots[positions.STEP_SLOT] = float("nan")
    slots[positions.WHERE_SLOT] = positions.OUTSIDE
    slots[positions.SINCE_SLOT] = time.perf_counter()
    return slots


class Whereabouts:
    """One Monitor's position, and the thread that serves it to the sidecar at ``socket_path``."""

    def __init__(self, workload: str, socket_path: str, *, exit_on_hang: bool, on_exit: Callable[[], None]) -> None:
        self.slots = _anonymous()
        self.slots[positions.PID_SLOT] = os.getpid()
        self.slots[positions.THREAD_SLOT] = threading.get_ident()
        self._workload = workload
        self._socket_path = socket_path
        self._exit_on_hang = exit_on_hang
        self._on_exit = on_exit  # closes the Monitor as failed on a hang, before the process ends
        self._record: Path | None = None
        self._map: mmap.mmap | None = None
        self._sock: socket.socket | None = None
        self.announced = threading.Event()  # the sidecar knows the record: it may ask for the stacks from now on
        self._stop = threading.Event()
        self._before_compile = positions.OUTSIDE
        self._stepper = threading.get_ident()  # the thread that runs the steps: its compiles mark the position
        self._thread = threading.Thread(target=self._run, name="tpuscope-position", daemon=True)
        self._map_record()  # here, where the sidecar is up: the timers write to the record from their first write
        self._thread.start()

    # --- what the job's threads call: cheap, never raise --------------------------------------------------------------
    def compiling(self) -> None:
        """JAX lowered a function on the thread that runs the steps: its compile goes on until the backend's ends.
        (Not at the end of tracing: ``jax.eval_shape`` and ``make_jaxpr`` trace and compile nothing.)"""
        slots = self.slots
        if slots[positions.WHERE_SLOT] != positions.COMPILE and threading.get_ident() == self._stepper:
            self._before_compile = slots[positions.WHERE_SLOT]
            slots[positions.SINCE_SLOT] = time.perf_counter()
            slots[positions.WHERE_SLOT] = positions.COMPILE

    def compiled(self) -> None:
        """The backend compile ended, or the persistent cache had it: back where the job was."""
        slots = self.slots
        if slots[positions.WHERE_SLOT] == positions.COMPILE:
            slots[positions.SINCE_SLOT] = time.perf_counter()
            slots[positions.WHERE_SLOT] = self._before_compile

    @contextlib.contextmanager
    def at(self, where: float) -> Iterator[None]:
        """Inside the block the process is at ``where`` (a checkpoint's save or restore); then where it was."""
        slots = self.slots
        before = slots[positions.WHERE_SLOT]
        slots[positions.SINCE_SLOT] = time.perf_counter()
        slots[positions.WHERE_SLOT] = where
        try:
            yield
        finally:
            slots[positions.SINCE_SLOT] = time.perf_counter()
            slots[positions.WHERE_SLOT] = before

    def close(self) -> None:
        """Stop the thread (its connection's end wakes it) and remove the record: the sidecar stops reading it."""
        self._stop.set()
        if (sock := self._sock) is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=1.0)
        self.slots = _anonymous()
        self._unmap()

    def forget_in_child(self) -> None:
        """In a forked child: the parent's record is the parent's (the mapping is shared), and no thread runs."""
        self.slots = _anonymous()
        self._stop.set()
        self._map = None  # the child's copy of the mapping goes with the child; the parent's file stays
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.close()  # this process's copy of the descriptor; the parent's connection stays open
            self._sock = None

    # --- the thread ---------------------------------------------------------------------------------------------------
    def _run(self) -> None:
        wait = RECONNECT_SECONDS[0]
        while not self._stop.is_set():
            try:
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
                sock.connect(self._socket_path)
            except OSError:
                sock.close()
                self._stop.wait(wait)  # no sidecar (yet): try again, less and less often
                wait = min(2 * wait, RECONNECT_SECONDS[1])
                continue
            wait = RECONNECT_SECONDS[0]
            self._sock = sock
            try:
                self._serve(sock)
            except Exception:  # a bug of ours: this connection's end, never the job's
                log.debug("tpuscope: the position thread's connection failed", exc_info=True)
            finally:
                self._sock = None
                sock.close()
            self._stop.wait(wait)  # the sidecar went away (restarted): reconnect

    def _serve(self, sock: socket.socket) -> None:
        if self._map is None:
            self._map_record()
        if self._record is not None:  # else a sidecar that does not watch for hangs: the connection only waits
            hello = events.Watch(self._workload, record=self._record.name, exit_on_hang=self._exit_on_hang)
            sock.send(events.encode(hello), socket.MSG_NOSIGNAL)
            self.announced.set()
        while not self._stop.is_set():
            message = sock.recv(64)
            if not message:
                return
            if message.startswith(positions.STACKS_REQUEST):
                self._write_stacks(message[len(positions.STACKS_REQUEST) :].strip().decode() or "0")
            elif message == positions.EXIT_REQUEST and self._exit_on_hang:
                self._exit()

    def _map_record(self) -> None:
        """Make the record in the sidecar's directory (where there is one), and write there from now on."""
        folder = positions.directory(self._socket_path)
        if not folder.is_dir():
            return
        record = folder / f"{os.getpid()}-{secrets.token_hex(4)}.position"
        try:
            mapped = _write_readable(record, bytes(positions.RECORD_BYTES), mapped=True)
        except OSError as e:
            log.warning("tpuscope: no hang diagnosis: cannot make %s: %s", record, e)
            return
        slots, before = _doubles(mapped), self.slots
        copied = [before[index] for index in range(positions.SLOTS)]
        for index, value in enumerate(copied):  # where the job is now
            slots[index] = value
        self._record, self._map = record, mapped
        self.slots = slots
        if threading.current_thread() is self._thread:
            # A timer that took the old slots just before the swap writes there: once it is done, what it wrote
            # is taken, unless a timer has written the record since.
            time.sleep(0.01)
            for index in range(positions.SLOTS):
                if before[index] != copied[index] and slots[index] == copied[index]:
                    slots[index] = before[index]
        slots[positions.MAGIC_SLOT] = positions.MAGIC  # now it is a record

    def _unmap(self) -> None:
        if self._record is not None:
            for path in (self._record, positions.stacks_path(self._record)):
                with contextlib.suppress(OSError):
                    path.unlink()
        self._record = None
        self._map = None  # closed when the last view of it goes: a timer may hold one a moment longer

    def _write_stacks(self, request: str) -> None:
        if self._record is None:
            return
        threads = stacks()
        answer: dict[str, Any] = {"request": request, "pid": os.getpid(), "taken": time.time(), "threads": threads}
        text = json.dumps(answer)
        while len(text) > positions.MAX_STACKS_BYTES and len(threads) > 1:
            threads.pop()  # the main thread comes first: the last ones go
            text = json.dumps(answer)
        path = positions.stacks_path(self._record)
        partial = path.with_suffix(".tmp")
        _write_readable(partial, text.encode())
        os.replace(partial, path)

    def _exit(self) -> None:
        """End the process on the sidecar's word: the failure reported, the output flushed, then out."""
        try:
            self._on_exit()
        finally:
            with contextlib.suppress(Exception):
                sys.stdout.flush()
                sys.stderr.flush()
            os._exit(positions.EXIT_STATUS)


def _write_readable(path: Path, data: bytes, *, mapped: bool = False) -> mmap.mmap | None:
    """Write ``path`` readable by the sidecar's group (where the socket admits it, the sidecar may run as another
    user of it), whatever the job's umask; ``mapped``: and return it mapped for writing."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o640)
    try:
        os.fchmod(fd, 0o640)
        os.write(fd, data)
        return mmap.mmap(fd, len(data)) if mapped else None
    finally:
        os.close(fd)


def stacks() -> list[dict[str, Any]]:
    """Every thread's Python stack but this one's, outermost frame first, bounded; the main thread first."""
    own = threading.get_ident()
    known = {t.ident: t for t in threading.enumerate()}
    frames = sys._current_frames()
    order = sorted(frames, key=lambda ident: (known.get(ident) is not threading.main_thread(), ident))
    threads = []
    for ident in order[: positions.MAX_THREADS + 1]:
        if ident == own:
            continue
        thread = known.get(ident)
        summary = traceback.extract_stack(frames[ident], limit=positions.MAX_FRAMES)
        threads.append(
            {
                "ident": ident,
                "name": thread.name if thread is not None else "?",
                "daemon": bool(thread is not None and thread.daemon),
                "frames": [
                    {
                        "file": f.filename,
                        "line": f.lineno or 0,
                        "function": f.name,
                        "code": (f.line or "")[: positions.MAX_LINE],
                        "library": f.filename.startswith(_LIBRARY),
                    }
                    for f in summary
                ],
            }
        )
    return threads[: positions.MAX_THREADS]


class Nowhere:
    """The stand-in where the hang watch is off: the timers write into slots no one reads."""

    def __init__(self) -> None:
        self.slots = _anonymous()

    def compiling(self) -> None:
        pass

    def compiled(self) -> None:
        pass

    def at(self, where: float) -> contextlib.nullcontext[None]:
        return contextlib.nullcontext()

    def close(self) -> None:
        pass

    def forget_in_child(self) -> None:
        pass
