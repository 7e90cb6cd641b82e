"""Where the device time of a few profiled steps went, read from a jax profiler capture (a serialized XSpace).

The job's capture (:mod:`tpuscope.tracing.profiles`) annotates each traced step with
``StepTraceAnnotation(events.STEP_ANNOTATION, step_num=n)`` and hands the XSpace to the sidecar, whose profile service
(:mod:`tpuscope.exporter.profiles`) runs this module as a child process on it (``python -m tpuscope.exporter.xspace
TRACE``: it prints the capture's :class:`~tpuscope.events.DeviceProfile` as JSON). A fused jitted step cannot be timed
from the host, but its trace can: per device and step, the time is split into

- compute: the union of the non-collective ops' time;
- exposed collective: collective op time that no compute covers (on the CPU a collective's time includes waiting at
  its rendezvous for the slower devices: that wait is the straggler signal, so it counts as collective time);
- overlapped collective: the rest of the collective time, hidden under compute;
- idle: the step window that no op covers (waiting for the host, the input or the next dispatch).

``compute + exposed collective + idle == step`` by construction: exposed collective is the collective union minus the
compute union, so compute and exposed collective are disjoint and together make up the union of all ops.

Step windows come from the host: window k is [start of step k, start of step k+1). With asynchronous dispatch a
step's device work runs after its Python annotation has ended, so consecutive starts give the steady-state period, not
the annotation's own length. The last annotated step only closes the window before it, and the first windows (the
capture started inside them) are left out. Ops straddling a window's edge are clipped to it.

Which events are ops:

- CPU backend (what the tests run): there are no device planes. Each XLA thunk is an event on a ``/host:CPU`` thread
  line with the stats ``hlo_op`` and ``device_ordinal``. One program's thunks hop between threads (a thunk that waits
  at a rendezvous resumes on another), so a device's ops are gathered over all lines. Control-flow thunks (while,
  conditional, call) run their bodies inline on the same thread: an op that encloses another op of its device on its
  line is such a container, and only the ops it encloses count (else a loop's gaps would read as compute).
- GPU and TPU (not testable on this machine's CPU): ``/device:GPU:N`` / ``/device:TPU:N`` planes, one per device,
  whose "XLA Ops" line holds the HLO ops; without it (a raw GPU capture) the "Stream #..." lines hold the kernels.
  Where device planes exist, the host's thunk events are ignored so that nothing is counted twice.

Collectives are told by name (``COLLECTIVE_OP``): XLA names each instruction after its opcode or, for JAX, after the
primitive (``all-reduce``, ``psum.7``, ``psum_invariant.28``, ``all_gather.3``, ``ppermute.3``...), and XProf
(xprof/convert/xplane_to_step_events.cc) takes GPU kernels whose names start with ``nccl`` as collectives. TPU keeps
an ``hlo_category`` stat in the event metadata, but ``ProfileEvent.stats`` does not show metadata stats, so names are
all there is.

The parse is one pass over the events plus a sort of each line's ops and of each device's intervals. On the bench's
default model (8 CPU devices) a step is about 8,000 events and 550 KB of trace; 5 steps parse in about 65 ms (of which
reading the events' stats is most). The trace reader (jaxlib's ``ProfileData``) is imported inside :func:`split_steps`,
so importing this module costs nothing; loading it costs its process about 100 MiB, which is why the sidecar parses in a
child process.
"""

from __future__ import annotations

import bisect
import functools
import importlib
import itertools
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tpuscope import events
from tpuscope.events import STEP_ANNOTATION

# The HLO instruction names (and GPU kernel names) of collectives: an XLA opcode or a JAX collective primitive at the
# start of the name, followed by its end or a separator (all-reduce-start.1, psum_invariant.28, all_gather.3), or a
# kernel name starting with nccl.
COLLECTIVE_OP = re.compile(
    r"^(?:nccl"
    r"|(?:ragged[-_])?(?:all[-_]reduce|all[-_]gather|reduce[-_]scatter|all[-_]to[-_]all"
    r"|collective[-_]permute|collective[-_]broadcast|psum|pmax|pmin|ppermute|pbroadcast)(?:$|[-_.]))"
)

# The planes of real devices; their trailing number is the device's ordinal.
DEVICE_PLANE = re.compile(r"^/device:(?:GPU|TPU):(\d+)$")
HOST_PLANE = "/host:CPU"
OPS_LINE = "XLA Ops"
STREAM_LINE_PREFIX = "Stream #"

Interval = tuple[float, float]


@dataclass(frozen=True)
class DeviceSplit:
    """One device's split, each figure a mean per measured step, in seconds."""

    device: int  # the local device ordinal
    step_s: float
    compute_s: float
    exposed_collective_s: float
    overlapped_collective_s: float
    idle_s: float


@dataclass(frozen=True)
class ProfiledSteps:
    """The split of the measured steps; each figure a mean per step and per device, in seconds."""

    steps: int  # steps measured
    devices: int  # devices measured: those with any op in the capture
    step_s: float  # the step window
    compute_s: float  # union of non-collective (leaf) op time within the window
    exposed_collective_s: float  # collective op time no compute covers
    overlapped_collective_s: float  # collective op time covered by compute
    idle_s: float  # the window minus the union of all ops
    slowest_compute_s: float  # per step, the compute of the device with the most, averaged over steps
    per_device: tuple[DeviceSplit, ...] = ()  # by device ordinal: the straggler's view


# --- interval math over sorted, disjoint (start, end) lists ------------------------------------------------------


def union(intervals: Iterable[Interval]) -> list[Interval]:
    """The union of any intervals, as sorted disjoint intervals (touching ones merged, empty ones dropped)."""
    merged: list[Interval] = []
    for start, end in sorted(intervals):
        if end <= start:
            continue
        if merged and start <= merged[-1][1]:
            if end > merged[-1][1]:
                merged[-1] = (merged[-1][0], end)
        else:
            merged.append((start, end))
    return merged


def total(intervals: Iterable[Interval]) -> float:
    """The summed length of disjoint intervals."""
    return sum(end - start for start, end in intervals)


def clip(intervals: Sequence[Interval], low: float, high: float) -> list[Interval]:
    """The parts of sorted disjoint intervals inside [low, high): a bisection, so each window costs only its own ops."""
    if high <= low:
        return []
    first = bisect.bisect_right(intervals, low, key=lambda interval: interval[1])
    inside = list(intervals[first : bisect.bisect_left(intervals, high, key=lambda interval: interval[0])])
    if inside:  # only the first and the last can straddle an edge
        inside[0] = (max(inside[0][0], low), inside[0][1])
        inside[-1] = (inside[-1][0], min(inside[-1][1], high))
    return inside


def subtract(intervals: Sequence[Interval], cover: Sequence[Interval]) -> list[Interval]:
    """The parts of sorted disjoint ``intervals`` that sorted disjoint ``cover`` leaves uncovered: one merge pass."""
    left: list[Interval] = []
    j = 0
    for start, end in intervals:
        while j < len(cover) and cover[j][1] <= start:
            j += 1
        k, at = j, start
        while k < len(cover) and cover[k][0] < end:
            if cover[k][0] > at:
                left.append((at, cover[k][0]))
            at = max(at, cover[k][1])
            k += 1
        if at < end:
            left.append((at, end))
    return left


# --- reading the trace -------------------------------------------------------------------------------------------


@dataclass
class _Ops:
    """One device's leaf ops, as raw intervals (ns), compute and collective apart."""

    compute: list[Interval] = field(default_factory=list)
    collective: list[Interval] = field(default_factory=list)


# An op read from a line: start, and minus its end (ns: a plain tuple sort then puts an op before the ops it encloses
# even when they start together), device ordinal, HLO name.
_Op = tuple[float, float, int, str]


def _add_leaves(line_ops: list[_Op], devices: dict[int, _Ops]) -> None:
    """Add a line's ops to their devices, leaving out the containers (ops enclosing another op of their device).

    Events on one thread nest like a call stack, so a stack of the ops still open finds each op's parent."""
    line_ops.sort()
    container = [False] * len(line_ops)
    open_ops: list[int] = []
    for i, (start, minus_end, device, _) in enumerate(line_ops):
        while open_ops and -line_ops[open_ops[-1]][1] <= start:
            open_ops.pop()
        if open_ops:
            parent = line_ops[open_ops[-1]]
            if parent[2] == device and minus_end >= parent[1]:
                container[open_ops[-1]] = True
        open_ops.append(i)
    for (start, minus_end, device, name), enclosing in zip(line_ops, container, strict=True):
        if not enclosing:
            ops = devices.setdefault(device, _Ops())
            (ops.collective if is_collective(name) else ops.compute).append((start, -minus_end))


@functools.lru_cache(maxsize=4096)
def is_collective(name: str) -> bool:
    """Whether an op of this name is a collective (``COLLECTIVE_OP``); a program has a few hundred names at most."""
    return COLLECTIVE_OP.match(name) is not None


def _read(profile: Any) -> tuple[dict[int, float], dict[int, _Ops]]:
    """The start (ns) of each annotated step by step number, and each device's leaf ops."""
    step_starts: dict[int, float] = {}
    host_ops: dict[int, _Ops] = {}
    device_ops: dict[int, _Ops] = {}
    for plane in profile.planes:
        if plane.name == HOST_PLANE:
            for line in plane.lines:
                _add_leaves(_read_host_line(line, step_starts), host_ops)
        elif match := DEVICE_PLANE.match(plane.name):
            ordinal = int(match.group(1))
            lines = list(plane.lines)
            ops_lines = [line for line in lines if line.name == OPS_LINE] or [
                line for line in lines if line.name.startswith(STREAM_LINE_PREFIX)
            ]
            for line in ops_lines:
                _add_leaves([(event.start_ns, -event.end_ns, ordinal, event.name) for event in line.events], device_ops)
    return step_starts, device_ops or host_ops


def _read_host_line(line: Any, step_starts: dict[int, float]) -> list[_Op]:
    """A host thread's thunks; its step annotations go into ``step_starts`` (the earliest start of each number).

    Reading stats is most of the parse's cost, so they are read only where they can matter, and only until what is
    looked for is found: a thunk's event is named by its HLO instruction, whose names XLA keeps to
    ``[A-Za-z0-9_.-]`` (its NameUniquer), while most other events ("Wait for donation holds", "end: dot.1",
    "ThunkExecutor::Execute", the Python tracer's "$file.py:12 f") have a space or a colon; and a thunk's first
    stats are ``hlo_op`` and ``device_ordinal``, before the costlier source location and flow ids."""
    ops: list[_Op] = []
    for event in line.events:
        name = event.name
        if " " in name or ":" in name:
            continue
        op: str | None = None
        device: int | None = None
        for key, value in event.stats:
            if key == "step_num" and name == STEP_ANNOTATION and isinstance(value, int):
                step_starts[value] = min(step_starts.get(value, event.start_ns), event.start_ns)
                break
            if key == "hlo_op":
                op = str(value)
            elif key == "device_ordinal" and isinstance(value, int):
                device = value
            if op is not None and device is not None:
                ops.append((event.start_ns, -event.end_ns, device, op))
                break
    return ops


def _windows(step_starts: dict[int, float], skip_first: int) -> list[Interval]:
    """The measured step windows: [start of a step, start of the next) in time order, the first ``skip_first`` out.

    Time order, not step-number order: the windows are the timeline's, whatever the numbers say."""
    starts = sorted(step_starts.values())
    return list(itertools.pairwise(starts))[skip_first:]


def split_steps(xspace: bytes, skip_first: int = 1) -> ProfiledSteps | None:
    """The split of a capture's annotated steps; None when no step window remains or the trace holds no device op.

    ``skip_first``: windows to leave out at the start (the capture's own start is in the first)."""
    step_starts, devices = _read(profile_data().from_serialized_xspace(xspace))
    windows = _windows(step_starts, skip_first)
    if not windows or not devices:
        return None
    splits = [_device_split(ordinal, devices[ordinal], windows) for ordinal in sorted(devices)]
    per_device = tuple(split for split, _ in splits)
    compute_by_window = zip(*(computes for _, computes in splits), strict=True)
    return ProfiledSteps(
        steps=len(windows),
        devices=len(per_device),
        step_s=_mean(d.step_s for d in per_device),
        compute_s=_mean(d.compute_s for d in per_device),
        exposed_collective_s=_mean(d.exposed_collective_s for d in per_device),
        overlapped_collective_s=_mean(d.overlapped_collective_s for d in per_device),
        idle_s=_mean(d.idle_s for d in per_device),
        slowest_compute_s=_mean(max(computes) for computes in compute_by_window) * 1e-9,
        per_device=per_device,
    )


def _device_split(ordinal: int, ops: _Ops, windows: list[Interval]) -> tuple[DeviceSplit, list[float]]:
    """One device's split over the windows, and its compute (ns) in each window."""
    compute_ops, collective_ops = union(ops.compute), union(ops.collective)
    computes: list[float] = []
    exposed = overlapped = 0.0
    for low, high in windows:
        compute, collective = clip(compute_ops, low, high), clip(collective_ops, low, high)
        computes.append(total(compute))
        exposed_here = total(subtract(collective, compute))
        exposed += exposed_here
        overlapped += total(collective) - exposed_here
    span, compute_t = sum(high - low for low, high in windows), sum(computes)
    per_step_s = 1e-9 / len(windows)
    split = DeviceSplit(
        device=ordinal,
        step_s=span * per_step_s,
        compute_s=compute_t * per_step_s,
        exposed_collective_s=exposed * per_step_s,
        overlapped_collective_s=overlapped * per_step_s,
        idle_s=(span - compute_t - exposed) * per_step_s,
    )
    return split, computes


def _mean(values: Iterable[float]) -> float:
    listed = list(values)
    return sum(listed) / len(listed)


def profile_data() -> Any:
    """jaxlib's trace reader: from jaxlib alone where it can be (30 ms), else through the public ``jax.profiler``
    (which imports all of jax: half a second)."""
    try:
        return importlib.import_module("jaxlib._profile_data").ProfileData
    except (ImportError, AttributeError):
        from jax.profiler import ProfileData

        return ProfileData


def device_profile(split: ProfiledSteps | None) -> events.DeviceProfile:
    """The wire's form of a split: ``error`` when the trace measured nothing (no step window or no device op)."""
    if split is None:
        return events.DeviceProfile(result="error")
    return events.DeviceProfile(
        result="ok",
        steps=split.steps,
        devices=split.devices,
        step_s=split.step_s,
        compute_s=split.compute_s,
        exposed_collective_s=split.exposed_collective_s,
        overlapped_collective_s=split.overlapped_collective_s,
        idle_s=split.idle_s,
        slowest_compute_s=split.slowest_compute_s,
    )


def main(argv: Sequence[str]) -> int:
    """``python -m tpuscope.exporter.xspace TRACE``: print the trace's DeviceProfile as JSON (the sidecar's parse).

    The sidecar runs it at the lowest CPU priority (exporter/profiles.py). The file is opened without following
    a link, and one over :data:`~tpuscope.events.PROFILE_MAX_BYTES` is refused unread."""
    import os
    import sys

    import msgspec

    (path,) = argv
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as trace:
        data = trace.read(events.PROFILE_MAX_BYTES + 1)
    if len(data) > events.PROFILE_MAX_BYTES:
        print(f"{path}: over {events.PROFILE_MAX_BYTES} bytes", file=sys.stderr)
        return 2
    sys.stdout.buffer.write(msgspec.json.encode(device_profile(split_steps(data))))
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
