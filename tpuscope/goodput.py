"""Goodput accounting: where a workload's wall time went, from its events.

The denominator is wall time, all of it: each process of the workload from its start to its end, and each gap
from a process's failure (or disappearance) to the next start of the workload. Every second of it lands in one
category once settled, so the categories add up to the wall time and goodput is ``productive / wall``, as in the
reference definition (``ml-goodput-measurement``; docs/goodput.md compares the two category by category).

- :class:`GoodputLedger` books one process: the sidecar keeps one per connection, so two processes of one
  workload (one per GPU) or two threads of one Monitor never read as each other's restart.
- :class:`WorkloadGoodput` books a workload: its processes, and the downtime between them. The sidecar keeps
  one per workload (it outlives the job's restarts, so it sees the gap and the work a failure throws away);
  ``tpuscope workload`` and ``tpuscope report`` keep one for a recording.

Step time counts as ``productive`` only once it is durable: when a checkpoint covering the step is saved, or the
process stops cleanly. Until then it is pending, and it becomes ``lost`` if the process fails, vanishes or
restores a checkpoint. Counters never go down, so this is the only way to report lost work without counting it twice.

A restore below the highest step reached (a rollback after divergence, a resume after a failure) throws away the
steps in between: :class:`Rollbacks` counts them and their durable seconds, which the rules move to lost.

Custom badput (``with mon.badput("eval"):``) is time the job names itself, each name a category of its own
booked when the event carrying it arrives (:class:`BadputNames` bounds the names). Time marked before a step is
taken from the time before it (``init`` before the first, ``other`` after); time marked inside a step from its
productive time, as the reference does.
"""

from __future__ import annotations

import re
from array import array
from collections.abc import Hashable, Iterable
from dataclasses import dataclass

from tpuscope import events

CATEGORIES = ("productive", "compile", "io_wait", "checkpoint", "init", "lost", "other", "downtime")
# Booked when they happen, so a rate over a short window sees them: the numerator of the goodput SLO.
PROMPT_BADPUT = ("compile", "io_wait", "checkpoint", "init", "lost", "downtime")
# The category the recording rules book per workload, not the sidecar, which sees one worker only: its workers'
# wait for a straggler beyond what they wait for each other, carved out of productive (docs/goodput.md).
STRAGGLER = "straggler"
# Booked in lumps (productive when durable, other when a process ends), which a window without a save or an end
# would read as missing: out of the goodput SLO's numerator. Every other category, a custom one included, is in it.
BOOKED_IN_LUMPS = ("productive", "other")

# Custom badput (Monitor.badput): the names a workload keeps as categories of their own, and the one category every
# later name folds into, so that a job naming a category per eval run cannot grow /metrics without bound.
MAX_CUSTOM_BADPUT = 8
CUSTOM_BADPUT = "custom"
_BADPUT_NAME = re.compile(events.BADPUT_NAME_PATTERN)

Increments = list[tuple[str, float]]


def badput_name_error(name: object) -> str | None:
    """Why ``name`` cannot name a custom badput category; None when it can."""
    if not isinstance(name, str) or not _BADPUT_NAME.match(name):
        return f"{name!r} is not a lower-case word of a letter then up to 31 letters, digits or _"
    if name in CATEGORIES or name in (STRAGGLER, CUSTOM_BADPUT):
        taken = "the category past the bound" if name == CUSTOM_BADPUT else "a built-in category"
        return f"{name!r} is {taken}"
    return None


class BadputNames:
    """A workload's custom badput categories: the first :data:`MAX_CUSTOM_BADPUT` names marked, each its own; a later
    name, or one no custom category may take (a built-in's, unchecked by the job), books as :data:`CUSTOM_BADPUT`."""

    def __init__(self) -> None:
        self.kept: dict[str, None] = {}  # in the order first marked

    def category(self, name: str) -> str:
        if name in self.kept:
            return name
        if len(self.kept) >= MAX_CUSTOM_BADPUT or badput_name_error(name) is not None:
            return CUSTOM_BADPUT
        self.kept[name] = None
        return name


def _fit(increments: Increments, room: float) -> Increments:
    """``increments`` scaled down to add up to ``room`` at most: nothing is booked beyond the time there was."""
    total = sum(seconds for _, seconds in increments)
    if total <= room or not total:
        return increments
    fits = max(0.0, room) / total
    return [(category, seconds * fits) for category, seconds in increments if seconds * fits > 0]


class PendingSteps:
    """Steps not yet durable and their productive seconds, in the order they ended: two flat arrays, 16 bytes a
    step (far less than a dict of floats, for a job that checkpoints rarely), and the index of the oldest."""

    def __init__(self) -> None:
        self._steps = array("q")
        self._seconds = array("d")
        self._head = 0
        self.seconds = 0.0  # of all the pending steps

    def __len__(self) -> int:
        return len(self._steps) - self._head

    def append(self, step: int, seconds: float) -> None:
        self._steps.append(step)
        self._seconds.append(seconds)
        self.seconds += seconds

    def pop_oldest(self, up_to_step: float = float("inf"), count: int | None = None) -> float:
        """Remove the oldest steps up to ``up_to_step`` (or ``count`` of them); their seconds."""
        end = self._head
        limit = len(self._steps) if count is None else min(len(self._steps), self._head + count)
        while end < limit and self._steps[end] <= up_to_step:
            end += 1
        total = sum(self._seconds[self._head : end])
        self._head = end
        self.seconds = self.seconds - total if len(self) else 0.0  # no rounding left over once empty
        if self._head > 4096 and self._head * 2 > len(self._steps):  # drop the dead front now and then
            del self._steps[: self._head]
            del self._seconds[: self._head]
            self._head = 0
        return total

    def pop_all(self) -> float:
        return self.pop_oldest()


class GoodputLedger:
    """One process, from its start (or its first event, when its start was not seen) to its end."""

    # A job that never checkpoints would keep every step pending: past this, the oldest count as productive (at risk).
    MAX_PENDING_STEPS = 100_000

    def __init__(self, started_at: float, saw_start: bool = True, names: BadputNames | None = None) -> None:
        self.started_at = started_at  # Unix time
        self.last_at = started_at  # of its latest event
        self.pending = PendingSteps()
        self.booked = 0.0  # every second booked so far, in any category
        self.compile_since_step = 0.0
        self.highest_step = -1  # the highest step number it finished
        self._before_first_step = saw_start  # init is booked at the first step, when the start was seen
        self._accounted_since_start = 0.0  # compile and checkpoint seconds between the start and the first step
        self.names = BadputNames() if names is None else names  # its workload's, shared by its processes

    def observe(self, event: events.AnyEvent, now: float) -> Increments:
        """The seconds per category that ``event``, sent at ``now`` (Unix time), adds."""
        # Called for every step: comparisons rather than max() and min(), type() rather than isinstance() (final).
        if now > self.last_at:
            self.last_at = now
        if type(event) is events.Step:
            # A step began no earlier than its process: one that says otherwise (clocks) moves the start.
            if now - event.duration_s < self.started_at:
                self.started_at = now - event.duration_s
            return self._step(event, now)  # books as it goes: its room depends on what is booked
        if isinstance(event, events.Compile):
            self.compile_since_step += event.duration_s
            self._accounted_since_start += event.duration_s
            return self._book([("compile", event.duration_s)])
        if isinstance(event, events.Checkpoint):
            return self._book(self._checkpoint(event))
        return []

    def end(self, now: float, clean: bool, badput: Iterable[events.Badput] = ()) -> Increments:
        """The process ended at ``now``: cleanly (its pending steps are its result) or not (they are lost); the
        custom badput its end carries (marked after its last step) is booked, and time no event claimed is ``other``."""
        self.last_at = max(now, self.last_at)
        room = self.last_at - self.started_at - self.booked - self.pending.seconds
        out = self._book(_fit(self._badput(badput), room))
        pending = self.pending.pop_all()
        out += self._book([("productive" if clean else "lost", pending)] if pending else [])
        other = self.last_at - self.started_at - self.booked
        if other > 1e-9:
            out += self._book([("other", other)])
        return out

    def _book(self, out: Increments) -> Increments:
        for _, seconds in out:
            self.booked += seconds
        return out

    def _badput(self, badput: Iterable[events.Badput]) -> Increments:
        return [(self.names.category(b.name), b.seconds) for b in badput if b.seconds > 0]

    def _step(self, e: events.Step, now: float) -> Increments:
        out: Increments = []
        io = e.io_s
        compute_time = e.duration_s - io if e.duration_s > io else 0.0
        compile_in_step = min(self._compiled_in(e.compile_s), compute_time)
        inside: Increments = []
        if e.badput:  # custom badput marked since the last step: before this one (its time up to here), or inside it
            inside = self._badput(b for b in e.badput if b.in_step)
            # The time up to the step's start, less what is booked and pending of it (the step's compiles ran after).
            room = now - e.duration_s - self.started_at - (self.booked - compile_in_step) - self.pending.seconds
            before = self._book(_fit(self._badput(b for b in e.badput if not b.in_step), room))
            self._accounted_since_start += sum(seconds for _, seconds in before)  # not init, before the first step
            out += before
        if self._before_first_step:
            accounted_before_step = self._accounted_since_start - compile_in_step
            init = now - e.duration_s - self.started_at - accounted_before_step
            if init > 0:
                out.append(("init", init))
                self.booked += init
            self._before_first_step = False
        self.compile_since_step = 0.0
        if e.step > self.highest_step:
            self.highest_step = e.step
        # Steps of one process that overlap (two threads stepping one Monitor) share its wall time: what does not
        # fit in the time it has been alive, less what is booked and pending, is not booked twice.
        productive = compute_time - compile_in_step
        marked = 0.0
        if inside:  # as the reference books it: taken out of the step's productive time
            inside = _fit(inside, productive)
            marked = sum(seconds for _, seconds in inside)
            productive -= marked
        room = now - self.started_at - self.booked - self.pending.seconds
        if io + productive + marked > max(0.0, room):  # (an empty step fits however little room is left: no 0 / 0)
            fits = max(0.0, room) / (io + productive + marked)
            io, productive = io * fits, productive * fits
            inside = [(category, seconds * fits) for category, seconds in inside if seconds * fits > 0]
        out += self._book(inside)
        if io:
            out.append(("io_wait", io))
            self.booked += io
        # No "the step number went back, so it restarted": a restart is a new process, and a job may number its
        # steps per epoch, or step one Monitor from two threads.
        self.pending.append(e.step, productive)
        if len(self.pending) > self.MAX_PENDING_STEPS:
            out += self._book([("productive", self.pending.pop_oldest(count=1))])
        return out

    def _checkpoint(self, e: events.Checkpoint) -> Increments:
        # An async save held the loop only for its blocking part; the rest overlapped steps booked themselves.
        held = e.duration_s if e.blocking_s is None else min(e.blocking_s, e.duration_s)
        # Compiles during the checkpoint (Orbax's first save) are booked as compile already.
        compile_in_checkpoint = min(self._compiled_in(e.compile_s), held)
        self.compile_since_step = max(0.0, self.compile_since_step - compile_in_checkpoint)
        seconds = held - compile_in_checkpoint
        out: Increments = [("checkpoint", seconds)] if seconds else []
        if self._before_first_step:
            self._accounted_since_start += seconds
        if e.ok and e.operation == "save":
            # A save that held the loop holds every step before it; an async one the steps up to its own (the
            # loop went on meanwhile), in the order they ended.
            saved = self.pending.pop_all() if e.blocking_s is None else self.pending.pop_oldest(up_to_step=e.step)
            if saved:
                out.append(("productive", saved))
        elif e.ok and e.operation == "restore":  # the process's state is the checkpoint's now
            lost = self.pending.pop_all()
            if lost:
                out.append(("lost", lost))
        return out

    def _compiled_in(self, measured: float | None) -> float:
        """The compile seconds that ran inside a step or checkpoint: as the job measured them (``compile_s``);
        from a job too old to say, or an async save, all those since the last step (which books a compile that
        ran before the first step against it)."""
        return measured if measured is not None else self.compile_since_step


@dataclass
class _Gap:
    """A process that failed or vanished, not yet followed by the workload's next start."""

    since: float  # Unix time it went down
    booked_until: float  # downtime is booked up to here


def rolled_back(seconds: float) -> Increments:
    """Productive seconds a rollback threw away, as a reader that can book a negative moves them: from productive
    to lost (the recording rules carve ``tpuscope_goodput_rolled_back_seconds_total`` the same way; the sidecar's
    counters cannot go down, so it serves them apart)."""
    return [("productive", -seconds), ("lost", seconds)] if seconds > 0 else []


class Rollbacks:
    """The steps a workload's restores threw away, and the productive seconds booked for them.

    One entry per save or clean end, in two flat arrays (as :class:`PendingSteps`): its step and the productive
    seconds booked so far; time booked step by step (past ``GoodputLedger.MAX_PENDING_STEPS``) adds to the total
    only. A restore to step ``s`` below the highest step reached throws away the steps after ``s`` and the seconds
    booked after the entry of ``s``. The highest step reached is the restoring process's own once it has stepped (a
    job that restores within its loop), else the workload's processes' before it (a job restarted from a
    checkpoint): a process starting over from step 0 without a restore is not rolled back against the run before.
    """

    MAX_ENTRIES = 100_000  # saves remembered; past this the oldest half go

    def __init__(self) -> None:
        self.steps = 0  # thrown away so far
        self.seconds = 0.0  # of productive time thrown away so far
        self.productive = 0.0  # booked so far
        # Each save's step, and the productive seconds booked when it made them durable.
        self._steps, self._booked = array("q"), array("d")
        self.highest_ended = -1  # the highest step of the processes that ended

    def booked(self, step: int | None, productive: float) -> None:
        """``productive`` seconds made durable, up to step ``step`` (None: a step's own, past the pending bound)."""
        self.productive += productive
        if step is None:
            return
        self._steps.append(step)
        self._booked.append(self.productive)
        if len(self._steps) > self.MAX_ENTRIES:
            del self._steps[: self.MAX_ENTRIES // 2], self._booked[: self.MAX_ENTRIES // 2]

    def restored(self, step: int, ledger: GoodputLedger, live: list[GoodputLedger]) -> None:
        """A restore of step ``step`` by the process of ``ledger``, ``live`` every process of the workload."""
        highest = (
            ledger.highest_step
            if ledger.highest_step >= 0
            else max([self.highest_ended, *(other.highest_step for other in live)])
        )
        if highest > step:
            self.steps += highest - step
            while self._steps and self._steps[-1] > step:
                self._steps.pop()
                self._booked.pop()
            kept = self._booked[-1] if self._booked else 0.0
            self.seconds += self.productive - kept
            self.productive = kept
        # From here the workload is at ``step``: a second process restoring it (one per GPU) throws nothing more.
        self.highest_ended = min(self.highest_ended, step)
        for other in live:
            other.highest_step = min(other.highest_step, step)


class WorkloadGoodput:
    """A workload: a ledger per live process (``source``: the sidecar's connection; a recording uses one), the
    downtime between a failure and the next start, and the wall time of both: the sum of the categories once every
    process has ended and every gap has closed, and the continuous denominator of the goodput SLO meanwhile."""

    def __init__(self) -> None:
        self.processes: dict[Hashable, GoodputLedger] = {}
        self.gaps: list[_Gap] = []  # oldest first: the next start closes the oldest
        self._settled = 0.0  # wall seconds of the processes that ended and the gaps that closed
        self._clock = 0.0  # Unix time of the latest event or tick
        self.rollbacks = Rollbacks()
        self.badput_names = BadputNames()  # the custom badput categories of all its processes

    @property
    def wall(self) -> float:
        """Seconds: every process from its start to its end (or now), every gap from its failure to the next
        start (or now). It can read less than before when an event sent earlier arrives after a tick; the
        sidecar's counter waits for it to catch up."""
        live = sum(self._clock - ledger.started_at for ledger in self.processes.values())
        return self._settled + live + sum(self._clock - gap.since for gap in self.gaps)

    @property
    def down_since(self) -> float | None:
        """When the oldest process not yet replaced went down; None while none is."""
        return self.gaps[0].since if self.gaps else None

    def observe(self, event: events.AnyEvent, now: float, source: Hashable = None) -> Increments:
        if now > self._clock:
            self._clock = now
        ledger = self.processes.get(source)
        if ledger is not None and type(event) is events.Step:  # the common case: a live process's step
            out = ledger.observe(event, now)
            return self._made_durable(out, None) if out else out
        if ledger is not None and type(event) is not events.Lifecycle:
            return self._live(ledger, event, now)
        if isinstance(event, events.Lifecycle) and event.state == "start":
            out = self._ended(source, ledger.last_at, clean=False) if ledger is not None else []
            return out + self._started(source, now, saw_start=True)
        out = []
        if ledger is None:  # its start was not seen: a sidecar restarted under a running job
            out = self._started(source, now - _duration(event), saw_start=False)
        if isinstance(event, events.Lifecycle) and event.state in ("stop", "failure"):
            return out + self._ended(source, now, clean=event.state == "stop", badput=event.badput)
        return out + self._live(self.processes[source], event, now)

    def _live(self, ledger: GoodputLedger, event: events.AnyEvent, now: float) -> Increments:
        """An event of a live process, a step aside."""
        if type(event) is events.Checkpoint and event.ok and event.operation == "restore":
            self.rollbacks.restored(event.step, ledger, list(self.processes.values()))
        step = event.step if type(event) is events.Checkpoint else ledger.highest_step
        return self._made_durable(ledger.observe(event, now), step)

    def _made_durable(self, increments: Increments, step: int | None) -> Increments:
        for category, seconds in increments:
            if category == "productive":
                self.rollbacks.booked(step, seconds)
        return increments

    def left(self, source: Hashable, now: float, clean: bool) -> Increments:
        """The process behind ``source`` went without a stop or a failure: its connection closed (``clean``: after
        it had said goodbye, the ledger of what it sent after that), or it now reports another workload."""
        if source not in self.processes:
            return []
        self._clock = max(self._clock, now)
        return self._ended(source, now, clean)

    def tick(self, now: float) -> Increments:
        """Bring the wall time and the open gaps' downtime up to ``now``."""
        self._clock = max(self._clock, now)
        out: Increments = []
        for gap in self.gaps:
            if now > gap.booked_until:
                out.append(("downtime", now - gap.booked_until))
                gap.booked_until = now
        return out

    def _started(self, source: Hashable, at: float, saw_start: bool) -> Increments:
        self.processes[source] = GoodputLedger(at, saw_start, self.badput_names)
        if not self.gaps:
            return []
        gap = self.gaps.pop(0)
        self._settled += max(at, gap.booked_until) - gap.since  # a tick may have run past a start sent earlier
        down = at - gap.booked_until
        return [("downtime", down)] if down > 0 else []

    def _ended(self, source: Hashable, at: float, clean: bool, badput: Iterable[events.Badput] = ()) -> Increments:
        ledger = self.processes.pop(source)
        out = self._made_durable(ledger.end(at, clean, badput), ledger.highest_step)
        self.rollbacks.highest_ended = max(self.rollbacks.highest_ended, ledger.highest_step)
        self._settled += ledger.last_at - ledger.started_at  # end() took the later of `at` and its last event
        if not clean:
            self.gaps.append(_Gap(ledger.last_at, ledger.last_at))
        return out


def _duration(event: events.AnyEvent) -> float:
    """How long before it was sent the event's subject began (a step's or a checkpoint's duration)."""
    return float(getattr(event, "duration_s", 0.0))
