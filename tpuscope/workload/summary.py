"""The run summary ``tpuscope bench`` prints: a Monitor sink that keeps what it sees."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from tpuscope import events
from tpuscope.goodput import CATEGORIES, GoodputLedger
from tpuscope.stats import percentile


@dataclass
class RunSummary:
    """Collects the job's events job-side (it needs no sidecar) and sums them up."""

    started: float = field(default_factory=time.perf_counter)
    step_seconds: list[float] = field(default_factory=list)
    phase_seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(events.PHASES, 0.0))
    checkpoint_seconds: list[float] = field(default_factory=list)
    checkpoint_failures: int = 0
    compile_seconds: float = 0.0
    cache: dict[bool, int] = field(default_factory=lambda: {True: 0, False: 0})
    flops: float = 0.0
    peak_flops_per_second: float = 0.0
    ledger: GoodputLedger = field(default_factory=GoodputLedger)
    goodput: dict[str, float] = field(default_factory=lambda: dict.fromkeys(CATEGORIES, 0.0))

    def emit(self, event: events.AnyEvent) -> None:
        for category, seconds in self.ledger.observe(event, time.time()):
            self.goodput[category] += seconds
        if isinstance(event, events.Step):
            self.step_seconds.append(event.duration_s)
            self.flops += event.flops
            for phase, seconds in event.phase_seconds():
                self.phase_seconds[phase] += seconds
        elif isinstance(event, events.Checkpoint) and event.operation == "save":
            self.checkpoint_seconds.append(event.duration_s)
            self.checkpoint_failures += not event.ok
        elif isinstance(event, events.Compile):
            self.compile_seconds += event.duration_s
        elif isinstance(event, events.CompileCache):
            self.cache[event.hit] += 1
        elif isinstance(event, events.Hardware):
            self.peak_flops_per_second = event.peak_flops_per_second

    def close(self) -> None:
        pass

    @property
    def steps(self) -> int:
        return len(self.step_seconds)

    def wall_seconds(self) -> float:
        return max(time.perf_counter() - self.started, 1e-9)

    def steps_per_second(self) -> float:
        return self.steps / self.wall_seconds()

    def mfu(self) -> float | None:
        step_time = sum(self.step_seconds)
        if not (self.flops and self.peak_flops_per_second and step_time):
            return None
        return self.flops / step_time / self.peak_flops_per_second

    def lines(self) -> list[str]:
        total = sum(self.step_seconds) or 1.0
        shares = ", ".join(f"{phase} {seconds / total:.0%}" for phase, seconds in self.phase_seconds.items())
        ckpt = f"{len(self.checkpoint_seconds)} saved"
        if self.checkpoint_seconds:
            ckpt += f" ({self.checkpoint_failures} failed), p95 {percentile(self.checkpoint_seconds, 0.95):.2f} s"
        # Shares of the time the ledger booked, as the sidecar and `tpuscope report` count them: the summary's own
        # clock also holds the time before the Monitor's start and after its stop, which no category owns.
        booked = sum(self.goodput.values()) or 1e-9
        badput = ", ".join(f"{c} {s / booked:.1%}" for c, s in self.goodput.items() if c != "productive" and s)
        mfu = self.mfu()
        return [
            f"steps         {self.steps} ({self.steps_per_second():.2f} steps/s)",
            f"step time     p50 {percentile(self.step_seconds, 0.5) * 1e3:.1f} ms, "
            f"p95 {percentile(self.step_seconds, 0.95) * 1e3:.1f} ms",
            f"phase shares  {shares}",
            f"compile       {self.compile_seconds:.2f} s; cache {self.cache[True]} hits, {self.cache[False]} misses",
            f"MFU           {mfu:.2%} over every step (the sidecar's gauge averages about the last 20)"
            if mfu is not None
            else "MFU           n/a (no FLOPs or peak reported)",
            f"checkpoints   {ckpt}",
            f"goodput       {self.goodput['productive'] / booked:.1%} of {booked:.1f} s wall"
            + (f"; badput: {badput}" if badput else ""),
        ]
