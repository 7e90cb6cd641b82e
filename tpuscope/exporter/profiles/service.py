"""The sidecar's device-profile service: it parses the traces that jobs capture, so that no job parses its own.

A job's capture (the Monitor's device profiler, :mod:`tpuscope.tracing`) ends with the serialized XSpace of a few
steps. Reading it is seconds of Python, which in the job would compete with the training loop for its GIL and cores.
So the job only starts and stops the trace and hands the bytes over, naming its workload beside them (a
:class:`~tpuscope.events.ProfileHandover`), and this service puts what it parsed straight into the sidecar's metrics
(``Aggregator.parsed_profile``, on the ingest thread): a job that has ended meanwhile loses nothing.

The answer goes back to the job as well, because two things only the job holds need it: its own sinks (a
``RecordSink``'s recording, which ``tpuscope report --recording`` reads without a sidecar, holds each profile on
the step that carried it back) and its sampling (a capture that measured but cost too much doubles its period). It
goes back marked ``served``, so the aggregator does not count that step's copy again. A trace without a handover
(a job that names no workload, or one older than handovers) is answered unserved: the step that carries it back is
what the aggregator counts.

The hand-over is a spool directory beside the socket (:func:`tpuscope.events.profile_spool`):

- this service makes it as it starts and removes it as it stops: a job finds a sidecar that parses by finding it (an
  older sidecar makes none, and its jobs take no captures). Whoever may connect to the socket may write into it (its
  group bits follow ``--socket-mode``), without listing it: the names carry a random token per job process;
- a job writes ``STEM.head`` (its handover), then ``STEM.xspace.tmp``, and renames that ``STEM.xspace``: a trace here
  is whole, and its handover already there;
- this service answers ``STEM.json`` (the :class:`~tpuscope.events.DeviceProfile`, as JSON, written the same way) and
  deletes the trace; the job reads and deletes the answer.

One trace is parsed at a time, the oldest first; of a job's traces only its newest waits (an older one is answered
``error`` and counted ``dropped``: the job stopped waiting for it). A trace over
:data:`~tpuscope.events.PROFILE_MAX_BYTES` is deleted unread. Files of a job that died (a trace never renamed, an
answer never read) are deleted after :data:`STALE_SECONDS`. Every outcome is counted in
``tpuscope_profile_parses_total{result}``.

Each parse runs in a child process (``python -m tpuscope.exporter.profiles.xspace TRACE``) at the lowest CPU
priority: the protobuf runtime's C parser reads bytes any process allowed to send events can write (a crash costs a
child, not the sidecar); the decoded trace and its intervals, several times the trace's bytes (at most
:data:`~tpuscope.exporter.profiles.xspace.PARSE_MEMORY_BYTES`), are the child's, not the sidecar's, whose own memory
stays small; and the training job beside it keeps its cores. The parser needs no jax: only protobuf, which the
sidecar has anyway (OTLP).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import msgspec

from tpuscope import catalog, events
from tpuscope.exporter import job_directory
from tpuscope.exporter.metrics import Series

log = logging.getLogger("tpuscope.exporter")

POLL_SECONDS = 0.1  # how often the spool is looked at: what a job waits at most beyond the parse itself
PARSE_TIMEOUT = 120.0  # the most one parse may take: a trace at the size cap parses in well under a minute
STALE_SECONDS = 600.0  # a file older than this belongs to no job still waiting: deleted
CLEAN_EVERY = 10.0  # seconds between two looks for stale files
HANDOVER_MAX_BYTES = 4096  # a workload's name and a few figures
PARSER = "tpuscope.exporter.profiles.xspace"  # the module each parse runs as, in a child process


class ProfileService:
    """Parses the device traces jobs leave in the spool beside ``socket``, on a thread of its own."""

    def __init__(
        self,
        socket: Path,
        socket_mode: int,
        metrics: Series,
        nice: int,
        serve: Callable[[str, events.DeviceProfile], None] = lambda workload, profile: None,
    ) -> None:
        self.spool = events.profile_spool(socket)
        self._serve = serve  # a parsed capture, for its workload: into the metrics, on the aggregator's thread
        self._nice = nice  # the parser's: 19 by default, so the training job's threads go first
        self._mode = job_directory.mode_for(socket_mode)
        parses = metrics[catalog.PROFILE_PARSES]
        self._parses = {result: parses.labels(result) for result in catalog.PROFILE_PARSE_RESULTS}
        self._seconds = metrics[catalog.PROFILE_PARSE_SECONDS]
        self._stop = threading.Event()
        self._child: subprocess.Popen[bytes] | None = None
        self._spawning = threading.Lock()  # a child is started, or killed at stop, under it
        self._thread: threading.Thread | None = None
        self._cleaned = 0.0

    def start(self) -> bool:
        """Make the spool and start parsing; False (said once) where it cannot be made."""
        try:
            job_directory.make(self.spool, self._mode)  # or taken over from a sidecar that died: its traces parsed
        except OSError as e:
            log.warning("device profiles: cannot make %s (%s): jobs take no captures", self.spool, e)
            return False
        self._thread = threading.Thread(target=self._run, name="tpuscope-profiles", daemon=True)
        self._thread.start()
        log.info("device profiles: parsing the traces jobs leave in %s", self.spool)
        return True

    def stop(self, timeout: float = 5.0) -> None:
        """Stop parsing (a parse under way is killed) and remove the spool: jobs see no service from now on."""
        self._stop.set()
        with self._spawning:  # a parse about to start sees the stop; one started is killed
            if (child := self._child) is not None:
                with contextlib.suppress(OSError):
                    child.kill()
        if self._thread is not None:
            self._thread.join(timeout)
            shutil.rmtree(self.spool, ignore_errors=True)

    # --- the service's thread -------------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                parsed = self._step()
            except Exception:  # a bug here must not end the service: the next look tries again
                log.exception("device profiles: the spool could not be served")
                parsed = False
            if not parsed:
                self._stop.wait(POLL_SECONDS)

    def _step(self) -> bool:
        """Parse the oldest waiting trace, if any; whether one was."""
        now = time.time()
        clean = now - self._cleaned > CLEAN_EVERY
        if clean:
            self._cleaned = now
        newest: dict[str, tuple[int, str, float]] = {}  # job -> (seq, stem, mtime) of its newest trace
        with os.scandir(self.spool) as entries:
            for entry in entries:
                stem = entry.name.removesuffix(events.PROFILE_TRACE_SUFFIX)
                match = events.PROFILE_STEM.match(stem) if stem != entry.name else None
                try:
                    mtime = entry.stat(follow_symlinks=False).st_mtime
                except FileNotFoundError:  # its job took it back
                    continue
                if match is None:  # an answer, a trace being written, a stranger: gone once stale
                    if clean and now - mtime > STALE_SECONDS:
                        self._remove(entry.name)
                    continue
                seq, job = int(match["seq"]), match["job"]
                if job in newest:  # the job stopped waiting for the older one
                    older, newer = sorted([newest[job], (seq, stem, mtime)])
                    self._finish(older[1], events.DeviceProfile(result="error"), "dropped")
                    newest[job] = newer
                else:
                    newest[job] = (seq, stem, mtime)
        if not newest:
            return False
        _, stem, _ = min(newest.values(), key=lambda trace: trace[2])
        profile, result = self._parse(self.spool / (stem + events.PROFILE_TRACE_SUFFIX))
        self._finish(stem, profile, result)
        return True

    def _parse(self, path: Path) -> tuple[events.DeviceProfile, str]:
        """The trace's profile and the parse's result (a value of PROFILE_PARSE_RESULTS), in a child process."""
        error = events.DeviceProfile(result="error")
        try:
            st = os.lstat(path)
        except OSError:
            return error, "error"
        if not stat.S_ISREG(st.st_mode):
            return error, "error"
        if st.st_size > events.PROFILE_MAX_BYTES:
            return error, "too_large"
        began = time.monotonic()
        try:
            with self._spawning:
                if self._stop.is_set():
                    return error, "error"
                self._child = subprocess.Popen(
                    [sys.executable, "-m", PARSER, os.fspath(path)],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                )
            with contextlib.suppress(OSError):  # at once, for its start-up too: the one place the parser is niced
                os.setpriority(os.PRIO_PROCESS, self._child.pid, self._nice)
            out, err = self._child.communicate(timeout=PARSE_TIMEOUT)
        except subprocess.TimeoutExpired:
            self._child.kill()  # type: ignore[union-attr]
            self._child.communicate()  # type: ignore[union-attr]
            log.warning("device profiles: a trace of %d bytes took over %g s to parse", st.st_size, PARSE_TIMEOUT)
            return error, "error"
        except OSError as e:
            log.warning("device profiles: cannot start the parser: %s", e)
            return error, "error"
        finally:
            child, self._child = self._child, None
        seconds = time.monotonic() - began
        self._seconds.inc(seconds)
        if child is None or child.returncode != 0:
            if not path.exists():  # its job stopped waiting and took it back: nobody to answer
                return error, "dropped"
            if not self._stop.is_set():
                tail = err.decode(errors="replace").strip().splitlines()[-1:] if child is not None else []
                log.warning("device profiles: the parse of a trace failed: %s", tail[0] if tail else "no reason")
            return error, "error"
        try:
            profile = msgspec.json.decode(out, type=events.DeviceProfile)
        except msgspec.DecodeError as e:
            log.warning("device profiles: the parser's answer is unreadable: %s", e)
            return error, "error"
        profile = msgspec.structs.replace(profile, parse_s=seconds)
        return profile, "ok" if profile.result == "ok" else "empty"

    def _finish(self, stem: str, profile: events.DeviceProfile, result: str) -> None:
        """Serve the trace's answer where its job handed it over, answer the job (unless it took the trace back),
        delete the trace, count the result."""
        self._parses[result].inc()
        trace = self.spool / (stem + events.PROFILE_TRACE_SUFFIX)
        handover = self._handover(stem)
        if not trace.exists():  # its job took it back (and counted it): nothing to serve
            return
        if handover is not None and result != "dropped":  # a dropped one was given up on, and counted, by its job
            profile = msgspec.structs.replace(
                profile,
                capture_s=handover.capture_s,
                period_s=handover.period_s,
                trace_bytes=handover.trace_bytes,
                served=True,
            )
            self._serve(handover.workload, profile)
        answer = self.spool / (stem + events.PROFILE_ANSWER_SUFFIX)
        partial = answer.with_name(answer.name + events.PROFILE_PARTIAL_SUFFIX)
        try:
            with contextlib.suppress(FileNotFoundError):
                partial.unlink()
            fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
            with os.fdopen(fd, "wb") as f:
                os.fchmod(f.fileno(), 0o644)  # the job may run as another user of the socket's group
                f.write(msgspec.json.encode(profile))
            os.rename(partial, answer)
        except OSError as e:
            log.warning("device profiles: cannot answer %s: %s", stem, e)
        self._remove(trace.name)

    def _handover(self, stem: str) -> events.ProfileHandover | None:
        """The job's handover of a trace (and it is removed), or None: none (its job names no workload), unreadable."""
        path = self.spool / (stem + events.PROFILE_HEADER_SUFFIX)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            return None
        try:
            with os.fdopen(fd, "rb") as f:
                data = f.read(HANDOVER_MAX_BYTES + 1) if stat.S_ISREG(os.fstat(f.fileno()).st_mode) else b""
            return msgspec.json.decode(data, type=events.ProfileHandover) if len(data) <= HANDOVER_MAX_BYTES else None
        except (OSError, msgspec.DecodeError) as e:
            log.warning("device profiles: the handover of %s is unreadable (%s): its job's step carries it", stem, e)
            return None
        finally:
            self._remove(path.name)

    def _remove(self, name: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.spool / name)
