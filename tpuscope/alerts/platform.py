"""The platform owner's goodput (issue 57): how much of what the fleet pays for turns into training.

Google's ML Productivity Goodput is the product of three factors: *scheduling* goodput (the share of a workload's
time during which every resource it needs is there), *runtime* goodput (the share of that time spent on productive
steps) and *program* goodput (how close the program runs to the chips' peak: MFU). tpuscope had the last two; this
module records the first from kube-state-metrics, the product, the chips no job holds, and the windows an owner
excludes from the goodput SLO. docs/goodput.md says how each factor departs from Google's.

**Scheduling.** The unit is what a user submits: a JobSet, or a Job that no JobSet owns. It exists from its first
Job's creation, so the time it waits in a queue before any pod (or sidecar) runs is counted. At each evaluation
each live Job (created, neither complete nor failed) is ready when its ready (or succeeded) pods number at least
what it wants (``min(parallelism, completions)``, JobSet's own idea of a ready Job); a JobSet when all its live
Jobs are. The unit's state is then one of :data:`tpuscope.conventions.SCHEDULING_STATES`: ready, queued (a queue
holds its Jobs suspended: Kueue's admission wait), starting (never ready yet) or recovering (ready before, not
now: a restart's time to recover). Scheduling goodput over a window is the mean of "ready" over the evaluations
the unit existed in it. An evaluation kube-state-metrics did not answer is not counted either way.

**The fleet's chips.** Per node pool (GKE's node labels, which kube-state-metrics serves only with
``--metric-labels-allowlist``: docs/fleet.md), the chips its nodes offer, the chips running pods request, and the
chips tpuscope's collectors report: a pool with chips and no pod is paid for and idle.

**Exclusions.** A series :data:`tpuscope.conventions.SLO_EXCLUDED` (``tpuscope exclusion`` writes its rule) marks
a window; the goodput SLO's two terms are not recorded for what it covers, so the burn rates read neither the bad
nor the wall time of the window, as ml-goodput-measurement's exclusions take a window out of both.
"""

from __future__ import annotations

from tpuscope import catalog as c
from tpuscope.alerts.recording import CONTROLLER_KINDS, KSM_JOB_COMPLETE, KSM_JOB_EXISTS, KSM_JOB_SUSPENDED
from tpuscope.conventions import (
    CHIPS_ALLOCATABLE,
    CHIPS_HEARD,
    CHIPS_IDLE,
    CHIPS_REQUESTED,
    CONTROLLER,
    CONTROLLER_NEWEST,
    GOODPUT_RATE,
    MFU_RATE,
    ML_PRODUCTIVITY_GOODPUT,
    PEAK_FLOPS_SUM,
    PLATFORM_WINDOWS,
    PROGRAM_GOODPUT,
    QUEUE_ADMISSION_WAIT,
    RUNTIME_GOODPUT,
    SCHEDULING,
    SCHEDULING_GOODPUT,
    SCHEDULING_STATES,
    UNIT_QUEUED,
    UNIT_READY,
    UNIT_STARTED,
    WALL_RATE,
)
from tpuscope.promql import PLACEMENT, WORKLOAD, series

JOB = "namespace, job_name"  # kube-state-metrics' labels of a Job
UNIT = f"{PLACEMENT}, {CONTROLLER}"  # a scheduling unit: a JobSet (controller_kind JobSet) or a Job of its own
JOBSET_KIND = "JobSet"
KSM_JOB_FAILED = 'kube_job_failed{condition="true"}'
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
# in a label value's name becomes "_").
CHIP_RESOURCES = 'resource=~"google_com_tpu|nvidia_com_gpu"'
# How long a unit that has been ready is remembered as such through an evaluation kube-state-metrics missed.
STARTED_MEMORY = "10m"


def per_unit(per_job: str, aggregation: str) -> str:
    """A per-Job expression (kube-state-metrics' ``namespace, job_name``) as one series per scheduling unit: a JobSet's
    Jobs aggregated by ``aggregation`` under the JobSet (``jobset`` and ``controller`` its name, as the sidecars'
    targets name a JobSet's pods), a Job of its own as itself (``controller`` its name, as its pods' targets do)."""
    owner = f'kube_job_owner{{owner_kind="{JOBSET_KIND}"}}'
    owned = f"{per_job} * on ({JOB}) group_left (owner_name) {owner}"
    jobset = f'label_replace({owned}, "jobset", "$1", "owner_name", "(.+)")'
    jobset = f'label_replace({jobset}, "controller", "$1", "owner_name", "(.+)")'
    jobset = f'label_replace({jobset}, "controller_kind", "{JOBSET_KIND}", "", "")'
    alone = f'label_replace({per_job} unless on ({JOB}) {owner}, "controller", "$1", "job_name", "(.+)")'
    alone = f'label_replace({alone}, "controller_kind", "{CONTROLLER_KINDS[0]}", "", "")'
    return f"{aggregation} by ({UNIT}) ({jobset}) or {aggregation} by ({UNIT}) ({alone})"


def live_jobs() -> str:
    """1 per Job that exists and has neither completed nor failed for good, as kube-state-metrics says now."""
    ended = f"{KSM_JOB_COMPLETE} == 1 or {KSM_JOB_FAILED} == 1"
    return f"({KSM_JOB_EXISTS} * 0 + 1 unless on ({JOB}) ({ended}))"


def job_ready() -> str:
    """1 per live Job whose ready or succeeded pods number at least what it wants, else 0."""
    parallelism, completions = "kube_job_spec_parallelism", "kube_job_spec_completions"
    # min(parallelism, completions); completions is unset on a work-queue Job, where kube-state-metrics serves none.
    wanted = f"({parallelism} <= {completions} or {completions} or {parallelism})"
    ready_pod = 'kube_pod_status_ready{condition="true"} == 1 or kube_pod_status_phase{phase="Succeeded"} == 1'
    owned = 'label_replace(kube_pod_owner{owner_kind="Job"}, "job_name", "$1", "owner_name", "(.+)")'
    ready = f"count by ({JOB}) ({owned} and on (namespace, pod) ({ready_pod}))"
    return f"(({ready} >= bool on ({JOB}) {wanted}) or on ({JOB}) {wanted} * 0) * on ({JOB}) {live_jobs()}"


def scheduling_rules() -> list[dict[str, str]]:
    """Each scheduling unit's readiness now, whether it has been ready, and its state (module docstring)."""
    suspended = f"max by ({JOB}) ({KSM_JOB_SUSPENDED} == 1) * on ({JOB}) {live_jobs()}"
    queued = f"({UNIT_QUEUED} or {UNIT_READY} * 0)"
    started = f"({UNIT_STARTED} or {UNIT_READY} * 0)"
    not_ready = f"(1 - {UNIT_READY})"
    states = {
        "ready": UNIT_READY,
        "queued": f"{not_ready} * on ({UNIT}) {queued}",
        "starting": f"{not_ready} * on ({UNIT}) (1 - {queued}) * on ({UNIT}) (1 - {started})",
        "recovering": f"{not_ready} * on ({UNIT}) (1 - {queued}) * on ({UNIT}) {started}",
    }
    assert tuple(states) == SCHEDULING_STATES
    state = " or ".join(f'label_replace({expr}, "state", "{name}", "", "")' for name, expr in states.items())
    return [
        {"record": UNIT_READY, "expr": per_unit(job_ready(), "min")},
        {"record": UNIT_QUEUED, "expr": per_unit(suspended, "max")},
        {  # reads its own past: a unit once ready stays started while it exists
            "record": UNIT_STARTED,
            "expr": f"({UNIT_READY} == 1 or last_over_time({UNIT_STARTED}[{STARTED_MEMORY}])) * 0 + 1"
            f" and on ({UNIT}) {UNIT_READY}",
        },
        {"record": SCHEDULING, "expr": state},
    ]


def queue_rules() -> list[dict[str, str]]:
    """Kueue's admission wait per ClusterQueue (its histograms name no workload; the per-workload wait is the
    ``queued`` state above)."""
    wait = "kueue_admission_wait_time_seconds"
    return [
        {
            "record": QUEUE_ADMISSION_WAIT,
            "expr": f"sum by (cluster_queue) (rate({wait}_sum[1h]))"
            f" / (sum by (cluster_queue) (rate({wait}_count[1h])) > 0)",
        }
    ]


def chip_rules() -> list[dict[str, str]]:
    """Per node pool and resource: the chips the nodes have, those running pods request, those tpuscope hears."""
    pools = f"group by (node, {POOL}) (kube_node_labels)"

    def by_pool(per_node: str) -> str:
        return f"sum by ({POOL}, resource) ({per_node} * on (node) group_left ({POOL}) {pools})"

    running = 'kube_pod_status_phase{phase="Running"} == 1'
    requested = f"sum by (node, resource) (kube_pod_container_resource_requests{{{CHIP_RESOURCES}}}"
    requested += f" and on (namespace, pod) ({running}))"
    # One series a chip and source: a TPU chip's from the runtime and the device plugin both, a GPU's from NVML.
    chips = f"count by (node) (group by (node, {c.Label.DEVICE}) ({{selector}}))"
    tpu = chips.format(selector=series(c.DUTY_CYCLE, f'{c.Label.SOURCE}!="{c.NVML}"'))
    gpu = chips.format(selector=series(c.DUTY_CYCLE, f'{c.Label.SOURCE}="{c.NVML}"'))
    heard = f'label_replace({tpu}, "resource", "google_com_tpu", "", "")'
    heard += f' or label_replace({gpu}, "resource", "nvidia_com_gpu", "", "")'
    return [
        {"record": CHIPS_ALLOCATABLE, "expr": by_pool(f"kube_node_status_allocatable{{{CHIP_RESOURCES}}}")},
        {"record": CHIPS_REQUESTED, "expr": by_pool(requested)},
        {"record": CHIPS_HEARD, "expr": by_pool(f"({heard})")},
        {  # a pool where no running pod requests a chip has all its chips idle
            "record": CHIPS_IDLE,
            "expr": f"clamp_min({CHIPS_ALLOCATABLE} - {CHIPS_REQUESTED}, 0) or {CHIPS_ALLOCATABLE}",
        },
    ]


def program_rules() -> list[dict[str, str]]:
    """Each workload's MFU over 5 minutes, for the product's program factor over long windows."""
    flops = f"sum by ({WORKLOAD}) (rate({series(c.MODEL_FLOPS)}[5m]))"
    return [{"record": MFU_RATE, "expr": f"{flops} / on ({WORKLOAD}) ({PEAK_FLOPS_SUM} > 0)"}]


def platform_rules() -> list[dict[str, str]]:
    """The rules evaluated every 30 s: the units' states, the queues' waits, the chips, the workloads' MFU."""
    return scheduling_rules() + queue_rules() + chip_rules() + program_rules()


def product_rules() -> list[dict[str, str]]:
    """The three factors and their product over :data:`PLATFORM_WINDOWS`, per workload and per namespace (a team).

    A workload's scheduling is its unit's: a JobSet's workloads join it on ``namespace, jobset``, a plain Job's on
    the controller its workers' pods had in the last hour. A team's scheduling is the mean over its units' time,
    its runtime its workloads' productive seconds over their wall seconds, its program the mean of its workloads'.
    """
    rules = []
    productive = f'{GOODPUT_RATE}{{category="productive"}}'
    for window in PLATFORM_WINDOWS:

        def ready(kind: str, window: str = window) -> str:
            return f'avg_over_time({SCHEDULING}{{state="ready", controller_kind="{kind}"}}[{window}])'

        workloads = f'group by ({WORKLOAD}) ({WALL_RATE}{{jobset!=""}})'
        of_jobset = f"{ready(JOBSET_KIND)} * on ({PLACEMENT}) group_right () {workloads}"
        controllers = f"group by (namespace, {CONTROLLER}, workload) ({CONTROLLER_NEWEST})"
        of_job = f"{ready(CONTROLLER_KINDS[0])} * on (namespace, {CONTROLLER}) group_right () {controllers}"
        names = {
            factor: (f"workload:{factor}{window}", f"namespace:{factor}{window}")
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
