"""The recording rules: what the alerts, the dashboards and the fleet simulator read precomputed.

Recording rules are named ``level:metric:operations`` (the Prometheus convention), their names in
:mod:`tpuscope.conventions`, which the dashboards and readers share: ``workload:`` aggregates a workload across its
workers, ``worker:`` and ``device:`` stay per worker and per device. What each record holds, and why, is said here,
beside its expression.

The SLO ratios over windows longer than an hour are built from recorded per-workload
5-minute rates, as Sloth and Pyrra do: a 3-day ``rate()`` of every host's raw
counters would read three days of samples of every series at each evaluation, a cost
that grows with the fleet; the recorded rates grow with the number of workloads.
"""

from __future__ import annotations

from tpuscope import catalog as c
from tpuscope import durations
from tpuscope.alerts.rules import excluded, per_workload, slo_windows, workload_on_host
from tpuscope.alerts.stragglers import labelled
from tpuscope.conventions import (
    BAD_RATE,
    BADPUT_RATIO,
    CHECKPOINT_LAST,
    COLLECTIVE_P99,
    COLLECTIVE_P99_MEDIAN,
    COLLECTIVE_P99_WORST,
    COLLECTOR_ERRORS_RATE,
    COLLECTORS_DOWN,
    COMPUTE_MEDIAN,
    COMPUTE_OVER_MEDIAN,
    COMPUTE_PER_WORKER,
    CONTROLLER,
    CONTROLLER_NEWEST,
    CONTROLLER_QUEUED,
    CONTROLLER_WANTED,
    CORE_ELSEWHERE,
    CORE_LOCATION,
    CORE_LOCATION_WORKERS,
    DOWN_FOR,
    DOWN_SINCE,
    FAILURES_HOUR,
    GOODPUT_RATE,
    HANG_ELSEWHERE,
    HANG_POSITION,
    HANG_POSITION_WORKERS,
    HOST_CPU_BUSIEST,
    HOST_IOWAIT_BUSIEST,
    HOST_MEMORY_AVAILABLE_LEAST,
    HOST_SWAP_BUSIEST,
    INGEST_RATE,
    MAJOR_FAULTS_BUSIEST,
    MEMORY_USED,
    PEAK_FLOPS_SUM,
    PHASE_SHARE,
    PROFILE_FRESH,
    PROFILE_FRESH_PERIODS,
    PROFILE_FRESH_SECONDS,
    PROFILE_MEDIAN,
    PROFILE_OVER_MEDIAN,
    PROFILE_SHARE,
    REQUESTS_FAST_RATE,
    REQUESTS_RATE,
    RESTARTS_HOUR,
    RUN_MEMORY,
    RUNNING,
    RUNNING_INFERRED,
    RUNTIME_ERROR_WORKERS,
    SERVED,
    SIDECARS_DOWN,
    SLOW_REQUESTS_RATIO,
    STEP_MEAN,
    STEP_P99,
    STEPS_RATE,
    STRAGGLER_RATE,
    UNBOOKED_RATE,
    WALL_ALL_RATE,
    WALL_RATE,
    XID_HOUR,
)
from tpuscope.generator_config import GeneratorConfig
from tpuscope.goodput import BOOKED_IN_LUMPS
from tpuscope.goodput import STRAGGLER as STRAGGLER_CATEGORY
from tpuscope.promql import PLACEMENT, RUN, WORKLOAD, add, grown, le, memory_available_ratio, series
from tpuscope.thresholds import Thresholds

WORKER = "job, instance, slice, worker"
COMPUTE = 'phase="compute"'
RAW_UP_TO = "1h"  # SLO windows up to this read the raw counters; longer ones the recorded 5m rates
COLLECTIVE_END_TO_END = 'operation="collective_end_to_end"'
SLICE = f"{PLACEMENT}, job, {c.Label.SLICE}"  # a slice's hosts, as one sidecar job scrapes them
# A worker no sidecar has served for this long, its run not ended, is down since its last step (its pod went
# with its sidecar): longer than a few failed scrapes, and Prometheus' own lookback.
DOWN_AFTER = "5m"
# The goodput SLO's bad time, a matcher on the category label: the categories booked as they happen, the job's own
# (custom badput) among them. Productive time is booked when a checkpoint covers it and other when a process ends:
# over a window with neither, counting them would read all time bad (tpuscope.goodput.BOOKED_IN_LUMPS).
BADPUT_CATEGORIES = f'category!~"{"|".join(BOOKED_IN_LUMPS)}"'


# kube-state-metrics' series (its v2 names, default resources): each namespace it lists. A controller is judged
# gone only in a namespace it lists, and one scrape it misses is no controller gone (its series looked back for
# KSM_BLIP).
KSM_NAMESPACES = "kube_namespace_created"
KSM_BLIP = "5m"
# Its series of a Job (namespace and job_name labels): that it exists, as Google's recipe for a GMP install keeps it
# (prometheus-engine examples/kube-state-metrics keeps kube_job_created, drops kube_job_info), whether it completed,
# and whether it is suspended (a queue such as Kueue holds it: its pods deleted on purpose). The last two only where
# they are scraped (docs/fleet.md): without them, a completed Job reads as wanted (its workers ended cleanly: not
# down) and a suspended one as down.
KSM_JOB_EXISTS = "kube_job_created"
KSM_JOB_COMPLETE = 'kube_job_complete{condition="true"}'
KSM_JOB_SUSPENDED = "kube_job_status_suspended"
KSM_JOB_FAILED = 'kube_job_failed{condition="true"}'  # failed for good: its backoff limit spent
# The kinds of pod controller kube-state-metrics describes, that the rules judge by it (controllers_wanted).
CONTROLLER_KINDS = ("Job", "ReplicaSet", "StatefulSet")


def recording_rules(config: GeneratorConfig) -> list[dict[str, str]]:
    return (
        step_rules()
        + profile_rules(config.thresholds)
        + unbooked_rules()
        + slo_rules(config)
        + collective_rules()
        + failure_rules()
        + collector_rules(config)
        + host_rules()
        + core_state_rules()
    )


def step_rules() -> list[dict[str, str]]:
    """Step rate and time, each phase's share, the straggler's measure, device memory."""
    step_sum = series(c.STEP_DURATION, suffix="sum")
    phase_sum = series(c.STEP_PHASE_DURATION, suffix="sum")
    compute_sum = series(c.STEP_PHASE_DURATION, COMPUTE, suffix="sum")
    compute_count = series(c.STEP_PHASE_DURATION, COMPUTE, suffix="count")
    return [
        # Steps a second: every worker counts each step of its workload, so the most of theirs, not their sum.
        {
            "record": STEPS_RATE,
            "expr": f"max by ({WORKLOAD}) (rate({series(c.STEPS)}[5m]))",
        },
        # The mean and the p99 of a step's time, over every worker's steps.
        {
            "record": STEP_MEAN,
            "expr": f"sum by ({WORKLOAD}) (rate({step_sum}[5m]))"
            f" / sum by ({WORKLOAD}) (rate({series(c.STEP_DURATION, suffix='count')}[5m]))",
        },
        {
            "record": STEP_P99,
            "expr": f"histogram_quantile(0.99, sum by ({WORKLOAD}, le)"
            f" (rate({series(c.STEP_DURATION, suffix='bucket')}[5m])))",
        },
        # Each phase's share of the workload's step time.
        {
            "record": PHASE_SHARE,
            "expr": f"sum by ({WORKLOAD}, phase) (rate({phase_sum}[5m])) / ignoring (phase) group_left"
            f" sum by ({WORKLOAD}) (rate({step_sum}[5m]))",
        },
        # Each worker's host-timed compute a step, its workload's median worker's, and each worker's over that
        # median: the straggler's measure, for the alert and for a fleet's own panels.
        {
            "record": COMPUTE_PER_WORKER,
            "expr": f"sum by ({WORKLOAD}, {WORKER}) (rate({compute_sum}[5m]))"
            f" / sum by ({WORKLOAD}, {WORKER}) (rate({compute_count}[5m]))",
        },
        {
            "record": COMPUTE_MEDIAN,
            "expr": f"quantile by ({WORKLOAD}) (0.5, {COMPUTE_PER_WORKER})",
        },
        {
            "record": COMPUTE_OVER_MEDIAN,
            "expr": f"{COMPUTE_PER_WORKER} / on ({WORKLOAD}) group_left () {COMPUTE_MEDIAN}",
        },
        # Each device's memory in use, a share of its limit.
        {
            "record": MEMORY_USED,
            "expr": f"{series(c.DEVICE_MEMORY_USED)} / {series(c.DEVICE_MEMORY_LIMIT)}",
        },
        # Per workload, its chips' peak FLOP/s: the fleet's MFU integrates it over the range, where it read every
        # host's peak at every point (docs/fleet.md).
        {"record": PEAK_FLOPS_SUM, "expr": f"sum by ({WORKLOAD}) ({series(c.PEAK_FLOPS)})"},
    ]


def profile_rules(thresholds: Thresholds) -> list[dict[str, str]]:
    """What the sampled device profiles say of each workload and worker: the measures of a fused step, whose
    host-timed phases cannot split compute from collectives.

    The profile gauges hold the mean over the steps of the worker's last few fresh captures until the next
    capture (one capture's few steps are too noisy to judge by), and linger in the sidecar of a
    finished job. A worker counts once its gauges are a mean of ``profile_min_steps`` measured steps or more (a
    sidecar too old to say how many: at once, as before), and only while its latest capture is younger than
    :data:`PROFILE_FRESH_PERIODS` of the worker's periods (a job too old to say its period:
    :data:`PROFILE_FRESH_SECONDS`) and its process is connected. The period is in the seconds the job runs by,
    which the fleet simulator does not compress (it compresses the rules' windows, and a simulated job's captures
    would come at the period it says): the simulator divides the constant window, a ``time() - seconds``, and
    never the period.
    A median of 0 (no worker waits on collectives at all) divides nothing: a ratio to it would be NaN or
    infinite, so the worker has none.
    """
    last, period = series(c.PROFILE_LAST_CAPTURE), series(c.PROFILE_PERIOD)
    # The period after the minus: fleetsim.rules.scale_expr divides a number that follows "time() - ".
    within_periods = f"{last} > time() - {period} * {PROFILE_FRESH_PERIODS}"
    within_default = f"({last} > time() - {PROFILE_FRESH_SECONDS} unless {period})"
    fresh = f"({within_periods} or {within_default}) and {series(c.WORKLOAD_PROCESSES)} > 0"
    too_few = f"{series(c.PROFILE_STEPS)} < {thresholds.profile_min_steps:g}"
    return [
        # Each part's time per worker, from the fresh captures of running workers only.
        {
            "record": PROFILE_FRESH,
            "expr": f"{series(c.PROFILE_TIME)} and on ({WORKLOAD}, {WORKER}) ({fresh})"
            f" unless on ({WORKLOAD}, {WORKER}) {too_few}",
        },
        # Each part's time of the workload's median worker.
        {
            "record": PROFILE_MEDIAN,
            "expr": f"quantile by ({WORKLOAD}, part) (0.5, {PROFILE_FRESH})",
        },
        # Each worker's part over that median: the profiled straggler's measures, far more compute than its peers,
        # far less waiting on them.
        {
            "record": PROFILE_OVER_MEDIAN,
            "expr": f"{PROFILE_FRESH} / on ({WORKLOAD}, part) group_left () ({PROFILE_MEDIAN} > 0)",
        },
        # Each part's share of the step: the mean over workers of each one's share, as a worker's parts add up to its
        # profiled step.
        {
            "record": PROFILE_SHARE,
            "expr": f"avg by ({WORKLOAD}, part) ({PROFILE_FRESH} / ignoring (part) group_left ()"
            f" ({series(c.PROFILE_STEP)} > 0))",
        },
    ]


def unbooked_rules() -> list[dict[str, str]]:
    """The wall time no sidecar booked, per worker, and since when a worker is down: what Prometheus can vouch
    for, with kube-state-metrics where it is scraped (docs/goodput.md, docs/alerts.md).

    A preemption deletes the pod, sidecar and all: from then until the next pod's sidecar sees the job start
    again, nobody books the workload's downtime. Prometheus still holds the worker's series: a worker seen in
    the last :data:`RUN_MEMORY` that has not ended cleanly (its end time later than its last step or start)
    runs on, a second a second for each process it last had (:data:`RUNNING_INFERRED`). kube-state-metrics
    corrects that guess both ways (:data:`RUNNING`): a worker whose pod's controller is gone (a JobSet deleted,
    a Deployment scaled to zero) ended on purpose; one not seen for longer, whose controller still wants its
    pods, is down still (its pods Pending). While no sidecar serves the worker, all of its time is unbooked;
    while one does, or while its sidecar's target is listed but cannot be scraped (:data:`SERVED`), none (the
    rule records 0, so a window's sum counts the time it was served too).
    """
    wall, end, last = series(c.GOODPUT_WALL), series(c.WORKLOAD_END_TIME), series(c.LAST_STEP)

    def latest(selector: str, by: str = RUN) -> str:
        return f"max by ({by}) (last_over_time({selector}[{RUN_MEMORY}]))"

    placed = f"{RUN}, {CONTROLLER}"  # a worker and the controller of its pod (absent outside Kubernetes)
    seen = f"count by ({placed}) (last_over_time({wall}[{RUN_MEMORY}]))"
    processes = f"({latest(series(c.WORKLOAD_PROCESSES), by=placed)} or {seen} * 0 + 1)"
    ended = f"{latest(end)} >= on ({RUN}) {latest(last)}"
    # Gone on kube-state-metrics' word only: a controller of a kind it describes, in a namespace it lists, that it
    # no longer says wants its pods. A kind it does not describe (a JAXJob, a RayCluster) is inferred as before.
    known = f'{RUNNING_INFERRED}{{controller_kind=~"{"|".join(CONTROLLER_KINDS)}"}}'
    listed = f"group by (namespace) (last_over_time({KSM_NAMESPACES}[{KSM_BLIP}]))"
    unwanted = f"unless on (namespace, {CONTROLLER}) {CONTROLLER_WANTED} and on (namespace) {listed}"
    # Or gone because its controller's pods run another workload since: a JobSet deleted and applied again under
    # its name with its workload renamed has Jobs of the same names (JobSet derives them), which want their pods.
    newest = f"max_over_time({CONTROLLER_NEWEST}[{RUN_MEMORY}])"
    superseded = f"{newest} < on (namespace, {CONTROLLER}) group_left () max by (namespace, {CONTROLLER}) ({newest})"
    gone = f"{known} {unwanted} or {known} and on (namespace, {CONTROLLER}, workload) {superseded}"
    # Only a Job's workers are remembered: a Job that wants its pods wants every worker of it. A ReplicaSet or
    # StatefulSet scaled down still wants some replicas, not the one that went. Remembered while kube-state-metrics
    # says its Job wants its pods, and through an outage of kube-state-metrics itself (its namespace listed in the
    # last RUN_MEMORY, not now): no false all-clear, and no second page when it returns.
    unseen = (
        f'last_over_time({RUNNING}{{controller_kind="{CONTROLLER_KINDS[0]}"}}[{RUN_MEMORY}])'
        f" unless on ({RUN}) {seen} unless on (namespace, {CONTROLLER}, workload) {superseded}"
    )
    listed_lately = f"group by (namespace) (last_over_time({KSM_NAMESPACES}[{RUN_MEMORY}]))"
    remembered = (
        f"{unseen} and on (namespace, {CONTROLLER}) {CONTROLLER_WANTED}"
        f" or ({unseen} unless on (namespace) {listed}) and on (namespace) {listed_lately}"
    )
    target = "on (job, instance)"  # the scrape target of the sidecar that served the worker
    # A pod kube-state-metrics says is not ready (its node dead, the pod being deleted) is not merely unscraped.
    not_ready = 'kube_pod_status_ready{condition="true"} == 0'
    unscraped = f"{target} up == 0 unless on (namespace, pod) {not_ready}"
    per_target = f"{RUN}, job, instance, pod"  # a sidecar target, and its pod for kube-state-metrics
    served = (
        f"group by ({per_target}) ({wall})"
        # listed but not scraped: a failed scrape, a NetworkPolicy; the pod is there. Remembered as long as that
        # lasts, beyond the hour its series are looked back for.
        f" or (group by ({per_target}) (last_over_time({wall}[{RUN_MEMORY}]))"
        f" or last_over_time({SERVED}[{DOWN_AFTER}])) and {unscraped}"
    )
    # Not listed yet or any more: Prometheus just started, or the pod just went. Its time is unbooked at once, but
    # it is down only after DOWN_AFTER (a restarted Prometheus has not scraped yet; no page for that).
    unlisted_lately = f"group by ({RUN}) (last_over_time({wall}[{DOWN_AFTER}]) unless {target} up)"
    # A worker whose run goes on and that nobody serves: a second a second for each process it last had, one at
    # least (a job whose processes all failed, expired by its sidecar, is down still). Once per worker, whatever
    # controllers its pods had in the hour.
    running = f"max by ({RUN}) ({RUNNING})"
    # Down since its last step, or since a queue last held its Job (resumed, its pods not served yet): the time
    # it waited in the queue was no outage.
    since = f"({latest(last)} or last_over_time({DOWN_SINCE}[{RUN_MEMORY}]))"
    queued = f"max by ({RUN}) ({RUNNING} * 0 + on (namespace, {CONTROLLER}) group_left () {CONTROLLER_QUEUED})"
    return [
        # Per controller of a sidecar's pod, 1 while it still wants its pods (:func:`controllers_wanted`): a deleted
        # JobSet's Jobs, a Deployment scaled to zero have no series.
        {"record": CONTROLLER_WANTED, "expr": controllers_wanted()},
        # Per Job, the last time a queue (Kueue) held it suspended, remembered for RUN_MEMORY after, as its workers
        # are: a resumed Job's workers are down from then, not from their last step before it (the wait in the
        # queue was no outage).
        {
            "record": CONTROLLER_QUEUED,
            "expr": f"max by (namespace, {CONTROLLER}) ({job_named(f'{recent(KSM_JOB_SUSPENDED)} == 1')} * 0 + time())"
            f" or last_over_time({CONTROLLER_QUEUED}[{RUN_MEMORY}]) > time() - {durations.parse(RUN_MEMORY):g}",
        },
        # Per controller and workload, the last step (or start) any of its workers had in the last RUN_MEMORY: a
        # Job's pods that run a newer workload than a worker's (a JobSet applied again, its workload renamed) leave
        # that worker gone. A worker's last step is its last sighting; over RUN_MEMORY here, and RUN_MEMORY more
        # where it is read.
        {
            "record": CONTROLLER_NEWEST,
            "expr": f"max by (namespace, {CONTROLLER}, workload) (last_over_time({last}[{RUN_MEMORY}]))",
        },
        # Per worker seen in the last RUN_MEMORY whose run has not ended cleanly, the processes it last had: what
        # Prometheus alone infers. Recorded once for the rules below: its hour-long look-backs are the costly part.
        {
            "record": RUNNING_INFERRED,
            "expr": f"{processes} unless on ({RUN}) {ended}",
        },
        # Per worker whose run goes on: RUNNING_INFERRED, less the workers whose controller kube-state-metrics says
        # is gone, plus the workers not seen for longer than RUN_MEMORY whose controller still wants its pods
        # (Pending). It reads its own past: a Job's worker kube-state-metrics vouches for is remembered as long as
        # it does.
        {
            "record": RUNNING,
            "expr": f"({RUNNING_INFERRED} unless on ({placed}) ({gone})) or ({remembered})",
        },
        # Per worker, 1 while a sidecar serves it, or while its sidecar's target is listed but not scraped (up == 0,
        # a NetworkPolicy, an overloaded Prometheus): what cannot be seen is not counted down.
        {"record": SERVED, "expr": served},
        # Per worker, the wall time no sidecar booked, a second a second while none serves it (its pod went,
        # sidecar and all), else 0.
        {
            "record": UNBOOKED_RATE,
            "expr": f"(clamp_min({running}, 1) unless on ({RUN}) {SERVED}) or {running} * 0",
        },
        # Per worker, since when it has been down: as its sidecar says, or, gone with its pod, since its last step
        # (or start), remembered.
        {
            "record": DOWN_SINCE,
            "expr": f"max by ({RUN}) ({series(c.WORKLOAD_DOWN_SINCE)})"
            f" or (({queued} > on ({RUN}) {since}) or {since})"
            f" unless on ({RUN}) {SERVED} unless on ({RUN}) {unlisted_lately} and on ({RUN}) {RUNNING}",
        },
        # Per workload, how long it has been down, since its first worker went: what keeps the goodput burn quiet
        # over the outage TpuscopeWorkloadDown paged for.
        {"record": DOWN_FOR, "expr": down_for()},
        # Per workload, its latest good checkpoint, remembered through its restarts while it runs on: a restarted
        # job's new sidecars have no save yet.
        {
            "record": CHECKPOINT_LAST,
            "expr": f"max by ({WORKLOAD}) ({series(c.CHECKPOINT_LAST_SUCCESS)}) or last_over_time({CHECKPOINT_LAST}"
            f"[{RUN_MEMORY}]) and on ({WORKLOAD}) group by ({WORKLOAD}) ({RUNNING})",
        },
    ]


def renamed(selector: str, kind: str, label: str) -> str:
    """kube-state-metrics' series of a controller of ``kind``, labelled as the sidecars' targets name their pod's."""
    named = f'label_replace({selector}, "controller", "$1", "{label}", "(.+)")'
    return f'label_replace({named}, "controller_kind", "{kind}", "", "")'


def named(selector: str, kind: str, label: str = "job_name") -> str:
    """Each controller of ``kind`` that ``selector`` picks, once, labelled as the sidecars' targets name it."""
    return f"group by (namespace, {CONTROLLER}) ({renamed(selector, kind, label)})"


def job_named(selector: str) -> str:
    """A Job's series, its values kept, labelled as the sidecars' targets name their pod's controller."""
    return renamed(selector, CONTROLLER_KINDS[0], "job_name")


def recent(metric: str) -> str:
    """A series of kube-state-metrics as it was in the last :data:`KSM_BLIP`: one missed scrape is no change."""
    return f"last_over_time({metric}[{KSM_BLIP}])"


def jobs_suspended(window: str) -> str:
    """The Jobs kube-state-metrics said were suspended at some time in ``window``, as controllers."""
    return named(f"max_over_time({KSM_JOB_SUSPENDED}[{window}]) == 1", CONTROLLER_KINDS[0])


def down_for() -> str:
    """How long each workload has been down, since its first worker went: TpuscopeWorkloadDown reads it as it is
    now (a record of it lags an evaluation), the goodput burn recorded (:data:`DOWN_FOR`)."""
    return f"time() - min by ({WORKLOAD}) ({DOWN_SINCE})"


def controllers_wanted() -> str:
    """Each controller of pods that still wants them, as kube-state-metrics says, labelled as the sidecars'
    targets name their pod's controller (namespace, controller_kind, controller): a Job that exists and has not
    completed (a JobSet's Jobs, which it deletes with itself; a Job that failed for good is wanted still, its
    workload down until someone deletes it), a ReplicaSet (a Deployment's) or a StatefulSet of one replica or
    more. Each series is looked back for :data:`KSM_BLIP`: one missed scrape is no controller gone."""

    job, replicaset, statefulset = CONTROLLER_KINDS
    completed = f"{recent(KSM_JOB_COMPLETE)} == 1"
    suspended = f"{recent(KSM_JOB_SUSPENDED)} == 1"
    return " or ".join(
        (
            named(
                f"({recent(KSM_JOB_EXISTS)} unless on (namespace, job_name) ({completed} or {suspended}))",
                job,
            ),
            named(f"{recent('kube_replicaset_spec_replicas')} > 0", replicaset, "replicaset"),
            named(f"{recent('kube_statefulset_replicas')} > 0", statefulset, "statefulset"),
        )
    )


def slo_rules(config: GeneratorConfig) -> list[dict[str, str]]:
    """The SLO ratios the burn-rate alerts read, one per window, and the 5-minute rates they sum."""
    within, total = latency_requests(config)
    unbooked = f"sum by ({WORKLOAD}) ({UNBOOKED_RATE})"
    bad = f"sum by ({WORKLOAD}) ({GOODPUT_RATE}{{{BADPUT_CATEGORIES}}})"
    rules = [
        *goodput_rates(),
        # Per workload, the wall time its sidecars booked, a second a second.
        {"record": WALL_RATE, "expr": per_workload("rate", series(c.GOODPUT_WALL), "5m")},
        # The goodput SLO's two terms, each workload's once, a second a second: its wall time, booked or not, and
        # its bad time, the badput booked as it happens and the wall time no sidecar booked. The ratio of each
        # window reads these, not the per-worker series they sum (docs/bench.md). A bad rate of 0 where nothing bad
        # was booked, so that every window has both. Neither term is recorded for what an exclusion window covers
        # (tpuscope.alerts.exclusion): the ratios over every window read the rest of their time.
        {"record": WALL_ALL_RATE, "expr": excluded(add(WALL_RATE, unbooked, on=WORKLOAD))},
        {"record": BAD_RATE, "expr": excluded(f"{add(bad, unbooked, on=WORKLOAD)} or {WALL_ALL_RATE} * 0")},
        # Per workload, the requests answered within the latency SLO's threshold, and all of them, a second: what
        # its ratios over windows longer than RAW_UP_TO sum.
        {"record": REQUESTS_FAST_RATE, "expr": per_workload("rate", within, "5m")},
        {"record": REQUESTS_RATE, "expr": per_workload("rate", total, "5m")},
    ]
    return rules + slo_ratios(config, slow=False)


def goodput_rates() -> list[dict[str, str]]:
    """Each workload's goodput by category, a second a second: the sidecars' categories, with two corrections only
    the rules can make. ``straggler`` (its workers' wait for a straggler beyond what they wait for each other, which
    only the rules see, :mod:`tpuscope.alerts.stragglers`) is carved out of productive; so is what the workload's
    restores threw away (``tpuscope_goodput_rolled_back_seconds_total``: productive seconds booked for steps a
    rollback repeats), which goes to lost. The categories still add up to the wall time. Productive is booked when
    durable, the straggler's wait as it happens and a rollback at the restore: they add up over a window that holds
    them (docs/goodput.md); a 5-minute rate of productive reads below zero at a rollback of more than it booked."""
    by = f"{WORKLOAD}, category"
    others = per_workload("rate", series(c.GOODPUT, 'category!~"productive|lost"'), "5m", by=by)
    productive = per_workload("rate", series(c.GOODPUT, 'category="productive"'), "5m", by=by)
    lost = per_workload("rate", series(c.GOODPUT, 'category="lost"'), "5m", by=by)
    rolled_back = per_workload("rate", series(c.GOODPUT_ROLLED_BACK), "5m")
    straggler = labelled(STRAGGLER_RATE, "category", STRAGGLER_CATEGORY)

    def minus(a: str, b: str) -> str:
        return f"({a} - on ({WORKLOAD}) group_left () {b} or {a})"

    carved = minus(minus(productive, STRAGGLER_RATE), rolled_back)
    lost_and_rolled_back = f"({lost} + on ({WORKLOAD}) group_left () {rolled_back} or {lost})"
    return [{"record": GOODPUT_RATE, "expr": f"{others} or {carved} or {lost_and_rolled_back} or {straggler}"}]


def latency_requests(config: GeneratorConfig) -> tuple[str, str]:
    """The latency SLO's counters: the requests answered within its threshold, and all of them."""
    fast = f'le="{le(config.thresholds.inference_latency_seconds)}"'
    return series(c.INFERENCE_REQUEST_DURATION, fast, suffix="bucket"), series(
        c.INFERENCE_REQUEST_DURATION, suffix="count"
    )


def slo_ratios(config: GeneratorConfig, slow: bool) -> list[dict[str, str]]:
    """Each SLO's bad share over each window its own burn rates read: those pages read (``slow`` False), or those
    only tickets read (True: a day and more, in a group of their own at :data:`tpuscope.alerts.rules.SLOW_INTERVAL`).

    Sums, not averages, of the 5-minute rates: a category that began mid-window counts 0 before. Goodput sums its
    two recorded terms in every window, the time no sidecar booked (unbooked_rules: downtime, bad and wall time) in
    both; the latency SLO reads the raw counters up to RAW_UP_TO, more exact."""
    t = config.thresholds
    within, total = latency_requests(config)
    rules = []
    for window in slo_windows(1 - t.goodput_objective, slow):
        bad, wall = (f"sum_over_time({rate}[{window}])" for rate in (BAD_RATE, WALL_ALL_RATE))
        rules.append({"record": f"{BADPUT_RATIO}{window}", "expr": f"{bad} / {wall}"})
    for window in slo_windows(1 - t.inference_latency_objective, slow):
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
        # Each worker's p99 over 5 minutes of its collective_end_to_end operation: what
        # TpuscopeCollectiveLatencySpike compares with its own past, and what the on-call board draws (a quantile
        # of the raw buckets over a day would read every host's every bucket at each point: docs/fleet.md).
        {
            "record": COLLECTIVE_P99,
            "expr": f"histogram_quantile(0.99, sum by ({PLACEMENT}, {WORKER}, le) (rate({buckets}[5m])))",
        },
        # Per slice, its worst host's p99 and its median host's: the on-call board's hosts at any fleet size.
        {"record": COLLECTIVE_P99_WORST, "expr": f"max by ({SLICE}) ({COLLECTIVE_P99})"},
        {"record": COLLECTIVE_P99_MEDIAN, "expr": f"quantile by ({SLICE}) (0.5, {COLLECTIVE_P99})"},
    ]


def failure_rules() -> list[dict[str, str]]:
    """Each worker's failures (and restarts) of the last hour, by reason: the counter's growth summed over the
    worker's successive sidecars (a restarted pod is a new sidecar, its counters born at 1). Recorded once for the
    two alerts and the boards that read them, which would otherwise read every sidecar's counters over the hour at
    each evaluation, and at each point of a board. And each GPU's XID errors of the last hour, for the same reason."""
    per_gpu = f"{PLACEMENT}, {WORKER}, accelerator, device, xid"

    def last_hour(counter: c.Metric) -> str:
        return f"sum by ({RUN}, reason) ({grown(series(counter), '1h')})"

    return [
        # Per worker and reason: what TpuscopeWorkloadFailed and TpuscopeWorkloadCrashLooping read.
        {"record": FAILURES_HOUR, "expr": last_hour(c.WORKLOAD_FAILURES)},
        # Its twin for restarts: what the on-call board's sliding hour reads.
        {"record": RESTARTS_HOUR, "expr": last_hour(c.WORKLOAD_RESTARTS)},
        # Per GPU and XID code: what the on-call board's sliding hour reads.
        {"record": XID_HOUR, "expr": f"sum by ({per_gpu}) ({grown(series(c.XID_ERRORS), '1h')})"},
    ]


def collector_rules(config: GeneratorConfig) -> list[dict[str, str]]:
    """The sidecars' own health, for the on-call board at any range without reading every host's series at each
    point. Every series is kept, zeros too: a board that draws 0 has looked and found nothing wrong, where an absent
    one has not."""
    per_slice = f"{SLICE}, {c.Label.COLLECTOR}, {c.Label.REASON}"
    return [
        # Per slice, collector and reason, the collector errors a second: which collector fails where, and why. Job
        # debug keeps the per-host breakdown of one workload's hosts.
        {"record": COLLECTOR_ERRORS_RATE, "expr": f"sum by ({per_slice}) (rate({series(c.COLLECTOR_ERRORS)}[5m]))"},
        # Per slice and collector, how many hosts' latest collection failed.
        {
            "record": COLLECTORS_DOWN,
            "expr": f"sum by ({SLICE}, {c.Label.COLLECTOR}) (1 - {series(c.COLLECTOR_UP)})",
        },
        # Per slice and result, the events the sidecars received a second.
        {"record": INGEST_RATE, "expr": f"sum by ({SLICE}, {c.Label.RESULT}) (rate({series(c.INGEST_EVENTS)}[5m]))"},
        # Per scrape job of sidecars, how many of its targets Prometheus could not scrape.
        {"record": SIDECARS_DOWN, "expr": f'sum by ({PLACEMENT}, job) (1 - up{{job=~"{config.exporter_job}"}})'},
    ]


def host_rules() -> list[dict[str, str]]:
    """Per slice, the worst of its hosts now: the busiest CPU and iowait, the least memory available, the most swap
    and the job's major page faults a second. The on-call board reads the fleet through them at any range and fleet
    size, where per host it read every host's series at each point and drew a thousand lines no one reads; Job
    debug draws one workload's hosts, and the alerts name the host."""
    host = f"{SLICE}, instance"
    available = memory_available_ratio(host)
    swap = f"sum by ({host}, {c.Label.DIRECTION}) (rate({series(c.HOST_SWAP_IO)}[5m]))"
    faults = f"sum by ({host}) (rate({series(c.JOB_MAJOR_PAGE_FAULTS)}[5m]))"
    return [
        {"record": HOST_CPU_BUSIEST, "expr": f"max by ({SLICE}) (avg by ({host}) ({series(c.HOST_CPU_UTILIZATION)}))"},
        {"record": HOST_IOWAIT_BUSIEST, "expr": f"max by ({SLICE}) ({series(c.HOST_CPU_IOWAIT)})"},
        {"record": HOST_MEMORY_AVAILABLE_LEAST, "expr": f"min by ({SLICE}) ({available})"},
        {"record": HOST_SWAP_BUSIEST, "expr": f"max by ({SLICE}, {c.Label.DIRECTION}) ({swap})"},
        {"record": MAJOR_FAULTS_BUSIEST, "expr": f"max by ({SLICE}) ({faults})"},
    ]


def core_state_rules() -> list[dict[str, str]]:
    """Which worker of a stalled workload has its TPU cores somewhere else than its peers', and on which the TPU
    runtime's own detectors report a megascale hang or a slice error: each sidecar serves its
    cores' program and HLO location while a workload on its host stalls (the runtime's series carry no workload
    label: the workload running on the host is theirs). A location is a program fingerprint and an HLO location;
    the workers at the location most of them are at are the majority, and a worker with cores anywhere else is
    named, with how long its cores have been there. A tie names nobody (two against two says nothing), and so
    does a workload whose workers are all at one place."""
    located = (
        f"{series(c.CORE_LOCATION_AGE)} * on (job, instance, device, core) group_left (fingerprint, hlo_location)"
        f" {series(c.CORE_STATE)} * on (job, instance) group_left ({c.Label.WORKLOAD}) {workload_on_host()}"
    )
    location = "fingerprint, hlo_location"
    most = f"max by ({WORKLOAD}) ({CORE_LOCATION_WORKERS})"
    detected = f"{series(c.TPU_RUNTIME_ERROR)} == 1"
    return [
        # Each worker's cores at each location, the longest any has been there.
        {"record": CORE_LOCATION, "expr": f"max by ({RUN}, instance, {location}) ({located})"},
        # The workers at each location.
        {"record": CORE_LOCATION_WORKERS, "expr": f"count by ({WORKLOAD}, {location}) ({CORE_LOCATION})"},
        # The workers whose cores sit where the most workers' do not, likely the one a hung job waits for: what
        # TpuscopeWorkloadStalled's description names.
        {
            "record": CORE_ELSEWHERE,
            "expr": f"{CORE_LOCATION} unless on ({WORKLOAD}, {location})"
            f" ({CORE_LOCATION_WORKERS} == on ({WORKLOAD}) group_left () {most})",
        },
        # The workers on whose hosts the runtime's own detectors report a megascale hang or a slice error (the
        # gauges behind GKE's MegascaleHangDetected and SliceErrorDetected node conditions), whatever the stall:
        # libtpu sees a megascale hang before tpuscope's threshold does, and a slice error says why the job
        # stopped. The stall names them too.
        {
            "record": RUNTIME_ERROR_WORKERS,
            "expr": f"max by ({RUN}, instance, reason)"
            f" (({detected}) * on (job, instance) group_left ({c.Label.WORKLOAD}) {workload_on_host()})",
        },
    ]


def hang_rules() -> list[dict[str, str]]:
    """Which worker of a hung workload is stuck elsewhere than its peers: each sidecar serves its processes'
    positions once they have stayed past their limit and their stacks are logged, a step, a phase and
    the top Python frames each. A worker's position is its step and phase (the frames are kept to name it, not
    compared: two workers waiting at one collective may wait on different lines); the workers at the position
    most of them share are the majority, and a worker stuck anywhere else is named. A tie names nobody (two
    against two says nothing), and so does a workload whose workers are all at one place: as
    :func:`tpuscope.positions.elsewhere` decides it from the sidecars' logs.

    Evaluated in the alerts' group, ahead of them (:func:`tpuscope.alerts.rule_groups`): a group evaluates its
    rules in order, so TpuscopeWorkloadHung, which fires at once, names the worker from the positions of the very
    evaluation it fires at. From the recording group, a record may be an evaluation older than the alert: its
    first notification would name nobody, or the wrong place, until the next."""
    position = f"{c.Label.STEP}, {c.Label.PHASE}"
    most = f"max by ({WORKLOAD}) ({HANG_POSITION_WORKERS})"
    return [
        # Each worker's stuck positions, with their top Python frames.
        {
            "record": HANG_POSITION,
            "expr": f"max by ({RUN}, instance, {position}, {c.Label.FRAMES}) ({series(c.STUCK_POSITION)})",
        },
        # The workers at each position, each worker once, whatever its processes' frames there.
        {
            "record": HANG_POSITION_WORKERS,
            "expr": f"count by ({WORKLOAD}, {position}) (group by ({RUN}, {position}) ({HANG_POSITION}))",
        },
        # The workers stuck where the most workers are not, likely the one a hung job waits for: what
        # TpuscopeWorkloadHung names.
        {
            "record": HANG_ELSEWHERE,
            "expr": f"{HANG_POSITION} unless on ({WORKLOAD}, {position})"
            f" ({HANG_POSITION_WORKERS} == on ({WORKLOAD}) group_left () {most})",
        },
    ]
