"""``tpuscope bench trace-cost --steps N``: what spans add to a step, on the unsampled and the sampled path.

Three Monitors time the same empty step (three phases, no work) N times each,
in interleaved rounds: spans off; spans on but the step not kept (the path
nearly every step takes: phase timings kept, the sampler asked, nothing
created); spans on and every step kept (a step span and three children,
exported to a JSON-lines file). The sampled round ends with a flush that it is
charged for, and its export queue holds a whole round, so every span is created,
queued and written: the figure is the full cost of a kept step. The difference
to the first is the cost of each path. No sidecar listens, so sending costs the
same small amount in all three.
"""

from __future__ import annotations

import argparse
import logging
import os
import tempfile
import time
from pathlib import Path

from tpuscope.bench.timing import empty_steps
from tpuscope.tracing import Monitor, Traces

TARGET_UNSAMPLED_US = 5.0
ROUNDS = 5


def per_step_seconds(monitor: Monitor, steps: int) -> float:
    start = time.perf_counter()
    empty_steps(monitor, steps, first=1)  # from 1: step 0 is always a 1-in-N step
    if monitor.spans:
        monitor.spans.provider.force_flush()  # the export is part of the cost
    return (time.perf_counter() - start) / steps


def run(args: argparse.Namespace) -> int:
    steps: int = args.steps
    os.environ["OTEL_BSP_MAX_QUEUE_SIZE"] = str(steps * 4)  # a round's spans: none dropped, all charged for
    os.environ["TPUSCOPE_SPANS_MAX_BYTES"] = str(1 << 40)  # one file, unrotated: the count below reads it whole
    with tempfile.TemporaryDirectory(prefix="ts-") as tmp:
        socket, spans = Path(tmp) / "absent.sock", Path(tmp) / "sampled.jsonl"
        monitors = {
            "spans off": Monitor("cost-off", socket=socket, traces=False),
            # Never kept: 1 in 10^12 steps, and only steps 10^6 times the recent p99.
            "unsampled": Monitor(
                "cost-unsampled",
                socket=socket,
                traces=Traces(spans_file=Path(tmp) / "unsampled.jsonl", sample_every=10**12, slow_factor=1e6),
            ),
            "sampled": Monitor("cost-sampled", socket=socket, traces=Traces(spans_file=spans, sample_every=1)),
        }
        best = dict.fromkeys(monitors, float("inf"))
        logging.getLogger("tpuscope").setLevel(logging.ERROR)  # no sidecar listens, by design
        try:
            for _ in range(ROUNDS):
                for name, monitor in monitors.items():
                    best[name] = min(best[name], per_step_seconds(monitor, steps))
        finally:
            for monitor in monitors.values():
                monitor.close()
        kept = monitors["sampled"].spans.kept if monitors["sampled"].spans else 0
        written = sum('"name":"lifecycle"' not in line for line in spans.open()) if spans.exists() else 0
    base = best["spans off"]
    unsampled = (best["unsampled"] - base) * 1e6
    sampled = (best["sampled"] - base) * 1e6
    print(f"per-step cost of spans, best of {ROUNDS} interleaved rounds of {steps} empty steps (3 phases each):")
    print(f"  spans off: {base * 1e6:.2f} us per step (timing and the event, no sidecar listening)")
    print(f"  unsampled path: +{unsampled:.2f} us per step (target at most {TARGET_UNSAMPLED_US:g} us)")
    print(f"  sampled path: +{sampled:.2f} us per step ({kept} steps kept, {written} spans written)")
    verdict = "within" if unsampled <= TARGET_UNSAMPLED_US else "OVER"
    print(f"  the unsampled path is {verdict} its target")
    return 0
