"""Where the device time of a few profiled steps went, read from a jax profiler capture (a serialized XSpace).

A fused jitted step cannot be timed from the host, but its trace can: per device and step, the time splits into
compute, exposed collective (collective time no compute hides: the wait for the slower devices), overlapped
collective (what the compiler hid) and idle (what no op covers), and ``compute + exposed collective + idle == step``
by construction. The trace is read as XProf reads it, straight from the protobuf (:mod:`.xplane`), because the
event metadata's stats are where TPU and GPU runtimes say which ops are collectives; and one plane at a time into
flat arrays, because the parse must fit the child process it runs in. Which events are ops on each backend, and
where the step windows come from: docs/sidecar.md, "How a device profile is read".

The sidecar's profile service (:mod:`.service`) runs ``python -m tpuscope.exporter.profiles.xspace TRACE``: it prints
the capture's :class:`~tpuscope.events.DeviceProfile` as JSON. It needs protobuf only, so a sidecar without jax
parses too.
"""

from __future__ import annotations

import array
import bisect
import functools
import itertools
import re
import statistics
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from tpuscope import events
from tpuscope.events import STEP_ANNOTATION
from tpuscope.exporter.profiles.intervals import clip, overlap, subtract, total, union

# The HLO instruction names (and GPU kernel names) of collectives: an XLA opcode or a JAX collective primitive at the
# start of the name, followed by its end or a separator (all-reduce-start.1, psum_invariant.28, all_gather.3), or a
# kernel name starting with nccl (any case, as XProf's ClassifyGpuEvent).
COLLECTIVE_OP = re.compile(
    r"^(?:nccl"
    r"|(?:ragged[-_])?(?:all[-_]reduce|all[-_]gather|reduce[-_]scatter|all[-_]to[-_]all"
    r"|collective[-_]permute|collective[-_]broadcast|psum|pmax|pmin|ppermute|pbroadcast)(?:$|[-_.]))",
    re.IGNORECASE,
)
# The HLO categories of collectives, as tsl names them (xla_op_utils.h; XProf's IsCollective in
# xprof/convert/smart_suggestion/signal_provider.h), with their async halves and fusions; send and recv move data
# between devices too (a pipeline's stages).
COLLECTIVE_CATEGORIES = frozenset(
    {
        "all-reduce",
        "all-reduce-start",
        "all-reduce-done",
        "all-reduce fusion",
        "all-reduce-scatter fusion",
        "all-to-all",
        "ragged-all-to-all",
        "all-gather",
        "all-gather-start",
        "all-gather-done",
        "all-gather fusion",
        "reduce-scatter",
        "reduce-scatter fusion",
        "collective-permute",
        "collective-permute-start",
        "collective-permute-done",
        "collective-broadcast",
        "megacore fusion",
        "host recv",
        "host recv-done",
        "host send",
        "host send-done",
        "send",
        "send-done",
        "recv",
        "recv-done",
    }
)
# Categories that say an op is one half of an async pair, not what it does: its name says that.
ASYNC_CATEGORIES = frozenset({"async-start", "async-done", "async-update"})
# The halves of an async op, at the end of its name's kind: all-reduce-start.3, all-gather-done.
ASYNC_HALF = re.compile(r"^(?P<kind>.+?)-(?P<half>start|done)(?:[._]\d+)*$")

# The planes of real devices; their trailing number is the device's ordinal.
DEVICE_PLANE = re.compile(r"^/device:(?:GPU|TPU):(\d+)$")
HOST_PLANE = "/host:CPU"
CUPTI_PLANE = "/host:CUPTI"  # CUPTI's driver calls, one line per thread, before the profiler merges it into HOST_PLANE
OPS_LINE = "XLA Ops"
ASYNC_OPS_LINE = "Async XLA Ops"  # libtpu: each async op's time in flight, from its start to its done
STEPS_LINE = "Steps"
MODULES_LINE = "XLA Modules"
STREAM_LINE_PREFIX = "Stream #"
COPY_EVENTS = ("Memcpy", "Memset")  # CUPTI's names of a GPU's copies and fills (MemcpyH2D, MemcpyD2H...)
# Stat names, as tsl/profiler/utils/xplane_schema.h spells them.
HLO_CATEGORY = "hlo_category"
HLO_OP = "hlo_op"
DEVICE_ORDINAL = "device_ordinal"
STEP_NUM = "step_num"
GROUP_ID = "group_id"
CORRELATION_ID = "correlation_id"  # CUPTI's: a kernel's and the driver call's that launched it
PROGRAM_ID = "program_id"
# A program run's name on a device's "XLA Modules" line: the module, then its program id (jit_f(12190760917235803885)).
MODULE_PROGRAM_ID = re.compile(r"\((\d+)\)$")

# The most memory the parse child may map: a trace costs a few times its bytes to parse, and the sidecar's container
# must keep room for the sidecar itself (docs/sidecar.md has what a parse costs).
PARSE_MEMORY_BYTES = 384 << 20
Interval = tuple[int, int]  # picoseconds: a trace's clock is epoch nanoseconds, past a float's exact integers


@dataclass(frozen=True)
class DeviceSplit:
    """One device's split, each figure a mean per measured step, in seconds."""

    device: int  # the local device ordinal
    steps: int  # the windows it was measured on (a program's runs may be on some devices only)
    step_s: float
    compute_s: float
    exposed_collective_s: float
    overlapped_collective_s: float
    idle_s: float


@dataclass(frozen=True)
class StepSplit:
    """One measured step, each figure a mean over the devices that ran it, in seconds."""

    step_s: float
    compute_s: float
    exposed_collective_s: float
    overlapped_collective_s: float
    idle_s: float
    slowest_compute_s: float  # the compute of the device with the most in this step


@dataclass(frozen=True)
class ProfiledSteps:
    """The split of the measured steps; each figure a mean per step and per device, in seconds."""

    steps: int  # steps measured
    devices: int  # devices measured: those with any op in the capture
    step_s: float  # the step window
    compute_s: float  # the time some non-collective op runs, within the window
    exposed_collective_s: float  # collective op time no compute covers
    overlapped_collective_s: float  # collective op or in-flight time compute covers
    idle_s: float  # the window minus the union of all ops
    slowest_compute_s: float  # per step, the compute of the device with the most, averaged over steps
    per_device: tuple[DeviceSplit, ...] = ()  # by device ordinal: the straggler's view
    per_step: tuple[StepSplit, ...] = ()  # in time order: the spread from one step to the next
    ops_by_category: int = 0  # ops told collective or not by their HLO category
    ops_by_name: int = 0  # ops told by name only (no category in the trace)
    windows_from: str = ""  # "device" (a plane's Steps line), "annotation" (the host's) or "module" (program runs)


# --- telling ops apart -------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=4096)
def is_collective(name: str) -> bool:
    """Whether an op of this name is a collective (``COLLECTIVE_OP``); a program has a few hundred names at most."""
    return COLLECTIVE_OP.match(name) is not None


def instruction(name: str) -> str:
    """An op's HLO instruction name: libtpu names an op by its whole HLO text (``%all-reduce.3 = f32[...] ...``)."""
    return name[1:].split(" ", 1)[0] if name.startswith("%") else name


def is_collective_op(name: str, category: str | None) -> bool:
    """Whether an op is a collective: by its HLO category where it has one, as XProf tells; else by its name."""
    if category is None or category in ASYNC_CATEGORIES:
        return is_collective(instruction(name))
    return category in COLLECTIVE_CATEGORIES


def async_half(name: str) -> tuple[str, str] | None:
    """``(kind, "start" | "done")`` for the half of an async collective (``all-reduce-start.3``), else None."""
    match = ASYNC_HALF.match(instruction(name))
    if match is None or not is_collective(match["kind"]):
        return None
    return match["kind"], match["half"]


# --- reading the trace -------------------------------------------------------------------------------------------


@dataclass
class _Ops:
    """One device's ops, as raw intervals (ps): compute and collective op time, and async collectives in flight."""

    # Flat (start, end, start, end...) arrays of 8-byte integers: a busy device's ops are hundreds of thousands of
    # intervals, which as tuples of Python ints would cost many times the memory (the parse's memory is bounded).
    compute: array.array[int] = field(default_factory=lambda: array.array("q"))
    collective: array.array[int] = field(default_factory=lambda: array.array("q"))
    in_flight: array.array[int] = field(default_factory=lambda: array.array("q"))
    steps: list[tuple[int, Interval]] = field(default_factory=list)  # (number, window) from the Steps line
    modules: list[tuple[str, Interval]] = field(default_factory=list)  # (program, run) from the XLA Modules line
    kernels: list[tuple[int, Interval]] = field(default_factory=list)  # (correlation id, span) of a GPU's kernels


@dataclass
class _Trace:
    """What a capture holds: the host's step annotations and each device's ops, and how ops were told apart."""

    step_starts: dict[int, int] = field(default_factory=dict)  # step number -> earliest start (ps)
    host_ops: dict[int, _Ops] = field(default_factory=dict)  # the CPU backend's thunks, by device ordinal
    device_ops: dict[int, _Ops] = field(default_factory=dict)  # device planes' ops, by device ordinal
    by_category: int = 0  # device ops told by their HLO category
    by_name: int = 0  # device ops told by name only
    host_thunks: int = 0  # the CPU backend's thunks: all told by name
    # by thread (a host line's id: the thread's id, on /host:CPU and /host:CUPTI alike): its (start, end, step number)
    annotated: defaultdict[int, list[tuple[int, int, int]]] = field(default_factory=lambda: defaultdict(list))
    # by thread: its kernel launches' (start, correlation id)
    launches: defaultdict[int, list[tuple[int, int]]] = field(default_factory=lambda: defaultdict(list))
    launched: dict[int, int] = field(default_factory=dict)  # a kernel's correlation id -> the step that launched it
    origin_ns: int | None = None  # the first line's start: times are picoseconds from it (epoch ps overflow int64)

    def base(self, line: Any) -> int:
        """Where a line's events' offsets count from, in picoseconds from the trace's origin."""
        if self.origin_ns is None:
            self.origin_ns = int(line.timestamp_ns)
        return (int(line.timestamp_ns) - self.origin_ns) * 1000

    def resolve_launches(self) -> None:
        """A kernel's step: the annotation its launch nests in on its thread (as XProf groups a GPU's kernels into
        steps, through CUPTI's correlation ids); else, where a runtime thread launched it, the step whose
        annotation began last before the launch (XProf follows the runtime's own flow events there; this reading
        holds while the job's thread does not run a step ahead of its launches). Done once every plane is read: a
        thread's launches and its annotations may come from two planes."""
        starts = sorted((start, number) for annotated in self.annotated.values() for start, _, number in annotated)
        for thread, launches in self.launches.items():
            annotated = sorted(self.annotated.get(thread, ()))
            own = [start for start, _, _ in annotated]
            for at, correlation_id in launches:
                i = bisect.bisect_right(own, at) - 1
                if i >= 0 and at < annotated[i][1]:
                    self.launched[correlation_id] = annotated[i][2]
                elif (i := bisect.bisect_right(starts, (at, 1 << 62)) - 1) >= 0:
                    self.launched[correlation_id] = starts[i][1]


class _Kind(NamedTuple):
    """What the events of one metadata id are, told once per id."""

    collective: bool
    half: tuple[str, str] | None  # (kind, "start" | "done") for a half of an async collective
    by_category: bool  # told by the HLO category (else by name)
    copy: bool  # a GPU's copy or fill (CUPTI's Memcpy*, Memset*): the host's input, not an op


class _Plane:
    """A plane's two tables, looked up once per metadata id rather than once per event."""

    def __init__(self, plane: Any) -> None:
        self.plane = plane
        self.stat_ids = {meta.name: key for key, meta in plane.stat_metadata.items()}
        self._kinds: dict[int, _Kind] = {}
        self._programs: dict[int, str] = {}  # a run's metadata id -> its program, where the run itself says none

    def stat_id(self, name: str) -> int:
        return int(self.stat_ids.get(name, -1))

    def text(self, stat: Any) -> str:
        """A stat's string: its own, or the name of the stat metadata its ref_value names."""
        if stat.HasField("ref_value"):
            meta = self.plane.stat_metadata.get(stat.ref_value)
            return str(meta.name) if meta is not None else ""
        return str(stat.str_value)

    @staticmethod
    def number(stat: Any) -> int:
        kind = stat.WhichOneof("value")
        return int(getattr(stat, kind)) if kind in ("int64_value", "uint64_value") else -1

    def category(self, metadata_id: int) -> str | None:
        return self._categories.get(metadata_id)

    def kind(self, metadata_id: int) -> _Kind:
        """What the events of this metadata are: once per metadata id, not per event."""
        if (known := self._kinds.get(metadata_id)) is None:
            name, category = self.name(metadata_id), self.category(metadata_id)
            collective = is_collective_op(name, category)
            known = self._kinds[metadata_id] = _Kind(
                collective,
                async_half(name) if collective else None,
                category is not None,
                not collective and name.startswith(COPY_EVENTS),
            )
        return known

    @functools.cached_property
    def _categories(self) -> dict[int, str]:
        wanted = self.stat_id(HLO_CATEGORY)
        return {
            key: self.text(stat)
            for key, meta in self.plane.event_metadata.items()
            for stat in meta.stats
            if stat.metadata_id == wanted
        }

    def name(self, metadata_id: int) -> str:
        meta = self.plane.event_metadata.get(metadata_id)
        return str(meta.name) if meta is not None else ""

    def program(self, event: Any) -> str:
        """Which program a run (an "XLA Modules" event) is: its program id (a ``program_id`` stat of the event or
        of its metadata, else the number its name ends with: ``jit_f(12190760917235803885)``), else its name."""
        wanted = self.stat_id(PROGRAM_ID)
        for stat in event.stats if wanted >= 0 else ():
            if stat.metadata_id == wanted and (number := _integer(stat)) is not None:
                return str(number)
        if (known := self._programs.get(event.metadata_id)) is None:
            meta = self.plane.event_metadata.get(event.metadata_id)
            stats = meta.stats if meta is not None else ()
            number = next((n for s in stats if s.metadata_id == wanted and (n := _integer(s)) is not None), None)
            name = self.name(event.metadata_id)
            match = MODULE_PROGRAM_ID.search(name)
            known = str(number) if number is not None else match.group(1) if match else name
            self._programs[event.metadata_id] = known
        return known


def _integer(stat: Any) -> int | None:
    """A stat's value if it is an integer (an id, signed or not), else None."""
    kind = stat.WhichOneof("value")
    return int(getattr(stat, kind)) if kind in ("int64_value", "uint64_value") else None


def _read(data: bytes) -> _Trace:
    """What a serialized capture holds, one plane at a time: each device's ops are merged into their unions as its
    plane is read, so the parse holds one plane's events at most, not the whole trace's."""
    from tpuscope.exporter.profiles import xplane

    trace = _Trace()
    for plane in xplane.planes(data):
        if plane.name == HOST_PLANE:
            _read_host(_Plane(plane), trace)
        elif plane.name == CUPTI_PLANE:
            _read_launches(_Plane(plane), trace)
        elif match := DEVICE_PLANE.match(plane.name):
            _read_device(_Plane(plane), int(match.group(1)), trace)
    trace.resolve_launches()
    return trace


def _start(trace: _Trace, line: Any, event: Any) -> int:
    return trace.base(line) + int(event.offset_ps)


def _read_host(plane: _Plane, trace: _Trace) -> None:
    """The host's step annotations, (the CPU backend) its threads' thunks, and (a GPU's) kernel launches.

    Reading stats is most of the parse's cost, so they are read only where they can matter, and only until what is
    looked for is found: a thunk's event is named by its HLO instruction, whose names XLA keeps to
    ``[A-Za-z0-9_.-]`` (its NameUniquer), while most other events ("Wait for donation holds", "end: dot.1",
    "ThunkExecutor::Execute", the Python tracer's "$file.py:12 f") have a space or a colon; and a thunk's first
    stats are ``hlo_op`` and ``device_ordinal``, before the costlier source location and flow ids. A launch is
    named after its kernel, space or not (``void cutlass::Kernel2<...>(...)``), so any other event may be one, but
    only where CUPTI wrote the plane: a plane without a ``correlation_id`` stat (the CPU backend's, a TPU host's)
    has no launch to look for."""
    metadata = plane.plane.event_metadata
    steps = {key for key, meta in metadata.items() if meta.name == STEP_ANNOTATION}
    thunks = {key for key, meta in metadata.items() if " " not in meta.name and ":" not in meta.name} - steps
    step_num, hlo_op, ordinal = plane.stat_id(STEP_NUM), plane.stat_id(HLO_OP), plane.stat_id(DEVICE_ORDINAL)
    correlation = plane.stat_id(CORRELATION_ID)
    for line in plane.plane.lines:
        ops: list[_Op] = []
        annotated = trace.annotated[int(line.id)]
        launches = trace.launches[int(line.id)]
        for event in line.events:
            key = event.metadata_id
            if key in steps:
                for stat in event.stats:
                    if stat.metadata_id == step_num and (number := plane.number(stat)) >= 0:
                        start = _start(trace, line, event)
                        trace.step_starts[number] = min(trace.step_starts.get(number, start), start)
                        annotated.append((start, start + int(event.duration_ps), number))
                        break
            elif key in thunks:
                op: str | None = None
                device = -1
                for stat in event.stats:
                    if stat.metadata_id == hlo_op:
                        op = plane.text(stat)
                    elif stat.metadata_id == ordinal:
                        device = plane.number(stat)
                    elif stat.metadata_id == correlation:  # a launch of a kernel whose name is one word
                        launches.append((_start(trace, line, event), plane.number(stat)))
                        break
                    if op is not None and device >= 0:
                        start = _start(trace, line, event)
                        ops.append((start, -(start + int(event.duration_ps)), device, op))
                        break
            elif correlation >= 0:
                _add_launch(plane, trace, line, event, correlation, launches)
        trace.host_thunks += len(ops)
        _add_leaves(ops, trace.host_ops)


def _read_launches(plane: _Plane, trace: _Trace) -> None:
    """An unmerged capture's ``/host:CUPTI`` plane: its kernel launches, by thread (its lines are ``Host
    Threads/<tid>``, with the thread's id for the line's, as the thread's line on ``/host:CPU`` has)."""
    correlation = plane.stat_id(CORRELATION_ID)
    if correlation < 0:
        return
    for line in plane.plane.lines:
        launches = trace.launches[int(line.id)]
        for event in line.events:
            _add_launch(plane, trace, line, event, correlation, launches)


def _add_launch(plane: _Plane, trace: _Trace, line: Any, event: Any, correlation: int,
                launches: list[tuple[int, int]]) -> None:  # fmt: skip
    """A driver call's (start, correlation id), if it has one: a kernel's launch (or a copy's, which is harmless:
    a GPU's copies are not ops)."""
    for stat in event.stats:
        if stat.metadata_id == correlation:
            launches.append((_start(trace, line, event), plane.number(stat)))
            return


# An op read from a line: start, and minus its end (ps: a plain tuple sort then puts an op before the ops it encloses
# even when they start together), device ordinal, HLO name.
_Op = tuple[int, int, int, str]


def _add_leaves(line_ops: list[_Op], devices: dict[int, _Ops]) -> None:
    """Add a CPU thread's thunks to their devices, leaving out the containers (ops enclosing another op of their
    device). Events on one thread nest like a call stack, so a stack of the ops still open finds each op's parent."""
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
            (ops.collective if is_collective(name) else ops.compute).extend((start, -minus_end))


def _read_device(plane: _Plane, ordinal: int, trace: _Trace) -> None:
    """A device plane's ops (its "XLA Ops" line, else its stream lines) and its own steps (its "Steps" line)."""
    lines = list(plane.plane.lines)
    ops_lines = [line for line in lines if line.name == OPS_LINE] or [
        line for line in lines if line.name.startswith(STREAM_LINE_PREFIX)
    ]
    ops = trace.device_ops.setdefault(ordinal, _Ops())
    for line in ops_lines:
        _add_device_line(plane, line, ops, trace)
    for line in lines:
        if line.name == ASYNC_OPS_LINE:  # the collectives in flight, where libtpu draws them itself
            for event in line.events:
                if plane.kind(event.metadata_id).collective:
                    start = _start(trace, line, event)
                    ops.in_flight.extend((start, start + int(event.duration_ps)))
    group_id = plane.stat_id(GROUP_ID)
    for line in lines:
        if line.name == STEPS_LINE:
            for index, event in enumerate(line.events):
                number = next((plane.number(s) for s in event.stats if s.metadata_id == group_id), -1)
                if number < 0:
                    name = plane.name(event.metadata_id)
                    number = int(name) if name.isdigit() else index
                start = _start(trace, line, event)
                ops.steps.append((number, (start, start + int(event.duration_ps))))
        elif line.name == MODULES_LINE:
            for event in line.events:  # a few per program run: their stats cost little
                start = _start(trace, line, event)
                ops.modules.append((plane.program(event), (start, start + int(event.duration_ps))))
    if not (ops.compute or ops.collective):
        del trace.device_ops[ordinal]


def _add_device_line(plane: _Plane, line: Any, ops: _Ops, trace: _Trace) -> None:
    """A device line's ops, each for its self time (the time no op it encloses runs) in its own kind; async
    collectives' halves paired into their time in flight.

    One pass in time order with a stack of the ops still open, each piece of self time merged into the last as it
    comes (a TPU's ops run back to back): a busy line leaves far fewer intervals than it has ops. A line whose
    events are not in time order (the profiler writes them in order) is sorted first."""
    open_starts: dict[str, list[int]] = defaultdict(list)  # async kind -> starts still waiting for their done
    correlation = plane.stat_id(CORRELATION_ID) if line.name.startswith(STREAM_LINE_PREFIX) else -2
    base = trace.base(line)
    events: Iterable[Any] = line.events
    if any(_order(a) > _order(b) for a, b in itertools.pairwise(line.events)):
        events = sorted(line.events, key=_order)
    compute, collective_time = _Merged(ops.compute), _Merged(ops.collective)
    stack: list[list[Any]] = []  # the ops still open: [end, merged list of its kind, where its self time resumes]
    for event in events:
        collective, half, by_category, copy = plane.kind(event.metadata_id)
        if copy:
            continue  # CUPTI's copies on a GPU's stream lines: the host's input, not compute (as XProf files them)
        start = base + int(event.offset_ps)
        end = start + int(event.duration_ps)
        for stat in event.stats if correlation >= 0 else ():
            if stat.metadata_id == correlation:  # a GPU kernel: the step that launched it is found on the host
                ops.kernels.append((plane.number(stat), (start, end)))
                break
        if by_category:
            trace.by_category += 1
        else:
            trace.by_name += 1
        if half is not None:
            kind, which = half
            if which == "start":
                open_starts[kind].append(start)
            elif open_starts[kind]:
                ops.in_flight.extend((open_starts[kind].pop(0), end))
        _close_until(stack, (start, end))
        if stack:  # inside an op: that op's self time pauses here
            parent = stack[-1]
            parent[1].add(parent[2], start)
            parent[2] = max(parent[2], start)
        stack.append([end, collective_time if collective else compute, start])
    _close_until(stack, None)


def _order(event: Any) -> tuple[int, int]:
    """A line's time order: by start, and of two that start together the longer first (a parent before its child)."""
    return event.offset_ps, -event.duration_ps


def _close_until(stack: list[list[Any]], op: Interval | None) -> None:
    """Close the open ops that ``op`` is not inside (all of them at None): those that ended by its start, and those
    it outlasts (ops of a line nest or follow; one that overlaps without nesting is taken as a neighbour, not a
    parent). Each adds the rest of its self time."""
    while stack and (op is None or stack[-1][0] <= op[0] or stack[-1][0] < op[1]):
        closed_end, merged, resume = stack.pop()
        merged.add(resume, closed_end)
        if stack:
            stack[-1][2] = max(stack[-1][2], closed_end)


class _Merged:
    """Intervals in a flat array that merges each new one into the last where they touch (they mostly come in
    order)."""

    def __init__(self, flat: array.array[int]) -> None:
        self.flat = flat

    def add(self, start: int, end: int) -> None:
        if end <= start:
            return
        flat = self.flat
        if flat and flat[-2] <= start <= flat[-1]:
            if end > flat[-1]:
                flat[-1] = end
        else:
            flat.extend((start, end))


def _pairs(flat: array.array[int]) -> Iterator[Interval]:
    """The (start, end) intervals of a flat array."""
    return zip(flat[0::2], flat[1::2], strict=True)


# --- the split ---------------------------------------------------------------------------------------------------


# What a window is across devices: a step's number, or a program run's (program, which of its runs on the device).
WindowKey = int | tuple[str, int]
Windows = dict[int, list[tuple[WindowKey, Interval]]]  # device ordinal -> its (key, window) in time order


def _windows(trace: _Trace, devices: dict[int, _Ops], skip_first: int) -> tuple[str, Windows]:
    """The capture's step windows, and where they come from: one source for every device (steps numbered one way,
    so that a step's devices meet in it), the first that every device with ops has: its own steps (a TPU's Steps
    line; a GPU's kernels by the step that launched them), the host's annotations, its programs' runs."""
    first_annotation = min(trace.step_starts.values(), default=None)
    annotated = _annotation_windows(trace.step_starts, skip_first)
    sources: list[tuple[str, Callable[[_Ops], Sequence[tuple[WindowKey, Interval]]]]] = [
        ("device", lambda ops: _device_steps(ops.steps, first_annotation)),
        ("device", lambda ops: _launched_windows(ops.kernels, trace.launched)),
        ("annotation", lambda ops: annotated),
        ("module", lambda ops: _program_runs(ops.modules)),
    ]
    for name, source in sources:
        windows = {ordinal: [w for w in source(ops) if w[1][1] > w[1][0]] for ordinal, ops in devices.items()}
        if windows and all(windows.values()):
            return name, windows
    return "", {}


def _annotation_windows(step_starts: dict[int, int], skip_first: int) -> list[tuple[int, Interval]]:
    """The host's step windows: [start of a step, start of the next) in time order, numbered by the step that
    begins them, the first ``skip_first`` out.

    Time order, not step-number order: the windows are the timeline's, whatever the numbers say."""
    starts = sorted((start, number) for number, start in step_starts.items())
    return [(number, (start, following)) for (start, number), (following, _) in itertools.pairwise(starts)][skip_first:]


def _program_runs(modules: list[tuple[str, Interval]]) -> list[tuple[WindowKey, Interval]]:
    """A device's program runs in time order, each keyed by its program and which of that program's runs on the
    device it is: the k-th run of a program meets the other devices' k-th run of it."""
    runs: dict[str, int] = defaultdict(int)
    keyed: list[tuple[WindowKey, Interval]] = []
    for program, run in sorted(modules, key=lambda module: module[1]):
        keyed.append(((program, runs[program]), run))
        runs[program] += 1
    return keyed


def _device_steps(steps: list[tuple[int, Interval]], first_annotation: int | None) -> list[tuple[int, Interval]]:
    """A device's own steps, in time order, but for one that began before the first annotation (the capture may
    have begun inside it) and a last one much shorter than the others (the capture's stop may have cut it)."""
    kept = [
        s for s in sorted(steps, key=lambda step: step[1]) if first_annotation is None or s[1][0] >= first_annotation
    ]
    if len(kept) >= 3:
        *others, (_, (start, end)) = kept
        if end - start < 0.5 * statistics.median(high - low for _, (low, high) in others):
            kept.pop()
    return kept


def split_steps(xspace: bytes, skip_first: int = 0) -> ProfiledSteps | None:
    """The split of a capture's steps; None when no step window remains or the trace holds no device op.

    ``skip_first``: annotation windows to leave out at the start (the job annotates only steps whose windows the
    session saw whole: none by default)."""
    trace = _read(xspace)
    devices = trace.device_ops or trace.host_ops
    windows_from, measured = _windows(trace, devices, skip_first)
    if not measured:
        return None
    per_device: list[DeviceSplit] = []
    by_step: dict[WindowKey, list[tuple[int, int, int, int, int]]] = defaultdict(list)
    began: dict[WindowKey, int] = {}  # each step's start on the first device that ran it: steps in time order
    for ordinal in sorted(measured):
        split, steps = _device_split(ordinal, devices[ordinal], measured[ordinal])
        per_device.append(split)
        for (key, parts), (_, (start, _)) in zip(steps, measured[ordinal], strict=True):
            by_step[key].append(parts)
            began[key] = min(began.get(key, start), start)
    per_step = tuple(_step_split(by_step[key]) for key in sorted(by_step, key=began.__getitem__))
    return ProfiledSteps(
        steps=len(per_step),
        devices=len(per_device),
        step_s=_mean(s.step_s for s in per_step),
        compute_s=_mean(s.compute_s for s in per_step),
        exposed_collective_s=_mean(s.exposed_collective_s for s in per_step),
        overlapped_collective_s=_mean(s.overlapped_collective_s for s in per_step),
        idle_s=_mean(s.idle_s for s in per_step),
        slowest_compute_s=_mean(s.slowest_compute_s for s in per_step),
        per_device=tuple(per_device),
        per_step=per_step,
        ops_by_category=trace.by_category if trace.device_ops else 0,
        ops_by_name=trace.by_name if trace.device_ops else trace.host_thunks,
        windows_from=windows_from or "annotation",
    )


def _launched_windows(kernels: list[tuple[int, Interval]], launched: dict[int, int]) -> list[tuple[int, Interval]]:
    """A GPU's own steps: step k from its first kernel that step k launched to the first that step k+1 did (the
    device's period, its idle between steps included; XProf takes a GPU step the same way, to its last kernel)."""
    first: dict[int, int] = {}
    for correlation_id, (start, _) in kernels:
        if (number := launched.get(correlation_id)) is not None:
            first[number] = min(first.get(number, start), start)
    starts = sorted((start, number) for number, start in first.items())
    return [(number, (start, following)) for (start, number), (following, _) in itertools.pairwise(starts)]


PS = 1e-12


def _device_split(
    ordinal: int, ops: _Ops, windows: Sequence[tuple[WindowKey, Interval]]
) -> tuple[DeviceSplit, list[tuple[WindowKey, tuple[int, int, int, int, int]]]]:
    """One device's split over its windows, and each window's parts (ps): step, compute, exposed and overlapped
    collective, idle."""
    compute_ops, collective_ops = union(_pairs(ops.compute)), union(_pairs(ops.collective))
    # what overlap is judged on: in flight counts
    collective_time = union(itertools.chain(collective_ops, _pairs(ops.in_flight)))
    steps: list[tuple[WindowKey, tuple[int, int, int, int, int]]] = []
    for key, (low, high) in windows:
        compute = clip(compute_ops, low, high)
        computed = total(compute)
        exposed = total(subtract(clip(collective_ops, low, high), compute))
        busy = clip(collective_time, low, high)
        overlapped = overlap(busy, compute)
        steps.append((key, (high - low, computed, exposed, overlapped, high - low - computed - exposed)))
    per_step = PS / len(steps)
    sums = [sum(parts[i] for _, parts in steps) for i in range(5)]
    split = DeviceSplit(ordinal, len(steps), *(value * per_step for value in sums))
    return split, steps


def _step_split(devices: list[tuple[int, int, int, int, int]]) -> StepSplit:
    """A step's split: the mean over the devices that ran it, and the most compute of any."""
    step, compute, exposed, overlapped, idle = (
        sum(parts[i] for parts in devices) / len(devices) * PS for i in range(5)
    )
    return StepSplit(step, compute, exposed, overlapped, idle, max(parts[1] for parts in devices) * PS)


def _mean(values: Iterable[float]) -> float:
    listed = list(values)
    return sum(listed) / len(listed)


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
        per_step=tuple(
            events.ProfiledStep(
                step_s=s.step_s,
                compute_s=s.compute_s,
                exposed_collective_s=s.exposed_collective_s,
                overlapped_collective_s=s.overlapped_collective_s,
                idle_s=s.idle_s,
                slowest_compute_s=s.slowest_compute_s,
            )
            for s in split.per_step[-events.PROFILE_MAX_STEPS :]
        ),
        ops_by_category=split.ops_by_category,
        ops_by_name=split.ops_by_name,
    )


def main(argv: Sequence[str]) -> int:
    """``python -m tpuscope.exporter.profiles.xspace TRACE``: print the trace's DeviceProfile as JSON (the sidecar's
    parse).

    The sidecar runs it at the lowest CPU priority (:mod:`.service`). The file is opened without following
    a link, and one over :data:`~tpuscope.events.PROFILE_MAX_BYTES` is refused unread. The process may use
    :data:`PARSE_MEMORY_BYTES` at most: a trace too big to parse in it fails here (a MemoryError, counted an error
    by the sidecar), not the sidecar's container."""
    import os
    import resource
    import sys

    import msgspec

    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard == resource.RLIM_INFINITY or hard > PARSE_MEMORY_BYTES:
        resource.setrlimit(resource.RLIMIT_AS, (PARSE_MEMORY_BYTES, hard))

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
