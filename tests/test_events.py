"""The wire schema: round trips, validation, and the reason every bad datagram is rejected for."""

from __future__ import annotations

import math
from pathlib import Path

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tpuscope import events, goodput
from tpuscope.tracing import read_records

VALID = [
    events.Step(workload="llm", step=7, duration_s=0.5, compute_s=0.3, sync_s=0.1, io_s=0.05, other_s=0.05),
    events.Compile(workload="llm", stage="backend", duration_s=12.5, function="train_step"),
    events.CompileCache(workload="llm", hit=True),
    events.Checkpoint(workload="llm", operation="save", duration_s=3.0, ok=False, bytes=10**12, step=100),
    events.DeviceMemory(workload="llm", device="3", accelerator="v5e", used_bytes=2**34, limit_bytes=2**35),
    events.ProgramMemory(workload="llm", program="train_step", spill_bytes=4096),
    events.Lifecycle(workload="llm", state="restart", reason="preemption"),
    events.InferenceBatch(workload="serve", batch_size=8, queue_depth=3, request_seconds=[0.01, 0.2]),
]


@pytest.mark.parametrize("event", VALID, ids=lambda e: type(e).__name__)
def test_every_record_round_trips(event: events.AnyEvent) -> None:
    encoded = events.encode(event)
    assert encoded.startswith(events.HEADER)
    assert len(encoded) < 200
    assert events.decode(encoded) == event


def raw(*fields: object) -> bytes:
    """A datagram with a valid header and arbitrary positional fields."""
    return events.HEADER + msgspec.msgpack.encode(list(fields))


STEP = events.encode(VALID[0])


@pytest.mark.parametrize(
    ("datagram", "reason"),
    [
        (b"", "malformed"),
        (b"GET / HTTP/1.1\r\n", "malformed"),
        (b"TS", "malformed"),
        (STEP[:-4], "truncated"),
        (events.HEADER, "truncated"),
        (b"TS\x63" + STEP[3:], "unknown_version"),
        (events.HEADER + b"\xc1", "malformed"),
        (events.HEADER + b"x" * events.MAX_DATAGRAM_BYTES, "oversized"),
        (raw("step", "llm", 1, math.nan), "invalid_field"),
        (raw("step", "llm", 1, math.inf), "invalid_field"),
        (raw("step", "llm", -1, 1.0), "invalid_field"),
        (raw("step", "llm", 1, 1.0, 2.0), "invalid_field"),  # a phase longer than its step
        (raw("step", "bad label!", 1, 1.0), "invalid_field"),
        (raw("step", "x" * 65, 1, 1.0), "invalid_field"),
        (raw("nope", "llm"), "invalid_field"),
        (raw("compile", "llm", "linking", 1.0), "invalid_field"),
        (raw("step", "llm", 1, 1.0, 0, 0, 0, 0, 0, "extra"), "invalid_field"),
    ],
)
def test_bad_datagrams_are_rejected_with_a_reason(datagram: bytes, reason: str) -> None:
    with pytest.raises(events.InvalidEvent) as caught:
        events.decode(datagram)
    assert caught.value.reason == reason


def test_fields_a_newer_job_appends_are_ignored() -> None:
    """A job one version ahead (a field added at the end) still reaches an older sidecar."""
    fields = msgspec.msgpack.decode(STEP[len(events.HEADER) :])
    newer = events.HEADER + msgspec.msgpack.encode([*fields, "a field from the future", 42])
    assert events.decode(newer) == VALID[0]


@pytest.mark.parametrize("first_new_field", ["profile", "compile_s", "values", "badput"])
def test_a_sidecar_older_than_a_steps_trailing_fields_reads_the_step(first_new_field: str) -> None:
    """Issues 22, 23, 56 and 57: the job sends ``Step.profile``, ``Step.compile_s``, ``Step.values`` and
    ``Step.badput`` before every sidecar knows them. A sidecar of an earlier release reads Step without its last
    fields: decoding with that layout keeps the rest."""
    fields_now = msgspec.structs.fields(events.Step)[1:]  # Event's workload comes first
    names = [f.name for f in fields_now]
    old_fields = [(f.name, f.type, f.default) for f in fields_now[: names.index(first_new_field)]]
    trailing = ["profile", "compile_s", "values", "unread", "badput"]
    assert names[names.index(first_new_field) :] == trailing[trailing.index(first_new_field) :]  # only trailing ones
    old_step = msgspec.defstruct("Step", old_fields, bases=(events.Event,), tag="step", frozen=True)
    profile = events.DeviceProfile("ok", steps=4, devices=8, step_s=0.5, compute_s=0.3, exposed_collective_s=0.2)
    losses = (events.StepValues(3, 2.5, local="nan"),)
    marked = (events.Badput("eval", 1.5), events.Badput("sdc_check", 0.25, in_step=True))
    newer = msgspec.structs.replace(
        VALID[0], trace_id="ab" * 16, profile=profile, compile_s=0.05, values=losses, unread=1, badput=marked
    )
    datagram = events.encode(newer)
    assert datagram.startswith(events.HEADER)  # the same schema version: an older sidecar takes it
    read = msgspec.msgpack.Decoder(old_step).decode(datagram[len(events.HEADER) :])
    expected = {
        k: v
        for k, v in msgspec.structs.asdict(newer).items()
        if k in dict.fromkeys(["workload", *names[: names.index(first_new_field)]])
    }
    assert msgspec.structs.asdict(read) == expected


def test_a_sidecar_older_than_the_stops_custom_badput_reads_the_stop() -> None:
    """Issue 57: the stop (or failure) carries the custom badput no step carried; a sidecar of an earlier release
    reads Lifecycle without it."""
    old_life = msgspec.defstruct(
        "Lifecycle", [("state", events.LifecycleState), ("reason", str, "none")], bases=(events.Event,), tag="life"
    )
    stop = events.Lifecycle("llm", "failure", reason="oom", badput=(events.Badput("eval", 3.0),))
    datagram = events.encode(stop)
    assert events.decode(datagram) == stop
    read = msgspec.msgpack.Decoder(old_life).decode(datagram[len(events.HEADER) :])
    assert (read.workload, read.state, read.reason) == ("llm", "failure", "oom")


def test_a_step_whose_custom_badput_name_the_job_did_not_check_is_read_and_booked_as_the_fold() -> None:
    """A job that sent a name no custom category may take (upper case, a built-in category's): its step is read, and
    the ledger books the time under the fold category, so no step is lost and no label is made of it."""
    datagram = events.encode(events.Step("llm", 1, 1.0, badput=(events.Badput("eval", 1.0),))).replace(b"eval", b"Eval")
    step = events.decode(datagram)
    assert isinstance(step, events.Step) and step.badput == (events.Badput("Eval", 1.0),)
    names = goodput.BadputNames()
    assert [names.category(name) for name in ("Eval", "compile", "eval")] == [goodput.CUSTOM_BADPUT] * 2 + ["eval"]


def test_a_step_carries_at_most_so_many_custom_badput_entries() -> None:
    many = tuple(events.Badput(f"n{i}", 1.0) for i in range(events.MAX_BADPUT_ENTRIES + 1))
    datagram = events.encode(events.Step("llm", 1, 1.0, badput=many))
    assert len(datagram) < events.MAX_DATAGRAM_BYTES
    with pytest.raises(events.InvalidEvent):
        events.decode(datagram)
    assert events.decode(events.encode(events.Step("llm", 1, 1.0, badput=many[:-1]))).badput == many[:-1]


@given(st.binary(max_size=200))
def test_arbitrary_bytes_decode_or_raise_invalid_event(data: bytes) -> None:
    for datagram in (data, events.HEADER + data):
        try:
            events.decode(datagram)
        except events.InvalidEvent as e:
            assert e.reason in events.REJECT_REASONS


def test_socket_path_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(events.SOCKET_ENV, "/run/x/events.sock")
    assert str(events.default_socket_path()) == "/run/x/events.sock"
    monkeypatch.delenv(events.SOCKET_ENV)
    monkeypatch.setenv("XDG_RUNTIME_DIR", "/run/user/1000")
    assert str(events.default_socket_path()) == "/run/user/1000/tpuscope.sock"


@pytest.mark.parametrize(
    "line",
    ["[1, 2]", '{"type": "step", "workload": "llm", "step": 1, "duration_s": 0.1}', '{"time": "x", "type": "ckpt"}'],
    ids=["not an object", "no time", "a bad time"],
)
def test_a_bad_recorded_line_is_an_invalid_event_that_names_its_line(line: str, tmp_path: Path) -> None:
    good = events.to_record(VALID[0], 1.0)
    recording = tmp_path / "events.jsonl"
    recording.write_text(msgspec.json.encode(good).decode() + "\n" + line + "\n")
    with pytest.raises(events.InvalidEvent, match=r"events.jsonl, line 2:"):
        read_records(recording)
    unreadable: list[str] = []
    assert read_records(recording, unreadable) == [(1.0, VALID[0])]
    assert len(unreadable) == 1 and unreadable[0].startswith("line 2:")


@pytest.mark.parametrize("value", ["llm\n", "a\n"])
def test_a_label_with_a_trailing_newline_is_refused(value: str) -> None:
    """``$`` matches before a final newline: ``workload="llm\\n"`` would be a second series beside "llm"."""
    with pytest.raises(events.InvalidEvent) as caught:
        events.decode(raw("step", value, 1, 1.0))
    assert caught.value.reason == "invalid_field"


def test_a_trace_id_of_a_newline_is_refused() -> None:
    good = events.Step(workload="llm", step=1, duration_s=1.0, trace_id="0" * 32)
    assert events.decode(events.encode(good)) == good
    for bad in ("\n", "0" * 32 + "\n"):
        with pytest.raises(events.InvalidEvent):
            events.decode(events.encode(events.Step(workload="llm", step=1, duration_s=1.0, trace_id=bad)))


@pytest.mark.parametrize(
    ("given", "made"),
    [
        ("llm-pretrain", "llm-pretrain"),
        ("%fusion.3", "fusion.3"),
        ("a b\nc", "a_b_c"),
        ("__/x", "x"),
        ("é" * 3 + "x", "x"),
        ("", "unknown"),
        ("._-", "unknown"),
        ("x" * 300, "x" * events.LABEL_VALUE_MAX),
    ],
)
def test_one_rule_makes_a_label_value_of_anything_and_the_wire_accepts_it(given: str, made: str) -> None:
    """The job's labels (Monitor) and the runtime's (the core-state collector) are made by this one rule, and what it
    makes passes the wire schema's own check of a label value."""
    assert events.label_value(given, "unknown") == made
    assert msgspec.convert(made, type=events.LabelValue) == made
