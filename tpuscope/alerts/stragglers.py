"""What a straggler costs, whether it is chronic, and why it is late: the recording rules.

In a synchronous step every worker waits at the collectives for the slowest. No sidecar can see that alone: each
sees its own worker. Prometheus sees them all, so the rules book it (:func:`straggler_rules`, each record beside
what it holds and why, in the order they read each other): each worker's wait per step, that wait beyond its
workload's least, per workload that waiting a second (the goodput category ``straggler``, carved out of productive
by :func:`tpuscope.alerts.recording.goodput_rates`), the straggler now with its cause, and the share of the last
:data:`STRAGGLER_HISTORY` each worker was the straggler: TpuscopeStraggler opens its ticket over
``straggler_chronic``, valued at :func:`cost_per_hour`.
"""

from __future__ import annotations

from tpuscope import catalog as c
from tpuscope.conventions import (
    EVALUATED,
    PROFILE_FRESH,
    SOURCE,
    STRAGGLER,
    STRAGGLER_CHIPS,
    STRAGGLER_CHRONIC,
    STRAGGLER_HISTORY,
    STRAGGLER_LAG,
    STRAGGLER_RATE,
    STRAGGLER_SHARE,
    WAIT_BEYOND_LEAST,
    WAIT_PER_STEP,
)
from tpuscope.promql import WORKLOAD, series
from tpuscope.thresholds import Thresholds

# One worker, as its sidecar's target and its placement name it: the alert names its instance and node (the bad-host
# ledger keeps a chronic straggler's node, tpuscope.alerts.nodes).
WORKER = f"{WORKLOAD}, job, instance, node, slice, worker"
# How many evaluations of the group the history holds (a subquery's steps would be the global evaluation interval,
# whatever the group's, and count the evaluations a loaded Prometheus skipped).
EVALUATIONS = f"scalar(count_over_time({EVALUATED}[{STRAGGLER_HISTORY}]))"
COMPUTE, INPUT, HOST, UNKNOWN = c.STRAGGLER_CAUSES
# A cause explains the straggler's lag when its part of the step is at least this share of the lag.
EXPLAINS = 0.5


def per_step(total: str) -> str:
    """Each worker's ``total`` (a counter of seconds) per step, over 5 minutes."""
    steps = series(c.STEP_DURATION, suffix="count")
    return f"(sum by ({WORKER}) (rate({total}[5m])) / sum by ({WORKER}) (rate({steps}[5m])))"


def phase(name: str) -> str:
    """Each worker's host-timed phase ``name`` per step, over 5 minutes."""
    return per_step(series(c.STEP_PHASE_DURATION, f'phase="{name}"', suffix="sum"))


def profiled(part: str) -> str:
    """Each worker's fresh profiled ``part`` per step (and device)."""
    return f'max by ({WORKER}) ({PROFILE_FRESH}{{part="{part}"}})'


def labelled(expr: str, label: str, value: str) -> str:
    return f'label_replace({expr}, "{label}", "{value}", "", "")'


def beyond_median(expr: str) -> str:
    """Each worker's ``expr`` less its workload's median worker's."""
    return f"({expr} - on ({WORKLOAD}) group_left () quantile by ({WORKLOAD}) (0.5, {expr}))"


def straggler_rules(t: Thresholds) -> list[dict[str, str]]:
    """The records of what a straggler costs and why, in the order they read each other."""
    host_wait = f"({phase('sync')} > 0)"
    profile_wait = f"{profiled('exposed_collective')} unless on ({WORKLOAD}) {host_wait}"
    steps_rate = f"sum by ({WORKER}) (rate({series(c.STEPS)}[5m]))"
    devices = f"max by ({WORKER}) ({series(c.WORKLOAD_DEVICES)})"
    step = per_step(series(c.STEP_DURATION, suffix="sum"))
    beyond_rate = f"{WAIT_BEYOND_LEAST} * on ({WORKER}) group_left () {steps_rate}"
    # The device compute where profiled, else host-timed (which, in a step jitted whole, holds the wait too).
    compute = f"({profiled('compute')} or {phase('compute')} unless on ({WORKLOAD}) {profiled('compute')})"
    idle_beyond_input = f"({profiled('idle')} - on ({WORKER}) ({phase('io')} or {profiled('idle')} * 0))"
    lags = " or ".join(
        labelled(beyond_median(expr), "cause", cause)
        for cause, expr in ((COMPUTE, compute), (INPUT, phase("io")), (HOST, idle_beyond_input))
    )
    now = (
        f"bottomk by ({WORKLOAD}) (1, {WAIT_PER_STEP}) and on ({WORKLOAD}) ({STRAGGLER_SHARE} > {t.straggler_share:g})"
    )
    # The peers' lag behind the straggler: the median worker's wait beyond the least (the straggler's own is 0, so
    # with one straggler the median is a peer's; a max would take the noisiest peer's).
    lag = f"quantile by ({WORKLOAD}) (0.5, {WAIT_BEYOND_LEAST})"
    explained = (
        f"topk by ({WORKLOAD}) (1, ({STRAGGLER_LAG} and on ({WORKER}) ({now}))"
        f" >= on ({WORKLOAD}) group_left () ({EXPLAINS:g} * {lag}))"
    )
    costing = f"(({now}) * 0 + on ({WORKLOAD}) group_left () {STRAGGLER_CHIPS})"
    # A worker younger than the subquery's first 5-minute step has no hour yet: its wait now stands in.
    least_now = f"min by ({WORKLOAD}) ({WAIT_PER_STEP})"
    hourly = f"avg_over_time({WAIT_PER_STEP}[{STRAGGLER_HISTORY}:5m]) or {WAIT_PER_STEP}"
    least_hour = f"min by ({WORKLOAD}) ({hourly})"
    return [
        # 1 at each evaluation of the group, where the straggler's records are: how many evaluations a window of
        # them holds, whatever the interval, the evaluations a loaded Prometheus skipped, or a backfill's sampling.
        {"record": EVALUATED, "expr": "vector(1)"},
        # Each worker's wait at the collectives per step: its host-timed ``sync`` phase where its workload times one
        # (every step, a blip too), else its profiled exposed collective time (a step jitted whole, whose
        # collectives only a device profile sees; sampled).
        {
            "record": WAIT_PER_STEP,
            "expr": f"{labelled(host_wait, SOURCE, 'host')} or {labelled(profile_wait, SOURCE, 'profile')}",
        },
        # That wait beyond its workload's least: what it waits for the slowest beyond what the workers wait for
        # each other anyway (the transfer itself, the jitter that makes a different worker last at each step and
        # averages out). The straggler, last to arrive, waits least, and its wait is the transfer's, before it
        # straggled as since. The least is the least of the workers' means over the last STRAGGLER_HISTORY, not
        # over their last 5 minutes: the least of a few noisy 5-minute means lies below them all, and booked a
        # clean job's jitter as straggler time (docs/bench.md), where an hour's means hardly differ; but never
        # below the least now, or a straggler gone (its own wait back up) would leave its peers waiting for an
        # hour. A worker's wait below the least (the jitter again) counts below zero, so that the jitter cancels.
        {
            "record": WAIT_BEYOND_LEAST,
            "expr": f"{WAIT_PER_STEP} - on ({WORKLOAD}) group_left () ({least_hour} > {least_now} or {least_now})",
        },
        # Per workload, that waiting a second: in worker-seconds (the goodput category ``straggler``), in
        # chip-seconds (chips idle, on average, for the straggler), and as a share of the workers' steps. A
        # workload's sum below zero books nothing.
        {"record": STRAGGLER_RATE, "expr": f"clamp_min(sum by ({WORKLOAD}) ({beyond_rate}), 0)"},
        {
            "record": STRAGGLER_CHIPS,
            "expr": f"clamp_min(sum by ({WORKLOAD}) ({beyond_rate} * on ({WORKER}) group_left () {devices}), 0)",
        },
        {
            "record": STRAGGLER_SHARE,
            "expr": f"sum by ({WORKLOAD}) ({WAIT_BEYOND_LEAST})"
            f" / sum by ({WORKLOAD}) ({step} and on ({WORKER}) {WAIT_BEYOND_LEAST})",
        },
        # Per worker and cause, how much longer per step than its workload's median worker it spends in what would
        # make it late: device ``compute`` (profiled, else host-timed), ``input`` (the host-timed io phase),
        # ``host`` (profiled device idle beyond what the input explains: dispatch, callbacks, a busy CPU).
        {"record": STRAGGLER_LAG, "expr": lags},
        # The straggler now: the least-waiting worker of a workload whose share is over ``straggler_share``, valued
        # at the chips its peers keep waiting, with its cause: the one of its lags that explains half its peers'
        # median lag behind it or more, the longest such, else ``unknown``.
        {
            "record": STRAGGLER,
            "expr": f"{costing} * on ({WORKER}) group_left (cause) ({explained} * 0 + 1)"
            f" or {labelled(f'{costing} unless on ({WORKLOAD}) {explained}', 'cause', UNKNOWN)}",
        },
        # The share of the last STRAGGLER_HISTORY in which each worker was the straggler, of the whole window: a
        # job younger than it, straggled from its start, is not chronic yet.
        {
            "record": STRAGGLER_CHRONIC,
            "expr": f"clamp_max(sum by ({WORKER}) (count_over_time({STRAGGLER}[{STRAGGLER_HISTORY}]))"
            f" / {EVALUATIONS}, 1)",
        },
    ]


def cost_per_hour() -> str:
    """Each worker's cost as the straggler over the last :data:`STRAGGLER_HISTORY`: its peers' chip-hours spent
    waiting for it, an hour (the chips its straggling kept idle, on average)."""
    return f"sum by ({WORKER}, {SOURCE}) (sum_over_time({STRAGGLER}[{STRAGGLER_HISTORY}])) / {EVALUATIONS}"
