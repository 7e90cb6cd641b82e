"""Alerts on XLA compilation: failing, too long, again and again in the steady state, missing the persistent
cache."""

from __future__ import annotations

from tpuscope import catalog as c
from tpuscope import durations
from tpuscope.alerts.rules import (
    COMPILE_FAILURE_REASON_ANCHOR,
    Alert,
    new_or_increase,
    reason_runbook,
)
from tpuscope.conventions import AlertName, DashboardUID
from tpuscope.generator_config import GeneratorConfig
from tpuscope.promql import SIDECAR_START_SERIES, WORKLOAD, series

BACKEND = 'stage="backend"'
HIT = 'result="hit"'


def alerts(config: GeneratorConfig) -> list[Alert]:
    t = config.thresholds
    lookups = new_or_increase(c.COMPILE_CACHE_REQUESTS, "1h")
    # Each sidecar's compiles count only if it has served the workload's steps for the hour: a restarted
    # job (a new pod's sidecar, or a new process under the same one) compiles everything again.
    steady = (
        f"and on (job, instance, workload) {series(c.STEPS)} offset 1h > 0"
        f" and on (job, instance) {SIDECAR_START_SERIES} < time() - {durations.parse('1h'):g}"
    )
    return [
        Alert(
            AlertName.COMPILE_TIME_HIGH,
            "warning",
            f"{new_or_increase(c.COMPILE_DURATION, '1h', BACKEND, suffix='sum')} > {t.compile_seconds_per_hour:g}",
            "A workload spends a lot of time compiling.",
            "Workload {{ $labels.workload }} compiled for {{ $value | humanizeDuration }} in the last hour.",
            DashboardUID.JOB,
            runbook="Use the persistent compilation cache; keep shapes and static arguments fixed.",
        ),
        Alert(
            AlertName.RECOMPILING,
            "warning",
            f"{new_or_increase(c.COMPILE_DURATION, '30m', BACKEND, suffix='count', only=steady)}"
            f" > {t.steady_state_compiles:g} unless on ({WORKLOAD}) {new_or_increase(c.WORKLOAD_RESTARTS, '1h')} > 0",
            "A workload keeps recompiling in its steady state.",
            "Workload {{ $labels.workload }} compiled {{ $value }} programs in 30 minutes, an hour after it began "
            "stepping.",
            DashboardUID.JOB,
            runbook="Shapes or static arguments change between steps: pad to fixed shapes, bucket sequence lengths. "
            f"{c.RECOMPILES.name} says why each function was traced again, by cause (the On-call dashboard's "
            "Recompiles panel): see [Recompile causes](#recompile-causes).",
        ),
        Alert(
            AlertName.COMPILE_CACHE_HIT_RATIO_LOW,
            "warning",
            # A workload with no hit at all has no hit series: it reads 0, not nothing.
            f"({new_or_increase(c.COMPILE_CACHE_REQUESTS, '1h', HIT)} or on ({WORKLOAD}) {lookups} * 0)"
            f" / {lookups} < {t.compile_cache_hit_ratio:g} and {lookups} >= 10",
            "The persistent compilation cache misses.",
            "Workload {{ $labels.workload }} hit the compilation cache for {{ $value | humanizePercentage }} of its "
            "look-ups in the last hour.",
            DashboardUID.JOB,
            runbook="Check that the cache directory is shared and persistent, and that JAX and its flags did not "
            "change.",
        ),
        Alert(
            AlertName.COMPILE_FAILING,
            "warning",
            f"{new_or_increase(c.COMPILE_FAILURES, '1h', by=f'{WORKLOAD}, stage, reason')} > 0",
            "A workload's programs fail to compile.",
            "Workload {{ $labels.workload }} failed to compile {{ $value }} times in the last hour, at the "
            "{{ $labels.stage }} stage, reason {{ $labels.reason }}. What to do: "
            + reason_runbook(config, COMPILE_FAILURE_REASON_ANCHOR),
            DashboardUID.ONCALL,
            runbook="A program failed to trace, lower or compile (the `stage` label); the `reason` label is one of "
            "the [Compile failure reasons](#compile-failure-reasons) below, each with what to do. Counted once per "
            "job, however many hosts compile the same program. A failed compile usually ends the job "
            f"({AlertName.WORKLOAD_FAILED}, reason compile_error) and fails again on every restart: it comes with "
            "a change of the code, of its shapes or of JAX and libtpu. Read the job's log for the error.",
        ),
    ]
