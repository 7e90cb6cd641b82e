"""The sidecar's side of hang diagnosis: where each job process is, whether it is stuck, and its stacks if it is.

Each Monitor keeps its process's position in a record beside the socket and announces it on a connection of its
position thread (tpuscope.tracing.position). Every second, on the ingest thread, the sidecar reads each record
(two reads from memory) and judges how long the process has been where it is against that place's limit:

- in a step (a phase, or between two): :attr:`Limits.floor` (``hang_seconds``), or :attr:`Limits.factor` times
  the longest of the workload's recent steps (their compile time left out), whichever is longer; before the
  workload's first step, the long scale;
- compiling, in a checkpoint's save or restore, or between steps (an eval loop the job did not mark): the long
  scale, :attr:`Limits.long` (the stall threshold): these take as long as they take.

A process past its limit, at the same place at two reads, is asked for its stacks. Once they are in (or
:data:`ANSWER_SECONDS` have passed without an answer: a C extension holds the GIL, or the process is stopped),
the sidecar serves it as stuck (``tpuscope_workload_stuck``, ``tpuscope_workload_stuck_info``) and writes one
structured log line with the position and every thread's stacks: JSON on stderr, which ``kubectl logs`` shows and
Cloud Logging keeps as a structured entry after the pod is gone (and, where an OTLP endpoint is set, an
OpenTelemetry log record: exporter/otlp_logs.py). A workload is hung when every worker is stuck;
the rules compare the workers' positions and name the one elsewhere (alerts.recording.hang_rules). With the job's
``exit_on_hang``, :attr:`Limits.exit_after` after its stacks are logged (a few scrapes: the verdict leaves the
host first), the sidecar tells the process to end.
"""

from __future__ import annotations

import collections
import contextlib
import json
import logging
import mmap
import os
import socket
import sys
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

from tpuscope import catalog, durations, events, positions
from tpuscope.exporter import job_directory
from tpuscope.exporter.metrics import Series
from tpuscope.exporter.otlp_logs import VerdictLogs
from tpuscope.thresholds import Thresholds

log = logging.getLogger("tpuscope.exporter")

ANSWER_SECONDS = 5.0  # how long a process has to write its stacks before they are unknown
RECENT_STEPS = 256  # the steps a workload's step limit is learned from
LOGGER = "tpuscope.hang"  # the structured lines' logger name, in their "logger" field


@dataclass(frozen=True)
class Limits:
    """How long a process may stay at one place: ``floor`` and ``factor`` in a step, ``long`` elsewhere."""

    floor: float = Thresholds.hang_seconds
    factor: float = Thresholds.hang_step_factor
    long: float = Thresholds.stall_seconds
    exit_after: float = 60.0  # after the stacks are logged, before a process that asked for it is told to end

    def of(self, where: str, longest_step: float | None) -> float:
        if where in positions.LONG or longest_step is None:
            return self.long
        return max(self.floor, self.factor * longest_step)


@dataclass(eq=False)
class Watched:
    """One job process the sidecar watches, through its position thread's connection (``source``)."""

    source: Hashable
    send: Callable[[bytes], None]
    workload: str
    record: Path
    buffer: mmap.mmap
    exit_on_hang: bool
    last: positions.Position | None = None  # the last read, to tell a position held from one torn
    stuck_at: positions.Position | None = None  # the position it is stuck at, once past its limit
    request: int = 0
    asked: float = 0.0  # monotonic time the stacks were asked for
    logged: float = 0.0  # monotonic time the verdict was logged; 0: not yet
    frames: str = ""
    told_to_exit: bool = False


@dataclass
class _Served:
    """The label sets served for one workload, to remove those no longer true."""

    ages: set[str] = field(default_factory=set)
    stuck: set[tuple[str, str, str]] = field(default_factory=set)


class HangWatch:
    """Every watched process of this sidecar's jobs; called on the ingest thread only."""

    def __init__(
        self,
        socket_path: Path,
        socket_mode: int,
        metrics: Series,
        limits: Limits,
        host_labels: dict[str, str],
        stream: IO[str] | None = None,
        otlp: VerdictLogs | None = None,
    ) -> None:
        self.directory = positions.directory(socket_path)
        self._mode = job_directory.mode_for(socket_mode)
        self._metrics = metrics
        self.limits = limits
        self._host = host_labels
        self._stream = stream  # where the verdicts' lines go; None: stderr at the time (tests swap it)
        self._otlp = otlp  # the verdicts as OpenTelemetry logs too, where an OTLP endpoint is set
        self._watched: dict[Hashable, Watched] = {}
        self._steps: dict[str, collections.deque[float]] = {}
        self._served: dict[str, _Served] = {}
        self._stuck_here: frozenset[str] = frozenset()  # the workloads stuck here, for the libtpu collector's thread

    # --- set-up ----------------------------------------------------------------------------------------------------
    def start(self) -> bool:
        """Make the records' directory (before the socket accepts: a Monitor looks for it when it connects)."""
        try:
            job_directory.make(self.directory, self._mode)
        except OSError as e:
            log.warning("hang diagnosis is off: cannot make %s (%s)", self.directory, e)
            return False
        return True

    def stop(self) -> None:
        """Stop watching. The records stay: their jobs live on, and tell the next sidecar where they are."""
        for watched in list(self._watched.values()):
            self.left(watched.source, remove=False)
        with contextlib.suppress(OSError):
            os.rmdir(self.directory)  # only if empty: a job's record stays its own
        if self._otlp is not None:
            self._otlp.close()

    # --- what the ingest thread tells it ---------------------------------------------------------------------------
    def watch(self, source: Hashable, send: Callable[[bytes], None], hello: events.Watch) -> None:
        """A Monitor's position thread connected (``send`` writes to its connection)."""
        record = self.directory / hello.record
        try:
            with open(record, "rb") as f:
                buffer = mmap.mmap(f.fileno(), positions.RECORD_BYTES, prot=mmap.PROT_READ)
        except (OSError, ValueError) as e:
            log.warning("workload %s: cannot read its position record %s: %s", hello.workload, record, e)
            return
        self._watched[source] = Watched(source, send, hello.workload, record, buffer, hello.exit_on_hang)
        log.debug("workload %s: watching its position in %s", hello.workload, record)

    def left(self, source: Hashable, *, remove: bool = True) -> None:
        """The process's position thread went (the process ended, or closed its Monitor): its record and stacks
        are removed (``remove``), as a killed job cannot."""
        if (watched := self._watched.pop(source, None)) is None:
            return
        if watched.logged:
            self._say(watched, "INFO", "ended while stuck", positions.read(watched.buffer) or watched.stuck_at)
        with contextlib.suppress(Exception):
            watched.buffer.close()
        for path in (watched.record, positions.stacks_path(watched.record)) if remove else ():
            with contextlib.suppress(OSError):
                path.unlink()
        if not any(w.workload == watched.workload for w in self._watched.values()):
            self._unserve(watched.workload)

    def step(self, event: events.Step) -> None:
        """A finished step: what a step of its workload takes, compiles left out."""
        recent = self._steps.get(event.workload)
        if recent is None:
            recent = self._steps[event.workload] = collections.deque(maxlen=RECENT_STEPS)
        recent.append(max(0.0, event.duration_s - (event.compile_s or 0.0)))

    # --- each second -----------------------------------------------------------------------------------------------
    def tick(self, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        by_workload: dict[str, list[tuple[Watched, positions.Position, float]]] = {}
        for watched in list(self._watched.values()):
            position = positions.read(watched.buffer)
            if position is None or (position.step is None and position.where == "outside"):
                # Not a record, or a process that has not begun stepping: a serving process never does, and a
                # training one that hangs before its first step is TpuscopeWorkloadStalled's (its restore and its
                # compiles are judged).
                continue
            held = position == watched.last
            watched.last = position
            limit = self.limit(watched.workload, position.where)
            if held and now - position.since > limit:
                self._stuck(watched, position, limit, now)
            elif watched.stuck_at is not None and not held:
                if watched.logged:
                    self._say(watched, "INFO", "moved on", position)
                watched.stuck_at, watched.logged, watched.frames = None, 0.0, ""
            by_workload.setdefault(watched.workload, []).append((watched, position, limit))
        for workload, processes in by_workload.items():
            self._serve(workload, processes, now)
        self._stuck_here = frozenset(
            workload for workload, processes in by_workload.items() if all(w.logged for w, _, _ in processes)
        )

    def stuck(self) -> frozenset[str]:
        """The workloads whose every process here is stuck (read from any thread: a snapshot, replaced whole)."""
        return self._stuck_here

    def limit(self, workload: str, where: str) -> float:
        recent = self._steps.get(workload)
        return self.limits.of(where, max(recent) if recent else None)

    def _stuck(self, watched: Watched, position: positions.Position, limit: float, now: float) -> None:
        if watched.stuck_at != position:  # newly stuck here: ask for the stacks
            watched.stuck_at, watched.logged, watched.frames = position, 0.0, ""
            watched.request += 1
            watched.asked = now
            try:
                watched.send(positions.STACKS_REQUEST + b" %d" % watched.request)
            except OSError as e:
                log.debug("workload %s: cannot ask for its stacks: %s", watched.workload, e)
        if not watched.logged:
            stacks = self._answer(watched)
            if stacks is None and now - watched.asked < ANSWER_SECONDS:
                return  # a moment more
            watched.frames = positions.top_frames(stacks, position.thread) if stacks else "unknown"
            watched.logged = now
            self._say(watched, "WARNING", "stuck", position, limit=limit, stacks=stacks, now=now)
        elif watched.exit_on_hang and not watched.told_to_exit and now - watched.logged >= self.limits.exit_after:
            watched.told_to_exit = True
            log.warning("workload %s: stuck, and it asked to end then (exit_on_hang): told to", watched.workload)
            with contextlib.suppress(OSError):
                watched.send(positions.EXIT_REQUEST)

    def _answer(self, watched: Watched) -> dict[str, Any] | None:
        """The stacks the process wrote for the last request, or None (not yet, or unreadable)."""
        try:
            answer = json.loads(positions.stacks_path(watched.record).read_text())
        except (OSError, ValueError):
            return None
        if not isinstance(answer, dict) or str(answer.get("request")) != str(watched.request):
            return None
        return answer

    # --- what it serves and says -------------------------------------------------------------------------------------
    def _serve(self, workload: str, processes: list[tuple[Watched, positions.Position, float]], now: float) -> None:
        m = self._metrics
        served = self._served.setdefault(workload, _Served())
        ages: dict[str, tuple[float, float]] = {}
        for _, position, limit in processes:
            age = max(0.0, now - position.since)
            if position.where not in ages or age > ages[position.where][0]:
                ages[position.where] = (age, limit)
        for where, (age, limit) in ages.items():
            m[catalog.POSITION_AGE].labels(workload, where).set(age)
            m[catalog.POSITION_LIMIT].labels(workload, where).set(limit)
        for gone in served.ages - ages.keys():
            m[catalog.POSITION_AGE].remove(workload, gone)
            m[catalog.POSITION_LIMIT].remove(workload, gone)
        served.ages = set(ages)
        verdicts = [w for w, _, _ in processes if w.logged and w.stuck_at is not None]
        stuck = {(_step_label(w.stuck_at), w.stuck_at.where, w.frames) for w in verdicts if w.stuck_at is not None}
        for labels in stuck:
            m[catalog.STUCK_POSITION].labels(workload, *labels).set(1)
        for old in served.stuck - stuck:
            m[catalog.STUCK_POSITION].remove(workload, *old)
        served.stuck = stuck
        m[catalog.STUCK].labels(workload).set(1 if len(verdicts) == len(processes) else 0)

    def _unserve(self, workload: str) -> None:
        served = self._served.pop(workload, _Served())
        for where in served.ages:
            self._metrics[catalog.POSITION_AGE].remove(workload, where)
            self._metrics[catalog.POSITION_LIMIT].remove(workload, where)
        for labels in served.stuck:
            self._metrics[catalog.STUCK_POSITION].remove(workload, *labels)
        with contextlib.suppress(KeyError):
            self._metrics[catalog.STUCK].remove(workload)

    def _say(
        self,
        watched: Watched,
        severity: str,
        what: str,
        position: positions.Position | None,
        *,
        limit: float | None = None,
        stacks: dict[str, Any] | None = None,
        now: float | None = None,
    ) -> None:
        """One structured line: JSON with Cloud Logging's ``severity`` and ``message``, the verdict under
        ``tpuscope``. A stuck process's line carries every thread's stacks (bounded by the job's answer)."""
        now = time.monotonic() if now is None else now
        where = position.where if position is not None else "unknown"
        step = position.step if position is not None else None
        seconds = max(0.0, now - position.since) if position is not None else 0.0
        host = ", ".join(f"{k} {v}" for k, v in self._host.items() if k != str(catalog.Label.TPU_TOPOLOGY))
        message = f"tpuscope: workload {watched.workload} ({host}) {what}"
        if what == "stuck":
            message += (
                f" at step {step if step is not None else '(none yet)'}, {where}, for {durations.human(seconds)}"
                f" (its limit: {durations.human(limit or 0.0)}), at {watched.frames}"
            )
        verdict: dict[str, Any] = {
            "kind": "hang",
            "state": what,
            "workload": watched.workload,
            **self._host,
            "pid": position.pid if position is not None else None,
            "thread": position.thread if position is not None else None,  # the one that runs the steps
            "step": step,
            "phase": where,
            "seconds": round(seconds, 3),
            "since": datetime.fromtimestamp(time.time() - seconds, UTC).isoformat(),
        }
        if what == "stuck":
            verdict["limit_seconds"] = limit
            verdict["frames"] = watched.frames
            verdict["threads"] = stacks.get("threads") if stacks else None
            if stacks is None:
                verdict["stacks_unknown"] = (
                    f"the process did not answer in {ANSWER_SECONDS:g} s: a native call holds the GIL (a C "
                    "extension that does not release it), or the process is stopped"
                )
        line = {
            "severity": severity,
            "message": message,
            "time": datetime.now(UTC).isoformat(),
            "logger": LOGGER,
            "logging.googleapis.com/labels": {"workload": watched.workload, **self._host},
            "tpuscope": verdict,
        }
        stream = self._stream or sys.stderr
        with contextlib.suppress(OSError, ValueError):
            stream.write(json.dumps(line) + "\n")
            stream.flush()
        if self._otlp is not None:
            try:
                self._otlp.emit(severity, message, verdict)
            except Exception as e:  # the collector's trouble: the stderr line is out already
                log.warning("cannot send a hang verdict over OTLP: %s", e)


def _step_label(position: positions.Position) -> str:
    return "" if position.step is None else str(position.step)


def sender(sock: socket.socket) -> Callable[[bytes], None]:
    """What writes one request to a position thread's connection, never waiting."""

    def send(message: bytes) -> None:
        sock.send(message, socket.MSG_DONTWAIT | socket.MSG_NOSIGNAL)

    return send
