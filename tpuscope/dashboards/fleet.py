"""Fleet overview: is the fleet's money turning into training?

For the platform owner and the SRE looking across every job: how busy the chips
are, how much of the wall time is goodput against its objective, what a step
costs, and how often jobs fail and restart.
"""

from __future__ import annotations

from typing import Any

from tpuscope import catalog as c
from tpuscope.conventions import (
    BAD_RATE,
    CHIPS_ALLOCATABLE,
    CHIPS_HEARD,
    CHIPS_IDLE,
    CHIPS_REQUESTED,
    FAILURES_HOUR,
    GOODPUT_RATE,
    HOST_EVIDENCE,
    HOST_SUSPECT,
    ML_PRODUCTIVITY_GOODPUT,
    NODE_TOPOLOGY,
    NODE_WINDOWS,
    PEAK_FLOPS_SUM,
    PLATFORM_WINDOWS,
    PROGRAM_GOODPUT,
    QUEUE_ADMISSION_WAIT,
    RESTARTS_HOUR,
    RUNTIME_GOODPUT,
    SCHEDULING,
    SCHEDULING_GOODPUT,
    SLO_PERIOD,
    STRAGGLER_CHIPS,
    STRAGGLER_RATE,
    WALL_ALL_RATE,
    WALL_RATE,
    AlertName,
    DashboardUID,
    node_record,
    platform_record,
)
from tpuscope.dashboards import panels as p
from tpuscope.dashboards import queries as q
from tpuscope.thresholds import Thresholds

TITLE = "tpuscope / Fleet overview"
DESCRIPTION = "Every workload and chip: utilization, goodput against its objective, cost per step, failures."

PRICE = f"${q.PRICE}"
CHIPS = f"count ({q.selector(c.DUTY_CYCLE)})"


def mfu() -> str:
    """Model FLOPs done over the range over the peak FLOPs the chips could have done in the same time.

    Each sidecar reports its own host's FLOPs and peak (the job's process on that host, its devices), so
    summing a workload's workers gives the job's. The peak is integrated over the range (a subquery, one
    point per panel interval) from the recorded per-workload sum, not read now: a workload that started or ended
    within the range is weighed for the time it ran, and the fleet's figure is the workloads' MFUs weighted by their
    peak FLOP-seconds (two workloads at 50% read 50%, whatever their sizes). Only workloads reporting both halves
    count. Per workload, as the peak is recorded: the slice and worker variables do not apply.
    """
    workloads = f'workload=~"${q.WORKLOAD}"'
    flops = f"sum by (workload) (increase({c.MODEL_FLOPS.name}{{{workloads}}}[{q.RANGE}]))"
    peak = f"sum by (workload) ({PEAK_FLOPS_SUM}{{{workloads}}})"
    peak_flops = f"sum_over_time(({peak})[{q.RANGE}:{q.INTERVAL}]) * {q.SECONDS[q.INTERVAL]}"
    return f"sum ({flops} and on (workload) {peak_flops}) / sum ({peak_flops} and on (workload) {flops})"


def goodput_ratio(by: str = "", window: str = q.RANGE) -> str:
    """Productive share of wall time over ``window``, less the workers' wait for stragglers (the rules' category
    ``straggler``, carved out of productive: docs/goodput.md)."""
    per = f" by ({by})" if by else ""
    productive = f"sum{per} ({q.increase(c.GOODPUT, q.eq('category', 'productive'), window=window)})"
    straggled = q.recorded_total(STRAGGLER_RATE, by or "workload", window)
    carved = f"({productive} - ({f'sum ({straggled})' if not by else straggled} or {productive} * 0))"
    return f"{carved} / sum{per} ({q.increase(c.GOODPUT_WALL, window=window)})"


def goodput_ratio_hour(by: str) -> str:
    """Productive share of wall time over the last hour, per ``by`` (workload at least), from the recording rules."""
    productive = q.recorded_hour(GOODPUT_RATE, q.eq("category", "productive"), by=by)
    return f"{productive} / {q.recorded_hour(WALL_RATE, by=by)}"


def now(t: Thresholds) -> p.Section:
    # The fleet now: instant queries, one sample a chip. Drawn over the range, each point read every chip in the
    # fleet (8,000 series at 1,000 hosts: 9.5 s over 24 h) for a sparkline nobody reads.
    return p.Section(
        "The fleet now",
        [
            p.stat_panel(
                "Chips",
                "Accelerator chips the collectors see on the selected hosts (TPU chips from the runtime, GPUs "
                "from NVML), whether or not a job uses them.",
                "short",
                p.query(CHIPS, instant=True),
                span=3,
            ),
            p.stat_panel(
                "Duty cycle, mean",
                f"Mean share of time the chips were busy. Below {t.duty_cycle_low:.0%} the fleet pays for idle "
                "chips: find the idle hosts on the on-call dashboard, or the input-bound jobs on Job debug.",
                "percentunit",
                p.query(f"avg ({q.selector(c.DUTY_CYCLE)})", instant=True),
                limits=p.low_is_bad(t.duty_cycle_low),
                span=3,
            ),
            p.stat_panel(
                "Duty cycle, p95",
                "The 95th percentile of the chips' duty cycle: what the busiest chips reach. A high p95 with a "
                "low mean is a fleet with some jobs well tuned and many idle chips.",
                "percentunit",
                p.query(f"quantile (0.95, {q.selector(c.DUTY_CYCLE)})", instant=True),
                limits=p.low_is_bad(t.duty_cycle_low),
                span=3,
            ),
            p.stat_panel(
                "Model FLOPs utilization",
                "Model FLOPs the selected workloads did over the range, over what their chips' peak could have "
                "done while they ran: each workload's MFU over the range, weighted by its chips' peak. Below "
                f"{t.mfu_low:.0%} the chips are busy with something other than the model's math (or waiting): "
                "compare duty cycle with MFU per workload. Per workload (the peak from the recording rules): the "
                "slice and worker variables do not apply.",
                "percentunit",
                p.query(mfu(), instant=True),
                limits=p.low_is_bad(t.mfu_low),
                span=3,
            ),
            p.stat_panel(
                "Goodput",
                f"Productive share of the workloads' wall time over the range; the objective is "
                f"{t.goodput_objective:.0%}. Badput by category below says where the rest went.",
                "percentunit",
                p.query(goodput_ratio(), instant=True),
                limits=p.low_is_bad(t.goodput_objective),
                span=3,
            ),
            p.stat_panel(
                "Active workloads",
                f"Workloads that completed a step in the last {t.stall_seconds:g} s.",
                "short",
                p.query(f"count ({q.age(c.LAST_STEP)} < {t.stall_seconds:g}) or vector(0)", instant=True),
                span=3,
            ),
            p.stat_panel(
                "Spend per hour",
                "The chips the collectors see times the price per chip-hour (the dashboard variable): what the "
                "selected hosts cost while they run, busy or not.",
                "currencyUSD",
                p.query(f"{PRICE} * {CHIPS}", instant=True),
                span=3,
            ),
            p.stat_panel(
                "Failures over the range",
                "Workload failures (crashes, errors the job reported) across the selected workloads, each "
                "counted once per job however many hosts report it. Each one costs the work since its last "
                "checkpoint and a restart.",
                "short",
                p.query(f"sum ({q.once_per_job(c.WORKLOAD_FAILURES, window=q.RANGE)})", instant=True),
                limits=p.high_is_bad(1),
                span=3,
            ),
        ],
    )


def goodput(t: Thresholds) -> p.Section:
    badput = q.recorded_hour(GOODPUT_RATE, q.ne("category", "productive"), by="category")
    # The goodput SLO's two terms as the alerts read them: the time no sidecar booked (a pod gone, sidecar and
    # all) is downtime, bad and wall time, in both.
    bad = q.slo_period_sum(BAD_RATE, by="workload")
    wall = q.slo_period_sum(WALL_ALL_RATE, by="workload")
    budget_left = f"1 - ({bad} / {wall}) / {1 - t.goodput_objective:g}"
    return p.Section(
        "Goodput and its objective",
        [
            p.timeseries_panel(
                "Goodput, by workload",
                f"Productive share of each workload's wall time over the last hour. Step time becomes productive "
                "when a checkpoint covers it (work lost to a failure never does), so shorter windows swing with "
                f"each checkpoint. The dashed line is the objective ({t.goodput_objective:.0%}); a workload below "
                "it is wasting its chips: see Badput by category and the workload's Job debug dashboard. From the "
                "recording rules' 5-minute rates of each workload: the slice and worker variables do not apply.",
                "percentunit",
                p.query(goodput_ratio_hour("workload"), "{{workload}}"),
                limits=p.low_is_bad(t.goodput_objective),
                max_value=1,
            ),
            p.timeseries_panel(
                "Badput by category",
                "The fleet's wall time over the last hour that was not productive training, as a share of all "
                "wall time: compile, io_wait (input-bound steps), checkpoint, init (start to first step), lost "
                "(work redone after failures), downtime (from a failure to the next start) and other (the rest "
                "of a process's time, booked when it ends). The largest band is where the fleet's money goes "
                "first. From the recording rules' 5-minute rates of each workload: the slice and worker "
                "variables do not apply.",
                "percentunit",
                p.query(
                    q.share(badput, q.recorded_hour(WALL_RATE), ignoring="category"),
                    "{{category}}",
                ),
                stacked=True,
            ),
            p.bar_gauge_panel(
                "Chip-hours lost to stragglers, by workload",
                "The chip-hours each workload's workers spent over the dashboard's range waiting at the "
                "collectives for a straggler, beyond what they wait for each other: the goodput category "
                "`straggler`, in chips (docs/goodput.md). A workload with a chronic straggler reads high here and "
                f"in {AlertName.STRAGGLER}; its Job debug dashboard names the worker and the cause.",
                "none",
                p.query(f"{q.recorded_total(STRAGGLER_CHIPS, 'workload')} / 3600", "{{workload}}", instant=True),
            ),
            p.bar_gauge_panel(
                "Goodput objective: compliance over the range",
                f"Each workload's goodput over the dashboard's range against the {t.goodput_objective:.0%} "
                "objective: red below it.",
                "percentunit",
                p.query(goodput_ratio("workload"), "{{workload}}", instant=True),
                limits=p.low_is_bad(t.goodput_objective),
                max_value=1,
            ),
            p.bar_gauge_panel(
                "Goodput objective: error budget left",
                f"The share of the badput budget ({1 - t.goodput_objective:.0%} of wall time) each workload has "
                f"left over the last {SLO_PERIOD} (the SLO's period, whatever the dashboard's range: the "
                "burn-rate alerts assume it); below zero the objective is missed. Spend it on deliberate work "
                "(new compiles, experiments), not on restarts. Read from the recording rules' 5-minute rates.",
                "percentunit",
                p.query(budget_left, "{{workload}}", instant=True),
                limits=p.low_is_bad(0, 0.25),
                min_value=-1,
                max_value=1,
            ),
        ],
    )


def cost() -> p.Section:
    # Chip-seconds: each worker's chips times its wall time (all goodput categories: the job was up).
    wall = f"sum by (job, instance, workload) ({q.increase(c.GOODPUT_WALL, window=q.RANGE)})"
    chip_seconds = f"sum by (workload) ({q.selector(c.WORKLOAD_DEVICES)} * on (job, instance, workload) {wall})"
    steps = f"max by (workload) ({q.increase(c.STEPS, window=q.RANGE)})"
    devices = f"sum by (workload) ({q.selector(c.WORKLOAD_DEVICES)})"
    badput_share = f"(1 - ({goodput_ratio_hour('workload')}))"
    return p.Section(
        "Cost",
        [
            p.bar_gauge_panel(
                "Cost per step, by workload",
                "What a step cost over the range: the chip-hours the workload's workers held while they ran "
                "(chips times wall time, compile, checkpoints and stalls included) at the price per chip-hour, "
                "over the steps completed. Badput makes it rise.",
                "currencyUSD",
                p.query(f"{PRICE} * {chip_seconds} / 3600 / {steps}", "{{workload}}", instant=True),
            ),
            p.timeseries_panel(
                "Spend on badput per hour, by workload",
                "What the non-productive share of each workload's wall time (over the last hour) costs per hour "
                "at the chip-hour price: the money a fix to that workload's badput would save.",
                "currencyUSD",
                p.query(f"{PRICE} * {devices} * {badput_share}", "{{workload}}"),
            ),
        ],
    )


def scheduling_goodput(window: str = q.RANGE) -> str:
    """The share of the scheduling units' time (JobSets, Jobs of their own) over ``window`` during which every pod
    they want was ready, from kube-state-metrics (tpuscope.alerts.platform); a unit counts for the time it existed."""
    ready = f'{SCHEDULING}{{state="ready"}}'
    return f"sum (sum_over_time({ready}[{window}])) / sum (count_over_time({ready}[{window}]))"


def platform(t: Thresholds) -> p.Section:
    day = PLATFORM_WINDOWS[0]
    factors = {
        "Scheduling": platform_record("workload", SCHEDULING_GOODPUT, day),
        "Runtime": platform_record("workload", RUNTIME_GOODPUT, day),
        "Program": platform_record("workload", PROGRAM_GOODPUT, day),
        "Product": platform_record("workload", ML_PRODUCTIVITY_GOODPUT, day),
    }
    workloads = f'{{workload=~"${q.WORKLOAD}"}}'
    not_ready = f'{SCHEDULING}{{state!="ready"}}'
    last_day = (
        f"over the last {day} (recorded), the mean of the selected workloads' (a workload's scheduling is its "
        "JobSet's or Job's; docs/goodput.md)."
    )
    return p.Section(
        "ML productivity goodput: scheduling x runtime x program",
        [
            p.stat_panel(
                "Scheduling goodput of every JobSet",
                "The share of the time of every JobSet (and Job of its own) of the cluster over the range, since "
                "each was created, during which every pod it wants was ready: the time it waited in a queue, for "
                "nodes, for its pods to start, and to recover from a lost pod is not (kube-state-metrics; "
                "docs/goodput.md). The cluster's, whether tpuscope serves its workloads or not: the workload "
                "variable does not apply.",
                "percentunit",
                p.query(scheduling_goodput(), instant=True),
                span=4,
            ),
            *(
                p.stat_panel(
                    f"{factor} goodput, last {day}" if factor != "Product" else f"ML productivity goodput, last {day}",
                    f"{what} {last_day}",
                    "percentunit",
                    p.query(f"avg ({factors[factor]}{workloads})", instant=True),
                    span=2,
                )
                for factor, what in (
                    ("Scheduling", "The share of the time every pod was ready,"),
                    ("Runtime", "Productive share of the wall time the sidecars booked,"),
                    ("Program", "Model FLOPs over the chips' peak (MFU),"),
                    (
                        "Product",
                        "The three multiplied (Google's ML Productivity Goodput): the share of what the chips could "
                        "have done, while the job wanted them, that became model progress,",
                    ),
                )
            ),
            p.table_panel(
                f"The three factors and their product, by workload, over the last {day}",
                f"Each workload's scheduling goodput (its JobSet's), runtime goodput and program goodput over the "
                f"last {day}, and their product, as the recording rules keep them (per namespace too: "
                f"{platform_record('namespace', ML_PRODUCTIVITY_GOODPUT, day)}). Sort by the product to find the "
                "workloads that turn the least of their chips into training, and read which factor does it.",
                *(p.query(f"{record}{workloads}", table=True) for record in factors.values()),
                unit="percentunit",
                columns=tuple(factors),
                sort_by="Product",
            ),
            p.bar_gauge_panel(
                "Scheduling badput over the range, by JobSet and state",
                "Where each JobSet's (or Job's) time went while not every pod it wants was ready: queued (a queue "
                "such as Kueue held it suspended), starting (never all ready yet: scheduling, image pulls, start-up) "
                "or recovering (all ready before, not now: a lost pod's replacement). A share of its time over the "
                "range.",
                "percentunit",
                p.query(
                    f"avg_over_time({not_ready}[{q.RANGE}]) > 0", "{{namespace}}/{{controller}} {{state}}", instant=True
                ),
                max_value=1,
            ),
            p.timeseries_panel(
                "Kueue's admission wait, by ClusterQueue",
                "The mean time a workload waited to be admitted over the last hour, per ClusterQueue, from Kueue's "
                "own histogram (it names no workload: each JobSet's own wait is its queued share above). Empty "
                "where Kueue is not scraped.",
                "s",
                p.query(QUEUE_ADMISSION_WAIT, "{{cluster_queue}}"),
            ),
        ],
    )


def chips() -> p.Section:
    pools = {
        "Chips": CHIPS_ALLOCATABLE,
        "Requested by running pods": CHIPS_REQUESTED,
        "Reporting to tpuscope": CHIPS_HEARD,
        "Idle": CHIPS_IDLE,
    }
    pool_legend = "label_cloud_google_com_gke_nodepool, label_cloud_google_com_gke_tpu_topology, resource"
    return p.Section(
        "Chips the fleet pays for",
        [
            p.stat_panel(
                "Chips the cluster has",
                "TPU chips and GPUs the cluster's nodes offer (their allocatable google.com/tpu and nvidia.com/gpu, "
                "from kube-state-metrics), whether or not a pod holds them.",
                "short",
                p.query(f"sum ({CHIPS_ALLOCATABLE})", instant=True),
                span=3,
            ),
            p.stat_panel(
                "Requested by running pods",
                "Chips that running pods request: what the cluster's jobs hold.",
                "short",
                p.query(f"sum ({CHIPS_REQUESTED}) or vector(0)", instant=True),
                span=3,
            ),
            p.stat_panel(
                "Reporting to tpuscope",
                "Chips on the cluster's nodes that tpuscope's collectors report: a held chip that does not "
                "report is a job without a sidecar, invisible to every other panel here.",
                "short",
                p.query(f"sum ({CHIPS_HEARD}) or vector(0)", instant=True),
                span=3,
            ),
            p.stat_panel(
                "Idle chips: cost per hour",
                "Chips no running pod requests, at the price per chip-hour (the dashboard variable): what the "
                "fleet pays for nothing, whatever goodput its jobs report. The table below says which node pools.",
                "currencyUSD",
                p.query(f"{PRICE} * sum ({CHIPS_IDLE})", instant=True),
                limits=p.high_is_bad(0.001),
                span=3,
            ),
            p.table_panel(
                "Chips by node pool: held, reporting, idle",
                "Per node pool (GKE's node labels, which kube-state-metrics serves only when allowlisted: "
                "docs/fleet.md) and resource: the chips its nodes offer, those running pods request, those "
                "tpuscope hears from, and the idle ones. A pool with chips and no pod is paid for and idle.",
                *(p.query(f"sum by ({pool_legend}) ({record})", table=True) for record in pools.values()),
                columns=tuple(pools),
            ),
        ],
    )


def failures() -> p.Section:
    return p.Section(
        "Failures and restarts",
        [
            p.timeseries_panel(
                "Failures per hour, by workload and reason",
                "Workload failures in each hour (a point counts the hour before it), by the reason the job gave, "
                "each counted once per job however many hosts report it, from the recorded hour the alerts read. "
                "A repeating reason is a bug or a bad host, not bad luck.",
                "short",
                p.query(q.hour_once_per_job(FAILURES_HOUR), "{{workload}} {{reason}}"),
                min_interval=q.HOUR,
            ),
            p.timeseries_panel(
                "Restarts per hour, by workload and reason",
                "Workload restarts (preemptions, resumptions after a crash) in each hour (a point counts the hour "
                "before it), each counted once per job however many hosts report it. Each costs init time, compile "
                "time (less with a warm compilation cache) and the work since the last checkpoint.",
                "short",
                p.query(q.hour_once_per_job(RESTARTS_HOUR), "{{workload}} {{reason}}"),
                min_interval=q.HOUR,
            ),
        ],
    )


def suspect_nodes() -> p.Section:
    """The bad-host ledger (tpuscope.alerts.nodes): the nodes that keep breaking jobs, their evidence, and where they
    are."""
    week = NODE_WINDOWS[-1]
    suspect, evidence = node_record(HOST_SUSPECT, week), node_record(HOST_EVIDENCE, week)
    suspects = f"max by (node, basis) ({suspect})"
    placed = f"{suspects} * on (node) group_left (topology_block, topology_subblock, topology_host) {NODE_TOPOLOGY}"
    in_block = f"max by (node) ({suspect}) * on (node) group_left (topology_block, topology_subblock) {NODE_TOPOLOGY}"
    return p.Section(
        "Suspect nodes",
        [
            p.table_panel(
                f"Suspect nodes, last {week}",
                f"Nodes whose hardware keeps breaking the jobs that land on them ({AlertName.NODE_SUSPECT}'s, by the "
                "basis of the suspicion: two workloads or more left evidence there, one workload's process failed "
                "first there twice while it ran elsewhere unharmed, or an XID of the hardware's), with their GKE "
                "topology where the nodes have it. The value: the workloads, the first failures or the evidence rows. "
                "Cordon them (docs/alerts.md).",
                p.query(f"{placed} or on (node, basis) {suspects}", table=True),
                span=12,
            ),
            p.table_panel(
                f"Evidence on the suspect nodes, last {week}",
                "Each suspect node's evidence, by workload and kind: crash (its process failed first, alone), "
                "straggler (its worker was the chronic straggler), diverged_first (its worker went non-finite "
                "first), throttled (a GPU held its clocks down), xid (an XID of the hardware's). The workloads it "
                "hurt; evidence a workload left on two nodes or more counts nowhere (it moves with the job).",
                p.query(f"{evidence} and on (node) {suspect}", table=True),
                span=12,
            ),
            p.bar_gauge_panel(
                "Suspect nodes by block and sub-block",
                "How many suspect nodes share each GKE topology block and sub-block (from the scrape's node labels, "
                "or kube-state-metrics' where they are allowlisted): several in one place point at the rack, its "
                "power or its network, not the hosts.",
                "short",
                p.query(
                    f"count by (topology_block, topology_subblock) ({in_block})",
                    "{{topology_block}} {{topology_subblock}}",
                    instant=True,
                ),
            ),
        ],
    )


def dashboard(t: Thresholds) -> dict[str, Any]:
    sections = [now(t), goodput(t), cost(), failures(), platform(t), chips(), suspect_nodes()]
    return p.build(DashboardUID.FLEET, TITLE, DESCRIPTION, sections, p.variables(c.STEPS, price=True))
