"""How the benchmarks time what costs microseconds: an A/B of steps with the Monitor on and off, calls timed one by
one and paced as a job's steps are, the best of rounds, and a scrape timed as Prometheus asks.

Used by ``bench perf``, ``bench overhead``, ``bench trace-cost``, ``bench scrape-latency`` and ``bench flood``.
"""

from __future__ import annotations

import itertools
import statistics
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from tpuscope.tracing import Monitor

if TYPE_CHECKING:
    from tpuscope.workload.training import Workload

K = TypeVar("K")
# What Prometheus 2.x sends.
PROMETHEUS_HEADERS = {
    "Accept": "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
    "text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
    "Accept-Encoding": "gzip",
}


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


def scrape_once(url: str) -> tuple[float, int]:
    """Seconds from request to the last byte, and the bytes on the wire."""
    request = urllib.request.Request(url, headers=PROMETHEUS_HEADERS)
    start = time.perf_counter()
    with urllib.request.urlopen(request, timeout=10) as response:
        size = len(response.read())
    return time.perf_counter() - start, size
