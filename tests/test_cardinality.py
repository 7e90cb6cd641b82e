"""Bounded cardinality: a job cannot grow /metrics without bound, and workloads that are gone expire."""

from __future__ import annotations

import math
import socket
import time
import typing
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from tpuscope import __version__, catalog, events, goodput
from tpuscope.exporter import collectors
from tpuscope.exporter.aggregator import CONNECTION_ERRORS, INGEST_RESULTS, Aggregator
from tpuscope.exporter.collectors import base as collector_base
from tpuscope.exporter.collectors import gke_device_plugin, libtpu, nvml
from tpuscope.exporter.exposition import Writer
from tpuscope.exporter.labels import LIMITED, OTHER_LABELS, OVERFLOW, LabelLimiter
from tpuscope.exporter.metrics import register
from tpuscope.exporter.samples import SampleStore
from tpuscope.scrape import Scrape
from tpuscope.testing.waiting import scrape_until, sidecar_rounds
from tpuscope.tracing import Monitor
from tpuscope.workload.sidecar import SidecarProcess

Label = catalog.Label

# --- how every label is bounded --------------------------------------------------------------
# A label of the catalogue must appear in one of these, with the reason its values are few; a new
# label that does not fails test_every_label_of_every_metric_is_bounded.
CLOSED: dict[Label, tuple[str, ...]] = {  # every value the code can give it
    Label.PHASE: tuple(dict.fromkeys((*events.PHASES, *catalog.WHERE))),  # a step's phases; where a process is
    Label.STAGE: typing.get_args(events.CompileStage),
    Label.RESULT: (
        *INGEST_RESULTS,
        "hit",
        "miss",
        "ok",
        "error",
        *events.PROFILE_RESULTS,
        *catalog.PROFILE_PARSE_RESULTS,
    ),
    Label.OPERATION: (
        *typing.get_args(events.CheckpointOperation),
        *(m.operation for m in libtpu.RUNTIME_METRICS if m.operation),
    ),
    Label.SOURCE: (
        *typing.get_args(typing.get_type_hints(events.DeviceMemory)["source"]),
        libtpu.SOURCE,
        nvml.SOURCE,
        gke_device_plugin.SOURCE,
    ),
    Label.CLASSIFIED_BY: catalog.PROFILE_OP_CLASSIFIERS,
    Label.VERSION: (__version__,),
    Label.COLLECTOR: tuple(collectors.COLLECTORS),
    Label.DIRECTION: ("read", "write", "receive", "transmit"),
    Label.CLOCK: ("sm", "memory"),
    Label.REASON: (
        *events.REJECT_REASONS,
        *CONNECTION_ERRORS,
        *collector_base.REASONS,
        *catalog.RUNTIME_ERROR_REASONS,
    ),  # the sidecar's own; jobs' are limited
    Label.LABEL: tuple(LIMITED),
    Label.PART: catalog.PROFILE_PARTS,
    Label.VALUE: events.TRAINING_VALUES,
}
# Open but bounded: these values, and at most so many more per workload, which the sidecar caps itself.
PER_WORKLOAD: dict[Label, tuple[tuple[str, ...], int]] = {
    # The custom badput a job names (Monitor.badput): its first names, and the fold past them.
    Label.CATEGORY: (goodput.CATEGORIES, goodput.MAX_CUSTOM_BADPUT + 1),
}
HOST: dict[Label, str] = {  # set by collectors from what this host has, so bounded by it
    Label.CPU: "one value per logical CPU",
    Label.PID: "one value per watched process: connected jobs (at most ingest.MAX_CONNECTIONS) and --pid",
    Label.WORKLOAD: "job_* series: the workloads of the connected processes, as the limiter filed them",
    Label.DEVICE: "the devices the libtpu, gke-device-plugin and nvml collectors see (the plugin's: this pod's chips)",
    Label.DEVICE_ID: "the runtime's id of each of those TPU chips: one per device",
    Label.ACCELERATOR: "the accelerator kinds of those devices",
    # Not on any metric of the catalogue: the sidecar adds it to every series, like slice and worker.
    Label.TPU_TOPOLOGY: "one value per sidecar (--tpu-topology), constant for its life: it adds no series",
    Label.BUFFER_SIZE: "the TPU runtime's megascale buffer-size buckets",
    Label.XID: "XID codes, a set the NVIDIA driver defines",
    # Served only while a workload stalls, one series per core, at most core_state.MAX_CORES of them:
    Label.CORE: "the cores of the host's TPU chips (tc0, sc1: a kind and an index on its chip)",
    Label.FINGERPRINT: "one program per core at a time: the one it runs now (its series goes when it moves on)",
    Label.HLO_LOCATION: "one HLO location per core at a time, cut to the label alphabet and 64 characters",
}


# Served only while a job process is stuck (exporter/hangs.py), one series per stuck process.
WHILE_STUCK: dict[Label, str] = {
    Label.STEP: "the step the process is stuck at: one at a time",
    Label.FRAMES: "its top frames, cut to positions.MAX_TOP_FRAMES_LABEL characters: one at a time",
}


def test_every_label_of_every_metric_is_bounded() -> None:
    """Event-updated series: each label closed or capped by the limiter. Sampled: those, or bounded by the host."""
    unbounded = []
    for metric in catalog.CATALOG:
        for label in metric.labels:
            bounded = (
                label in CLOSED
                or label in LIMITED
                or (metric.sampled and label in HOST)
                or label in WHILE_STUCK
                or label in PER_WORKLOAD
            )
            if not bounded:
                unbounded.append(f"{metric.name}: {label}")
    assert not unbounded, "say how these labels are bounded (CLOSED, LIMITED, HOST, WHILE_STUCK or PER_WORKLOAD above)"
    # Every label a job sets is one the limiter caps: LabelValue fields, read from the schema.
    job_set = {Label(name) for cls in typing.get_args(events.AnyEvent) for name in ("workload", *OTHER_LABELS[cls])}
    assert job_set == set(LIMITED)
    # Each CLOSED table is a real, small set; so is each PER_WORKLOAD one with its open part.
    assert all(0 < len(values) <= 32 for values in CLOSED.values())
    assert all(0 < len(values) + more <= 32 for values, more in PER_WORKLOAD.values())


def test_a_job_naming_custom_badput_without_end_grows_each_workload_by_the_bound_at_most() -> None:
    """Jobs that name a custom badput category per eval (and one that names built-in ones, skipping the Monitor's
    check): each workload serves its fixed categories and at most the bound more; the seconds all stay booked."""
    registry, aggregator, _ = _aggregator()
    fixed, more = PER_WORKLOAD[Label.CATEGORY]
    sent = 0.0
    for workload in ("evals-a", "evals-b"):
        for process in range(3):  # its processes' names are one workload's
            source = (workload, process)
            aggregator.accept(events.Lifecycle(workload, "start"), at=1000.0, source=source)
            for n in range(20):
                name = "productive" if n == 19 else f"eval_{process}_{n}"
                marked = (events.Badput(name, 0.5),)
                aggregator.accept(events.Step(workload, n, 0.1, 0.1, badput=marked), at=1010.0 + n, source=source)
                sent += 0.5 if workload == "evals-a" else 0.0
            aggregator.accept(events.Lifecycle(workload, "stop"), at=1040.0, source=source)
    scrape = _scrape(registry)
    for workload in ("evals-a", "evals-b"):
        categories = {s.labels["category"] for s in scrape.find(catalog.GOODPUT.name, workload=workload)}
        assert set(fixed) <= categories and len(categories) <= len(fixed) + more, sorted(categories)
        assert goodput.CUSTOM_BADPUT in categories
    custom = {s.labels["category"]: s.value for s in scrape.find(catalog.GOODPUT.name, workload="evals-a")}
    assert sum(v for c, v in custom.items() if c not in fixed) == pytest.approx(sent)


def test_the_trace_id_is_an_exemplar_never_a_label() -> None:
    assert "trace_id" not in {str(label) for label in Label}
    # No field typed TraceId is a label field of any event (those are the LabelValue ones).
    traced = {
        (cls, name)
        for cls in typing.get_args(events.AnyEvent)
        for name, hint in typing.get_type_hints(cls, include_extras=True).items()
        if hint == events.TraceId
    }
    assert traced == {(events.Step, "trace_id")}
    assert all(name not in OTHER_LABELS[cls] for cls, name in traced)
    registry, aggregator, _ = _aggregator(max_label_values=5)
    trace = "0123456789abcdef0123456789abcdef"
    aggregator.accept(events.Step(workload="traced", step=1, duration_s=0.2, compute_s=0.2, trace_id=trace))
    text = Writer(registry).render(openmetrics=True).decode()
    families = list(text_string_to_metric_families(text))
    samples = [s for family in families for s in family.samples]
    assert all(trace not in s.labels.values() for s in samples)
    assert [s.exemplar.labels for s in samples if s.exemplar] == [{"trace_id": trace}]


# --- the limiter --------------------------------------------------------------------------------
NAMES = [str(label) for label in LIMITED]
value_calls = st.tuples(
    st.just("value"), st.sampled_from(NAMES), st.sampled_from(["a", "b", "c", "d", "e", "f"]), st.sampled_from("xyz")
)
releases = st.tuples(st.just("release"), st.sampled_from(["a", "b", "c", "x", "y", "z"]))


@given(max_values=st.integers(1, 4), operations=st.lists(st.one_of(value_calls, releases), max_size=150))
def test_limiter_holds_at_most_n_values_maps_them_stably_and_counts_every_overflow(
    max_values: int, operations: list[tuple[str, ...]]
) -> None:
    overflows: Counter[str] = Counter()
    reported: dict[str, int] = {}
    limiter = LabelLimiter(
        max_values, on_overflow=lambda label: overflows.update([label]), on_held=reported.__setitem__
    )
    model: dict[str, dict[str, set[str]]] = {name: {} for name in NAMES}  # label -> held value -> its workloads
    expected: Counter[str] = Counter()
    for operation in operations:
        if operation[0] == "value":
            _, label, value, workload = operation
            workload = value if label == "workload" else workload  # as the aggregator calls it
            held = model[label]
            got = limiter.value(label, value, workload)
            if value in held or len(held) < max_values:
                assert got == value  # a held value, or room: kept as it is
                held.setdefault(value, set()).add(workload)
            else:
                assert got == OVERFLOW
                expected[label] += 1
        else:
            workload = operation[1]
            freed = limiter.release(workload)
            expected_freed = []
            for label, held in model.items():
                for value in list(held):
                    held[value].discard(workload)
                    if not held[value]:
                        del held[value]
                        expected_freed.append((label, value))
            assert sorted(freed) == sorted(expected_freed)
        for label, held in model.items():
            assert limiter.held(label) == set(held)
            assert len(held) <= max_values
            assert reported.get(label, 0) == len(held)
    assert overflows == expected


def test_limit_copies_only_an_event_that_overflows() -> None:
    limiter = LabelLimiter(1)
    step = events.Step(workload="w1", step=0, duration_s=0.1)
    assert limiter.limit(step) is step
    assert limiter.limit(step) is step
    assert limiter.limit(msgspec.structs.replace(step, workload="w2")).workload == OVERFLOW
    memory = events.DeviceMemory(workload="w1", device="0", accelerator="v5e", used_bytes=1)
    assert limiter.limit(memory) is memory
    other = limiter.limit(events.DeviceMemory(workload="w1", device="1", accelerator="v5e", used_bytes=2))
    assert (other.workload, other.device, other.accelerator, other.used_bytes) == ("w1", OVERFLOW, "v5e", 2)
    # The sidecar's own event about an overflowed workload is not another overflow.
    failure = events.Lifecycle(workload=OVERFLOW, state="failure", reason="vanished")
    assert limiter.limit(failure).workload == OVERFLOW
    assert limiter.held("workload") == {"w1"}


# --- expiry, in process (the clock is an argument) ------------------------------------------------
def _aggregator(
    max_label_values: int = 100, workload_expiry: float = 60.0
) -> tuple[CollectorRegistry, Aggregator, SampleStore]:
    registry = CollectorRegistry()
    store = SampleStore()
    registry.register(store)
    metrics = register(registry)
    return (
        registry,
        Aggregator(metrics, store, max_label_values=max_label_values, workload_expiry=workload_expiry),
        store,
    )


def _scrape(registry: CollectorRegistry) -> Scrape:
    return Scrape(Writer(registry).render(openmetrics=False).decode())


def _series(registry: CollectorRegistry) -> list[tuple[str, dict[str, str], float]]:
    return [(s.name, s.labels, s.value) for s in _scrape(registry).samples]


def _every_kind(workload: str, device: str) -> Iterator[events.AnyEvent]:
    yield events.Lifecycle(workload=workload, state="start")
    yield events.Hardware(workload=workload, accelerator=f"acc-{workload}", devices=1, peak_flops_per_second=1e12)
    yield events.Step(workload=workload, step=0, duration_s=0.1, compute_s=0.1, flops=1e9)
    yield events.Compile(workload=workload, stage="backend", duration_s=1.0)
    yield events.CompileCache(workload=workload, hit=True)
    yield events.Checkpoint(workload=workload, operation="save", duration_s=1.0, ok=True, bytes=10, step=0)
    yield events.DeviceMemory(workload=workload, device=device, accelerator=f"acc-{workload}", used_bytes=5)
    yield events.ProgramMemory(workload=workload, program=f"prog-{workload}", spill_bytes=1)
    yield events.Lifecycle(workload=workload, state="restart", reason=f"why-{workload}")
    yield events.InferenceBatch(workload=workload, batch_size=2, queue_depth=1, request_seconds=[0.01])
    yield events.CompileFailure(workload=workload, stage="backend", reason="unsupported")
    yield events.Recompile(workload=workload, cause="input_types")
    yield events.ModelLoaded(workload=workload, version=f"v-{workload}")


def test_expiry_removes_every_series_state_and_label_value_of_the_workload_only() -> None:
    registry, aggregator, _ = _aggregator(max_label_values=10, workload_expiry=60.0)
    start = time.monotonic()
    for event in _every_kind("gone", device="7"):
        aggregator.accept(event)
    aggregator.process_joined("stays")
    for event in _every_kind("stays", device="0"):
        aggregator.accept(event)
    before = _series(registry)
    assert any(labels.get("workload") == "gone" for _, labels, _ in before)
    assert aggregator.expire(start + 30) == []  # not yet
    assert aggregator.expire(time.monotonic() + 61) == ["gone"]  # "stays" has a process connected
    after = _series(registry)
    assert not any("gone" in value for _, labels, _ in after for value in labels.values())
    assert not any(labels.get("device") == "7" for _, labels, _ in after)  # its reported device memory too
    assert any(labels.get("workload") == "stays" for _, labels, _ in after)
    assert any(labels.get("device") == "0" for _, labels, _ in after)
    # Only the workload's series went: all the others are as they were.
    kept = [s for s in before if s[1].get("workload") != "gone" and s[1].get("device") != "7"]
    changed = {catalog.WORKLOADS_EXPIRED.name, catalog.LABEL_VALUES.name}
    assert [s for s in kept if s[0] not in changed] == [s for s in after if s[0] not in changed]
    values = {labels["label"]: value for name, labels, value in after if name == catalog.LABEL_VALUES.name}
    # reason: "none", why-stays and unsupported; cause: input_types; version: v-stays.
    assert values == {"workload": 1, "device": 1, "accelerator": 1, "program": 1, "reason": 3, "cause": 1, "version": 1}
    assert _scrape(registry).value(catalog.WORKLOADS_EXPIRED.name) == 1
    # Back again: fresh series and a fresh ledger, not the old counts.
    aggregator.accept(events.Step(workload="gone", step=0, duration_s=0.1, compute_s=0.1))
    again = _scrape(registry)
    assert again.value(catalog.STEPS.name, workload="gone") == 1
    assert again.value(catalog.STEP_DURATION.series("count"), workload="gone") == 1
    assert not again.has(catalog.WORKLOAD_RESTARTS.name, workload="gone")


def test_the_expiry_clock_starts_when_the_last_process_leaves() -> None:
    _, aggregator, _ = _aggregator(workload_expiry=60.0)
    aggregator.accept(events.Lifecycle(workload="quiet", state="stop"))
    aggregator.process_joined("quiet")
    assert aggregator.expire(time.monotonic() + 600) == []  # idle for long, but connected
    aggregator.process_left("quiet")
    assert aggregator.expire(time.monotonic() + 30) == []
    assert aggregator.expire(time.monotonic() + 61) == ["quiet"]


def test_expiry_zero_never_expires() -> None:
    _, aggregator, _ = _aggregator(workload_expiry=0)
    aggregator.accept(events.Step(workload="forever", step=0, duration_s=0.1))
    assert aggregator.expire(time.monotonic() + 10 * 365 * 86400) == []


# --- a real sidecar --------------------------------------------------------------------------------
CAP = 50
EVENTS = 1_000_000
DEVICE_MEMORY = (catalog.DEVICE_MEMORY_USED, catalog.DEVICE_MEMORY_LIMIT, catalog.DEVICE_MEMORY_PEAK)


def series_bound(cap: int) -> int:
    """The most tpuscope_ sample lines events can make with ``cap`` values per limited label.

    Per family: the product over its labels of each label's values (a limited one: ``cap`` and
    _overflow; a closed one: its set; reason is both), times the lines per series (a histogram:
    its buckets, +Inf, _sum and _count). Families events fill: the event-updated ones and the
    reported device memory (no collector runs in these tests).
    """

    def values(label: Label) -> int:
        return (cap + 1 if label in LIMITED else 0) + len(CLOSED.get(label, ()))

    total = 0
    for metric in catalog.CATALOG:
        if metric.sampled and metric not in DEVICE_MEMORY:
            continue
        lines = len(metric.buckets) + 3 if metric.kind is catalog.Kind.HISTOGRAM else 1
        total += math.prod(values(label) for label in metric.labels) * lines
    return total


def _million(workload_events: int) -> Iterator[bytes]:
    """One event per workload, each a new workload: mostly steps, 1% each with a new device, program, reason."""
    for i in range(workload_events):
        workload, kind = f"w{i}", i % 100
        event: events.AnyEvent
        if kind == 1:
            event = events.DeviceMemory(workload=workload, device=f"d{i}", accelerator="v5e", used_bytes=i)
        elif kind == 2:
            event = events.ProgramMemory(workload=workload, program=f"p{i}", spill_bytes=i)
        elif kind == 3:
            event = events.Lifecycle(workload=workload, state="restart", reason=f"r{i}")
        else:
            event = events.Step(workload=workload, step=i, duration_s=0.01, compute_s=0.01)
        yield events.encode(event)
    # A clean goodbye, so the sidecar adds no failure of its own: one more workload, one more reason ("none").
    yield events.encode(events.Lifecycle(workload="the-end", state="stop"))


def _rss(url: str) -> float:
    return Scrape.fetch(url).present("process_resident_memory_bytes")


def test_a_million_invented_label_values_keep_metrics_bounded_and_lose_nothing(short_tmp: Path) -> None:
    path = short_tmp / "s.sock"
    with SidecarProcess(path, "127.0.0.1:0", "--max-label-values", str(CAP), "--collectors=none") as sidecar:
        rss_before = _rss(sidecar.url)
        started = time.monotonic()
        # A blocking socket: a full buffer makes the send wait instead of dropping, so the counts are exact.
        with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as s:
            s.connect(str(path))
            for message in _million(EVENTS):
                s.send(message)
        sent = EVENTS + 1
        scrape = scrape_until(
            sidecar.url, lambda s: s.present(catalog.INGEST_EVENTS.name, result="accepted") >= sent, 60
        )
        elapsed = time.monotonic() - started
        # A scrape reads one family after another while the last events land, so the one that saw every event
        # accepted may hold fewer steps (steps come before the ingest counts). Every event is in now: read afresh.
        scrape = Scrape.fetch(sidecar.url)
        rss_after = _rss(sidecar.url)
    series = [s for s in scrape.samples if s.name.startswith(catalog.PREFIX)]
    bound = series_bound(CAP)
    print(
        f"\n{sent} events in {elapsed:.1f} s ({sent / elapsed:,.0f}/s); sidecar RSS {rss_before / 2**20:.1f} MiB "
        f"before, {rss_after / 2**20:.1f} MiB after; {len(series)} tpuscope series, bound {bound}"
    )
    per_kind = sum(1 for i in range(EVENTS) if i % 100 == 1)  # events with a new device (program, reason alike)
    steps = EVENTS - 3 * per_kind
    assert scrape.value(catalog.INGEST_EVENTS.name, result="accepted") == sent
    assert scrape.present(catalog.INGEST_EVENTS.name, result="invalid") == 0
    assert len(series) < bound < EVENTS  # without the cap, the steps family alone would hold 970,000 series
    overflow = catalog.LABEL_OVERFLOW.name
    assert scrape.value(overflow, label="workload") == sent - CAP
    assert scrape.value(overflow, label="device") == per_kind - CAP
    assert scrape.value(overflow, label="program") == per_kind - CAP
    assert scrape.value(overflow, label="reason") == per_kind - CAP + 1  # the stop's "none" came last
    assert scrape.present(overflow, label="accelerator") == 0
    for label, held in {"workload": CAP, "device": CAP, "program": CAP, "reason": CAP, "accelerator": 1}.items():
        assert scrape.value(catalog.LABEL_VALUES.name, label=label) == held, label
    # Nothing lost: every step is counted, under its own workload or under _overflow.
    assert scrape.value(catalog.STEPS.name) == steps
    assert scrape.value(catalog.STEPS.name, workload=OVERFLOW) == steps - sum(
        1 for i in range(CAP) if i % 100 not in (1, 2, 3)
    )
    assert scrape.has(catalog.DEVICE_MEMORY_USED.name, device=OVERFLOW)
    assert scrape.has(catalog.MEMORY_SPILL.name, workload=OVERFLOW, program=OVERFLOW)
    assert scrape.has(catalog.WORKLOAD_RESTARTS.name, workload=OVERFLOW, reason=OVERFLOW)
    # Observed values keep to the tables: a limited label has at most CAP and _overflow (besides the
    # sidecar's own closed values, such as the reasons of rejected events).
    for label in LIMITED:
        seen = {s.labels[label] for s in series if label in s.labels} - set(CLOSED.get(label, ()))
        assert len(seen) <= CAP + 1, label
    for label, allowed in CLOSED.items():
        if label not in LIMITED:
            assert {s.labels[label] for s in series if label in s.labels} <= set(allowed), label


def _workload_series(scrape: Scrape, workload: str) -> list[str]:
    return [s.name for s in scrape.samples if s.labels.get("workload") == workload]


def test_a_workload_gone_for_the_expiry_has_its_series_removed_and_comes_back_fresh(short_tmp: Path) -> None:
    path = short_tmp / "s.sock"
    expired = catalog.WORKLOADS_EXPIRED.name
    expiry = 2.0
    with SidecarProcess(path, "127.0.0.1:0", "--workload-expiry", f"{expiry:g}s", "--collectors=none") as sidecar:
        idle = Monitor("idle", socket=path)  # connected throughout, and silent after its start
        with Monitor("gone", socket=path) as mon:
            with mon.step(0):
                pass
            mon.program_memory("train", spill_bytes=1)
            closing = time.monotonic()  # its last event and its leaving come after this
        scrape = scrape_until(sidecar.url, lambda s: s.value(catalog.STEPS.name, workload="gone") == 1, 5)
        assert _workload_series(scrape, "gone") and scrape.present(expired) == 0
        scrape = scrape_until(sidecar.url, lambda s: not _workload_series(s, "gone"), 10)
        assert time.monotonic() - closing >= expiry, "removed before its expiry"
        assert not _workload_series(scrape, "gone"), scrape.text
        assert scrape.value(expired) == 1
        # Idle for longer than the expiry too, but still connected: kept.
        assert scrape.value(catalog.WORKLOAD_PROCESSES.name, workload="idle") == 1
        assert scrape.has(catalog.STEPS.name, workload="idle")
        assert "workload gone expired" in sidecar.log()
        # Back after expiry: fresh counters.
        with Monitor("gone", socket=path) as mon, mon.step(5):
            pass
        # Its start creates the counter at 0, its step makes it 1 (a scrape may fall between the two); not 2.
        scrape = scrape_until(sidecar.url, lambda s: (s.value(catalog.STEPS.name, workload="gone") or 0) >= 1, 5)
        assert scrape.value(catalog.STEPS.name, workload="gone") == 1
        assert not scrape.has(catalog.MEMORY_SPILL.name, workload="gone")
        idle.close()


def test_workload_expiry_zero_keeps_every_workload(short_tmp: Path) -> None:
    path = short_tmp / "s.sock"
    with SidecarProcess(path, "127.0.0.1:0", "--workload-expiry", "0", "--collectors=none") as sidecar:
        with Monitor("kept", socket=path) as mon, mon.step(0):
            pass
        scrape_until(sidecar.url, lambda s: not s.has(catalog.WORKLOAD_PROCESSES.name, workload="kept"), 5)
        with Monitor("witness", socket=path):  # connected: its wall time shows each expiry check's round
            scrape = sidecar_rounds(sidecar.url, "witness", 3)  # past three expiry checks
    assert scrape.value(catalog.STEPS.name, workload="kept") == 1
    assert scrape.present(catalog.WORKLOADS_EXPIRED.name) == 0
