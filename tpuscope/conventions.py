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


# Recording rules (``level:metric:operations``, the metric's name from the catalogue) that the alerts, the dashboards
# or the fleet simulator read. Only the names are here: what each record holds, and why, is said beside its
# expression, in the module each block's first line names.

# tpuscope.alerts.recording.step_rules
STEPS_RATE = f"workload:{c.STEPS.base_name}:rate5m"
STEP_MEAN = f"workload:{c.STEP_DURATION.name}:mean5m"
STEP_P99 = f"workload:{c.STEP_DURATION.name}:p99_5m"
PHASE_SHARE = f"workload_phase:{c.STEP_PHASE_DURATION.name}:share5m"
COMPUTE_PER_WORKER = f"worker:{c.STEP_PHASE_DURATION.name}:compute_mean5m"
COMPUTE_MEDIAN = f"workload:{c.STEP_PHASE_DURATION.name}:compute_median5m"
COMPUTE_OVER_MEDIAN = f"worker:{c.STEP_PHASE_DURATION.name}:compute_over_median5m"
MEMORY_USED = f"device:{c.DEVICE_MEMORY_USED.name}:ratio_limit"
PEAK_FLOPS_SUM = f"workload:{c.PEAK_FLOPS.name}:sum"

# tpuscope.alerts.recording.profile_rules
PROFILE_FRESH = f"worker_part:{c.PROFILE_TIME.name}:fresh"
PROFILE_MEDIAN = f"workload_part:{c.PROFILE_TIME.name}:median"
PROFILE_OVER_MEDIAN = f"worker_part:{c.PROFILE_TIME.name}:over_median"
PROFILE_SHARE = f"workload_part:{c.PROFILE_TIME.name}:share"
# A worker's device profile counts for this many of the periods its job says it captures at
# (tpuscope_profile_period_seconds) after the sidecar received it, so that one busy or failed capture does not
# drop a worker, and a worker that stopped capturing drops out. The sidecar averages the captures it received
# within as long (catalog.PROFILE_MEAN_CAPTURES of them), the rules judge the gauges as long: one window for both.
PROFILE_FRESH_PERIODS = 3
# ...and, from a job too old to say its period, this long: three of the default periods
# (tpuscope.tracing.profile_sampler.DEFAULT_PERIOD, which the generators and the sidecar may not import; a test ties
# the two).
PROFILE_FRESH_SECONDS = 1800

# tpuscope.alerts.recording.unbooked_rules
# How long Prometheus remembers a worker nothing serves any more (its pod gone, sidecar and all): the sidecar's
# default --workload-expiry, after which the sidecar forgets a workload too.
RUN_MEMORY = "1h"
# The target labels that name the Kubernetes controller of a sidecar's pod.
CONTROLLER = "controller_kind, controller"
CONTROLLER_WANTED = f"namespace_controller:{c.WORKLOAD_PROCESSES.name}:wanted"
CONTROLLER_QUEUED = f"namespace_controller:{c.WORKLOAD_PROCESSES.name}:queued_last"
CONTROLLER_NEWEST = f"namespace_controller_workload:{c.LAST_STEP.name}:max1h"
RUNNING_INFERRED = f"worker:{c.WORKLOAD_PROCESSES.name}:running_inferred"
RUNNING = f"worker:{c.WORKLOAD_PROCESSES.name}:running"
SERVED = f"worker:{c.GOODPUT_WALL.base_name}:served"
UNBOOKED_RATE = f"worker:{c.GOODPUT_WALL.base_name}_unbooked:rate"
DOWN_SINCE = f"worker:{c.WORKLOAD_DOWN_SINCE.name}:last"
DOWN_FOR = f"workload:{c.WORKLOAD_DOWN_SINCE.name}:age"
CHECKPOINT_LAST = f"workload:{c.CHECKPOINT_LAST_SUCCESS.name}:max"

# tpuscope.alerts.recording.slo_rules and slo_ratios
GOODPUT_RATE = f"workload_category:{c.GOODPUT.base_name}:rate5m"
WALL_RATE = f"workload:{c.GOODPUT_WALL.base_name}:rate5m"
BAD_RATE = f"workload:{c.GOODPUT.base_name}_bad:rate5m"
WALL_ALL_RATE = f"workload:{c.GOODPUT_WALL.base_name}_with_unbooked:rate5m"
REQUESTS_FAST_RATE = f"workload:{c.INFERENCE_REQUEST_DURATION.name}_within_objective:rate5m"
REQUESTS_RATE = f"workload:{c.INFERENCE_REQUEST_DURATION.name}_count:rate5m"
# The SLO ratios, one rule per window: BADPUT_RATIO + "1h" is the badput ratio over the last hour.
BADPUT_RATIO = "workload:tpuscope_badput:ratio_rate"
SLOW_REQUESTS_RATIO = "workload:tpuscope_inference_slow_requests:ratio_rate"
# The period an SLO's error budget covers: the alerts' burn rates are multiples of the rate that spends the
# budget in exactly this period (the SRE workbook's), and the dashboards show what is left of it.
SLO_PERIOD = "30d"

# tpuscope.alerts.recording.collective_rules
COLLECTIVE_P99 = f"worker:{c.MEGASCALE_LATENCY.name}:collective_p99_5m"
COLLECTIVE_P99_WORST = f"slice:{c.MEGASCALE_LATENCY.name}:collective_p99_5m_worst_host"
COLLECTIVE_P99_MEDIAN = f"slice:{c.MEGASCALE_LATENCY.name}:collective_p99_5m_median_host"

# tpuscope.alerts.recording.failure_rules: the last hour's failures, restarts and XID errors
FAILURES_HOUR = f"worker_reason:{c.WORKLOAD_FAILURES.base_name}:grown1h"
RESTARTS_HOUR = f"worker_reason:{c.WORKLOAD_RESTARTS.base_name}:grown1h"
XID_HOUR = f"device_xid:{c.XID_ERRORS.base_name}:grown1h"

# tpuscope.alerts.recording.collector_rules: the sidecars' own health, per slice
COLLECTOR_ERRORS_RATE = f"slice_collector_reason:{c.COLLECTOR_ERRORS.base_name}:rate5m"
COLLECTORS_DOWN = f"slice_collector:{c.COLLECTOR_UP.name}:hosts_down"
INGEST_RATE = f"slice_result:{c.INGEST_EVENTS.base_name}:rate5m"
SIDECARS_DOWN = "job:tpuscope_sidecar_targets:down"

# tpuscope.alerts.recording.host_rules: each slice's worst host
HOST_CPU_BUSIEST = f"slice:{c.HOST_CPU_UTILIZATION.name}:busiest_host"
HOST_IOWAIT_BUSIEST = f"slice:{c.HOST_CPU_IOWAIT.name}:busiest_host"
HOST_MEMORY_AVAILABLE_LEAST = f"slice:{c.HOST_MEMORY_AVAILABLE.name.removesuffix('_bytes')}:ratio_least_host"
HOST_SWAP_BUSIEST = f"slice_direction:{c.HOST_SWAP_IO.base_name}:rate5m_busiest_host"
MAJOR_FAULTS_BUSIEST = f"slice:{c.JOB_MAJOR_PAGE_FAULTS.base_name}:rate5m_busiest_host"

# tpuscope.alerts.recording.core_state_rules: where a stalled workload's TPU cores are
CORE_LOCATION = f"worker_location:{c.CORE_LOCATION_AGE.name}:max"
CORE_LOCATION_WORKERS = f"workload_location:{c.CORE_STATE.name}:workers"
CORE_ELSEWHERE = f"worker_location:{c.CORE_LOCATION_AGE.name}:elsewhere"
RUNTIME_ERROR_WORKERS = f"worker_reason:{c.TPU_RUNTIME_ERROR.name}:detected"

# tpuscope.alerts.recording.hang_rules: where a hung workload's processes are stuck
HANG_POSITION = f"worker_position:{c.STUCK_POSITION.name}:max"
HANG_POSITION_WORKERS = f"workload_position:{c.STUCK_POSITION.name}:workers"
HANG_ELSEWHERE = f"worker_position:{c.STUCK_POSITION.name}:elsewhere"

# tpuscope.alerts.stragglers: what a straggler costs, and why it is late
# Where a measure comes from, a label of the alerts and records that have two: the workload's fresh device
# profiles, or the phases the job times on the host.
SOURCE = "source"
STRAGGLER_HISTORY = "1h"
EVALUATED = "group:tpuscope_rule_evaluations:one"
WAIT_PER_STEP = "worker:tpuscope_collective_wait_seconds:per_step"
WAIT_BEYOND_LEAST = "worker:tpuscope_collective_wait_seconds:beyond_least"
STRAGGLER_RATE = "workload:tpuscope_straggler_wait_seconds:rate5m"
STRAGGLER_CHIPS = "workload:tpuscope_straggler_wait_chip_seconds:rate5m"
STRAGGLER_SHARE = "workload:tpuscope_straggler_wait_seconds:share"
STRAGGLER_LAG = "worker_cause:tpuscope_straggler_lag_seconds:per_step"
STRAGGLER = "worker_cause:tpuscope_straggler_wait_chip_seconds:rate5m"
STRAGGLER_CHRONIC = f"worker:tpuscope_straggler:ratio{STRAGGLER_HISTORY}"

# tpuscope.alerts.platform: the platform owner's goodput (scheduling x runtime x program), and the fleet's chips
JOB_UNIT = "namespace_job:tpuscope_scheduled:unit"
JOB_READY = "namespace_job:tpuscope_scheduled:ready"
UNIT_READY = "namespace_controller:tpuscope_scheduled:ready"
UNIT_QUEUED = "namespace_controller:tpuscope_scheduled:queued"
UNIT_STARTED = "namespace_controller:tpuscope_scheduled:ever_ready"
SCHEDULING = "namespace_controller_state:tpuscope_scheduled:state"
SCHEDULING_STATES = ("ready", "queued", "starting", "recovering")  # the values of SCHEDULING's state label
QUEUE_ADMISSION_WAIT = "cluster_queue:tpuscope_queue_admission_wait_seconds:mean1h"
MFU_RATE = f"workload:{c.MODEL_FLOPS.base_name}:mfu_rate5m"
SCHEDULING_GOODPUT = "tpuscope_scheduling_goodput:ratio"
RUNTIME_GOODPUT = "tpuscope_runtime_goodput:ratio"
PROGRAM_GOODPUT = "tpuscope_program_goodput:ratio"
ML_PRODUCTIVITY_GOODPUT = "tpuscope_ml_productivity_goodput:ratio"
PLATFORM_WINDOWS = ("1d", "3d")


def platform_record(level: str, factor: str, window: str) -> str:
    """The record of ``factor`` (SCHEDULING_GOODPUT, ...) per ``level`` (workload, namespace) over ``window`` (one of
    PLATFORM_WINDOWS): the name and the window, as BADPUT_RATIO."""
    return f"{level}:{factor}{window}"


CHIPS_ALLOCATABLE = "nodepool_resource:tpuscope_chips_allocatable:sum"
CHIPS_REQUESTED = "nodepool_resource:tpuscope_chips_requested_running:sum"
CHIPS_HEARD = "nodepool_resource:tpuscope_chips_reporting:count"
CHIPS_IDLE = "nodepool_resource:tpuscope_chips_idle:sum"

# tpuscope.alerts.nodes: the bad-host ledger (its REASONING says what each record holds and why)
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
HOST_EVIDENCE_KINDS = ("crash", "straggler", "diverged_first", "throttled", "xid")  # HOST_EVIDENCE's evidence label
HOST_SUSPICION_BASES = ("workloads", "restarts", "xid")  # HOST_SUSPECT's basis label


def node_record(record: str, window: str) -> str:
    """A ledger's ``record`` (HOST_EVIDENCE, ...) over ``window`` (one of NODE_WINDOWS)."""
    return f"{record}{window}"


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


# tpuscope.alerts.exclusion: a window the goodput SLO does not count, written by `tpuscope exclusion`
SLO_EXCLUDED = "scope:tpuscope_slo:excluded"
