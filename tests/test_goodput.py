"""The goodput ledger: where wall time went, with lost work counted once."""

from __future__ import annotations

from collections.abc import Hashable

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tpuscope import events, goodput
from tpuscope.goodput import PendingSteps, WorkloadGoodput

W = "job"


def feed(
    book: WorkloadGoodput, timeline: list[tuple[float, events.AnyEvent]], source: Hashable = None
) -> dict[str, float]:
    totals: dict[str, float] = {}
    for now, event in timeline:
        for category, seconds in book.observe(event, now, source):
            assert seconds > 0, (category, seconds)
            totals[category] = totals.get(category, 0.0) + seconds
    return totals


def marked(before: float, inside: float = 0.0, name: str = "eval") -> tuple[events.Badput, ...]:
    """Custom badput as a step carries it: ``before`` seconds marked before the step, ``inside`` inside it."""
    return (events.Badput(name, before), events.Badput(name, inside, in_step=True))


def step(n: int, duration: float, io: float = 0.0) -> events.Step:
    return events.Step(workload=W, step=n, duration_s=duration, io_s=io, compute_s=duration - io)


def save(n: int, duration: float, ok: bool = True, blocking: float | None = None) -> events.Checkpoint:
    return events.Checkpoint(workload=W, operation="save", duration_s=duration, ok=ok, step=n, blocking_s=blocking)


START = events.Lifecycle(workload=W, state="start")
STOP = events.Lifecycle(workload=W, state="stop")
FAILURE = events.Lifecycle(workload=W, state="failure", reason="crash")


def test_categories_add_up_to_wall_time() -> None:
    """start at 0; 1 s of init; step 0 compiles for 2 s; checkpoint; clean stop at 10.5."""
    timeline: list[tuple[float, events.AnyEvent]] = [
        (0.0, START),
        (3.0, events.Compile(workload=W, stage="backend", duration_s=2.0)),
        (4.0, step(0, 3.0, io=0.5)),  # init 1 s, io 0.5, compile 2, productive 0.5
        (5.0, step(1, 1.0)),
        (6.0, step(2, 1.0)),
        (7.0, save(2, 1.0)),
        (8.0, step(3, 1.0)),
        (10.5, step(4, 2.5, io=1.0)),
        (11.0, STOP),  # half a second after the last step that no event claims
    ]
    book = WorkloadGoodput()
    totals = feed(book, timeline)
    assert totals == pytest.approx(
        {"init": 1.0, "io_wait": 1.5, "compile": 2.0, "checkpoint": 1.0, "productive": 5.0, "other": 0.5}
    )
    assert sum(totals.values()) == pytest.approx(11.0) == pytest.approx(book.wall)


def test_work_after_the_last_checkpoint_is_lost_and_the_gap_until_the_restart_is_downtime() -> None:
    """The reference's "wasted progress" and "infrastructure recovery": the crashed process's unsaved steps, then
    the 5.5 s nobody ran until the next start."""
    book = WorkloadGoodput()
    first_run = feed(
        book,
        [
            (0.0, START),
            (1.0, step(0, 1.0)),
            (2.0, step(1, 1.0)),
            (2.5, save(1, 0.5)),
            (3.5, step(2, 1.0)),
            (4.5, step(3, 1.0)),
            (4.5, FAILURE),
        ],
    )
    assert first_run == pytest.approx({"productive": 2.0, "checkpoint": 0.5, "lost": 2.0})
    assert book.down_since == 4.5
    assert dict(book.tick(7.0)) == pytest.approx({"downtime": 2.5})  # it grows while the workload is down
    rerun = feed(
        book,
        [
            (10.0, START),
            (10.2, events.Checkpoint(workload=W, operation="restore", duration_s=0.2, ok=True, step=1)),
            (11.2, step(2, 1.0)),
            (11.2, STOP),
        ],
    )
    assert rerun == pytest.approx({"downtime": 3.0, "checkpoint": 0.2, "productive": 1.0})
    assert book.down_since is None
    assert sum(first_run.values()) + 2.5 + sum(rerun.values()) == pytest.approx(11.2) == pytest.approx(book.wall)


def test_a_process_that_vanishes_from_a_recording_went_down_after_its_last_event() -> None:
    """One stream (a recording) has no connection to close: a start while a process is live means that process
    went without a word, at its last event."""
    book = WorkloadGoodput()
    totals = feed(book, [(0.0, START), (1.0, step(0, 1.0)), (2.0, step(1, 1.0)), (9.0, START), (10.0, step(2, 1.0))])
    assert totals == pytest.approx({"lost": 2.0, "downtime": 7.0})
    assert dict(book.left(None, 10.0, clean=False)) == pytest.approx({"lost": 1.0})
    assert book.down_since == 10.0


@pytest.mark.parametrize(
    "numbers",
    [[0, 0, 1, 1, 2, 2, 3, 3], [0, 1, 0, 2, 1, 3, 2, 3], [0, 1, 2, 3, 0, 1, 2, 3]],
    ids=["two threads in step", "two threads one behind", "numbered per epoch"],
)
def test_step_numbers_that_go_back_within_one_process_lose_nothing(numbers: list[int]) -> None:
    """Two threads stepping one Monitor, or a job numbering its steps per epoch: one process, no restart. (The old
    ledger read a number going back as a restart and booked the steps after it as lost.)"""
    timeline: list[tuple[float, events.AnyEvent]] = [(0.0, START)]
    timeline += [(1.0 + i, step(n, 1.0)) for i, n in enumerate(numbers)]
    timeline += [(9.0, save(3, 0.0)), (9.5, step(4, 0.5)), (10.0, STOP)]
    totals = feed(WorkloadGoodput(), timeline)
    assert totals == pytest.approx({"productive": 8.5, "other": 1.5})  # 8 to 9, 9.5 to 10


def test_steps_of_two_threads_that_overlap_share_their_process_wall_time() -> None:
    """Two threads step one Monitor at once, a 1 s step each every second: 10 s of wall time hold 20 steps of
    1 s. The process's steps are booked up to the time it has been alive, not twice over."""
    timeline: list[tuple[float, events.AnyEvent]] = [(0.0, START)]
    for n in range(10):
        timeline += [(n + 1.0, step(n, 1.0, io=0.25)), (n + 1.0, step(n, 1.0, io=0.25))]
    book = WorkloadGoodput()
    totals = feed(book, [*timeline, (10.0, STOP)])
    assert "lost" not in totals
    assert totals == pytest.approx({"productive": 7.5, "io_wait": 2.5})
    assert sum(totals.values()) == pytest.approx(book.wall) == pytest.approx(10.0)


def test_two_processes_of_one_workload_each_book_their_own_steps() -> None:
    """One process per GPU: rank B's step n after rank A's is no restart, and A's stop settles only A's steps. (The
    old ledger booked 2 clean ranks of 20 steps as 1.05 s productive, 0.95 s lost.)"""
    book = WorkloadGoodput()
    a, b = object(), object()
    totals: dict[str, float] = {}
    order = [(0.0, START, a), (0.0, START, b)]
    for n in range(20):
        order += [(0.1 * (n + 1), step(n, 0.1), a), (0.1 * (n + 1), step(n, 0.1), b)]
    order += [(2.0, STOP, a), (3.0, step(20, 1.0), b), (3.0, STOP, b)]
    for now, event, source in order:
        for category, seconds in book.observe(event, now, source):
            totals[category] = totals.get(category, 0.0) + seconds
    assert totals == pytest.approx({"productive": 5.0})
    assert book.wall == pytest.approx(5.0)  # 2 s of A and 3 s of B


def test_an_async_save_books_only_what_it_blocked_and_makes_only_its_steps_durable() -> None:
    """An async save of step 1 holds the loop 0.2 s, and is durable 3 s later while steps 2 to 4 ran: 0.2 s of
    checkpoint time (not 3 s, which overlapped the steps: a 3.0 s job booked 4.5 s), steps 0 and 1 productive."""
    timeline: list[tuple[float, events.AnyEvent]] = [
        (0.0, START),
        (1.0, step(0, 1.0)),
        (2.0, step(1, 1.0)),
        (3.2, step(2, 1.0)),  # the save's 0.2 s went before this step
        (4.2, step(3, 1.0)),
        (5.2, save(1, 3.0, blocking=0.2)),
        (5.2, step(4, 1.0)),
    ]
    book = WorkloadGoodput()
    totals = feed(book, timeline)
    assert totals == pytest.approx({"checkpoint": 0.2, "productive": 2.0})
    assert dict(book.left(None, 5.2, clean=False)) == pytest.approx({"lost": 3.0})
    assert book.wall == pytest.approx(5.2)


@given(
    st.lists(
        st.tuples(
            st.sampled_from(
                [
                    *("start", "step", "compile", "save", "async", "restore", "stop", "fail", "vanish", "tick"),
                    *("marked", "stop-marked"),
                ]
            ),
            st.sampled_from([0, 1]),
            st.floats(0.0, 2.0),
        ),
        max_size=60,
    )
)
def test_the_categories_never_add_up_to_more_than_wall_time(operations: list[tuple[str, int, float]]) -> None:
    """Any sequence of events of two processes: at every point the categories booked are at most the wall time;
    once every process has ended and every gap is booked, exactly it."""
    book, now, booked = WorkloadGoodput(), 100.0, 0.0
    for n, (operation, source, seconds) in enumerate(operations):
        now += seconds
        event: events.AnyEvent | None = {
            "start": START,
            "stop": STOP,
            "fail": FAILURE,
            "step": step(n, seconds, io=seconds / 4),
            "compile": events.Compile(workload=W, stage="backend", duration_s=seconds / 2),
            "save": save(n, seconds / 2),
            "async": save(n, 4 * seconds, blocking=seconds / 3),
            "restore": events.Checkpoint(workload=W, operation="restore", duration_s=seconds, ok=True, step=n),
            "marked": msgspec.structs.replace(step(n, seconds), badput=marked(seconds, seconds / 3)),
            "stop-marked": msgspec.structs.replace(STOP, badput=marked(seconds, 0)),
        }.get(operation)
        if event is not None:
            increments = book.observe(event, now, source)
        elif operation == "vanish":
            increments = book.left(source, now, clean=False)
        else:
            increments = book.tick(now)
        assert all(seconds >= 0 for _, seconds in increments)
        booked += sum(seconds for _, seconds in increments)
        assert booked <= book.wall + 1e-6
    for source in list(book.processes):
        booked += sum(seconds for _, seconds in book.observe(STOP, now, source))
    booked += sum(seconds for _, seconds in book.tick(now))
    assert booked == pytest.approx(book.wall, abs=1e-6)


def test_a_compile_before_the_first_step_is_start_up_not_the_first_steps_compute() -> None:
    """start at 0; the job compiles its step ahead of the loop for 5 s (flops_of, AOT); step 0 takes 1 s and
    compiles nothing (compile_s=0): its second is productive, and init is the 0.5 s before it that nothing
    else claims. (Taking every compile since the start from step 0 booked it 0 s productive, 1.5 s init.)"""
    compiled = events.Compile(workload=W, stage="backend", duration_s=5.0)
    first = events.Step(workload=W, step=0, duration_s=1.0, compute_s=1.0, compile_s=0.0)
    timeline: list[tuple[float, events.AnyEvent]] = [(0.0, START), (5.0, compiled), (6.5, first), (6.5, STOP)]
    assert feed(WorkloadGoodput(), timeline) == pytest.approx({"compile": 5.0, "init": 0.5, "productive": 1.0})
    # A compile inside the step (its first call) is the step's: taken from it, and not from init.
    inside = events.Step(workload=W, step=0, duration_s=6.0, compute_s=6.0, compile_s=5.0)
    timeline = [(0.0, START), (6.0, compiled), (6.5, inside), (6.5, STOP)]
    assert feed(WorkloadGoodput(), timeline) == pytest.approx({"compile": 5.0, "init": 0.5, "productive": 1.0})


def test_a_restore_after_compiles_is_booked_as_checkpoint_time() -> None:
    """A restore of 2 s that follows 3 s of compiles and compiles nothing itself is 2 s of checkpoint time (it
    was booked 0 s: the compiles before it were taken from it)."""
    timeline: list[tuple[float, events.AnyEvent]] = [
        (0.0, START),
        (3.0, events.Compile(workload=W, stage="backend", duration_s=3.0)),
        (5.0, events.Checkpoint(workload=W, operation="restore", duration_s=2.0, ok=True, step=7, compile_s=0.0)),
    ]
    assert feed(WorkloadGoodput(), timeline) == pytest.approx({"compile": 3.0, "checkpoint": 2.0})


def test_failed_checkpoints_make_nothing_durable() -> None:
    book = WorkloadGoodput()
    totals = feed(book, [(0.0, START), (1.0, step(0, 1.0)), (2.0, save(0, 0.5, ok=False))])
    assert "productive" not in totals and totals["checkpoint"] == 0.5
    assert feed(book, [(3.0, FAILURE)]) == pytest.approx({"lost": 1.0, "other": 1.5})


def test_compiles_during_a_checkpoint_are_not_counted_twice() -> None:
    timeline: list[tuple[float, events.AnyEvent]] = [
        (1.0, step(0, 1.0)),
        (1.5, events.Compile(workload=W, stage="backend", duration_s=0.4)),
        (2.0, save(0, 1.0)),
    ]
    totals = feed(WorkloadGoodput(), timeline)
    assert totals["compile"] == pytest.approx(0.4)
    assert totals["checkpoint"] == pytest.approx(0.6)


@given(st.lists(st.tuples(st.sampled_from(["step", "save", "overflow"]), st.integers(0, 50)), max_size=300))
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
    assert pending.pop_oldest(up_to_step=8_999) == 1_000
    pending.append(10_000, 0.5)
    assert pending.pop_all() == 1_000.5 and len(pending) == 0


def restore(n: int) -> events.Checkpoint:
    return events.Checkpoint(workload=W, operation="restore", duration_s=0.1, ok=True, step=n)


def test_a_rollback_within_the_job_throws_away_its_steps_and_the_productive_time_already_durable() -> None:
    """Saves at steps 3 and 5 made steps 0-5 durable; the loss went NaN at step 4, the job noticed at step 7 and
    restored step 3: steps 4 to 7 are thrown away, 2 s of them booked productive (4 and 5), 2 s still pending
    (6 and 7, lost as any restore loses them)."""
    book = WorkloadGoodput()
    timeline: list[tuple[float, events.AnyEvent]] = [(0.0, START)]
    for n in range(8):
        timeline.append((n + 1.0, step(n, 1.0)))
        if n in (3, 5):
            timeline.append((n + 1.0, save(n, 0.0, blocking=0.0)))
    totals = feed(book, [*timeline, (9.0, restore(3))])
    assert totals == pytest.approx({"productive": 6.0, "lost": 2.0, "checkpoint": 0.1})
    assert (book.rollbacks.steps, book.rollbacks.seconds) == (4, pytest.approx(2.0))
    # Back at step 4: the steps after the restore are new work, and a second restore of 3 throws away only them.
    feed(book, [(10.0, step(4, 1.0)), (11.0, save(4, 0.0, blocking=0.0)), (12.0, restore(3))])
    assert (book.rollbacks.steps, book.rollbacks.seconds) == (5, pytest.approx(3.0))


def test_a_restart_that_restores_an_earlier_checkpoint_rolls_back_from_the_last_run_and_a_fresh_run_does_not() -> None:
    book = WorkloadGoodput()
    run = [(float(n + 1), step(n, 1.0)) for n in range(10)]
    saves = [(3.0, save(2, 0.0, blocking=0.0)), (6.0, save(5, 0.0, blocking=0.0))]
    feed(book, [(0.0, START), *run[:3], saves[0], *run[3:6], saves[1], *run[6:], (10.0, FAILURE)])
    # The rerun restores step 2, not its last save (5): 7 steps again (3 to 9), 3 s of them durable (3 to 5).
    feed(book, [(20.0, START), (20.1, restore(2)), (21.1, step(3, 1.0))])
    assert (book.rollbacks.steps, book.rollbacks.seconds) == (7, pytest.approx(3.0))
    # A run that starts over from step 0 without a restore, then restores its own step 1: its own steps only.
    fresh = WorkloadGoodput()
    feed(fresh, [(0.0, START), *[(float(n + 1), step(n, 1.0)) for n in range(10)], (10.0, STOP)])
    feed(fresh, [(20.0, START), (21.0, step(0, 1.0)), (22.0, step(1, 1.0)), (23.0, step(2, 1.0)), (23.1, restore(1))])
    assert fresh.rollbacks.steps == 1


# --- custom badput (Monitor.badput, issue 57) -----------------------------------------------------------------------
def test_custom_badput_between_steps_is_its_own_category_and_no_longer_other() -> None:
    """start at 0; step 0 from 1 to 2; an eval of 3 s, then step 1 from 5.5 to 6.5 carries it; stop at 7. Without
    the mark the 3.5 s between the steps and the 0.5 s after them were all other."""
    eval_step = msgspec.structs.replace(step(1, 1.0), badput=marked(3.0))
    timeline: list[tuple[float, events.AnyEvent]] = [(0.0, START), (2.0, step(0, 1.0)), (6.5, eval_step), (7.0, STOP)]
    book = WorkloadGoodput()
    totals = feed(book, timeline)
    assert totals == pytest.approx({"init": 1.0, "productive": 2.0, "eval": 3.0, "other": 1.0})
    assert sum(totals.values()) == pytest.approx(7.0) == pytest.approx(book.wall)


def test_custom_badput_inside_a_step_comes_out_of_its_productive_time() -> None:
    """As the reference books a custom event inside a step interval: a step of 2 s holding a 0.5 s SDC check is
    1.5 s productive, whatever the phase the check ran in."""
    checked = msgspec.structs.replace(step(0, 2.0), badput=(events.Badput("sdc_check", 0.5, in_step=True),))
    timeline: list[tuple[float, events.AnyEvent]] = [(0.0, START), (3.0, checked), (3.0, STOP)]
    assert feed(WorkloadGoodput(), timeline) == pytest.approx({"init": 1.0, "productive": 1.5, "sdc_check": 0.5})
    # More than the step's compute (a clock, a job that lied): the step's productive time, no more.
    lying = msgspec.structs.replace(step(0, 2.0, io=1.5), badput=(events.Badput("sdc_check", 9.0, in_step=True),))
    totals = feed(WorkloadGoodput(), [(0.0, START), (2.0, lying), (2.0, STOP)])
    assert totals == pytest.approx({"io_wait": 1.5, "sdc_check": 0.5})


def test_custom_badput_before_the_first_step_is_not_also_init() -> None:
    """start at 0; a 2 s compile, a 1.5 s eval of the initial weights, step 0 from 4 to 5: init is the 0.5 s left."""
    first = msgspec.structs.replace(step(0, 1.0), compile_s=0.0, badput=marked(1.5))  # compiled before it
    compiled = events.Compile(workload=W, stage="backend", duration_s=2.0)
    timeline: list[tuple[float, events.AnyEvent]] = [(0.0, START), (2.0, compiled), (5.0, first), (5.0, STOP)]
    totals = feed(WorkloadGoodput(), timeline)
    assert totals == pytest.approx({"compile": 2.0, "eval": 1.5, "init": 0.5, "productive": 1.0})
    # Marked time the start leaves no room for (a clock): what there was, and no init.
    too_long = msgspec.structs.replace(first, badput=marked(9.0))
    totals = feed(WorkloadGoodput(), [(0.0, START), (2.0, compiled), (5.0, too_long), (5.0, STOP)])
    assert totals == pytest.approx({"compile": 2.0, "eval": 2.0, "productive": 1.0})


def test_custom_badput_after_the_last_step_rides_on_the_stop_or_the_failure() -> None:
    after = msgspec.structs.replace(STOP, badput=marked(2.0))
    timeline: list[tuple[float, events.AnyEvent]] = [(0.0, START), (1.0, step(0, 1.0)), (4.0, after)]
    assert feed(WorkloadGoodput(), timeline) == pytest.approx({"productive": 1.0, "eval": 2.0, "other": 1.0})
    failed = msgspec.structs.replace(FAILURE, badput=marked(2.0))
    timeline = [(0.0, START), (1.0, step(0, 1.0)), (4.0, failed)]
    assert feed(WorkloadGoodput(), timeline) == pytest.approx({"lost": 1.0, "eval": 2.0, "other": 1.0})


def test_a_workload_keeps_so_many_custom_badput_names_and_folds_the_rest() -> None:
    """Two processes of one workload name 10 categories between them: the first MAX_CUSTOM_BADPUT named keep their
    own, the rest are custom; a name a built-in category holds (a job that did not check) is custom too."""
    names = [f"check_{i}" for i in range(10)]
    book, now, totals = WorkloadGoodput(), 0.0, {}
    for source in ("a", "b"):
        totals |= feed(book, [(now, START)], source)
    for n, name in enumerate([*names, "productive", "straggler", names[0]]):
        now += 2.0
        marking = msgspec.structs.replace(step(n, 1.0), badput=marked(1.0, name=name))
        for category, seconds in feed(book, [(now, marking)], source=("a", "b")[n % 2]).items():
            totals[category] = totals.get(category, 0.0) + seconds
    kept = names[: goodput.MAX_CUSTOM_BADPUT]
    assert list(book.badput_names.kept) == kept
    assert {c: s for c, s in totals.items() if c in kept} == {name: pytest.approx(1.0) for name in kept} | {
        names[0]: pytest.approx(2.0)
    }
    assert totals[goodput.CUSTOM_BADPUT] == pytest.approx(10 - goodput.MAX_CUSTOM_BADPUT + 2)
    assert "productive" not in totals or totals["productive"] == 0  # nothing durable yet: no save, no stop


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("eval", None),
        ("sdc_check2", None),
        ("Eval", "lower-case word"),
        ("eval-loop", "lower-case word"),
        ("e" * 33, "lower-case word"),
        ("productive", "built-in category"),
        ("other", "built-in category"),
        ("straggler", "built-in category"),
        ("custom", "past the bound"),
    ],
)
def test_a_custom_badput_name_is_a_lower_case_word_no_category_holds(name: str, why: str | None) -> None:
    error = goodput.badput_name_error(name)
    assert (error is None) if why is None else (why in str(error)), error


def test_every_category_is_booked_promptly_or_in_lumps_and_custom_ones_promptly() -> None:
    """The goodput SLO's numerator is every category not booked in lumps: the prompt ones, straggler, and custom."""
    assert set(goodput.PROMPT_BADPUT) | set(goodput.BOOKED_IN_LUMPS) == set(goodput.CATEGORIES)
    assert not set(goodput.PROMPT_BADPUT) & set(goodput.BOOKED_IN_LUMPS)
    assert goodput.STRAGGLER not in goodput.BOOKED_IN_LUMPS and goodput.CUSTOM_BADPUT not in goodput.BOOKED_IN_LUMPS
