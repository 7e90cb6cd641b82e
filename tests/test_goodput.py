"""The goodput ledger: where wall time went, with lost work counted once."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tpuscope import events
from tpuscope.goodput import GoodputLedger, PendingSteps

W = "job"


def feed(ledger: GoodputLedger, timeline: list[tuple[float, events.AnyEvent]]) -> dict[str, float]:
    totals: dict[str, float] = {}
    for now, event in timeline:
        for category, seconds in ledger.observe(event, now):
            assert seconds > 0, (category, seconds)
            totals[category] = totals.get(category, 0.0) + seconds
    return totals


def step(n: int, duration: float, io: float = 0.0) -> events.Step:
    return events.Step(workload=W, step=n, duration_s=duration, io_s=io, compute_s=duration - io)


def save(n: int, duration: float, ok: bool = True) -> events.Checkpoint:
    return events.Checkpoint(workload=W, operation="save", duration_s=duration, ok=ok, step=n)


def test_categories_add_up_to_wall_time() -> None:
    """start at 0; 1 s of init; step 0 compiles for 2 s; checkpoint; clean stop at 10.5."""
    timeline: list[tuple[float, events.AnyEvent]] = [
        (0.0, events.Lifecycle(workload=W, state="start")),
        (3.0, events.Compile(workload=W, stage="backend", duration_s=2.0)),
        (4.0, step(0, 3.0, io=0.5)),  # init 1 s, io 0.5, compile 2, productive 0.5
        (5.0, step(1, 1.0)),
        (6.0, step(2, 1.0)),
        (7.0, save(2, 1.0)),
        (8.0, step(3, 1.0)),
        (10.5, step(4, 2.5, io=1.0)),
        (10.5, events.Lifecycle(workload=W, state="stop")),
    ]
    totals = feed(GoodputLedger(), timeline)
    assert totals == pytest.approx(
        {"init": 1.0, "io_wait": 1.5, "compile": 2.0, "checkpoint": 1.0, "productive": 0.5 + 1 + 1 + 1 + 1.5}
    )
    assert sum(totals.values()) == pytest.approx(10.5)


def test_work_after_the_last_checkpoint_is_lost_on_failure_and_not_counted_again() -> None:
    ledger = GoodputLedger()
    first_run = feed(
        ledger,
        [
            (0.0, events.Lifecycle(workload=W, state="start")),
            (1.0, step(0, 1.0)),
            (2.0, step(1, 1.0)),
            (2.5, save(1, 0.5)),
            (3.5, step(2, 1.0)),
            (4.5, step(3, 1.0)),
            (4.5, events.Lifecycle(workload=W, state="failure", reason="crash")),
        ],
    )
    assert first_run["productive"] == pytest.approx(2.0)
    assert first_run["lost"] == pytest.approx(2.0)
    rerun = feed(
        ledger,
        [
            (10.0, events.Lifecycle(workload=W, state="start")),
            (10.2, events.Checkpoint(workload=W, operation="restore", duration_s=0.2, ok=True, step=1)),
            (11.2, step(2, 1.0)),
            (11.2, events.Lifecycle(workload=W, state="stop")),
        ],
    )
    assert "lost" not in rerun
    assert rerun["productive"] == pytest.approx(1.0)


def test_repeated_step_numbers_lose_the_unsaved_steps() -> None:
    """A restart the sidecar was not told about: the step numbers go back."""
    ledger = GoodputLedger()
    totals = feed(ledger, [(float(n), step(n, 1.0)) for n in range(5)] + [(6.0, step(3, 1.0))])
    assert totals["lost"] == pytest.approx(2.0)  # steps 3 and 4 are being redone


def test_failed_checkpoints_make_nothing_durable() -> None:
    ledger = GoodputLedger()
    totals = feed(ledger, [(1.0, step(0, 1.0)), (2.0, save(0, 0.5, ok=False))])
    assert "productive" not in totals and totals["checkpoint"] == 0.5
    assert feed(ledger, [(3.0, events.Lifecycle(workload=W, state="failure"))]) == {"lost": 1.0}


def test_compiles_during_a_checkpoint_are_not_counted_twice() -> None:
    ledger = GoodputLedger()
    totals = feed(
        ledger,
        [(1.0, step(0, 1.0)), (1.5, events.Compile(workload=W, stage="backend", duration_s=0.4)), (2.0, save(0, 1.0))],
    )
    assert totals["compile"] == pytest.approx(0.4)
    assert totals["checkpoint"] == pytest.approx(0.6)


def test_a_compile_before_the_first_step_is_start_up_not_the_first_steps_compute() -> None:
    """start at 0; the job compiles its step ahead of the loop for 5 s (flops_of, AOT); step 0 takes 1 s and
    compiles nothing (compile_s=0): its second is productive, and init is the 0.5 s before it that nothing
    else claims. (Taking every compile since the start from step 0 booked it 0 s productive, 1.5 s init.)"""
    compiled = events.Compile(workload=W, stage="backend", duration_s=5.0)
    first = events.Step(workload=W, step=0, duration_s=1.0, compute_s=1.0, compile_s=0.0)
    timeline: list[tuple[float, events.AnyEvent]] = [
        (0.0, events.Lifecycle(workload=W, state="start")),
        (5.0, compiled),
        (6.5, first),
        (6.5, events.Lifecycle(workload=W, state="stop")),
    ]
    assert feed(GoodputLedger(), timeline) == pytest.approx({"compile": 5.0, "init": 0.5, "productive": 1.0})
    # A compile inside the step (its first call) is the step's: taken from it, and not from init.
    inside = events.Step(workload=W, step=0, duration_s=6.0, compute_s=6.0, compile_s=5.0)
    timeline = [(0.0, timeline[0][1]), (6.0, compiled), (6.5, inside), (6.5, timeline[3][1])]
    assert feed(GoodputLedger(), timeline) == pytest.approx({"compile": 5.0, "init": 0.5, "productive": 1.0})


def test_a_restore_after_compiles_is_booked_as_checkpoint_time() -> None:
    """A restore of 2 s that follows 3 s of compiles and compiles nothing itself is 2 s of checkpoint time (it
    was booked 0 s: the compiles before it were taken from it)."""
    timeline: list[tuple[float, events.AnyEvent]] = [
        (0.0, events.Lifecycle(workload=W, state="start")),
        (3.0, events.Compile(workload=W, stage="backend", duration_s=3.0)),
        (5.0, events.Checkpoint(workload=W, operation="restore", duration_s=2.0, ok=True, step=7, compile_s=0.0)),
    ]
    assert feed(GoodputLedger(), timeline) == pytest.approx({"compile": 3.0, "checkpoint": 2.0})


@given(st.lists(st.tuples(st.sampled_from(["step", "save", "back", "overflow"]), st.integers(0, 50)), max_size=300))
def test_pending_steps_agree_with_a_plain_dict(operations: list[tuple[str, int]]) -> None:
    """The compact pending store gives the seconds a dict in step order would, through every operation."""
    pending, reference, step = PendingSteps(), {}, 0
    for operation, n in operations:
        if operation == "step":
            step += 1
            pending.append(step, step / 10)
            reference[step] = step / 10
        elif operation == "save":  # everything up to a recent step became durable
            upto = step - n % 5
            expected = sum(v for s, v in reference.items() if s <= upto)
            reference = {s: v for s, v in reference.items() if s > upto}
            assert pending.pop_oldest(up_to_step=upto) == pytest.approx(expected)
        elif operation == "back":  # the job went back n steps
            step = max(0, step - n)
            expected = sum(v for s, v in reference.items() if s > step)
            reference = {s: v for s, v in reference.items() if s <= step}
            assert pending.pop_after(step) == pytest.approx(expected)
        elif reference:  # the oldest, when too many are pending
            oldest = min(reference)
            assert pending.pop_oldest(count=1) == pytest.approx(reference.pop(oldest))
        assert len(pending) == len(reference)
    assert pending.pop_all() == pytest.approx(sum(reference.values()))


def test_pending_steps_drop_their_dead_front_and_keep_their_order() -> None:
    pending = PendingSteps()
    for step in range(10_000):
        pending.append(step, 1.0)
    assert pending.pop_oldest(up_to_step=7_999) == 8_000  # past 4096 and half: the front is dropped
    assert len(pending) == 2_000
    assert pending.pop_after(8_999) == 1_000
    pending.append(9_000, 0.5)
    assert pending.pop_all() == 1_000.5 and len(pending) == 0
