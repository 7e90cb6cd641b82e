"""The wire schema between the job (``tpuscope.tracing``) and the sidecar.

One event is one message on a Unix ``SOCK_SEQPACKET`` socket (why that kind: :mod:`tpuscope.exporter.ingest`):
a three-byte header (``b"TS"`` and the schema version) followed by the record as MessagePack, encoded
positionally (``array_like``) so a step event costs well under a hundred bytes. A recording (``tpuscope workload
--record``) holds the same records as JSON lines, read back by :func:`read_records`. The sidecar validates each
record it decodes and counts the reason of each :class:`InvalidEvent`. Fields may only be added at the end of a
record with a default, and a sidecar ignores trailing fields it does not know, so a job and a sidecar image,
upgraded separately, work together both ways; any other change bumps :data:`VERSION`.
"""

from __future__ import annotations

import errno
import functools
import itertools
import math
import operator
import os
import re
import socket
import tempfile
import typing
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec

VERSION = 1
MAGIC = b"TS"
HEADER = MAGIC + bytes([VERSION])
# A longer datagram is rejected unread, so one bad sender cannot make the sidecar parse megabytes.
MAX_DATAGRAM_BYTES = 8192

SOCKET_ENV = "TPUSCOPE_SOCKET"

# A label value becomes a Prometheus label: bounded length, a safe alphabet. Free text (function names) is bounded
# but never a label. \Z, not $: $ also matches before a final newline, and "llm\n" would be a second workload.
LABEL_VALUE_MAX = 64
_LABEL_ALPHABET = "A-Za-z0-9_.:/-"
LabelValue = Annotated[
    str,
    msgspec.Meta(min_length=1, max_length=LABEL_VALUE_MAX, pattern=rf"^[A-Za-z0-9][{_LABEL_ALPHABET}]*\Z"),
]
_OUTSIDE_ALPHABET = re.compile(rf"[^{_LABEL_ALPHABET}]")
_LEADING = re.compile(r"^[^A-Za-z0-9]+")
Text = Annotated[str, msgspec.Meta(max_length=256)]
# A week bounds any duration we report; NaN fails the check, infinity too. A sender clamps a duration that may be
# longer (a configured period) to it: one field out of bounds rejects its whole event.
MAX_SECONDS = 7 * 86400.0
Seconds = Annotated[float, msgspec.Meta(ge=0.0, le=MAX_SECONDS)]
Count = Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)]
Flops = Annotated[float, msgspec.Meta(ge=0.0, le=1e30)]


def label_value(text: object, empty: str) -> str:
    """``text`` as a :data:`LabelValue`, for a sender that must not fail on what it was given: characters outside
    the alphabet become ``_``, a leading non-alphanumeric run goes (``%fusion.3`` -> ``fusion.3``), then it is cut
    to :data:`LABEL_VALUE_MAX`; ``empty`` if nothing is left."""
    return _LEADING.sub("", _OUTSIDE_ALPHABET.sub("_", str(text)))[:LABEL_VALUE_MAX] or empty


# A W3C trace id in lowercase hex, or empty: the step's spans were not kept.
TraceId = Annotated[str, msgspec.Meta(pattern=r"^([0-9a-f]{32})?\Z")]

PHASES = ("compute", "sync", "io", "other")
Phase = Literal["compute", "sync", "io", "other"]
CompileStage = Literal["tracing", "lowering", "backend"]
CheckpointOperation = Literal["save", "restore"]
LifecycleState = Literal["start", "stop", "failure", "restart"]


# What became of a capture (tpuscope.tracing.profile_sampler): measured; skipped, a profiler (the user's, JAX's
# PGLE) was running or could start; failed (capture, hand-off or parse) or discarded (the job left its step loop).
PROFILE_RESULTS = ("ok", "busy", "error")
ProfileResult = Literal["ok", "busy", "error"]

# --- device-profile captures: from the job to the sidecar's parser -----------------------------------------------
# The annotation on each traced step: XProf's own step marker, so XProf finds the steps of a capture too.
STEP_ANNOTATION = "train"
# A larger serialized trace is neither handed over nor read: a few steps' trace is a few MB, a bigger one ran far
# past its steps.
PROFILE_MAX_BYTES = 128 << 20
# In the spool (profile_spool) a job writes STEM.head (a ProfileHandover, so the sidecar serves its answer itself)
# and STEM.xspace.tmp, renamed STEM.xspace (whole or absent); the sidecar answers STEM.json (a DeviceProfile, written
# the same way). STEM is JOB-SEQ: pid and a random token (two containers' jobs may both be pid 1), capture number.
PROFILE_HEADER_SUFFIX = ".head"
PROFILE_TRACE_SUFFIX = ".xspace"
PROFILE_ANSWER_SUFFIX = ".json"
PROFILE_PARTIAL_SUFFIX = ".tmp"
PROFILE_STEM = re.compile(r"^(?P<job>[0-9]{1,10}-[0-9a-f]{8})-(?P<seq>[0-9]{1,12})\Z")


def profile_spool(socket_path: str | os.PathLike[str]) -> Path:
    """Where the sidecar listening at ``socket_path`` takes device traces to parse: a directory beside its socket,
    which exists while that sidecar offers the service (an older sidecar makes none: its jobs take no captures)."""
    return Path(os.fspath(socket_path) + ".profiles")


# The most measured steps a capture's event carries one by one (DeviceProfile.per_step): a capture measures a few.
PROFILE_MAX_STEPS = 64


class ProfiledStep(msgspec.Struct, array_like=True, frozen=True):
    """One measured step of a capture, each figure a mean over the host's devices (as in DeviceProfile)."""

    step_s: Seconds
    compute_s: Seconds
    exposed_collective_s: Seconds
    overlapped_collective_s: Seconds
    idle_s: Seconds
    slowest_compute_s: Seconds


class DeviceProfile(msgspec.Struct, array_like=True, frozen=True):
    """Where the device time of a few sampled steps went, from a device trace the job took in-process.

    Each figure is a mean per step and per local device over the measured steps (tpuscope.exporter.profiles
    says which): ``compute_s`` is the union of the non-collective ops' time, ``exposed_collective_s`` the
    collective ops' time that no compute covers, ``overlapped_collective_s`` the collective time (ops, or async
    ones in flight) that compute covers, ``idle_s`` the step minus every op (the host, the input, the next
    dispatch; on the CPU backend also devices waiting for the host's cores); ``compute_s + exposed_collective_s +
    idle_s == step_s``. ``slowest_compute_s``: the compute of the busiest local device. ``capture_s``: what the
    capture cost the job (starting and stopping the trace, on its profiler's thread); ``parse_s``: what parsing
    it cost the sidecar. ``period_s``: the wall seconds the job now aims at between two captures, its widening
    included; the rules count a capture fresh for a few of them. A capture that measured nothing (``result``
    busy or error) has zeros but for what it cost and the period. ``per_step`` lets the sidecar average several
    captures and say their spread. ``ops_by_category`` / ``ops_by_name``: the device ops classified by their HLO
    category (as XProf does) and those told only by name (no category in the trace: the CPU backend, an older
    runtime). ``served``: the parsing sidecar served the capture already (from the job's ProfileHandover), so the
    step carrying it back is not counted again. From ``parse_s`` on the fields are trailing: 0 (unknown), empty or
    False from an older job, parser or sidecar (whose jobs' steps carry the capture).
    """

    result: ProfileResult
    steps: Count = 0
    devices: Count = 0
    step_s: Seconds = 0.0
    compute_s: Seconds = 0.0
    exposed_collective_s: Seconds = 0.0
    overlapped_collective_s: Seconds = 0.0
    idle_s: Seconds = 0.0
    slowest_compute_s: Seconds = 0.0
    capture_s: Seconds = 0.0
    trace_bytes: Count = 0
    parse_s: Seconds = 0.0
    period_s: Seconds = 0.0
    per_step: Annotated[tuple[ProfiledStep, ...], msgspec.Meta(max_length=PROFILE_MAX_STEPS)] = ()
    ops_by_category: Count = 0
    ops_by_name: Count = 0
    served: bool = False


class ProfileHandover(msgspec.Struct, frozen=True):
    """Whose trace a spool's STEM.xspace is, written beside it as STEM.head by the job that captured it: the sidecar
    that parses it serves the answer for ``workload`` itself, whether or not the job is still there to carry it.
    ``capture_s``, ``trace_bytes`` and ``period_s`` as in DeviceProfile: the job's figures, which the parse lacks."""

    workload: LabelValue
    capture_s: Seconds = 0.0
    trace_bytes: Count = 0
    period_s: Seconds = 0.0


class Event(msgspec.Struct, array_like=True, frozen=True, tag_field="k"):
    """Base of every record; ``workload`` names the job that sent it."""

    workload: LabelValue


# The training values a job reports (:class:`StepValues`), each a label value of the sidecar's series of them.
TRAINING_VALUES = ("loss", "grad_norm", "local")
# A reading of one: a finite float, or the non-finite one spelled out. JSON (a recording) has no NaN nor infinity,
# and a non-finite value is what these are read for.
Reading = float | Literal["nan", "inf", "-inf"] | None
# The most steps' values one event carries: the job keeps at most this many unread (tracing/training_values.py).
MAX_STEP_VALUES = 64


def reading(value: float) -> Reading:
    """``value`` as the wire carries it: the float, or "nan", "inf", "-inf"."""
    return value if math.isfinite(value) else typing.cast(Reading, repr(value))


class StepValues(msgspec.Struct, array_like=True, frozen=True):
    """One step's loss, and its gradient norm and this process's value before the reduction where the job gives
    them, read once the device computed them (tpuscope.tracing.training_values): None where not given."""

    step: Count
    loss: Reading = None
    grad_norm: Reading = None
    local: Reading = None

    def values(self) -> tuple[tuple[str, float], ...]:
        """(name, value) of each value read, as floats (NaN and infinities included)."""
        return tuple(
            (name, float(value))
            for name, value in (("loss", self.loss), ("grad_norm", self.grad_norm), ("local", self.local))
            if value is not None
        )


StepValuesList = Annotated[tuple[StepValues, ...], msgspec.Meta(max_length=MAX_STEP_VALUES)]

# A custom badput name (``Monitor.badput``), a label value of tpuscope_goodput_seconds_total{category};
# tpuscope.goodput says which names are taken and how many a workload keeps.
BADPUT_NAME_PATTERN = r"^[a-z][a-z0-9_]{0,31}\Z"
# On the wire any short string: a name the job did not check is booked as the fold category (goodput.BadputNames),
# where a stricter type would throw away the whole step that carries it.
BadputName = Annotated[str, msgspec.Meta(min_length=1, max_length=64)]
# A job sends one entry per name used since its last event and keeps fewer names (goodput.MAX_CUSTOM_BADPUT and
# the fold): the room above is for a later job that keeps more, whose events an older sidecar must still take.
MAX_BADPUT_ENTRIES = 32


class Badput(msgspec.Struct, array_like=True, frozen=True):
    """Seconds the job marked as custom badput ``name`` (``with mon.badput("eval"):``), less the compiles inside;
    ``in_step``: marked inside the step that carries it, whose productive time it is then part of."""

    name: BadputName
    seconds: Seconds
    in_step: bool = False


BadputList = Annotated[tuple[Badput, ...], msgspec.Meta(max_length=MAX_BADPUT_ENTRIES)]


class TrainingValues(Event, tag="train", frozen=True):
    """The training values still unsent when the Monitor closes: no step follows to carry them (a step carries
    those read at its end, :attr:`Step.values`). ``unread``: those the job dropped because they were never ready."""

    values: StepValuesList = ()
    unread: Count = 0


class Step(Event, tag="step", frozen=True):
    """A finished training step and where its time went (the phases add up to ``duration_s``).

    ``dropped``: the events this process could not send since its last successful send, so the sidecar sees the
    job's losses too. ``flops``: the model FLOPs the step did on all the job's devices (0: unknown), for MFU.
    ``trace_id`` names the trace of the step's spans when they were kept, for the sidecar to attach to the
    step-duration histogram as an exemplar. ``profile``: the latest device-profile capture, on the first step
    sent after it was parsed. ``compile_s``: the compile seconds the job reported while the step ran (part of its
    duration, booked as compile and not as productive); None from a job older than the field. ``values``: the
    training values (``s.loss``) the device had computed by this step's end, and ``unread`` those the job dropped
    since its last event because they were never ready. ``badput``: the custom badput marked since the last step
    (``mon.badput``), before this step or inside it. From ``profile`` on the fields are trailing: a sidecar older
    than one reads the step, ignores it without counting an error, and books such badput as ``other`` between
    steps and ``productive`` inside one.
    """

    step: Count
    duration_s: Seconds
    compute_s: Seconds = 0.0
    sync_s: Seconds = 0.0
    io_s: Seconds = 0.0
    other_s: Seconds = 0.0
    dropped: Count = 0
    flops: Flops = 0.0
    trace_id: TraceId = ""
    profile: DeviceProfile | None = None
    compile_s: Seconds | None = None
    values: StepValuesList = ()
    unread: Count = 0
    badput: BadputList = ()

    def __post_init__(self) -> None:
        measured = self.compute_s + self.sync_s + self.io_s + self.other_s
        # Phases are measured inside the step, so they cannot exceed it (1% + 1 ms slack for clocks).
        if measured > self.duration_s * 1.01 + 1e-3:
            raise ValueError(f"phases add up to {measured:.6f}s, more than the step's {self.duration_s:.6f}s")

    def phase_seconds(self) -> tuple[tuple[Phase, float], ...]:
        return (("compute", self.compute_s), ("sync", self.sync_s), ("io", self.io_s), ("other", self.other_s))


class Compile(Event, tag="compile", frozen=True):
    """One stage of one XLA compilation."""

    stage: CompileStage
    duration_s: Seconds
    function: Text = ""


class CompileFailure(Event, tag="compfail", frozen=True):
    """A compilation that failed at ``stage``; ``reason`` is one of tpuscope.reasons.COMPILE_FAILURE_VALUES."""

    stage: CompileStage
    reason: LabelValue = "other"


class Recompile(Event, tag="recompile", frozen=True):
    """A function traced again, and why (JAX's cache-miss explanation): one of tpuscope.reasons.RECOMPILE_VALUES."""

    cause: LabelValue = "other"


class CompileCache(Event, tag="cache", frozen=True):
    """One persistent compilation-cache look-up."""

    hit: bool


class Checkpoint(Event, tag="ckpt", frozen=True):
    """A finished checkpoint save or restore. ``compile_s``: the compile seconds reported while it ran (Orbax
    compiles its copies on the first save), when the job measured them; None: unknown. ``blocking_s``: of an
    async save, the seconds it held the training loop (``duration_s`` runs until it is durable); None: all."""

    operation: CheckpointOperation
    duration_s: Seconds
    ok: bool
    bytes: Count = 0
    step: Count = 0
    compile_s: Seconds | None = None
    blocking_s: Seconds | None = None


class DeviceMemory(Event, tag="devmem", frozen=True):
    """A reading of one device's memory, as the job sees it: ``source`` ``workload`` from the runtime's
    ``device.memory_stats()``, ``process`` the job's own resident memory where the backend keeps no device
    statistics (JAX on the CPU)."""

    device: LabelValue
    accelerator: LabelValue
    used_bytes: Count
    limit_bytes: Count = 0
    peak_bytes: Count = 0
    source: Literal["workload", "process"] = "workload"


class ProgramMemory(Event, tag="progmem", frozen=True):
    """What XLA's memory analysis says of one compiled program."""

    program: LabelValue
    spill_bytes: Count


class Hardware(Event, tag="hw", frozen=True):
    """What the job runs on: the denominator of model FLOPs utilization."""

    accelerator: LabelValue
    devices: Count
    peak_flops_per_second: Flops


class Lifecycle(Event, tag="life", frozen=True):
    """The job started, stopped, failed or restarted. A failure's ``reason`` is one of
    tpuscope.reasons.FAILURE_VALUES (``exception`` from a job older than them). ``badput``: on a stop or failure, the
    custom badput marked after the last step, which no step carries (a trailing field, as :attr:`Step.badput`)."""

    state: LifecycleState
    reason: LabelValue = "none"
    badput: BadputList = ()


class InferenceBatch(Event, tag="infer", frozen=True):
    """One executed serving batch: its size, the queue behind it and each request's latency."""

    batch_size: Count
    queue_depth: Count
    request_seconds: Annotated[list[Seconds], msgspec.Meta(max_length=1024)] = []


class ModelLoaded(Event, tag="model", frozen=True):
    """A serving process loaded the model it serves (its version a label: a few values, never a hash per build)."""

    version: LabelValue


# A position record's file name, in the sidecar's directory of them (tpuscope.positions).
RecordName = Annotated[str, msgspec.Meta(max_length=64, pattern=r"^[0-9]{1,10}-[0-9a-f]{8}\.position\Z")]


class Watch(Event, tag="watch", frozen=True):
    """The first message on the connection of a Monitor's position thread (tpuscope.tracing.position): where its
    process's position record is, and whether the process asked to end on a hang. Not an event of the workload:
    the sidecar keeps the connection to ask the thread for the process's stacks."""

    record: RecordName
    exit_on_hang: bool = False


AnyEvent = (
    Step
    | Compile
    | CompileCache
    | Checkpoint
    | DeviceMemory
    | ProgramMemory
    | Hardware
    | Lifecycle
    | InferenceBatch
    | CompileFailure
    | Recompile
    | ModelLoaded
    | TrainingValues
    | Watch
)

# Why a datagram was rejected; each is a value of the sidecar's reason label.
REJECT_REASONS = ("malformed", "truncated", "oversized", "unknown_version", "invalid_field")


class InvalidEvent(ValueError):
    """A datagram the sidecar rejects; ``reason`` is one of :data:`REJECT_REASONS`."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


_encoder = msgspec.msgpack.Encoder()
_decoder: msgspec.msgpack.Decoder[AnyEvent] = msgspec.msgpack.Decoder(AnyEvent)


# The types the encoder takes as they are; a field holding anything else goes through plain_fields first.
PLAIN_TYPES = frozenset({int, float, str, bool, list, tuple, type(None)})


def as_int(value: object) -> int:
    """What int() reads from a whole number of any kind: a NumPy integer, a JAX step counter (a 0-d array),
    a float that is whole. Raises TypeError or ValueError for anything else (an array of several values)."""
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        number = float(value)  # type: ignore[arg-type]
        if not number.is_integer():
            raise ValueError(f"{value!r} is not a whole number") from None
        return int(number)


def plain_fields(record: type[Event], fields: dict[str, object]) -> dict[str, object]:
    """``fields`` with each NumPy or JAX number (scalar or 0-d array) made the Python int, float or bool its field
    holds, as int(), float() and bool() read it (the encoder takes nothing else); TypeError or ValueError if not."""
    hints = _field_types(record)
    plain: dict[str, object] = {}
    for name, value in fields.items():
        kind = hints.get(name)
        if kind is list:
            plain[name] = [v if type(v) in (int, float) else float(v) for v in value]  # type: ignore[attr-defined]
        elif type(value) in PLAIN_TYPES:
            plain[name] = value
        elif kind is int:
            plain[name] = as_int(value)
        elif kind is float:
            plain[name] = float(value)  # type: ignore[arg-type]
        elif kind is bool:
            plain[name] = bool(value)
        else:
            raise TypeError(f"{name}={value!r}: a {type(value).__name__} where a {kind} is expected")
    return plain


@functools.cache
def _field_types(record: type[Event]) -> dict[str, type | None]:
    """Each field's Python type (int, float, bool, list, str), its annotations and Literals set aside."""
    kinds: dict[str, type | None] = {}
    for name, hint in typing.get_type_hints(record).items():
        origin = typing.get_origin(hint)
        if origin is Literal:
            kinds[name] = type(typing.get_args(hint)[0])
        else:
            kinds[name] = origin if origin is not None else hint
    return kinds


def encode(event: AnyEvent) -> bytes:
    return HEADER + _encoder.encode(event)


def decode(datagram: bytes | bytearray | memoryview) -> AnyEvent:
    """Decode and validate one datagram, or raise :class:`InvalidEvent`."""
    if len(datagram) > MAX_DATAGRAM_BYTES:
        raise InvalidEvent("oversized", f"{len(datagram)} bytes, the limit is {MAX_DATAGRAM_BYTES}")
    if bytes(datagram[:2]) != MAGIC or len(datagram) < len(HEADER):
        raise InvalidEvent("malformed", "no tpuscope header")
    if datagram[2] != VERSION:
        raise InvalidEvent("unknown_version", f"schema version {datagram[2]}, this sidecar reads {VERSION}")
    try:
        return _decoder.decode(memoryview(datagram)[len(HEADER) :])
    except msgspec.ValidationError as e:
        raise InvalidEvent("invalid_field", str(e)) from None
    except msgspec.DecodeError as e:
        reason = "truncated" if "truncated" in str(e) else "malformed"
        raise InvalidEvent(reason, str(e)) from None
    except Exception as e:  # e.g. UnicodeDecodeError from invalid UTF-8 in a string: found by fuzzing
        raise InvalidEvent("malformed", f"{type(e).__name__}: {e}") from None


# The JSON-lines form of an event (``tpuscope workload --record``): readable, and readable back.
_BY_TAG: dict[str, type[AnyEvent]] = {cls.__struct_config__.tag: cls for cls in typing.get_args(AnyEvent)}


def to_record(event: AnyEvent, received: float) -> dict[str, Any]:
    """``{"time": ..., "type": "step", "workload": ..., ...}``: one line of a recording."""
    return {"time": received, "type": event.__struct_config__.tag, **msgspec.structs.asdict(event)}


def from_record(record: dict[str, Any]) -> tuple[float, AnyEvent]:
    """The time and event of one recorded line, validated like a datagram."""
    try:
        cls = _BY_TAG[record["type"]]
        # Records are positional on the wire; fields missing from the end take their defaults.
        present = itertools.takewhile(lambda name: name in record, cls.__struct_fields__)
        event = msgspec.convert([record["type"], *(record[name] for name in present)], AnyEvent)
        received = float(record["time"])
    except (KeyError, TypeError, ValueError, msgspec.ValidationError) as e:  # not an object, no time, a bad field
        raise InvalidEvent("invalid_field", f"{record!r}: {e}") from None
    return received, event


def read_records(path: str | os.PathLike[str], unreadable: list[str] | None = None) -> list[tuple[float, AnyEvent]]:
    """The (time, event) pairs of a recording, in order; :class:`InvalidEvent` names a line that is no valid event,
    or, given an ``unreadable`` list, the line is skipped and why appended there (a job killed mid-write leaves a
    cut last line, and the rest of its recording is still worth reading)."""
    records = []
    with open(path) as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                records.append(from_record(msgspec.json.decode(line)))
            except (msgspec.DecodeError, InvalidEvent) as e:
                if unreadable is None:
                    raise InvalidEvent("malformed", f"{path}, line {number}: {e}") from None
                unreadable.append(f"line {number}: {e}")
    return records


def has_listener(path: Path) -> bool:
    """Whether a live process (a sidecar) accepts connections on the socket at ``path``; OSError when unsure."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        probe.connect(os.fspath(path))
    except OSError as e:
        if e.errno in (errno.ECONNREFUSED, errno.ENOENT):
            return False
        raise
    finally:
        probe.close()
    return True


def default_socket_path() -> Path:
    """Where the sidecar listens unless ``TPUSCOPE_SOCKET`` or a flag says otherwise: a per-user runtime directory,
    so two users on one host never collide and nobody else can write to the socket."""
    if path := os.environ.get(SOCKET_ENV):
        return Path(path)
    runtime = os.environ.get("XDG_RUNTIME_DIR") or os.path.join(tempfile.gettempdir(), f"tpuscope-{os.getuid()}")
    return Path(runtime) / "tpuscope.sock"
