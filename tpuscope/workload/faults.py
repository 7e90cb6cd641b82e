"""Faults ``tpuscope bench --inject`` can cause, so dashboards and alerts have something true to show.

Each is ``NAME`` or ``NAME=VALUE``; docs/bench.md has the table of what each
does and which metric it moves.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULTS = {
    "slow-io": 0.2,
    "stall": 10.0,
    "straggler": 3.0,
    "recompile": 10.0,
    "ckpt-fail": 0.0,
    "crash": -1.0,  # -1: half the run
    "spill": 0.0,
}


class FaultError(ValueError):
    pass


@dataclass(frozen=True)
class Faults:
    values: dict[str, float]

    @classmethod
    def parse(cls, specs: list[str]) -> Faults:
        values = {}
        for spec in specs:
            name, _, value = spec.partition("=")
            if name not in DEFAULTS:
                raise FaultError(f"unknown fault {name!r}; known: {', '.join(DEFAULTS)}")
            try:
                values[name] = float(value) if value else DEFAULTS[name]
            except ValueError:
                raise FaultError(f"{spec!r}: the value must be a number") from None
        return cls(values)

    def __contains__(self, name: str) -> bool:
        return name in self.values

    def get(self, name: str) -> float:
        return self.values[name]
