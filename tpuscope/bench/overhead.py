"""``tpuscope bench --overhead``: what the Monitor costs the JAX workload, per step.

Two measurements, because each alone can mislead:

- A/B: the same workload, in one process, alternating blocks of steps with the
  Monitor on and off (interleaved, so drifts in machine load hit both alike).
  This is the honest end-to-end figure, but on a shared 2-core machine its
  noise is larger than the Monitor's cost, so its margin is printed with it.
- Direct: the instrumentation alone (a step with three phases, and its event
  sent to the sidecar) timed over thousands of empty steps: the cost the A/B
  difference is made of, without the noise.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import TypeVar

from tpuscope.tracing import Monitor
from tpuscope.workload import runner
from tpuscope.workload.faults import Faults
from tpuscope.workload.training import Workload

K = TypeVar("K")

TARGET_PERCENT = 0.5


def run(args: argparse.Namespace) -> int:
    """The workload of ``tpuscope bench`` with its usual sidecar, the measurement in place of its loop.

    Device profiles at a job's default period (``$TPUSCOPE_PROFILE_PERIOD``, else 10 minutes), not the demo's
    short one: what is measured is what a job pays a step, and a capture inside the A/B would be noise."""
    return runner.run(argparse.Namespace(**{**vars(args), "profile_period": None}), body=_measure)


def _measure(args: argparse.Namespace, faults: Faults, monitor: Monitor) -> None:
    # No checkpoints: their seconds-long pauses would swamp a microsecond difference.
    with Workload(replace(runner.options(args, faults), checkpoint_every=0), monitor) as workload:
        print("\n".join(measure(workload, monitor, args.steps)), flush=True)


def blocks(total: int, block: int, warmup: int) -> Iterator[bool]:
    """Whether each step is instrumented: off for the warm-up, then alternating blocks of ``block`` steps.

    The warm-up compiles; left out of the Monitor, its seconds-long steps do not enter the step time the device
    profiler chooses its capture interval from (at step 10), so no capture falls inside the measurement."""
    for n in range(total):
        yield False if n < warmup else ((n - warmup) // block) % 2 == 0


@dataclass(frozen=True)
class ABResult:
    """Step times with the Monitor (or what ``ab_test``'s ``switch`` turns) on and off, interleaved, and the
    difference's noise."""

    step_off: float  # median seconds, Monitor off
    step_on: float
    difference: float  # mean over block pairs of (median on - median off)
    margin: float  # two standard errors of that mean
    pairs: int


def ab_test(
    workload: Workload,
    steps: int,
    block: int = 10,
    warmup: int = 5,
    switch: Callable[[bool], None] | None = None,
) -> ABResult:
    """Run ``steps`` of the workload, alternating blocks of ``block`` steps with the Monitor on and off.

    With ``switch``, the Monitor times every step past the warm-up, and what alternates is what ``switch(on)``
    turns on and off (the loss reported, say): it is called before the first step, then between each step and
    the next, from the progress callback."""
    pattern = list(blocks(steps, block, warmup))
    ends: list[float] = []

    def progress(n: int) -> None:
        ends.append(time.perf_counter())  # first: what follows is the next step's, in both arms alike
        if switch is not None and n + 1 < steps:
            switch(pattern[n + 1])

    if switch is None:
        instrumented = iter(pattern)
    else:
        switch(pattern[0])
        instrumented = (n >= warmup for n in range(steps))
    started = time.perf_counter()
    workload.run(progress=progress, instrumented=instrumented)
    durations = [b - a for a, b in itertools.pairwise([started, *ends])]
    on = [d for d, timed, n in zip(durations, pattern, range(steps), strict=True) if timed and n >= warmup]
    off = [d for d, timed, n in zip(durations, pattern, range(steps), strict=True) if not timed and n >= warmup]
    # Block-to-block differences show the noise the A/B difference has to be read against.
    pairs = [
        statistics.median(on[i : i + block]) - statistics.median(off[i : i + block]) for i in range(0, len(off), block)
    ]
    margin = 2 * statistics.stdev(pairs) / len(pairs) ** 0.5 if len(pairs) > 1 else float("inf")
    return ABResult(statistics.median(off), statistics.median(on), statistics.fmean(pairs), margin, len(pairs))


def measure(workload: Workload, monitor: Monitor, steps: int, block: int = 10, warmup: int = 5) -> list[str]:
    """Run the A/B and the direct measurement; return the report's lines."""
    ab = ab_test(workload, steps, block, warmup)
    step = ab.step_off
    # A Monitor of its own, so the empty probe steps stay out of the workload's series.
    with Monitor(f"{monitor.workload}-probe", socket=monitor.socket_path) as probe:
        direct = direct_cost(probe)
    verdict = "met" if direct / step * 100 <= TARGET_PERCENT else "MISSED"
    return [
        f"Monitor overhead: {ab.pairs * block} steps on and {ab.pairs * block} off, interleaved in blocks of {block}",
        f"  step time, Monitor off     p50 {step * 1e3:8.2f} ms",
        f"  step time, Monitor on      p50 {ab.step_on * 1e3:8.2f} ms",
        f"  A/B difference             {ab.difference * 1e6:+8.0f} us ({ab.difference / step:+.2%}) "
        f"+- {ab.margin * 1e6:.0f} us (2 standard errors over {ab.pairs} block pairs)",
        f"  instrumentation itself     {direct * 1e6:8.1f} us per step ({direct / step:.3%} of a step; "
        f"target <= {TARGET_PERCENT:g}%: {verdict})",
    ]


# Between two calls timed alone, a pause as between a real job's steps: the sidecar has gone back to sleep when
# the next event arrives, and waking it is part of what a send costs (half of it on this project's machine: a
# loop of back-to-back sends keeps the receiver awake and would time the cheaper half alone).
PACE_SECONDS = 50e-6


def direct_cost(monitor: Monitor, steps: int = 5000, loss: object = None) -> float:
    """Seconds per instrumented empty step (three phases and one event sent to the sidecar), each timed alone
    and paced as a job's steps are (:func:`paced_seconds_per_call`); with ``loss``, each step reports it too
    (:func:`empty_step`)."""
    # Numbered from 1: step 0 is a multiple of every K, where a device-profile capture would begin.
    return paced_seconds_per_call(lambda n: empty_step(monitor, n + 1, loss), steps)


def paced_seconds_per_call(call: Callable[[int], None], calls: int, rounds: int = 3) -> float:
    """Seconds per call of ``call(i)``, each timed alone with a pause of :data:`PACE_SECONDS` after it, less the
    timing's own cost (an empty call timed the same way); the best of ``rounds``."""
    return max(0.0, _paced(call, calls, rounds) - _paced(lambda i: None, calls, rounds))


def _paced(call: Callable[[int], None], calls: int, rounds: int) -> float:
    pause = int(PACE_SECONDS * 1e9)
    best = float("inf")
    for _ in range(rounds):
        total = 0
        for i in range(calls):
            began = time.perf_counter_ns()
            call(i)
            ended = time.perf_counter_ns()
            total += ended - began
            while time.perf_counter_ns() - ended < pause:
                pass
        best = min(best, total / calls / 1e9)
        time.sleep(0.2)
    return best


def best_seconds_per_call(run: Callable[[], None], calls: int, rounds: int = 3) -> float:
    """Seconds per call of ``run`` (which makes ``calls`` calls), the best of ``rounds``: the least disturbed by
    the rest of the machine. A pause after each lets a receiver (the sidecar) drain its buffer."""
    best = float("inf")
    for _ in range(rounds):
        started = time.perf_counter()
        run()
        best = min(best, (time.perf_counter() - started) / calls)
        time.sleep(0.2)
    return best


def best_alternated(measures: Mapping[K, Callable[[], float]], rounds: int = 3) -> dict[K, float]:
    """Each measure's least result over ``rounds`` in which they run one after another: variants compared side by
    side meet the same disturbances of the machine, and each keeps its least disturbed."""
    best = dict.fromkeys(measures, float("inf"))
    for _ in range(rounds):
        for key, measure in measures.items():
            best[key] = min(best[key], measure())
    return best


def empty_step(monitor: Monitor, n: int, loss: object = None) -> None:
    """An instrumented step that does nothing: three phases and one event; with ``loss``, it reports it too
    (``s.loss(loss)``, read at the step's end where it is ready: a number, or a JAX array already computed)."""
    with monitor.step(n) as step:
        with step.phase("io"):
            pass
        with step.phase("compute"):
            pass
        with step.phase("sync"):
            pass
        if loss is not None:
            step.loss(loss)


def empty_steps(monitor: Monitor, steps: int, first: int = 0) -> None:
    """``steps`` instrumented steps that do nothing, numbered from ``first``."""
    for n in range(first, first + steps):
        empty_step(monitor, n)
