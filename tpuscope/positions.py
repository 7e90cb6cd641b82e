"""Where a job's process is, as the job writes it and the sidecar reads it: the layout both sides share.

A hung job cannot say where it hangs: its threads are blocked, or spin, and send nothing. So the Monitor keeps
its position where the sidecar can read it at any time, without the job's help: a record of a few numbers in a
small file both map (:class:`Record`), in a directory beside the sidecar's socket (:func:`directory`). The
Monitor writes it at each step and phase boundary, a store to memory and no system call; the sidecar reads it
each second (tpuscope.exporter.hangs) and judges how long the process has been where it is.

When the sidecar suspects a hang it asks the process for its Python stacks, over a connection of the Monitor's
own thread (tpuscope.tracing.position): the answer is a JSON file beside the record (:func:`stacks_path`), of
every thread's frames, bounded (:data:`MAX_THREADS`, :data:`MAX_FRAMES`, :data:`MAX_STACKS_BYTES`).

The arithmetic of a verdict that two rooms need lives here too: the label a stack's top frames make
(:func:`top_frames`), and which workers sit elsewhere than most of theirs (:func:`elsewhere`), as the rules
decide it in Prometheus and ``tpuscope hangs`` decides it from the sidecars' logs.
"""

from __future__ import annotations

import math
import os
import struct
from collections import Counter
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tpuscope import catalog

# Where a process can be (catalog.WHERE, a closed label set), in the order of their codes: the record stores the
# index. "outside": between steps (before the first, after the last, or in code the job did not mark, such as an
# eval loop); "step": in a step, in no phase; a phase's name; "compile": JAX traces, lowers or compiles; a
# checkpoint's operation.
WHERE = catalog.WHERE
OUTSIDE, STEP, IO, COMPUTE, SYNC, OTHER, COMPILE, SAVE, RESTORE = (float(code) for code in range(len(WHERE)))
PHASE_CODES = {"io": IO, "compute": COMPUTE, "sync": SYNC, "other": OTHER}
# The positions judged on the long scale (the stall threshold): a phase the job does not time step by step.
LONG = frozenset({"outside", "compile", "checkpoint_save", "checkpoint_restore"})

# The record: eight doubles. A step number is exact as a double up to 2**53, a thread's identifier too (a
# pointer: 48 bits); "since" is CLOCK_MONOTONIC in seconds (Python's perf_counter), which every process of a host
# reads alike: the job's timers take it anyway, so writing it costs nothing more.
MAGIC_SLOT, PID_SLOT, STEP_SLOT, WHERE_SLOT, SINCE_SLOT, THREAD_SLOT = range(6)
SLOTS = 8
RECORD_BYTES = SLOTS * 8
MAGIC = 54.0  # written last when the record is made: a record that says anything else is not (yet) one
_RECORD = struct.Struct(f"={SLOTS}d")

# The sidecar's requests to the Monitor's thread, one message each.
STACKS_REQUEST = b"stacks"  # + b" N": write the stacks, marked as the answer to request N
EXIT_REQUEST = b"exit"  # the process hangs and asked to end then (exit_on_hang): the stacks are out
# The exit status of a process that ended on a hang: EX_TEMPFAIL, "try again", what a restart does.
EXIT_STATUS = 75

MAX_THREADS = 64
MAX_FRAMES = 40  # a thread's innermost frames
MAX_LINE = 160  # characters of a frame's source line
MAX_STACKS_BYTES = 128 << 10
# The label of a stuck process's top frames: a few, each "function (file:line)", innermost first, cut to this.
TOP_FRAMES = 3
MAX_TOP_FRAMES_LABEL = 200


def directory(socket_path: str | os.PathLike[str]) -> Path:
    """Where the jobs of the sidecar listening at ``socket_path`` keep their records: a directory beside its
    socket, which that sidecar makes (one that does not watch for hangs makes none)."""
    return Path(os.fspath(socket_path) + ".positions")


def stacks_path(record: Path) -> Path:
    return record.with_suffix(".stacks.json")


@dataclass(frozen=True)
class Position:
    """Where the process is, and since when (its monotonic clock); ``thread``: the one that runs the steps."""

    pid: int
    step: int | None
    where: str
    since: float
    thread: int

    @property
    def key(self) -> tuple[int | None, str]:
        return (self.step, self.where)


def read(buffer: Any) -> Position | None:
    """The position ``buffer`` (a mapped record) holds, or None if it is not a record or changes while read: a
    position worth judging is one held for minutes, so two reads that agree are one the job did not tear."""
    try:
        raw = bytes(buffer[:RECORD_BYTES])
        if len(raw) < RECORD_BYTES or raw != bytes(buffer[:RECORD_BYTES]):  # bytes: a NaN step equals itself
            return None
        first = _RECORD.unpack(raw)
        if first[MAGIC_SLOT] != MAGIC:
            return None
    except (struct.error, ValueError, TypeError):  # a record cut short, a mapping closed meanwhile
        return None
    code = first[WHERE_SLOT]
    if not (0 <= code < len(WHERE) and code == int(code)):
        return None
    step = first[STEP_SLOT]
    return Position(
        pid=int(first[PID_SLOT]),
        step=None if math.isnan(step) else int(step),
        where=WHERE[int(code)],
        since=first[SINCE_SLOT],
        thread=int(first[THREAD_SLOT]),
    )


def top_frames(stacks: Mapping[str, Any], thread: int) -> str:
    """The label value of the top of ``thread``'s stack in ``stacks`` (else the first thread's): its innermost
    frame, then the job's own frames under it (a library's are skipped), :data:`TOP_FRAMES` in all, as
    ``function (file:line) < caller (file:line)``, cut to :data:`MAX_TOP_FRAMES_LABEL`. "unknown" without one."""
    threads = stacks.get("threads") or []
    chosen = next((t for t in threads if t.get("ident") == thread), threads[0] if threads else None)
    frames: list[Mapping[str, Any]] = list(reversed((chosen or {}).get("frames") or []))  # innermost first
    if not frames:
        return "unknown"
    picked = [frames[0], *[f for f in frames[1:] if not f.get("library")]][:TOP_FRAMES]
    text = " < ".join(
        f"{f.get('function', '?')} ({_short(str(f.get('file', '?')))}:{f.get('line', 0)})" for f in picked
    )
    return text[:MAX_TOP_FRAMES_LABEL]


def _short(path: str) -> str:
    """A file as a frame label names it: from the package down where it is a library's, else its last two parts."""
    for marker in ("site-packages/", "dist-packages/"):
        if marker in path:
            return path.rsplit(marker, 1)[1]
    return "/".join(path.rsplit("/", 2)[-2:])


def elsewhere(positions: Mapping[Hashable, Sequence[Any]]) -> list[Hashable]:
    """The workers whose position fewer of them share than the most-shared one; nobody where every position is
    shared as much (all at one place, or two against two), as the rules decide it (alerts.recording.hang_rules).
    ``positions``: worker -> its position's key."""
    counts = Counter(tuple(p) for p in positions.values())
    most = max(counts.values(), default=0)
    return sorted((w for w, p in positions.items() if counts[tuple(p)] < most), key=str)
