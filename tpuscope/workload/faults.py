"""Faults ``tpuscope workload --inject`` can cause, so dashboards and alerts have something true to show.

Each is ``NAME``, ``NAME=VALUE``, and in a job of several processes either may end in ``@WORKER``: the fault
then hits that worker alone (``straggler=8@2``), where without it every worker has it. docs/bench.md has the
table of what each does and which metric it moves.
"""

from __future__ import annotations

from dataclasses import dataclass, field

DEFAULTS = {
    "slow-io": 0.2,
    "stall": 10.0,
    "straggler": 3.0,
    "blip": 5.0,  # seconds: one slow input, once, a third of the way through the run
    "recompile": 10.0,
    "ckpt-fail": 0.0,
    "crash": -1.0,  # -1: half the run
    "oom": -1.0,
    "compile-error": -1.0,
    "bad-data": -1.0,
    "spill": 0.0,
    # Training health: the step a worker's gradients go NaN at before the all-reduce (-1: half the run); the steps
    # the reported loss reads 50 times higher for, from a third of the run (0: to the end, it never comes down).
    "nan": -1.0,
    "spike": 50.0,
    # Hangs (tpuscope.workload.hangs): the step a worker hangs at, for good; -1: half the run.
    "hang-input": -1.0,
    "hang-spin": -1.0,
    "skip-collective": -1.0,
    # Long but healthy (tpuscope.workload.hangs), in seconds: none may read as a hang.
    "eval": 300.0,
    "slow-save": 180.0,
    "slow-compile": 120.0,
    "slow-steps": 40.0,
}
# The faults that end the run at a step (their value; -1: half the run), each its own way, for the failure
# reasons they land under (tpuscope.reasons): crash (other), oom, compile-error, bad-data.
FAILING = ("crash", "oom", "compile-error", "bad-data")
# The faults that hang a worker at a step (their value; -1: half the run), each its own way.
HANGING = ("hang-input", "hang-spin", "skip-collective")


# The faults one worker can have alone. The others would break the job rather than show a fault: a worker that
# alone skips its saves leaves its peers in Orbax's barrier, one that alone recompiles to another sequence length
# runs another program than its peers.
PER_WORKER = ("slow-io", "stall", "straggler", "blip", "nan", *FAILING, *HANGING)


class FaultError(ValueError):
    pass


@dataclass(frozen=True)
class Faults:
    """The faults of this process (``values``), and those any worker of its job has, with their values
    (``anywhere``): a straggler's extra work is in the one program every process runs, and every process enters
    the barrier one skips, so each must know that someone has it, and where."""

    values: dict[str, float]
    anywhere: dict[str, float] = field(default_factory=dict)

    @classmethod
    def parse(cls, specs: list[str], worker: int = 0, workers: int = 1) -> Faults:
        """The faults ``specs`` give worker ``worker`` of a job of ``workers`` processes."""
        values: dict[str, float] = {}
        anywhere: dict[str, float] = {}
        for spec in specs:
            fault, at, target = spec.partition("@")
            name, _, value = fault.partition("=")
            if name not in DEFAULTS:
                raise FaultError(f"unknown fault {name!r}; known: {', '.join(DEFAULTS)}")
            try:
                number = float(value) if value else DEFAULTS[name]
            except ValueError:
                raise FaultError(f"{spec!r}: the value must be a number") from None
            if at and name not in PER_WORKER:
                raise FaultError(f"{spec!r}: only {', '.join(PER_WORKER)} can hit one worker (@WORKER)")
            if at and not (target.isdecimal() and int(target) < workers):
                raise FaultError(f"{spec!r}: @WORKER must be a worker of the job, 0 to {workers - 1}")
            anywhere[name] = number
            if not at or int(target) == worker:
                values[name] = number
        return cls(values, anywhere)

    def __contains__(self, name: str) -> bool:
        return name in self.values

    def get(self, name: str) -> float:
        return self.values[name]
