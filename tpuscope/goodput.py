"""Goodput accounting: where a workload's wall time went, from its events.

The sidecar keeps one ledger per workload (it outlives the job's restarts, so it
sees work that a restart throws away); ``tpuscope bench`` keeps one for its own
summary. Both feed it the same events and get back seconds per category.

Step time counts as ``productive`` only once it is durable: when a checkpoint
covering the step is saved, or the run stops cleanly. Until then it is
pending, and it becomes ``lost`` if the job fails, restores an older
checkpoint, or is seen repeating step numbers (it restarted from an earlier
step). Counters never go down, so this is the only way to report lost work
without counting it twice.
"""

from __future__ import annotations

from array import array

from tpuscope import events

CATEGORIES = ("productive", "compile", "io_wait", "checkpoint", "init", "lost")

Increments = list[tuple[str, float]]


class PendingSteps:
    """Steps not yet durable and their productive seconds, in step order, 16 bytes a step.

    Two flat arrays and the index of the oldest: a job that checkpoints every 100,000 steps keeps
    1.6 MB here, where a dict of floats would take 15 MB. Steps only grow (going back drops the
    steps after first), so the oldest are taken from the front and lost work from the back.
    """

    def __init__(self) -> None:
        self._steps = array("q")
        self._seconds = array("d")
        self._head = 0

    def __len__(self) -> int:
        return len(self._steps) - self._head

    def append(self, step: int, seconds: float) -> None:
        self._steps.append(step)
        self._seconds.append(seconds)

    def pop_oldest(self, up_to_step: float = float("inf"), count: int | None = None) -> float:
        """Remove the oldest steps up to ``up_to_step`` (or ``count`` of them); their seconds."""
        end = self._head
        limit = len(self._steps) if count is None else min(len(self._steps), self._head + count)
        while end < limit and self._steps[end] <= up_to_step:
            end += 1
        total = sum(self._seconds[self._head : end])
        self._head = end
        if self._head > 4096 and self._head * 2 > len(self._steps):  # drop the dead front now and then
            del self._steps[: self._head]
            del self._seconds[: self._head]
            self._head = 0
        return total

    def pop_after(self, step: int) -> float:
        """Remove the steps after ``step`` (they are being redone); their seconds."""
        total = 0.0
        while len(self) and self._steps[-1] > step:
            self._steps.pop()
            total += self._seconds.pop()
        return total

    def pop_all(self) -> float:
        return self.pop_oldest()


class GoodputLedger:
    # A job that never checkpoints would keep every step pending: past this many
    # steps, the oldest are taken as productive (they are at risk, not lost).
    MAX_PENDING_STEPS = 100_000

    def __init__(self) -> None:
        self.pending = PendingSteps()
        self.last_step = -1
        self.compile_since_step = 0.0
        self.started_at: float | None = None  # set from "start" until the first step
        self.accounted_since_start = 0.0  # compile and checkpoint seconds between start and first step

    def observe(self, event: events.AnyEvent, now: float) -> Increments:
        """The seconds per category that ``event``, received at ``now`` (Unix time), adds."""
        if isinstance(event, events.Step):
            return self._step(event, now)
        if isinstance(event, events.Compile):
            self.compile_since_step += event.duration_s
            self.accounted_since_start += event.duration_s
            return [("compile", event.duration_s)]
        if isinstance(event, events.Checkpoint):
            return self._checkpoint(event)
        if isinstance(event, events.Lifecycle):
            return self._lifecycle(event, now)
        return []

    def _step(self, e: events.Step, now: float) -> Increments:
        out: Increments = [("io_wait", e.io_s)] if e.io_s else []
        compute_time = max(0.0, e.duration_s - e.io_s)
        compile_in_step = min(self._compiled_in(e.compile_s), compute_time)
        if self.started_at is not None:
            accounted_before_step = self.accounted_since_start - compile_in_step
            init = now - e.duration_s - self.started_at - accounted_before_step
            if init > 0:
                out.append(("init", init))
            self.started_at = None
        self.compile_since_step = 0.0
        if e.step <= self.last_step:  # the job went back: whatever it had not saved is being redone
            out += self._lose(after=e.step - 1)
        self.last_step = e.step
        self.pending.append(e.step, compute_time - compile_in_step)
        if len(self.pending) > self.MAX_PENDING_STEPS:
            out.append(("productive", self.pending.pop_oldest(count=1)))
        return out

    def _checkpoint(self, e: events.Checkpoint) -> Increments:
        # Compiles during the checkpoint (Orbax jits its copies on the first save) are compile time already.
        compile_in_checkpoint = min(self._compiled_in(e.compile_s), e.duration_s)
        self.compile_since_step = max(0.0, self.compile_since_step - compile_in_checkpoint)
        seconds = e.duration_s - compile_in_checkpoint
        out: Increments = [("checkpoint", seconds)] if seconds else []
        if self.started_at is not None:
            self.accounted_since_start += seconds
        if e.ok and e.operation == "save":
            saved = self.pending.pop_oldest(up_to_step=e.step)
            if saved:
                out.append(("productive", saved))
        elif e.ok and e.operation == "restore":
            out += self._lose(after=e.step)
            self.last_step = e.step
        return out

    def _compiled_in(self, measured: float | None) -> float:
        """The compile seconds that ran inside a step or checkpoint: as the job measured them (``compile_s``);
        from a job too old to say, or an async save, all those since the last step (which books a compile that
        ran before the first step against it)."""
        return measured if measured is not None else self.compile_since_step

    def _lifecycle(self, e: events.Lifecycle, now: float) -> Increments:
        if e.state == "start":
            self.started_at = now
            self.accounted_since_start = 0.0
            self.compile_since_step = 0.0
        elif e.state == "stop":  # a clean end: its last steps are its result
            saved = self.pending.pop_all()
            return [("productive", saved)] if saved else []
        elif e.state == "failure":
            return self._lose(after=-1)
        return []

    def _lose(self, after: int) -> Increments:
        """Pending work of steps after ``after`` is gone.

        ``pending`` is in step order, so the steps to drop are at its end: popping from there costs what
        is lost, not what is pending (a job that repeats one step number would otherwise pay for all).
        """
        lost = self.pending.pop_after(after)
        return [("lost", lost)] if lost else []
