"""The platform owner's goodput: how much of what the fleet pays for turns into training.

Google's ML Productivity Goodput is the product of three factors: *scheduling* goodput (the share of a workload's
time during which every resource it needs is there), *runtime* goodput (the share of that time spent on productive
steps) and *program* goodput (how close the program runs to the chips' peak: MFU). tpuscope had the last two; this
module records the first from kube-state-metrics, the product, the chips no job holds, and the windows an owner
excludes from the goodput SLO. docs/goodput.md says how each factor departs from Google's.

**Scheduling.** The unit is what a user submits: a JobSet, or a Job that no controller owns (a CronJob's Jobs are
none). It exists from its first Job's creation, so the time it waits in a queue before any pod (or sidecar) runs is
counted. At each evaluation each Job of it that has not completed is ready when its ready (or succeeded) pods, none
being deleted, number at least what it wants (``min(parallelism, completions)``, JobSet's own test of a ready Job),
and the unit when all its Jobs are; a Job that failed for good is not ready while another Job of its unit lives (a
JobSet restarts them all), and a unit whose Jobs all failed has ended. The unit's state is then one of
:data:`tpuscope.conventions.SCHEDULING_STATES`: ready, queued (a queue holds its Jobs suspended: Kueue's admission
wait), starting (never ready yet) or recovering (ready before, not now: a restart's time to recover). Scheduling
goodput over a window is the mean of "ready" over the evaluations the unit existed in it. An evaluation
kube-state-metrics did not answer is not counted either way, and one it answered twice (two replicas) once.

**The fleet's chips.** Per node pool (GKE's node labels, which kube-state-metrics serves only with
``--metric-labels-allowlist``: docs/fleet.md; without it, one pool of every node), the chips its nodes offer, the
chips running pods request, and the chips tpuscope's collectors report: a pool with chips and no pod is paid for and
idle.

**Exclusions.** A series :data:`tpuscope.conventions.SLO_EXCLUDED` (``tpuscope exclusion`` writes its rule) marks
a window; the goodput SLO's two terms are not recorded for what it covers, so the burn rates read neither the bad
nor the wall time of the window, as ml-goodput-measurement's exclusions take a window out of both.
"""

from __future__ import annotations

from tpuscope import catalog as c
from tpuscope.alerts.recording import (
    CONTROLLER_KINDS,
    KSM_JOB_COMPLETE,
    KSM_JOB_EXISTS,
    KSM_JOB_FAILED,
    KSM_JOB_SUSPENDED,
)
from tpuscope.conventions import (
    CHIPS_ALLOCATABLE,
    CHIPS_HEARD,
    CHIPS_IDLE,
    CHIPS_REQUESTED,
    CONTROLLER,
    CONTROLLER_NEWEST,
    GOODPUT_RATE,
    JOB_READY,
    JOB_UNIT,
    MFU_RATE,
    ML_PRODUCTIVITY_GOODPUT,
    PEAK_FLOPS_SUM,
    PLATFORM_WINDOWS,
    PROGRAM_GOODPUT,
    QUEUE_ADMISSION_WAIT,
    RUNTIME_GOODPUT,
    SCHEDULING,
    SCHEDULING_GOODPUT,
    UNIT_QUEUED,
    UNIT_READY,
    UNIT_STARTED,
    WALL_RATE,
    platform_record,
)
from tpuscope.promql import PLACEMENT, WORKLOAD, series

JOB = "namespace, job_name"  # kube-state-metrics' labels of a Job
UNIT = f"{PLACEMENT}, {CONTROLLER}"  # a scheduling unit: a JobSet (controller_kind JobSet) or a Job of its own
JOBSET_KIND = "JobSet"
# The node labels GKE sets, as kube-state-metrics names them once allowlisted: the pool, a TPU pool's topology and
# accelerator, a GPU pool's accelerator.
NODE_POOL_LABELS = (
    "label_cloud_google_com_gke_nodepool",
    "label_cloud_google_com_gke_tpu_topology",
    "label_cloud_google_com_gke_tpu_accelerator",
    "label_cloud_google_com_gke_accelerator",
)
POOL = ", ".join(NODE_POOL_LABELS)
# Extended resources as kube-state-metrics names them (google.com/tpu, nvidia.com/gpu: every character not allowed
# in a label name becomes "_").
TPU, GPU = "google_com_tpu", "nvidia_com_gpu"
CHIP_RESOURCES = f'resource=~"{TPU}|{GPU}"'
# How long a unit that has been ready is remembered as such through an evaluation kube-state-metrics missed.
STARTED_MEMORY = "10m"


def one(selector: str, by: str = JOB) -> str:
    """kube-state-metrics' series once per object (``by``): two replicas of it (HA, or a rollout's old and new pod
    on GMP, whose rules read each series for minutes after it ends) serve each series twice, with their own
    ``instance``."""
    return f"max by ({by}) ({selector})"


def unit_of_jobs() -> str:
    """1 per Job that is a scheduling unit's, labelled with its unit: a JobSet's Job with the JobSet (``jobset`` and
    ``controller`` its name, as the sidecars' targets name a JobSet's pods), a Job no controller owns as itself
    (``controller`` its name, as its pods' targets do). A Job another controller owns (a CronJob's) is none, and so
    is one that completed."""
    live = f"{one(KSM_JOB_EXISTS)} * 0 + 1 unless on ({JOB}) {one(KSM_JOB_COMPLETE)} == 1"
    in_jobset = f'group by ({JOB}, owner_name) (kube_job_owner{{owner_kind="{JOBSET_KIND}"}})'
    owned_otherwise = f'group by ({JOB}) (kube_job_owner{{owner_kind!~"{JOBSET_KIND}|"}})'
    jobset = f"({live}) * on ({JOB}) group_left (owner_name) {in_jobset}"
    for label in ("jobset", "controller"):
        jobset = f'label_replace({jobset}, "{label}", "$1", "owner_name", "(.+)")'
    jobset = (
        f'label_replace(label_replace({jobset}, "owner_name", "", "", ""), "controller_kind", "{JOBSET_KIND}", "", "")'
    )
    alone = f"({live}) unless on ({JOB}) {in_jobset} unless on ({JOB}) {owned_otherwise}"
    alone = f'label_replace({alone}, "controller", "$1", "job_name", "(.+)")'
    alone = f'label_replace({alone}, "controller_kind", "{CONTROLLER_KINDS[0]}", "", "")'
    return f"{jobset} or {alone}"


def failed_jobs() -> str:
    """1 per Job that failed for good (its backoff limit spent)."""
    return f"({one(KSM_JOB_FAILED)} == 1)"


def job_ready() -> str:
    """1 per Job of a unit whose ready or succeeded pods, none of them being deleted, number at least what it wants
    (``min(parallelism, completions)``, JobSet's own test of a ready Job), else 0; a Job that failed, 0."""
    parallelism, completions = one("kube_job_spec_parallelism"), one("kube_job_spec_completions")
    # completions is unset on a work-queue Job, where kube-state-metrics serves none.
    wanted = f"({parallelism} <= {completions} or {completions} or {parallelism})"
    ready_pod = 'kube_pod_status_ready{condition="true"} == 1 or kube_pod_status_phase{phase="Succeeded"} == 1'
    deleted = "kube_pod_deletion_timestamp"  # a pod being deleted (a restart's, a drain's) is going, ready or not
    owned = 'label_replace(kube_pod_owner{owner_kind="Job"}, "job_name", "$1", "owner_name", "(.+)")'
    pods = f"group by ({JOB}, pod) ({owned} and on (namespace, pod) ({ready_pod}) unless on (namespace, pod) {deleted})"
    ready = f"count by ({JOB}) ({pods}) >= bool on ({JOB}) {wanted} or on ({JOB}) {wanted} * 0"
    ready = f"({ready}) unless on ({JOB}) {failed_jobs()} or on ({JOB}) {failed_jobs()} * 0"
    return f"{JOB_UNIT} * on ({JOB}) group_left () ({ready})"


def scheduling_rules() -> list[dict[str, str]]:
    """Each Job's unit and readiness, each unit's readiness now, whether a queue holds it, whether it has been
    ready, and its state (module docstring). A unit is ready when every Job of it is; a failed Job counts while
    another Job of its unit lives on (JobSet restarts them all), and a unit whose Jobs all failed ended. A unit is
    a JobSet, or a Job no controller owns (``namespace, jobset, controller_kind, controller``, from
    kube-state-metrics)."""
    suspended = f"{JOB_UNIT} * on ({JOB}) group_left () {one(KSM_JOB_SUSPENDED)}"
    alive = f"group by ({UNIT}) ({JOB_UNIT} unless on ({JOB}) {failed_jobs()})"
    queued = f"({UNIT_QUEUED} or {UNIT_READY} * 0)"
    started = f"({UNIT_STARTED} or {UNIT_READY} * 0)"
    not_ready = f"(1 - {UNIT_READY})"
    states = {
        "ready": UNIT_READY,
        "queued": f"{not_ready} * on ({UNIT}) {queued}",
        "starting": f"{not_ready} * on ({UNIT}) (1 - {queued}) * on ({UNIT}) (1 - {started})",
        "recovering": f"{not_ready} * on ({UNIT}) (1 - {queued}) * on ({UNIT}) {started}",
    }
    state = " or ".join(f'label_replace({expr}, "state", "{name}", "", "")' for name, expr in states.items())
    return [
        # Per Job of a scheduling unit, the unit it is of.
        {"record": JOB_UNIT, "expr": unit_of_jobs()},
        # Per Job of a unit, 1 while every pod it wants is ready, else 0.
        {"record": JOB_READY, "expr": job_ready()},
        # Per unit, 1 while every pod each of its live Jobs wants is ready, else 0.
        {"record": UNIT_READY, "expr": f"min by ({UNIT}) ({JOB_READY}) and on ({UNIT}) {alive}"},
        # Per unit, 1 while a queue holds one of its Jobs suspended, else 0.
        {"record": UNIT_QUEUED, "expr": f"max by ({UNIT}) ({suspended}) and on ({UNIT}) {alive}"},
        # Per unit, 1 once it has been ready. It reads its own past: a unit once ready stays started while it exists.
        {
            "record": UNIT_STARTED,
            "expr": f"({UNIT_READY} == 1 or last_over_time({UNIT_STARTED}[{STARTED_MEMORY}])) * 0 + 1"
            f" and on ({UNIT}) {UNIT_READY}",
        },
        # Per unit, its state now, one series per state, 1 for the current one: ready, queued (a queue such as Kueue
        # holds it suspended), starting (never ready yet: scheduled, pulled, started) or recovering (ready before,
        # not now).
        {"record": SCHEDULING, "expr": state},
    ]


def queue_rules() -> list[dict[str, str]]:
    """Kueue's mean admission wait over the last hour, per ClusterQueue (its histograms name no workload; the
    per-workload wait is the ``queued`` state above)."""
    wait = "kueue_admission_wait_time_seconds"
    return [
        {
            "record": QUEUE_ADMISSION_WAIT,
            "expr": f"sum by (cluster_queue) (rate({wait}_sum[1h]))"
            f" / (sum by (cluster_queue) (rate({wait}_count[1h])) > 0)",
        }
    ]


def chip_rules() -> list[dict[str, str]]:
    """Per node pool and resource (``google_com_tpu``, ``nvidia_com_gpu``), the chips: those the nodes have, those
    running pods request, those tpuscope hears from, and those idle."""
    pools = f"group by (node, {POOL}) (kube_node_labels)"

    def by_pool(per_node: str) -> str:
        # kube-state-metrics serves no kube_node_labels at all without its allowlist: one pool of every node then.
        return f"sum by ({POOL}, resource) ({per_node} * on (node) group_left ({POOL}) {pools} or on (node) {per_node})"

    running = one('kube_pod_status_phase{phase="Running"}', "namespace, pod") + " == 1"
    requests = one(
        f"kube_pod_container_resource_requests{{{CHIP_RESOURCES}}}", "namespace, pod, container, node, resource"
    )
    requested = f"sum by (node, resource) ({requests} and on (namespace, pod) {running})"
    # One series a chip and source: a TPU chip's from the runtime and the device plugin both, a GPU's from NVML.
    chips = f"count by (node) (group by (node, {c.Label.DEVICE}) ({{selector}}))"
    tpu = chips.format(selector=series(c.DUTY_CYCLE, f'{c.Label.SOURCE}!="{c.NVML}"'))
    gpu = chips.format(selector=series(c.DUTY_CYCLE, f'{c.Label.SOURCE}="{c.NVML}"'))
    heard = f'label_replace({tpu}, "resource", "{TPU}", "", "") or label_replace({gpu}, "resource", "{GPU}", "", "")'
    allocatable = one(f"kube_node_status_allocatable{{{CHIP_RESOURCES}}}", "node, resource")
    return [
        # The chips the pool's nodes have (allocatable).
        {"record": CHIPS_ALLOCATABLE, "expr": by_pool(allocatable)},
        # The chips running pods request.
        {"record": CHIPS_REQUESTED, "expr": by_pool(f"({requested})")},
        # The chips tpuscope's collectors report.
        {"record": CHIPS_HEARD, "expr": by_pool(f"({heard})")},
        # The chips paid for and idle: those the nodes have less those requested. A pool where no running pod
        # requests a chip has all its chips idle.
        {
            "record": CHIPS_IDLE,
            "expr": f"clamp_min({CHIPS_ALLOCATABLE} - {CHIPS_REQUESTED}, 0) or {CHIPS_ALLOCATABLE}",
        },
    ]


def program_rules() -> list[dict[str, str]]:
    """Each workload's model FLOPs a second over its chips' peak, over 5 minutes: program goodput (MFU) as it goes,
    for the product's program factor over long windows."""
    flops = f"sum by ({WORKLOAD}) (rate({series(c.MODEL_FLOPS)}[5m]))"
    return [{"record": MFU_RATE, "expr": f"{flops} / on ({WORKLOAD}) ({PEAK_FLOPS_SUM} > 0)"}]


def platform_rules() -> list[dict[str, str]]:
    """The rules evaluated every 30 s: the units' states, the queues' waits, the chips, the workloads' MFU."""
    return scheduling_rules() + queue_rules() + chip_rules() + program_rules()


def product_rules() -> list[dict[str, str]]:
    """The three factors and their product over :data:`PLATFORM_WINDOWS`, per workload and per namespace (a team),
    each named as :func:`tpuscope.conventions.platform_record` says.

    A workload's scheduling is its unit's: a JobSet's workloads join it on ``namespace, jobset``, a plain Job's on
    the controller its workers' pods had within the window. A team's scheduling is the mean over its units' time,
    its runtime its workloads' productive seconds over their wall seconds, its program the mean of its workloads'.
    """
    rules = []
    productive = f'{GOODPUT_RATE}{{category="productive"}}'
    for window in PLATFORM_WINDOWS:

        def ready(kind: str, window: str = window) -> str:
            return f'avg_over_time({SCHEDULING}{{state="ready", controller_kind="{kind}"}}[{window}])'

        # The workloads of the window, not only those running now: one that ended within it keeps its factor.
        workloads = f'group by ({WORKLOAD}) (last_over_time({WALL_RATE}{{jobset!=""}}[{window}]))'
        of_jobset = f"{ready(JOBSET_KIND)} * on ({PLACEMENT}) group_right () {workloads}"
        controllers = f"group by (namespace, {CONTROLLER}, workload) (last_over_time({CONTROLLER_NEWEST}[{window}]))"
        of_job = f"{ready(CONTROLLER_KINDS[0])} * on (namespace, {CONTROLLER}) group_right () {controllers}"
        names = {
            factor: (platform_record("workload", factor, window), platform_record("namespace", factor, window))
            for factor in (SCHEDULING_GOODPUT, RUNTIME_GOODPUT, PROGRAM_GOODPUT, ML_PRODUCTIVITY_GOODPUT)
        }
        per_workload = {
            SCHEDULING_GOODPUT: f"max by ({WORKLOAD}) ({of_jobset} or {of_job})",
            RUNTIME_GOODPUT: f"sum by ({WORKLOAD}) (sum_over_time({productive}[{window}]))"
            f" / (sum by ({WORKLOAD}) (sum_over_time({WALL_RATE}[{window}])) > 0)",
            PROGRAM_GOODPUT: f"avg_over_time({MFU_RATE}[{window}])",
        }
        state_ready = f'{SCHEDULING}{{state="ready"}}'
        per_team = {
            SCHEDULING_GOODPUT: f"sum by (namespace) (sum_over_time({state_ready}[{window}]))"
            f" / sum by (namespace) (count_over_time({state_ready}[{window}]))",
            RUNTIME_GOODPUT: f"sum by (namespace) (sum_over_time({productive}[{window}]))"
            f" / (sum by (namespace) (sum_over_time({WALL_RATE}[{window}])) > 0)",
            PROGRAM_GOODPUT: f"avg by (namespace) ({names[PROGRAM_GOODPUT][0]})",
        }
        for level, exprs in ((0, per_workload), (1, per_team)):
            on = WORKLOAD if level == 0 else "namespace"
            rules += [{"record": names[factor][level], "expr": expr} for factor, expr in exprs.items()]
            product = f" * on ({on}) ".join(names[factor][level] for factor in exprs)
            rules.append({"record": names[ML_PRODUCTIVITY_GOODPUT][level], "expr": product})
    return rules
