"""What kube-state-metrics and Kueue serve for ``bench fleet-scale``'s fleet: the cluster's view of its workloads.

The platform rules read a cluster's objects as these two exporters serve them: the pods a Job wants and whether they
are ready, the chips the nodes have and the chips the pods request, the time a workload waits to be admitted. So
the fleet's objects are served here as each exporter would, one scrape target each (a cluster has one
kube-state-metrics, serving every object, and one Kueue controller), its series with their own labels only: fakes
of real exporters, true to their formats as of

- kube-state-metrics v2.20.0 (commit 4ffeda2ef866b0fef372849825a803296483b336), internal/store/namespace.go,
  job.go, pod.go and node.go: every pod series begins ``namespace``, ``pod``, ``uid``; every Job series
  ``namespace``, ``job_name``; every node series ``node``; a condition is served as three series, ``true``,
  ``false`` and ``unknown``, one of them 1, and only when the object has that condition (a running Job has no
  ``Complete`` nor ``Failed`` one, so no ``kube_job_complete`` nor ``kube_job_failed``); a resource name is
  sanitised (``google.com/tpu`` as ``google_com_tpu``) and given its unit; the node labels are those
  ``--metric-labels-allowlist=nodes=[...]`` lets through (:data:`NODE_LABELS`);
- Kueue v0.19.2 (commit 8eab68778fc1b52affe165fdf5af29d1e9b4f3cb), pkg/metrics/metrics.go: per ClusterQueue, with
  ``replica_role`` (the leader's: Kueue runs with leader election); its wait histograms' buckets are
  ``generateExponentialBuckets``' (1, then 2.5 doubling).

The fleet (:func:`tpuscope.bench.fleet_series.fleet`) is JobSets of 16 workers, 4 hosts to a slice, in 4 namespaces.
Each slice is one Job, named as JobSet names its child Jobs (``<jobset>-<replicatedJob>-<index>``), of 4 pods; each
pod has a node of its own, each slice's nodes a GKE TPU node pool of their own. Beside them, about a twentieth more
TPU nodes in node pools that run no pod at all: chips the cluster pays for and no one uses. One ClusterQueue a
namespace admits its JobSets. A preempted workload (the fleet's third: :func:`tpuscope.bench.fleet_scale.variations`)
shows as Kueue's preemption does: its Jobs suspended and its pods gone while it waits, its ClusterQueue with one
workload pending, and on its return new pods and one admission more, after a wait of the preemption's length.

Every value is a constant or a time an object began (the fleet's start, or a preempted pod's return): cheap to
serve at every scrape and to backfill.
"""

from __future__ import annotations

import math
import uuid
import zlib
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from tpuscope.bench.fleet_series import WORKERS_PER_SLICE, Host
from tpuscope.conventions import GKE_TOPOLOGY, SIDECAR_CONTAINER, sanitized

KSM_JOB = "kube-state-metrics"
KUEUE_JOB = "kueue"
# The scrape target's instance: each is one target, whose series carry their own labels only.
INSTANCES = {
    KSM_JOB: "kube-state-metrics.kube-system.svc:8080",
    KUEUE_JOB: "kueue-controller-manager.kueue-system.svc:8443",
}

TRAINING_CONTAINER = "train"  # tpuscope/kubernetes.py's; the sidecar, an init container, requests no chip
REPLICATED_JOB = "slice"  # the JobSet's replicatedJob, as deploy/kubernetes/jobset.yaml names it
PRIORITY_CLASS = "tpu-training"  # the pods' PriorityClass, which Kueue's series name too
CLUSTER, ZONE = "fleet", "us-west4-a"
IDLE_SHARE = 0.05  # of the hosts: TPU nodes in node pools of their own that run no pod

# The node labels kube-state-metrics serves, as --metric-labels-allowlist=nodes=[...] names them: GKE's.
NODE_POOL, NODE_ACCELERATOR, NODE_TOPOLOGY = (
    "cloud.google.com/gke-nodepool",
    "cloud.google.com/gke-tpu-accelerator",
    "cloud.google.com/gke-tpu-topology",
)
ACCELERATOR = "tpu-v5-lite-podslice"
TOPOLOGIES = {4: "2x2", 8: "2x4", 16: "4x4", 32: "4x8", 64: "8x8", 128: "8x16", 256: "16x16"}  # v5e's, by chips
TPU = "google_com_tpu"  # google.com/tpu, sanitised
UNITS = {TPU: "integer", "cpu": "core", "memory": "byte", "pods": "integer", "ephemeral_storage": "byte"}
# A TPU VM's resources as its kubelet reports them, the chips aside; and the training container's.
NODE_CAPACITY = {"cpu": 224.0, "memory": 202_948_833_280.0, "pods": 110.0, "ephemeral_storage": 101_203_873_792.0}
NODE_ALLOCATABLE = {"cpu": 223.0, "memory": 188_697_698_304.0, "pods": 110.0, "ephemeral_storage": 47_093_746_742.0}
POD_REQUESTS = {"cpu": 200.0, "memory": 171_798_691_840.0}
POD_LIMITS = {"cpu": 220.0, "memory": 171_798_691_840.0}
NODE_INFO = {
    "kernel_version": "6.6.87+",
    "os_image": "Container-Optimized OS from Google",
    "container_runtime_version": "containerd://2.0.4",
    "kubelet_version": "v1.33.2-gke.1240000",
    "kubeproxy_version": "deprecated",  # what kube-state-metrics serves since the field went
}
# The conditions every kubelet reports of its node, and each one's status on a healthy node.
# What GKE runs on each TPU node in kube-system (a DaemonSet's pod each), and what each requests.
DAEMONSETS = (
    "kube-proxy",
    "fluentbit-gke",
    "gke-metadata-server",
    "netd",
    "pdcsi-node",
    "node-problem-detector",
    "tpu-device-plugin",
    "gke-metrics-agent",
)
DAEMON_REQUESTS = {"cpu": 0.1, "memory": 104_857_600.0}
NODE_CONDITIONS = {"Ready": "true", "MemoryPressure": "false", "DiskPressure": "false", "PIDPressure": "false"}
CONDITION_STATUSES = ("true", "false", "unknown")  # kube-state-metrics' order
POD_PHASES = ("Pending", "Succeeded", "Failed", "Unknown", "Running")  # kube-state-metrics' order

REPLICA_ROLE = "leader"  # Kueue's, with leader election
# Each workload's first admission waited one of these seconds, in turn: a spread over the histograms' buckets.
FIRST_WAITS = (3.0, 12.0, 45.0, 150.0)


@dataclass(frozen=True)
class Preempted:
    """What a preemption does to a series: absent while it lasts (a deleted pod's), or ``held`` (a suspended Job's,
    a ClusterQueue's pending workloads); or a counter's rise of ``rise`` when the workload is admitted again."""

    held: float | None = None
    rise: float = 0.0


GONE = Preempted()


@dataclass(frozen=True)
class Series:
    """One series as the exporter serves it: its own labels, in the exporter's order, and its value, ``value`` or,
    ``began``, the time its object began; ``preempted``, what the preemption does to it."""

    name: str
    labels: tuple[tuple[str, str], ...]
    value: float = 0.0
    began: bool = False
    preempted: Preempted | None = None


# --- The fleet's objects ----------------------------------------------------------------------------------


def job_of(host: Host) -> str:
    """The Job that runs the host's pod: its JobSet's child Job for the host's slice."""
    return f"{host.workload}-{REPLICATED_JOB}-{host.slice}"


@dataclass(frozen=True)
class Node:
    """A TPU node: its node pool, one a slice, and its addresses."""

    pool: str
    worker: int  # its place in the pool
    number: int  # its place among the cluster's nodes: its addresses

    @property
    def name(self) -> str:
        """As GKE names a node: the cluster, its pool, the pool's instance group's hash, the instance's."""
        group, instance = (f"{zlib.crc32(key.encode()):08x}" for key in (self.pool, f"{self.pool}/{self.worker}"))
        return f"gke-{CLUSTER}-{self.pool}-{group}-{instance[:4]}"

    @property
    def topology(self) -> dict[str, str]:
        """GKE's node labels of its placement (cloud.google.com/gce-topology-*): a block of 512 nodes, a sub-block
        of 32, its host."""
        places = (f"b{self.number // 512:03d}", f"s{self.number // 32:04d}", f"h{self.number:05d}")
        return dict(zip(GKE_TOPOLOGY.values(), places, strict=True))

    @property
    def internal_ip(self) -> str:
        return f"10.128.{self.number // 256}.{self.number % 256}"

    @property
    def pod_cidr(self) -> str:
        return f"10.{4 + self.number // 256}.{self.number % 256}.0/24"

    @property
    def pod_ip(self) -> str:
        return f"10.{4 + self.number // 256}.{self.number % 256}.2"


def node_of(index: int) -> Node:
    """Host ``index``'s node (its pod's ``spec.nodeName``, the sidecar target's ``node``): one node pool a slice."""
    per = WORKERS_PER_SLICE
    return Node(f"tpu-pool-{index // per:04d}", index % per, index)


def nodes(hosts: int) -> list[Node]:
    """Every TPU node: the hosts', in order, then those of the node pools that run no pod, whole slices, about
    :data:`IDLE_SHARE` of the hosts and at least one slice."""
    per = WORKERS_PER_SLICE
    idle = math.ceil(hosts * IDLE_SHARE / per)
    return [node_of(index) for index in range(hosts)] + [
        Node(f"idle-pool-{n:04d}", worker, hosts + n * per + worker) for n in range(idle) for worker in range(per)
    ]


def cluster_queue(namespace: str) -> str:
    """The ClusterQueue that admits the namespace's workloads (through its LocalQueue)."""
    return f"{namespace}-cq"


# --- kube-state-metrics -----------------------------------------------------------------------------------


def kube_state_series(hosts: list[Host], chips: int, preempted: Iterable[str] = ()) -> list[Series]:
    """Every series kube-state-metrics serves for the fleet: its namespaces, Jobs, pods (the DaemonSets' on every node
    too) and nodes. ``chips``: each
    host's, the TPU chips its pod requests and its node has; ``preempted``: the workloads preempted for a while."""
    stopped = set(preempted)
    namespaces = dict.fromkeys(["kube-system", *(host.namespace for host in hosts)])
    out = [Series("kube_namespace_created", (("namespace", namespace),), began=True) for namespace in namespaces]
    pods = Counter(job_of(host) for host in hosts)
    for host in {job_of(host): host for host in hosts}.values():
        out += job_series(host, pods[job_of(host)], host.workload in stopped)
    for index, host in enumerate(hosts):
        out += pod_series(host, node_of(index), chips, host.workload in stopped)
    slice_chips = chips * WORKERS_PER_SLICE
    topology = TOPOLOGIES.get(slice_chips, f"{slice_chips} chips")
    for node in nodes(len(hosts)):
        out += node_series(node, chips, topology)
        out += daemon_pod_series(node)
    return out


def daemon_pod_series(node: Node) -> Iterator[Series]:
    """The pods GKE's DaemonSets run on every node (:data:`DAEMONSETS`), Running and Ready since the fleet began: the
    bulk of a cluster's pods, which every rule that joins pods reads past."""
    for daemonset in DAEMONSETS:
        pod = f"{daemonset}-{node.number:05x}"  # unique: a node runs one of each
        uid = str(uuid.uuid5(uuid.NAMESPACE_URL, f"kube-system/{pod}"))
        key = (("namespace", "kube-system"), ("pod", pod), ("uid", uid))
        yield Series(
            "kube_pod_owner",
            (*key, ("owner_kind", "DaemonSet"), ("owner_name", daemonset), ("owner_is_controller", "true")),
            1.0,
        )
        info = {"host_ip": node.internal_ip, "pod_ip": node.internal_ip, "node": node.name}
        info |= {"created_by_kind": "DaemonSet", "created_by_name": daemonset, "priority_class": "system-node-critical"}
        yield Series("kube_pod_info", (*key, *info.items(), ("host_network", "true")), 1.0)
        for status in CONDITION_STATUSES:
            yield Series("kube_pod_status_ready", (*key, ("condition", status)), float(status == "true"))
        for phase in POD_PHASES:
            yield Series("kube_pod_status_phase", (*key, ("phase", phase)), float(phase == "Running"))
        yield Series("kube_pod_created", key, began=True)
        for resource, amount in DAEMON_REQUESTS.items():
            labels = (("container", daemonset), ("node", node.name), ("resource", resource), ("unit", UNITS[resource]))
            yield Series("kube_pod_container_resource_requests", (*key, *labels), amount)


def job_series(host: Host, pods: int, preempted: bool) -> Iterator[Series]:
    """The Job that runs the host's pod, of ``pods`` pods (internal/store/job.go): running, admitted by Kueue (its
    ``Suspended`` condition False); while its workload is preempted, suspended and none of its pods active."""
    key = (("namespace", host.namespace), ("job_name", job_of(host)))
    idle = Preempted(held=0.0) if preempted else None
    owner = (("owner_kind", "JobSet"), ("owner_name", host.workload), ("owner_is_controller", "true"))
    yield Series("kube_job_created", key, began=True)
    yield Series("kube_job_owner", (*key, *owner), 1.0)
    yield Series("kube_job_spec_parallelism", key, float(WORKERS_PER_SLICE))
    yield Series("kube_job_spec_completions", key, float(WORKERS_PER_SLICE))
    yield Series("kube_job_status_active", key, float(pods), preempted=idle)
    yield Series("kube_job_status_ready", key, float(pods), preempted=idle)
    yield Series("kube_job_status_suspended", key, 0.0, preempted=Preempted(held=1.0) if preempted else None)


def pod_series(host: Host, node: Node, chips: int, preempted: bool) -> Iterator[Series]:
    """The host's pod (internal/store/pod.go): Running and Ready on its node since it began, its training container
    requesting the node's chips, its sidecar running; gone while its workload is preempted, and began again after."""
    pod = host.target["pod"]
    uid = str(uuid.uuid5(uuid.NAMESPACE_URL, f"{host.namespace}/{pod}"))
    key = (("namespace", host.namespace), ("pod", pod), ("uid", uid))
    job = job_of(host)

    def series(name: str, *labels: tuple[str, str], value: float = 1.0, began: bool = False) -> Series:
        return Series(name, (*key, *labels), value, began, GONE if preempted else None)

    yield series("kube_pod_owner", ("owner_kind", "Job"), ("owner_name", job), ("owner_is_controller", "true"))
    info = {"host_ip": node.internal_ip, "pod_ip": node.pod_ip, "node": node.name, "created_by_kind": "Job"}
    info |= {"created_by_name": job, "priority_class": PRIORITY_CLASS, "host_network": "false"}
    yield series("kube_pod_info", *info.items())
    for status in CONDITION_STATUSES:
        yield series("kube_pod_status_ready", ("condition", status), value=float(status == "true"))
    for phase in POD_PHASES:
        yield series("kube_pod_status_phase", ("phase", phase), value=float(phase == "Running"))
    for name in ("created", "start_time", "status_scheduled_time", "status_ready_time"):
        yield series(f"kube_pod_{name}", began=True)
    yield series("kube_pod_init_container_status_running", ("container", SIDECAR_CONTAINER))
    yield series("kube_pod_container_status_running", ("container", TRAINING_CONTAINER))
    for name, amounts in (("requests", POD_REQUESTS), ("limits", POD_LIMITS)):
        for resource, amount in {TPU: float(chips), **amounts}.items():
            labels = (("container", TRAINING_CONTAINER), ("node", node.name), ("resource", resource))
            yield series(f"kube_pod_container_resource_{name}", *labels, ("unit", UNITS[resource]), value=amount)


def node_series(node: Node, chips: int, topology: str) -> Iterator[Series]:
    """A TPU node (internal/store/node.go): Ready, schedulable, its chips allocatable; its node pool's labels."""
    key = (("node", node.name),)
    for name, amounts in (("allocatable", NODE_ALLOCATABLE), ("capacity", NODE_CAPACITY)):
        for resource, amount in {TPU: float(chips), **amounts}.items():
            yield Series(f"kube_node_status_{name}", (*key, ("resource", resource), ("unit", UNITS[resource])), amount)
    values = {NODE_POOL: node.pool, NODE_ACCELERATOR: ACCELERATOR, NODE_TOPOLOGY: topology, **node.topology}
    yield Series("kube_node_labels", (*key, *((sanitized("label_" + k), values[k]) for k in sorted(values))), 1.0)
    info = {**NODE_INFO, "provider_id": f"gce://tpuscope-{CLUSTER}/{ZONE}/{node.name}", "pod_cidr": node.pod_cidr}
    info |= {"system_uuid": str(uuid.uuid5(uuid.NAMESPACE_DNS, node.name)), "internal_ip": node.internal_ip}
    yield Series("kube_node_info", (*key, *info.items()), 1.0)
    yield Series("kube_node_spec_unschedulable", key, 0.0)
    for condition, healthy in NODE_CONDITIONS.items():
        for status in CONDITION_STATUSES:
            labels = (*key, ("condition", condition), ("status", status))
            yield Series("kube_node_status_condition", labels, float(status == healthy))


# --- Kueue ------------------------------------------------------------------------------------------------


def wait_buckets(count: int) -> list[float]:
    """Kueue's ``generateExponentialBuckets(count)``: 1, then from 2.5 doubling, ``count`` bounds in all."""
    return [1.0, *(2.5 * 2**i for i in range(count - 1))]


WAIT_HISTOGRAMS = {
    "kueue_admission_wait_time_seconds": wait_buckets(16),
    "kueue_quota_reserved_wait_time_seconds": wait_buckets(14),
}


def kueue_series(hosts: list[Host], preempted: Iterable[str] = (), waited: float = 0.0) -> list[Series]:
    """Every series of Kueue's ClusterQueues for the fleet (pkg/metrics/metrics.go), one a namespace: each workload
    admitted once, after a short wait (:data:`FIRST_WAITS`); a ``preempted`` one pending for ``waited`` seconds, then
    admitted again after that wait. The client library serves each series' labels sorted, ``le`` last."""
    stopped = set(preempted)
    workloads = list(dict.fromkeys(host.workload for host in hosts))
    queues: dict[str, list[str]] = {}
    for host in {host.workload: host for host in hosts}.values():
        queues.setdefault(cluster_queue(host.namespace), []).append(host.workload)
    role = ("replica_role", REPLICA_ROLE)
    out: list[Series] = []
    for queue, admitted in queues.items():
        key = (("cluster_queue", queue),)
        by_class = (*key, ("priority_class", PRIORITY_CLASS), role)
        waits = [FIRST_WAITS[workloads.index(workload) % len(FIRST_WAITS)] for workload in admitted]
        back = sum(workload in stopped for workload in admitted)  # admitted again after the preemption
        for name, buckets in WAIT_HISTOGRAMS.items():
            out += histogram(name, by_class, buckets, waits, back, waited)
        count = float(len(admitted))
        out += [
            Series(
                "kueue_pending_workloads", (*key, role, ("status", "active")), 0.0, preempted=held(float(back), back)
            ),
            Series("kueue_pending_workloads", (*key, role, ("status", "inadmissible")), 0.0),
            Series("kueue_admitted_active_workloads", (*key, role), count, preempted=held(count - back, back)),
            Series(
                "kueue_admitted_workloads_total",
                by_class,
                count,
                preempted=Preempted(rise=float(back)) if back else None,
            ),
        ]
    return out


def held(value: float, preempted: int) -> Preempted | None:
    """``value`` while the preemption lasts, if any of a queue's workloads is ``preempted``."""
    return Preempted(held=value) if preempted else None


def histogram(
    name: str, labels: tuple[tuple[str, str], ...], buckets: list[float], waits: list[float], back: int, waited: float
) -> Iterator[Series]:
    """A wait histogram of ``waits``; ``back`` more waits of ``waited`` seconds each once the preempted return."""

    def series(suffix: str, value: float, rise: float, *le: tuple[str, str]) -> Series:
        return Series(f"{name}_{suffix}", (*labels, *le), value, preempted=Preempted(rise=rise) if rise else None)

    for bound in [*buckets, math.inf]:
        le = "+Inf" if math.isinf(bound) else f"{bound:g}"  # as Go's strconv.FormatFloat(bound, 'g', -1, 64)
        yield series("bucket", sum(wait <= bound for wait in waits), back * (waited <= bound), ("le", le))
    yield series("sum", sum(waits), back * waited)
    yield series("count", len(waits), back)
