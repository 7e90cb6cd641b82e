"""``tpuscope bench overhead``: what the Monitor costs the JAX workload, per step.

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
from dataclasses import replace

from tpuscope.bench.timing import ab_test, direct_cost
from tpuscope.tracing import Monitor
from tpuscope.workload import runner
from tpuscope.workload.faults import Faults
from tpuscope.workload.training import Workload

TARGET_PERCENT = 0.5


def run(args: argparse.Namespace) -> int:
    """The workload of ``tpuscope workload`` with its usual sidecar, the measurement in place of its loop.

    Device profiles at a job's default period (``$TPUSCOPE_PROFILE_PERIOD``, else 10 minutes), not the demo's
    short one: what is measured is what a job pays a step, and a capture inside the A/B would be noise."""
    return runner.run(argparse.Namespace(**{**vars(args), "profile_period": None}), body=_measure)


def _measure(args: argparse.Namespace, faults: Faults, monitor: Monitor) -> None:
    # No checkpoints: their seconds-long pauses would swamp a microsecond difference.
    with Workload(replace(runner.options(args, faults), checkpoint_every=0), monitor) as workload:
        print("\n".join(measure(workload, monitor, args.steps)), flush=True)


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
