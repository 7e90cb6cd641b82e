"""The recording rules: what the alerts, the dashboards and the fleet simulator read precomputed.

Recording rules are named ``level:metric:operations`` (the Prometheus convention), their names in
:mod:`tpuscope.conventions`: ``workload:`` aggregates a workload across its workers, ``worker:`` and
``device:`` stay per worker and per device.

The SLO ratios over windows longer than an hour are built from recorded per-workload
5-minute rates, as Sloth and Pyrra do: a 3-day ``rate()`` of every host's raw
counters would read 17,280 samples a series at each evaluation, a cost that
grows with the fleet; the recorded rates grow with the number of workloads.
"""

from __future__ import annotations

from tpuscope import catalog as c
from tpuscope import durations
from tpuscope.alerts.rules import per_workload, slo_windows
from tpuscope.conventions import (
    BADPUT_CATEGORIES,
    BADPUT_RATIO,
    COMPUTE_MEDIAN,
    COMPUTE_OVER_MEDIAN,
    COMPUTE_PER_WORKER,
    DOWN_AFTER,
    DOWN_SINCE,
    GOODPUT_RATE,
    MEMORY_USED,
    PHASE_SHARE,
    PROFILE_FRESH,
    PROFILE_MEDIAN,
    PROFILE_OVER_MEDIAN,
    PROFILE_SHARE,
    REQUESTS_FAST_RATE,
    REQUESTS_RATE,
    RUN_MEMORY,
    RUNNING,
    SLOW_REQUESTS_RATIO,
    STEP_MEAN,
    STEP_P99,
    STEPS_RATE,
    UNBOOKED_RATE,
    WALL_RATE,
)
from tpuscope.generator_config import GeneratorConfig
from tpuscope.promql import add, le, series

WORKER = "job, instance, slice, worker"
COMPUTE = 'phase="compute"'
RAW_UP_TO = "1h"  # SLO windows up to this read the raw counters; longer ones the recorded 5m rates
# A worker's device profile counts this long after the sidecar received it: three of the job's default periods
# (tpuscope.tracing.profiles.DEFAULT_PERIOD, which this room may not import; a test ties the two), so one
# busy or failed capture does not drop a worker, and a worker that stopped capturing drops out.
PROFILE_FRESH_SECONDS = 1800
# The multislice runtime's collective latency (its collective_end_to_end operation), the p99 over 5 minutes of
# each worker: what TpuscopeCollectiveLatencySpike compares with its own 6 hours before (a quantile of the raw
# buckets over so long a window would read every host's every bucket and scrape at each evaluation). The alerts
# alone read it.
COLLECTIVE_P99 = f"worker:{c.MEGASCALE_LATENCY.name}:collective_p99_5m"
COLLECTIVE_END_TO_END = 'operation="collective_end_to_end"'


# One worker of a workload: its sidecars come and go with its pods, the worker stays.
RUN = "workload, slice, worker"


def recording_rules(config: GeneratorConfig) -> list[dict[str, str]]:
    return step_rules() + profile_rules() + unbooked_rules() + slo_rules(config) + collective_rules()


def step_rules() -> list[dict[str, str]]:
    """Step rate and time, each phase's share, the straggler's measure, device memory."""
    step_sum = series(c.STEP_DURATION, suffix="sum")
    phase_sum = series(c.STEP_PHASE_DURATION, suffix="sum")
    compute_sum = series(c.STEP_PHASE_DURATION, COMPUTE, suffix="sum")
    compute_count = series(c.STEP_PHASE_DURATION, COMPUTE, suffix="count")
    return [
        {
            "record": STEPS_RATE,
            "expr": f"max by (workload) (rate({series(c.STEPS)}[5m]))",
        },
        {
            "record": STEP_MEAN,
            "expr": f"sum by (workload) (rate({step_sum}[5m]))"
            f" / sum by (workload) (rate({series(c.STEP_DURATION, suffix='count')}[5m]))",
        },
        {
            "record": STEP_P99,
            "expr": "histogram_quantile(0.99, sum by (workload, le)"
            f" (rate({series(c.STEP_DURATION, suffix='bucket')}[5m])))",
        },
        {
            "record": PHASE_SHARE,
            "expr": f"sum by (workload, phase) (rate({phase_sum}[5m])) / ignoring (phase) group_left"
            f" sum by (workload) (rate({step_sum}[5m]))",
        },
        {
            "record": COMPUTE_PER_WORKER,
            "expr": f"sum by (workload, {WORKER}) (rate({compute_sum}[5m]))"
            f" / sum by (workload, {WORKER}) (rate({compute_count}[5m]))",
        },
        {
            "record": COMPUTE_MEDIAN,
            "expr": f"quantile by (workload) (0.5, {COMPUTE_PER_WORKER})",
        },
        {  # the straggler's measure, for the alert and for a fleet's own panels
            "record": COMPUTE_OVER_MEDIAN,
            "expr": f"{COMPUTE_PER_WORKER} / on (workload) group_left () {COMPUTE_MEDIAN}",
        },
        {
            "record": MEMORY_USED,
            "expr": f"{series(c.DEVICE_MEMORY_USED)} / {series(c.DEVICE_MEMORY_LIMIT)}",
        },
    ]


def profile_rules() -> list[dict[str, str]]:
    """What the sampled device profiles say of each workload and worker: the measures of a fused step, whose
    host-timed phases cannot split compute from collectives (issue 22).

    The profile gauges hold the latest capture until the next, and linger in the sidecar of a finished job:
    only a capture younger than :data:`PROFILE_FRESH_SECONDS` of a worker whose process is connected counts.
    A median of 0 (no worker waits on collectives at all) divides nothing: a ratio to it would be NaN or
    infinite, so the worker has none.
    """
    fresh = (
        f"{series(c.PROFILE_LAST_CAPTURE)} > time() - {PROFILE_FRESH_SECONDS} and {series(c.WORKLOAD_PROCESSES)} > 0"
    )
    return [
        {
            "record": PROFILE_FRESH,
            "expr": f"{series(c.PROFILE_TIME)} and on (workload, {WORKER}) ({fresh})",
        },
        {
            "record": PROFILE_MEDIAN,
            "expr": f"quantile by (workload, part) (0.5, {PROFILE_FRESH})",
        },
        {  # the profiled straggler's measures: far more compute than its peers, far less waiting on them
            "record": PROFILE_OVER_MEDIAN,
            "expr": f"{PROFILE_FRESH} / on (workload, part) group_left () ({PROFILE_MEDIAN} > 0)",
        },
        {  # the mean over workers of each one's share: a worker's parts add up to its profiled step
            "record": PROFILE_SHARE,
            "expr": f"avg by (workload, part) ({PROFILE_FRESH} / ignoring (part) group_left ()"
            f" ({series(c.PROFILE_STEP)} > 0))",
        },
    ]


def unbooked_rules() -> list[dict[str, str]]:
    """The wall time no sidecar booked, per worker, and since when a worker is down: what Prometheus alone can
    vouch for (docs/goodput.md).

    A preemption deletes the pod, sidecar and all: from then until the next pod's sidecar sees the job start
    again, nobody books the workload's downtime. Prometheus still holds the worker's series: a worker seen in
    the last :data:`RUN_MEMORY` that has not ended cleanly (its end time later than its last step or start)
    runs on, a second a second for each process it last had. While no sidecar serves it, all of that is
    unbooked; while one does, none (the rule records 0, so a window's sum counts the time it was served too).
    """
    wall, end, last = series(c.GOODPUT_WALL), series(c.WORKLOAD_END_TIME), series(c.LAST_STEP)

    def latest(selector: str) -> str:
        return f"max by ({RUN}) (last_over_time({selector}[{RUN_MEMORY}]))"

    seen = f"count by ({RUN}) (last_over_time({wall}[{RUN_MEMORY}]))"
    processes = f"({latest(series(c.WORKLOAD_PROCESSES))} or {seen} * 0 + 1)"
    served = f"count by ({RUN}) ({wall})"  # a sidecar serves the worker now
    # Served lately: one failed scrape (stale series) is not a pod gone.
    lately = f"count by ({RUN}) (last_over_time({wall}[{DOWN_AFTER}]))"
    return [
        {  # recorded once for the two rules below: its hour-long look-backs are the costly part
            "record": RUNNING,
            "expr": f"{processes} unless on ({RUN}) {latest(end)} >= on ({RUN}) {latest(last)}",
        },
        {"record": UNBOOKED_RATE, "expr": f"({RUNNING} unless on ({RUN}) {served}) or {RUNNING} * 0"},
        {  # down: as its sidecar says, or, gone with its pod, since its last step (or start)
            "record": DOWN_SINCE,
            "expr": f"max by ({RUN}) ({series(c.WORKLOAD_DOWN_SINCE)})"
            f" or ({latest(last)} unless on ({RUN}) {lately} and on ({RUN}) {RUNNING})",
        },
    ]


def slo_rules(config: GeneratorConfig) -> list[dict[str, str]]:
    """The SLO ratios the burn-rate alerts read, one per window, and the 5-minute rates they sum."""
    slow = f'le="{le(config.thresholds.inference_latency_seconds)}"'
    within = series(c.INFERENCE_REQUEST_DURATION, slow, suffix="bucket")
    total = series(c.INFERENCE_REQUEST_DURATION, suffix="count")
    rules = [
        {"record": GOODPUT_RATE, "expr": per_workload("rate", series(c.GOODPUT), "5m", by="workload, category")},
        {"record": WALL_RATE, "expr": per_workload("rate", series(c.GOODPUT_WALL), "5m")},
        {"record": REQUESTS_FAST_RATE, "expr": per_workload("rate", within, "5m")},
        {"record": REQUESTS_RATE, "expr": per_workload("rate", total, "5m")},
    ]
    t = config.thresholds
    # Sums, not averages, of the 5-minute rates: a category that began mid-window counts 0 before. Goodput sums
    # them in every window, the time no sidecar booked (unbooked_rules: downtime, bad and wall time) being a
    # rule's alone; the latency SLO reads the raw counters up to RAW_UP_TO, more exact. Each SLO's ratio is
    # recorded over the windows its own burn rates read.
    for window in slo_windows(1 - t.goodput_objective):
        unbooked = per_workload("sum_over_time", UNBOOKED_RATE, window)
        bad = add(per_workload("sum_over_time", f"{GOODPUT_RATE}{{{BADPUT_CATEGORIES}}}", window), unbooked)
        wall = add(per_workload("sum_over_time", WALL_RATE, window), unbooked)
        rules.append({"record": f"{BADPUT_RATIO}{window}", "expr": f"{bad} / {wall}"})
    for window in slo_windows(1 - t.inference_latency_objective):
        if durations.parse(window) <= durations.parse(RAW_UP_TO):
            fast, requests = per_workload("rate", within, window), per_workload("rate", total, window)
        else:
            fast = per_workload("sum_over_time", REQUESTS_FAST_RATE, window)
            requests = per_workload("sum_over_time", REQUESTS_RATE, window)
        rules.append({"record": f"{SLOW_REQUESTS_RATIO}{window}", "expr": f"1 - {fast} / {requests}"})
    return rules


def collective_rules() -> list[dict[str, str]]:
    """The multislice runtime's collective latency per worker, the p99 of all its buffer sizes: the runtime serves
    it on the hosts of a multislice job (no workload label: the job on the host is the runtime's)."""
    buckets = series(c.MEGASCALE_LATENCY, COLLECTIVE_END_TO_END, suffix="bucket")
    return [
        {
            "record": COLLECTIVE_P99,
            "expr": f"histogram_quantile(0.99, sum by ({WORKER}, le) (rate({buckets}[5m])))",
        },
    ]
