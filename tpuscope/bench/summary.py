"""The run summary ``tpuscope bench`` prints: a Monitor sink that keeps what it sees."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from tpuscope import events


@dataclass
class RunSummary:
    """Collects step and checkpoint events job-side (it needs no sidecar)."""

    started: float = field(default_factory=time.perf_counter)
    step_seconds: list[float] = field(default_factory=list)
    phase_seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(events.PHASES, 0.0))
    checkpoint_seconds: list[float] = field(default_factory=list)

    def emit(self, event: events.AnyEvent) -> None:
        if isinstance(event, events.Step):
            self.step_seconds.append(event.duration_s)
            for phase, seconds in event.phase_seconds():
                self.phase_seconds[phase] += seconds
        elif isinstance(event, events.Checkpoint):
            self.checkpoint_seconds.append(event.duration_s)

    def close(self) -> None:
        pass

    @property
    def steps(self) -> int:
        return len(self.step_seconds)

    def steps_per_second(self) -> float:
        return self.steps / max(time.perf_counter() - self.started, 1e-9)

    def lines(self) -> list[str]:
        total = sum(self.step_seconds) or 1.0
        shares = ", ".join(f"{phase} {seconds / total:.0%}" for phase, seconds in self.phase_seconds.items())
        ckpt = f"{len(self.checkpoint_seconds)}"
        if self.checkpoint_seconds:
            ckpt += f", p95 {percentile(self.checkpoint_seconds, 0.95):.2f} s"
        return [
            f"steps         {self.steps} ({self.steps_per_second():.1f} steps/s)",
            f"step time     p50 {percentile(self.step_seconds, 0.5) * 1e3:.1f} ms, "
            f"p95 {percentile(self.step_seconds, 0.95) * 1e3:.1f} ms",
            f"phase shares  {shares}",
            f"checkpoints   {ckpt}",
        ]


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile; 0 for no values."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0
