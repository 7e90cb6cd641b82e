"""The run summary ``tpuscope workload`` prints and writes as JSON: a Monitor sink that keeps what it sees.

Two splits of a step sit side by side and are named apart: the host-timed phases (what the loop's
``step.phase`` timers saw; a fused step's collectives run inside its one program, so there ``sync``
reads 0) and the profiled split, from the device traces the Monitor sampled (``Step.profile``): compute,
exposed collective and idle, which add up to the profiled step. Only what the events carried is counted:
a capture parsed after the last step rides on no step and is not in the summary.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from tpuscope import events
from tpuscope.catalog import MFU_STEPS
from tpuscope.goodput import CATEGORIES, WorkloadGoodput
from tpuscope.stats import percentile
from tpuscope.utilization import Mfu, ProfileSummary, measured_steps


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
    model_flops: Mfu = field(default_factory=Mfu)  # every step's
    peak_flops_per_second: float = 0.0
    ledger: WorkloadGoodput = field(default_factory=WorkloadGoodput)
    goodput: dict[str, float] = field(default_factory=lambda: dict.fromkeys(CATEGORIES, 0.0))
    profiles: list[events.DeviceProfile] = field(default_factory=list)  # every capture the steps carried

    def emit(self, event: events.AnyEvent) -> None:
        for category, seconds in self.ledger.observe(event, time.time()):
            # A custom badput category (Monitor.badput) joins the fixed ones at its first booking.
            self.goodput[category] = self.goodput.get(category, 0.0) + seconds
        if isinstance(event, events.Step):
            self.step_seconds.append(event.duration_s)
            self.model_flops.add(event.flops, event.duration_s)
            for phase, seconds in event.phase_seconds():
                self.phase_seconds[phase] += seconds
            if event.profile is not None:
                self.profiles.append(event.profile)
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
        return self.model_flops.of(self.peak_flops_per_second)

    def profiled(self) -> ProfiledSplit | None:
        """The split of the ok captures' steps, each capture weighted by its steps; None without one."""
        ok = [p for p in self.profiles if p.result == "ok" and p.steps]
        if not ok:
            return None
        steps = sum(p.steps for p in ok)

        def mean(part: str) -> float:
            return float(sum(getattr(p, part) * p.steps for p in ok)) / steps

        mean_profile = events.DeviceProfile(
            "ok",
            steps=steps,
            devices=max(p.devices for p in ok),
            step_s=mean("step_s"),
            compute_s=mean("compute_s"),
            exposed_collective_s=mean("exposed_collective_s"),
            overlapped_collective_s=mean("overlapped_collective_s"),
            idle_s=mean("idle_s"),
            slowest_compute_s=mean("slowest_compute_s"),
        )
        return ProfiledSplit(len(ok), mean_profile, ProfileSummary.of(s for p in ok for s in measured_steps(p)))

    def captures(self) -> dict[str, int]:
        counts = dict.fromkeys(events.PROFILE_RESULTS, 0)
        for p in self.profiles:
            counts[p.result] += 1
        return counts

    def capture_seconds(self) -> float:
        """What the captures cost the job: starting and stopping the traces, off the training thread (the sidecar
        parses them: :meth:`parse_seconds`)."""
        return sum(p.capture_s for p in self.profiles)

    def parse_seconds(self) -> float:
        """What parsing the captures cost the sidecar, in its own process."""
        return sum(p.parse_s for p in self.profiles)

    def profile_lines(self) -> list[str]:
        if not self.profiles:
            return ["device trace  no capture reported (--profile-period off, or the run too short for one)"]
        lines = []
        if split := self.profiled():
            p = split.mean
            step = p.step_s or 1e-9
            lines += [
                f"device trace  {split.captures} captures, {p.steps} profiled steps x {p.devices} devices: "
                f"step {p.step_s * 1e3:.1f} ms = compute {p.compute_s * 1e3:.1f} ms "
                f"({p.compute_s / step:.0%}) + exposed collective {p.exposed_collective_s * 1e3:.1f} ms "
                f"({p.exposed_collective_s / step:.0%}) + idle {p.idle_s * 1e3:.1f} ms "
                f"({p.idle_s / step:.0%})",
                f"              overlap {split.overlap():.0%} of collective time hidden under compute "
                f"({p.overlapped_collective_s * 1e3:.1f} ms); imbalance: the slowest device's compute "
                f"{split.imbalance():.2f}x the mean",
            ]
        counts = ", ".join(f"{n} {result}" for result, n in self.captures().items())
        cost = self.capture_seconds()
        wall = self.wall_seconds()
        lines.append(
            f"captures      {counts}; {cost:.2f} s to start and stop ({cost / wall:.1%} of {wall:.1f} s wall), "
            f"{self.parse_seconds():.2f} s of the sidecar's to parse"
        )
        return lines

    def json(self) -> dict[str, Any]:
        """What :meth:`lines` says, as numbers (``tpuscope workload`` writes it to RUN_DIR/summary.json)."""
        total = sum(self.step_seconds) or 1.0
        split = self.profiled()
        mfu = self.mfu()
        return {
            "steps": self.steps,
            "steps_per_second": self.steps_per_second(),
            "wall_s": self.wall_seconds(),
            "step_p50_s": percentile(self.step_seconds, 0.5) if self.step_seconds else None,
            "step_p95_s": percentile(self.step_seconds, 0.95) if self.step_seconds else None,
            "host_phases": {
                phase: {"seconds": seconds, "share": seconds / total} for phase, seconds in self.phase_seconds.items()
            },
            "profiled": split.json() if split else None,
            "captures": self.captures(),
            "capture_s": self.capture_seconds(),
            "capture_share_of_wall": self.capture_seconds() / self.wall_seconds(),
            "compile_s": self.compile_seconds,
            "compile_cache": {"hits": self.cache[True], "misses": self.cache[False]},
            "mfu": mfu,
            "checkpoints": {"saved": len(self.checkpoint_seconds), "failed": self.checkpoint_failures},
            "goodput_s": dict(self.goodput),
        }

    def lines(self) -> list[str]:
        total = sum(self.step_seconds) or 1.0
        shares = ", ".join(f"{phase} {seconds / total:.0%}" for phase, seconds in self.phase_seconds.items())
        ckpt = f"{len(self.checkpoint_seconds)} saved"
        if self.checkpoint_seconds:
            ckpt += f" ({self.checkpoint_failures} failed), p95 {percentile(self.checkpoint_seconds, 0.95):.2f} s"
        # Shares of the wall time the ledger booked, from the Monitor's start to its stop, as the sidecar and
        # `tpuscope report` count them: the summary's own clock also holds the time before and after.
        booked = sum(self.goodput.values()) or 1e-9
        badput = ", ".join(f"{c} {s / booked:.1%}" for c, s in self.goodput.items() if c != "productive" and s)
        mfu = self.mfu()
        return [
            f"steps         {self.steps} ({self.steps_per_second():.2f} steps/s)",
            f"step time     p50 {percentile(self.step_seconds, 0.5) * 1e3:.1f} ms, "
            f"p95 {percentile(self.step_seconds, 0.95) * 1e3:.1f} ms",
            f"phase shares  {shares} (host-timed: the loop's phase timers)",
            *self.profile_lines(),
            f"compile       {self.compile_seconds:.2f} s; cache {self.cache[True]} hits, {self.cache[False]} misses",
            f"MFU           {mfu:.2%} over every step (the sidecar's gauge: over the last {MFU_STEPS})"
            if mfu is not None
            else "MFU           n/a (no FLOPs or peak reported)",
            f"checkpoints   {ckpt}",
            f"goodput       {self.goodput['productive'] / booked:.1%} of {booked:.1f} s wall"
            + (f"; badput: {badput}" if badput else ""),
        ]


@dataclass(frozen=True)
class ProfiledSplit:
    """The ok captures' split: how many, and their mean per profiled step and per device (``mean.steps``:
    the profiled steps of them all, ``mean.devices``: the most devices one measured)."""

    captures: int
    mean: events.DeviceProfile
    summary: ProfileSummary  # the ratios, as the sidecar and the report sum them

    def overlap(self) -> float:
        """The share of collective time that compute hides (0 without collectives)."""
        return self.summary.overlap if self.summary.overlap is not None else 0.0

    def imbalance(self) -> float:
        """The slowest device's compute over the mean device's: 1 when the devices are even (or idle)."""
        return self.summary.imbalance if self.summary.imbalance is not None else 1.0

    def json(self) -> dict[str, Any]:
        p = self.mean
        step = p.step_s or 1e-9
        return {
            "captures": self.captures,
            "steps": p.steps,
            "devices": p.devices,
            "step_s": p.step_s,
            **{
                part: {"seconds": seconds, "share": seconds / step}
                for part, seconds in (
                    ("compute", p.compute_s),
                    ("exposed_collective", p.exposed_collective_s),
                    ("idle", p.idle_s),
                )
            },
            "overlapped_collective_s": p.overlapped_collective_s,
            "overlap": self.overlap(),
            "slowest_compute_s": p.slowest_compute_s,
            "imbalance": self.imbalance(),
        }
