"""The names that cross a boundary between tpuscope's parts, defined once.

As the kubernetes-mixin's ``config.libsonnet``: the sidecar's port, which the Kubernetes
manifests, the CLI's defaults and the docs share; the alert names, which the rules, the
Alertmanager routing, the dashboards and the readers share; the dashboards' UIDs, which the
dashboards and the alerts' links share; the recording rules' names, which the alerts and the fleet
simulator read. What a team may change (thresholds, webhooks, links) is in
:mod:`tpuscope.generator_config` instead.
"""

from __future__ import annotations

import enum
import re

from tpuscope import catalog as c
from tpuscope.goodput import BOOKED_IN_LUMPS

# The sidecar's /metrics port: tpuscope's entry in Prometheus' default port allocations wiki page.
DEFAULT_PORT = 9478

# The collector that reads the TPU runtime's metrics service. The training process serves it (libtpu runs
# inside the job), so on a host with no job it has nothing to read, and that is no fault.
LIBTPU_COLLECTOR = c.LIBTPU
# The sidecar's container in the pods tpuscope's manifests write (an init container with restartPolicy Always).
SIDECAR_CONTAINER = "tpuscope"

ALERT_PREFIX = "Tpuscope"
# Every alert of tpuscope's rules, and nothing else, matches this: routing an Alertmanager shared with
# other teams, and the dashboards' and readers' view of "our" alerts.
OUR_ALERTS = f"{ALERT_PREFIX}.+"


class AlertName(enum.StrEnum):
    """Every alert of the generated rules (tpuscope/alerts/), by area."""

    # training
    WORKLOAD_STALLED = f"{ALERT_PREFIX}WorkloadStalled"
    WORKLOAD_HUNG = f"{ALERT_PREFIX}WorkloadHung"
    STEP_TIME_REGRESSION = f"{ALERT_PREFIX}StepTimeRegression"
    INPUT_BOUND = f"{ALERT_PREFIX}InputBound"
    SYNC_BOUND = f"{ALERT_PREFIX}SyncBound"
    STRAGGLER = f"{ALERT_PREFIX}Straggler"
    LOW_DUTY_CYCLE = f"{ALERT_PREFIX}LowDutyCycle"
    LOW_MFU = f"{ALERT_PREFIX}LowMFU"
    WORKLOAD_FAILED = f"{ALERT_PREFIX}WorkloadFailed"
    WORKLOAD_DOWN = f"{ALERT_PREFIX}WorkloadDown"
    WORKLOAD_CRASH_LOOPING = f"{ALERT_PREFIX}WorkloadCrashLooping"
    COLLECTIVE_LATENCY_SPIKE = f"{ALERT_PREFIX}CollectiveLatencySpike"
    # compile and memory
    COMPILE_TIME_HIGH = f"{ALERT_PREFIX}CompileTimeHigh"
    RECOMPILING = f"{ALERT_PREFIX}Recompiling"
    COMPILE_CACHE_HIT_RATIO_LOW = f"{ALERT_PREFIX}CompileCacheHitRatioLow"
    COMPILE_FAILING = f"{ALERT_PREFIX}CompileFailing"
    MEMORY_SPILL = f"{ALERT_PREFIX}MemorySpill"
    DEVICE_MEMORY_NEAR_LIMIT = f"{ALERT_PREFIX}DeviceMemoryNearLimit"
    # checkpoints
    CHECKPOINT_FAILING = f"{ALERT_PREFIX}CheckpointFailing"
    CHECKPOINT_STALE = f"{ALERT_PREFIX}CheckpointStale"
    CHECKPOINT_MISSING = f"{ALERT_PREFIX}CheckpointMissing"
    CHECKPOINT_TIME_HIGH = f"{ALERT_PREFIX}CheckpointTimeHigh"
    # SLOs
    GOODPUT_BUDGET_BURN = f"{ALERT_PREFIX}GoodputBudgetBurn"
    INFERENCE_LATENCY_BUDGET_BURN = f"{ALERT_PREFIX}InferenceLatencyBudgetBurn"
    # the monitoring itself, and the host
    COLLECTOR_DOWN = f"{ALERT_PREFIX}CollectorDown"
    EXPORTER_DOWN = f"{ALERT_PREFIX}ExporterDown"
    EXPORTER_ABSENT = f"{ALERT_PREFIX}ExporterAbsent"
    INGEST_LOSING_EVENTS = f"{ALERT_PREFIX}IngestLosingEvents"
    HOST_CPU_SATURATED = f"{ALERT_PREFIX}HostCPUSaturated"
    HOST_MEMORY_PRESSURE = f"{ALERT_PREFIX}HostMemoryPressure"
    DEVICE_THROTTLED = f"{ALERT_PREFIX}DeviceThrottled"
    # serving
    MODEL_STALE = f"{ALERT_PREFIX}ModelStale"
    # training health: the job's own numbers
    LOSS_NON_FINITE = f"{ALERT_PREFIX}LossNonFinite"
    NON_FINITE_FIRST_WORKER = f"{ALERT_PREFIX}NonFiniteFirstWorker"
    LOSS_SPIKE = f"{ALERT_PREFIX}LossSpike"
    # the fleet's hosts, across jobs
    NODE_SUSPECT = f"{ALERT_PREFIX}NodeSuspect"


class DashboardUID(enum.StrEnum):
    """Each generated dashboard's UID, which is also its file's name (``deploy/grafana/UID.json``)."""

    FLEET = "tpuscope-fleet"
    ONCALL = "tpuscope-oncall"
    JOB = "tpuscope-job"
    SERVING = "tpuscope-serving"


# Recording rules (``level:metric:operations``, the metric's name from the catalogue) that the alerts,
# the dashboards or the fleet simulator read.
STEPS_RATE = f"workload:{c.STEPS.base_name}:rate5m"
STEP_MEAN = f"workload:{c.STEP_DURATION.name}:mean5m"
STEP_P99 = f"workload:{c.STEP_DURATION.name}:p99_5m"
PHASE_SHARE = f"workload_phase:{c.STEP_PHASE_DURATION.name}:share5m"
COMPUTE_PER_WORKER = f"worker:{c.STEP_PHASE_DURATION.name}:compute_mean5m"
COMPUTE_MEDIAN = f"workload:{c.STEP_PHASE_DURATION.name}:compute_median5m"
COMPUTE_OVER_MEDIAN = f"worker:{c.STEP_PHASE_DURATION.name}:compute_over_median5m"
# Where a measure comes from, a label of the alerts and records that have two: the workload's fresh device
# profiles, or the phases the job times on the host (tpuscope.alerts.recording.profile_rules).
SOURCE = "source"
# What a straggler costs (issue 55, tpuscope.alerts.stragglers): each worker's wait at the collectives per step (its
# host-timed sync phase where its workload times one, else its profiled exposed collective), that wait beyond its
# workload's least-waiting worker's over the last STRAGGLER_HISTORY, and per workload the waiting beyond the least a
# second (worker-seconds, the goodput category "straggler"; chip-seconds, which are chips idle), and as a share of the
# workers' steps.
WAIT_PER_STEP = "worker:tpuscope_collective_wait_seconds:per_step"
WAIT_BEYOND_LEAST = "worker:tpuscope_collective_wait_seconds:beyond_least"
STRAGGLER_RATE = "workload:tpuscope_straggler_wait_seconds:rate5m"
STRAGGLER_CHIPS = "workload:tpuscope_straggler_wait_chip_seconds:rate5m"
STRAGGLER_SHARE = "workload:tpuscope_straggler_wait_seconds:share"
# Per worker and cause, how much longer per step than its workload's median worker it spends in what would make it
# late: device compute, the input phase, the device idle the input does not explain (the host).
STRAGGLER_LAG = "worker_cause:tpuscope_straggler_lag_seconds:per_step"
# The straggler now (the least-waiting worker of a workload whose share is over straggler_share), with its cause,
# valued at the chips its peers keep waiting; and the share of the last STRAGGLER_HISTORY it was the straggler.
STRAGGLER = "worker_cause:tpuscope_straggler_wait_chip_seconds:rate5m"
STRAGGLER_HISTORY = "1h"
STRAGGLER_CHRONIC = f"worker:tpuscope_straggler:ratio{STRAGGLER_HISTORY}"
# 1 at each evaluation of the alerts group, where the straggler's records are: how many evaluations a window of
# them holds, whatever the interval, the evaluations a loaded Prometheus skipped, or a backfill's sampling.
EVALUATED = "group:tpuscope_rule_evaluations:one"
MEMORY_USED = f"device:{c.DEVICE_MEMORY_USED.name}:ratio_limit"
# Per workload, its chips' peak FLOP/s: the fleet's MFU integrates it over the range, where it read every host's
# peak at every point (2.1 s over 24 h of 1,000 hosts).
PEAK_FLOPS_SUM = f"workload:{c.PEAK_FLOPS.name}:sum"
# From the sampled device profiles (issue 22), fresh captures of running workers only: each part's time per
# worker, its median over the workload, each worker's over that median, and each part's share of the step.
PROFILE_FRESH = f"worker_part:{c.PROFILE_TIME.name}:fresh"
PROFILE_MEDIAN = f"workload_part:{c.PROFILE_TIME.name}:median"
# The multislice runtime's collective latency (its collective_end_to_end operation), the p99 over 5 minutes of
# each worker: what TpuscopeCollectiveLatencySpike compares with its own 6 hours before, and what the on-call
# board draws (a quantile of the raw buckets over a day would read every host's every bucket at each sample:
# about 200 M samples at 1,000 hosts, docs/fleet.md).
COLLECTIVE_P99 = f"worker:{c.MEGASCALE_LATENCY.name}:collective_p99_5m"
# Where a stalled workload's TPU cores are (its sidecars ask the runtime once it stalls, issue 39): each worker's
# cores at each program and HLO location (the longest any has been there), the workers at each location, and the
# workers whose cores sit where the most workers' do not, likely the one a hung job waits for: what
# TpuscopeWorkloadStalled's description names.
CORE_LOCATION = f"worker_location:{c.CORE_LOCATION_AGE.name}:max"
CORE_LOCATION_WORKERS = f"workload_location:{c.CORE_STATE.name}:workers"
CORE_ELSEWHERE = f"worker_location:{c.CORE_LOCATION_AGE.name}:elsewhere"
# Where a hung workload's processes are stuck (each sidecar serves its own once past their limit, issue 54): each
# worker's stuck position (step, phase and top Python frames), the workers at each (step, phase), and the workers
# whose position the most workers' is not, likely the one a hung job waits for: what TpuscopeWorkloadHung names.
HANG_POSITION = f"worker_position:{c.STUCK_POSITION.name}:max"
HANG_POSITION_WORKERS = f"workload_position:{c.STUCK_POSITION.name}:workers"
HANG_ELSEWHERE = f"worker_position:{c.STUCK_POSITION.name}:elsewhere"
# The workers of a workload on whose hosts the TPU runtime's own detector reports a megascale hang or a slice error
# (the gauges behind GKE's MegascaleHangDetected and SliceErrorDetected node conditions): the stall names them too.
RUNTIME_ERROR_WORKERS = f"worker_reason:{c.TPU_RUNTIME_ERROR.name}:detected"
PROFILE_OVER_MEDIAN = f"worker_part:{c.PROFILE_TIME.name}:over_median"
PROFILE_SHARE = f"workload_part:{c.PROFILE_TIME.name}:share"
# A worker's device profile counts for this many of the periods its job says it captures at
# (tpuscope_profile_period_seconds) after the sidecar received it, so that one busy or failed capture does not
# drop a worker, and a worker that stopped capturing drops out. The sidecar averages the captures it received
# within as long (catalog.PROFILE_MEAN_CAPTURES of them), the rules judge the gauges as long: one window for both.
PROFILE_FRESH_PERIODS = 3
# ...and, from a job too old to say its period, this long: three of the default periods
# (tpuscope.tracing.profiles.DEFAULT_PERIOD, which the generators and the sidecar may not import; a test ties
# the two).
PROFILE_FRESH_SECONDS = 1800
GOODPUT_RATE = f"workload_category:{c.GOODPUT.base_name}:rate5m"
WALL_RATE = f"workload:{c.GOODPUT_WALL.base_name}:rate5m"
# Per workload, the goodput SLO's two terms, each once: its bad time (the badput booked as it happens and the
# wall time no sidecar booked) and its wall time (booked or not), a second a second. The ratio of each window
# reads these, not the per-worker series they sum (issue 35: 5x fewer samples).
BAD_RATE = f"workload:{c.GOODPUT.base_name}_bad:rate5m"
WALL_ALL_RATE = f"workload:{c.GOODPUT_WALL.base_name}_with_unbooked:rate5m"
# Per worker (workload, slice, worker), the wall time no sidecar booked, a second a second while none serves it:
# its pod went, sidecar and all.
UNBOOKED_RATE = f"worker:{c.GOODPUT_WALL.base_name}_unbooked:rate"
# How long Prometheus remembers a worker nothing serves any more (its pod gone, sidecar and all): the sidecar's
# default --workload-expiry, after which the sidecar forgets a workload too.
RUN_MEMORY = "1h"
# A worker no sidecar has served for this long, its run not ended, is down since its last step (its pod went
# with its sidecar): longer than a few failed scrapes, and Prometheus' own lookback.
DOWN_AFTER = "5m"
# Per worker seen in the last RUN_MEMORY whose run has not ended cleanly: the processes it last had. What
# Prometheus alone infers; RUNNING corrects it where kube-state-metrics is scraped.
RUNNING_INFERRED = f"worker:{c.WORKLOAD_PROCESSES.name}:running_inferred"
# Per Kubernetes controller of a sidecar's pod (the target labels CONTROLLER), 1 while it still wants its pods,
# as kube-state-metrics says: a Job that exists and has not finished, a ReplicaSet or StatefulSet of one
# replica or more. A deleted JobSet's Jobs, a Deployment scaled to zero: no series.
CONTROLLER_WANTED = f"namespace_controller:{c.WORKLOAD_PROCESSES.name}:wanted"
CONTROLLER = "controller_kind, controller"
# Per Job, the last time kube-state-metrics said a queue (Kueue) held it suspended: a resumed Job's workers are down
# from then, not from their last step before it (the wait in the queue was no outage).
CONTROLLER_QUEUED = f"namespace_controller:{c.WORKLOAD_PROCESSES.name}:queued_last"
# Per controller and workload, the last step (or start) any of its workers had in the last RUN_MEMORY: a Job's pods
# that run a newer workload than a worker's (a JobSet applied again, its workload renamed) leave that worker gone.
CONTROLLER_NEWEST = f"namespace_controller_workload:{c.LAST_STEP.name}:max1h"
# Per worker whose run goes on: RUNNING_INFERRED, less the workers whose controller kube-state-metrics says is
# gone, plus the workers not seen for longer than RUN_MEMORY whose controller still wants its pods (Pending).
RUNNING = f"worker:{c.WORKLOAD_PROCESSES.name}:running"
# Per worker, 1 while a sidecar serves it, or while its sidecar's target is listed but not scraped (up == 0, a
# NetworkPolicy, an overloaded Prometheus): what cannot be seen is not counted down.
SERVED = f"worker:{c.GOODPUT_WALL.base_name}:served"
# Per worker and reason, its failures of the last hour over its successive sidecars (tpuscope.promql.grown): what
# TpuscopeWorkloadFailed and TpuscopeWorkloadCrashLooping read, recorded once.
FAILURES_HOUR = f"worker_reason:{c.WORKLOAD_FAILURES.base_name}:grown1h"
# Its twin for restarts: what the on-call board's sliding hour reads (raw, it read every sidecar's counters over
# the hour at every point: 100 M samples over 6 h of 64 hosts).
RESTARTS_HOUR = f"worker_reason:{c.WORKLOAD_RESTARTS.base_name}:grown1h"
# Per GPU and XID code, the driver's XID errors of the last hour: what the on-call board's sliding hour reads (raw,
# its "sidecar started in the hour" join read every sidecar's start time over the hour at every point: 88 M samples
# over 24 h of 256 hosts without a GPU among them).
XID_HOUR = f"device_xid:{c.XID_ERRORS.base_name}:grown1h"
# Per slice, collector and reason, the sidecars' collector errors a second: what the on-call board draws (an
# increase() of every host's every error counter at each point read 25.6 M samples over 24 h of 256 hosts, 11 s);
# Job debug keeps the per-host breakdown of one workload's hosts.
COLLECTOR_ERRORS_RATE = f"slice_collector_reason:{c.COLLECTOR_ERRORS.base_name}:rate5m"
# Per slice, the worst of its hosts now, for the on-call board's hosts at any range and fleet size (per host, each
# panel read every host's series at every point: 14 M samples and 6.5 s for the swap over 24 h of 1,000 hosts, and a
# thousand lines no one reads); Job debug draws its workload's hosts one by one, the alerts name the host.
HOST_CPU_BUSIEST = f"slice:{c.HOST_CPU_UTILIZATION.name}:busiest_host"
HOST_IOWAIT_BUSIEST = f"slice:{c.HOST_CPU_IOWAIT.name}:busiest_host"
HOST_MEMORY_AVAILABLE_LEAST = f"slice:{c.HOST_MEMORY_AVAILABLE.name.removesuffix('_bytes')}:ratio_least_host"
HOST_SWAP_BUSIEST = f"slice_direction:{c.HOST_SWAP_IO.base_name}:rate5m_busiest_host"
MAJOR_FAULTS_BUSIEST = f"slice:{c.JOB_MAJOR_PAGE_FAULTS.base_name}:rate5m_busiest_host"
# Per slice and collector, how many of the slice's hosts' collectors failed their latest collection (zeros kept).
COLLECTORS_DOWN = f"slice_collector:{c.COLLECTOR_UP.name}:hosts_down"
# Per slice, its hosts' multislice collective p99 (COLLECTIVE_P99): the worst host's and the median host's.
COLLECTIVE_P99_WORST = f"slice:{c.MEGASCALE_LATENCY.name}:collective_p99_5m_worst_host"
COLLECTIVE_P99_MEDIAN = f"slice:{c.MEGASCALE_LATENCY.name}:collective_p99_5m_median_host"
# Per slice and result, the events the sidecars received a second.
INGEST_RATE = f"slice_result:{c.INGEST_EVENTS.base_name}:rate5m"
# Per scrape job of sidecars, how many of its targets Prometheus could not scrape (zeros kept).
SIDECARS_DOWN = "job:tpuscope_sidecar_targets:down"
# Per worker, since when it has been down: its sidecar's gauge, or its last step when its pod went with it.
DOWN_SINCE = f"worker:{c.WORKLOAD_DOWN_SINCE.name}:last"
# Per workload, how long it has been down (since its first worker went): what TpuscopeWorkloadDown pages on, and
# what keeps the goodput burn quiet over the outage it paged for.
DOWN_FOR = f"workload:{c.WORKLOAD_DOWN_SINCE.name}:age"
# Per workload, its latest good checkpoint, remembered through its restarts (a new pod's sidecar has none until it
# saves) while the workload runs on.
CHECKPOINT_LAST = f"workload:{c.CHECKPOINT_LAST_SUCCESS.name}:max"
# The goodput SLO's bad time, a matcher on the category label: the categories booked as they happen, the job's own
# (custom badput) among them. Productive time is booked when a checkpoint covers it and other when a process ends:
# over a window with neither, counting them would read all time bad (tpuscope.goodput.BOOKED_IN_LUMPS).
BADPUT_CATEGORIES = f'category!~"{"|".join(BOOKED_IN_LUMPS)}"'
# The platform owner's goodput (issue 57, tpuscope.alerts.platform): Google's ML Productivity Goodput, scheduling x
# runtime x program. Per Job of a scheduling unit, the unit it is of, and 1 while every pod it wants is ready (else
# 0). Per scheduling unit (a JobSet, or a Job no controller owns: namespace, jobset, controller_kind,
# controller, from kube-state-metrics), 1 while every pod each of its live Jobs wants is ready (else 0); 1 while a
# queue holds one of its Jobs suspended (else 0); 1 once it has been ready;
# and its state now, one series per state, 1 for the current one: ready, queued (a queue such as Kueue holds it
# suspended), starting (never ready yet: scheduled, pulled, started) or recovering (ready before, not now).
JOB_UNIT = "namespace_job:tpuscope_scheduled:unit"
JOB_READY = "namespace_job:tpuscope_scheduled:ready"
UNIT_READY = "namespace_controller:tpuscope_scheduled:ready"
UNIT_QUEUED = "namespace_controller:tpuscope_scheduled:queued"
UNIT_STARTED = "namespace_controller:tpuscope_scheduled:ever_ready"
SCHEDULING = "namespace_controller_state:tpuscope_scheduled:state"
SCHEDULING_STATES = ("ready", "queued", "starting", "recovering")
# Per ClusterQueue, Kueue's mean admission wait over the last hour (its histograms carry no workload).
QUEUE_ADMISSION_WAIT = "cluster_queue:tpuscope_queue_admission_wait_seconds:mean1h"
# Per workload, its model FLOPs a second over its chips' peak: program goodput (MFU) as it goes.
MFU_RATE = f"workload:{c.MODEL_FLOPS.base_name}:mfu_rate5m"
# The factors and their product over the windows PLATFORM_WINDOWS, per workload and per namespace (a team):
# the name + a window, as BADPUT_RATIO.
SCHEDULING_GOODPUT = "tpuscope_scheduling_goodput:ratio"
RUNTIME_GOODPUT = "tpuscope_runtime_goodput:ratio"
PROGRAM_GOODPUT = "tpuscope_program_goodput:ratio"
ML_PRODUCTIVITY_GOODPUT = "tpuscope_ml_productivity_goodput:ratio"
PLATFORM_WINDOWS = ("1d", "3d")


def platform_record(level: str, factor: str, window: str) -> str:
    """The record of ``factor`` (SCHEDULING_GOODPUT, ...) per ``level`` (workload, namespace) over ``window``."""
    return f"{level}:{factor}{window}"


# Per node pool and resource (google_com_tpu, nvidia_com_gpu): the chips its nodes have (allocatable), the chips
# running pods request, the chips tpuscope's collectors report, and the first less the second: chips paid for idle.
CHIPS_ALLOCATABLE = "nodepool_resource:tpuscope_chips_allocatable:sum"
CHIPS_REQUESTED = "nodepool_resource:tpuscope_chips_requested_running:sum"
CHIPS_HEARD = "nodepool_resource:tpuscope_chips_reporting:count"
CHIPS_IDLE = "nodepool_resource:tpuscope_chips_idle:sum"
# The bad-host ledger (tpuscope.alerts.nodes): per node, the evidence that its hardware breaks the jobs that land on
# it, kept across jobs. Each evaluation, per node, target and workload, 1 for each kind of evidence that holds now
# (HOST_EVIDENCE_KINDS), and the time the node's process was its workload's first to fail, alone and for a reason
# that points at the host; over NODE_WINDOWS, the evidence per node, workload and kind, the nodes each worker ran on,
# the first failures counted, the kinds of evidence a workload left on several nodes (its own, not theirs), and the
# suspect nodes, by the basis of the suspicion (HOST_SUSPICION_BASES). Each node's topology, where GKE labels it.
HOST_EVIDENCE_NOW = "node_workload_evidence:tpuscope_host_evidence:present"
FIRST_FAILURE = "node_workload:tpuscope_first_failure:timestamp"
WORKLOAD_NODES = "node_workload:tpuscope_workload_ran:present"
HOST_EVIDENCE = "node_workload_evidence:tpuscope_host_evidence:max"
FIRST_FAILURES = "node_workload:tpuscope_first_failures:count"
EVIDENCE_SPREAD = "workload_evidence:tpuscope_host_evidence_nodes:count"
RAN_ON = "node_workload:tpuscope_workload_ran:max"
HOST_SUSPECT = "node_basis:tpuscope_host_suspect:count"
NODE_TOPOLOGY = "node:tpuscope_topology:info"
NODE_WINDOWS = ("1d", "7d")
HOST_EVIDENCE_KINDS = ("crash", "straggler", "diverged_first", "throttled", "xid")
HOST_SUSPICION_BASES = ("workloads", "restarts", "xid")
# The topology GKE puts on its nodes (block, sub-block, host: the racks and machines of a placement): the names the
# scrape gives them on every series of a pod on the node (tpuscope.kubernetes), where the node has them, and the
# node labels they come from.
GKE_TOPOLOGY = {
    "topology_block": "cloud.google.com/gce-topology-block",
    "topology_subblock": "cloud.google.com/gce-topology-subblock",
    "topology_host": "cloud.google.com/gce-topology-host",
}
TOPOLOGY_LABELS = tuple(GKE_TOPOLOGY)


def sanitized(kubernetes_label: str) -> str:
    """A Kubernetes label's name as Prometheus' service discovery and kube-state-metrics (its SanitizeLabelName) write
    it: every character not allowed in a label name as ``_``."""
    return re.sub(r"[^A-Za-z0-9_]", "_", kubernetes_label)


def node_record(record: str, window: str) -> str:
    """A ledger's ``record`` (HOST_EVIDENCE, ...) over ``window`` (one of NODE_WINDOWS)."""
    return f"{record}{window}"


# The windows an owner excludes from the goodput SLO (planned maintenance, a pause): a series of this name, 1 while
# the window lasts, labelled with what it covers (a workload, a JobSet, a namespace, or nothing: the fleet).
# `tpuscope exclusion` writes the rule that makes it; the SLO's terms skip the time it covers.
SLO_EXCLUDED = "scope:tpuscope_slo:excluded"
REQUESTS_FAST_RATE = f"workload:{c.INFERENCE_REQUEST_DURATION.name}_within_objective:rate5m"
REQUESTS_RATE = f"workload:{c.INFERENCE_REQUEST_DURATION.name}_count:rate5m"
# The period an SLO's error budget covers: the alerts' burn rates are multiples of the rate that spends the
# budget in exactly this period (the SRE workbook's), and the dashboards show what is left of it.
SLO_PERIOD = "30d"
# The SLO ratios, one rule per window: BADPUT_RATIO + "1h" is the badput ratio over the last hour.
BADPUT_RATIO = "workload:tpuscope_badput:ratio_rate"
SLOW_REQUESTS_RATIO = "workload:tpuscope_inference_slow_requests:ratio_rate"
