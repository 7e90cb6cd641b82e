"""The dashboards' counts and ratios on a multi-host fleet whose right answers are known.

A real Prometheus reads a TSDB that ``promtool tsdb create-blocks-from openmetrics`` wrote from series as
the sidecars of such a fleet serve them (and as tpuscope's recording rules record them), and the panels'
queries, taken from the dashboards as Grafana gets them, run against it at one instant:

- ``train``, a job of 4 hosts (slice 0, workers 0..3), failed and restarted once: its 4 sidecars, each with
  the failure, went away with their pods, and 4 new sidecars (new instances) each report the restart. Every
  host reports the same compiles: a recompile before the failure (its cause: input types), a compile that ran
  out of memory just before the failure, the compile after the restart, and the same checkpoint saves (each
  process saves its part): one before the failure, one after the restart.
- ``tune``, 2 hosts of another accelerator (another peak), started within the range.
- Each host's 4 chips: ``train``'s new pods read by the libtpu collector; ``tune``'s, on GKE without runtime
  metrics, by the gke-device-plugin collector, which also gives TensorCore utilization, and their sidecars
  label every series with their slice's topology.
- Both run at 50% MFU; each sidecar reports its own host's FLOPs and peak, as the job's Monitor sends them.
- ``train``'s new pods sample device profiles, all 4 at the same steps, at -20 and -10 min (0.3 s and 360 kB a
  capture); worker 2 is a straggler: more compute and less collective wait than its peers (who wait for it),
  in a step as long as theirs (lockstep).
- ``train``'s new pods report their loss: at -15 min worker 1's value before the reduction (``local``) went NaN
  at step 9000, its peers' and every loss a step later, for 5 steps; a minute later the job restored the
  checkpoint of step 8805 (200 steps and 25 productive seconds a worker thrown away), and its loss, finite again,
  has spiked for the last 10 minutes.
- ``train`` lost half a day's goodput 10 days ago and a whole day 35 days ago; ``serve``'s latency SLO
  missed by 3% of requests for a day 10 days ago: the error budgets cover the SLO's 30 days, not the
  dashboard's hour, nor anything older.
- In Kubernetes, namespace ``ml``: every sidecar's series carry its pod's target labels, as the scrape's
  relabelings give them (the JobSet, the pod's controller), and kube-state-metrics (v2) has described the
  cluster's objects for the last hour. ``train`` and ``tune`` are JobSets whose Jobs ``train-workers-0`` and
  ``tune-workers-0`` run their pods; ``serve`` is a Deployment whose ReplicaSet ``serve-5d8f`` runs 2 replicas
  (its previous one, ``serve-7c9b``, scaled to 0 by the rollout, stays listed). ``old`` is a JobSet deleted
  30 minutes ago: its 2 sidecars were seen until then, and its Job and pods went with it. ``eval`` is a
  JobSet whose Job completed 20 minutes ago: its sidecar went then, its Job and pod stay listed.
"""

from __future__ import annotations

import math
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import pytest
import yaml
from conftest import require
from dashboard_helpers import ALL, BOARDS, SCRAPE, Fleet, backfilled, panel_titled, served, step_values, substitute

from tpuscope import catalog as c
from tpuscope import conventions, durations, kubernetes
from tpuscope.alerts import rule_groups
from tpuscope.dashboards import queries
from tpuscope.generator_config import GeneratorConfig
from tpuscope.prometheus_api import PrometheusAPI
from tpuscope.promql import le
from tpuscope.thresholds import Thresholds

DEFAULTS = Thresholds()

RANGE = 3600  # the dashboard's time range: the last hour
HOUR, DAY = 3600, 86_400
V5E, V6E = 197e12, 918e12  # a chip's peak FLOP/s (tracing.jax_costs.PEAK_TFLOPS)
CHIPS = 4  # per host
MFU = 0.5

ROOT = Path(__file__).resolve().parents[1]
RULES = ROOT / "deploy/prometheus/tpuscope-rules.yaml"  # as generated: what a Prometheus evaluates

NAMESPACE = "ml"
# kube-state-metrics' own target: its series' namespace and pod are the objects' (honor_labels).
KSM_TARGET = {"job": "kube-state-metrics", "instance": "10.8.0.5:8080"}
KSM_SINCE = -RANGE  # it lists the objects alive in the last hour
PHASES = ("Pending", "Running", "Succeeded", "Failed", "Unknown")  # kube_pod_status_phase's, one series each
# The labels that name a pod's controller, on a sidecar's series and on the rules' view of kube-state-metrics.
CONTROLLER_OF = ("namespace", kubernetes.CONTROLLER_KIND, kubernetes.CONTROLLER_NAME)

# Prometheus ends a gone target's series at once (staleness markers); a backfilled TSDB has none, so the
# lookback that would otherwise show a gone series for 5 more minutes is cut to just over one scrape.
LOOKBACK = "15s"


def fleet(at: int) -> Fleet:
    f = Fleet(at)
    train, tune = {"workload": "train"}, {"workload": "tune"}
    for worker in range(4):
        # The first pods: up two hours ago, the failure at -31 min, gone at -30 min.
        pod = job_pod(f, "train", f"{worker}-a", {-2 * HOUR: "Running", -1860: "Failed"}, -1800)
        first = f.sidecar(f"train-{worker}-a:9478", pod, "0", str(worker), -2 * HOUR, -1800)
        # The pods after the restart: new sidecars, new instances, the same slice and worker.
        pod = job_pod(f, "train", f"{worker}-b", {-1740: "Pending", -1680: "Running"}, 0)
        second = f.sidecar(f"train-{worker}-b:9478", pod, "0", str(worker), -1680, 0)
        f.counter(c.WORKLOAD_FAILURES.name, {**first, **train, "reason": "crash"}, -1860, -1800, {-1860: 1})
        out_of_memory = {**first, **train, "stage": "backend", "reason": "out_of_memory"}
        f.counter(c.COMPILE_FAILURES.name, out_of_memory, -1870, -1800, {-1870: 1})
        f.counter(c.RECOMPILES.name, {**first, **train, "cause": "input_types"}, -3000, -1800, {-3000: 1})
        f.counter(c.WORKLOAD_RESTARTS.name, {**second, **train, "reason": "crash"}, -1680, 0, {-1680: 1})
        for host, start, end in ((first, -2 * HOUR, -1800), (second, -1680, 0)):
            # Every host compiles the same program at its start, 20 s (2 s of it tracing); the first pods
            # recompile it at -50 min, 10 s (1 s of it tracing).
            for stage, seconds in (("backend", 20.0), ("tracing", 2.0)):
                labels = {**host, **train, "stage": stage}
                count, total = {start: 1.0}, {start: seconds}
                if host is first:
                    count[-3000], total[-3000] = 2, seconds * 1.5
                f.counter(c.COMPILE_DURATION.series("count"), labels, start, end, count)
                f.counter(c.COMPILE_DURATION.series("sum"), labels, start, end, total)
            save = {**host, **train, "operation": "save", "result": "ok"}
            saved = -2400 if host is first else start + 600  # both within the dashboard's hour
            f.counter(c.CHECKPOINT_DURATION.series("count"), save, saved, end, {saved: 1})
            running(f, {**host, **train}, "v5e", CHIPS * V5E, start, end)
        devices(f, second, LIBTPU, "v5e", TRAIN_CHIP, -1680, 0)
        profiled(f, {**second, **train}, STRAGGLER_PROFILE if worker == STRAGGLER else PEER_PROFILE)
        straggled(f, {**second, **train}, worker)
        diverged(f, {**second, **train}, worker, -1680)
    for worker in range(2):
        pod = job_pod(f, "tune", str(worker), {-2400: "Running"}, 0)
        host = f.sidecar(f"tune-{worker}:9478", pod, "0", str(worker), -2400, 0, topology=TUNE_TOPOLOGY)
        running(f, {**host, **tune}, "v6e", CHIPS * V6E, -2400, 0)
        devices(f, host, DEVICE_PLUGIN, "v6e", TUNE_CHIP, -2400, 0)
    # A serving workload, every request of the last two hours within the objective (at its first replica).
    replicas = [replicaset_pod(f, "serve-5d8f", name) for name in ("x7k2p", "q9m4n")]
    serve = {**f.sidecar("serve-0:9478", replicas[0], "0", "0", -2 * HOUR, 0), "workload": "serve"}
    f.sidecar("serve-1:9478", replicas[1], "0", "0", -2 * HOUR, 0)
    within = {**serve, "le": le(DEFAULTS.inference_latency_seconds)}
    for name, labels in (
        (c.INFERENCE_REQUEST_DURATION.series("bucket"), within),
        (c.INFERENCE_REQUEST_DURATION.series("count"), serve),
    ):
        f.series(name, labels, -2 * HOUR, 0, lambda t: 10 * (t + 2 * HOUR))
    # A JobSet deleted 30 minutes ago, its Job and pods with it; one whose Job completed 20 minutes ago.
    for worker in range(2):
        pod = job_pod(f, "old", str(worker), {-2 * HOUR: "Running"}, -1800)
        f.sidecar(f"old-{worker}:9478", pod, "0", str(worker), -2 * HOUR, -1800)
    pod = job_pod(f, "eval", "0", {-2 * HOUR: "Running", -1200: "Succeeded"}, 0)
    f.sidecar("eval-0:9478", pod, "0", "0", -2 * HOUR, -1200)
    cluster(f)
    recorded(f)
    return f


def placed(pod: str, controller_kind: str, controller: str, jobset: str = "") -> dict[str, str]:
    """The target labels the scrape's relabelings give a sidecar in ``pod`` (none for an absent meta label:
    a pod of no JobSet has no jobset)."""
    labels = {
        "pod": pod,
        "namespace": NAMESPACE,
        "node": f"gke-tpu-node-of-{pod}",
        "jobset": jobset,
        kubernetes.CONTROLLER_KIND: controller_kind,
        kubernetes.CONTROLLER_NAME: controller,
    }
    assert set(labels) <= set(kubernetes.TARGET_LABELS), "only what the relabelings give"
    return {label: value for label, value in labels.items() if value}


def job_pod(f: Fleet, jobset: str, suffix: str, phases: Mapping[int, str], end: int) -> dict[str, str]:
    """A pod of the one Job of ``jobset`` (``<jobset>-workers-0``) as kube-state-metrics lists it, in each of
    ``phases`` from its time on, until ``end``; the target labels of its sidecar."""
    job = f"{jobset}-workers-0"
    pod = placed(f"{job}-{suffix}", "Job", job, jobset)
    listed(f, pod, phases, end)
    return pod


def replicaset_pod(f: Fleet, replicaset: str, suffix: str) -> dict[str, str]:
    """A pod of ``replicaset`` running all along; the target labels of its sidecar."""
    pod = placed(f"{replicaset}-{suffix}", "ReplicaSet", replicaset)
    listed(f, pod, {KSM_SINCE: "Running"}, 0)
    return pod


def listed(f: Fleet, pod: Mapping[str, str], phases: Mapping[int, str], end: int) -> None:
    """kube-state-metrics' series of a pod (target labels ``pod``) in each of ``phases`` from its time on."""
    start = max(KSM_SINCE, min(phases))
    kind, controller = (pod[label] for label in CONTROLLER_OF[1:])
    named = {**KSM_TARGET, "namespace": NAMESPACE, "pod": pod["pod"], "uid": f"uid-{pod['pod']}"}
    created = {"node": pod["node"], "created_by_kind": kind, "created_by_name": controller}
    f.series("kube_pod_info", {**named, **created}, start, end, constant(1))
    for phase in PHASES:
        f.series("kube_pod_status_phase", {**named, "phase": phase}, start, end, in_phase(phases, phase))
    running = in_phase(phases, "Running")
    for condition, ready in (("true", running), ("false", lambda t: 1 - running(t))):
        f.series("kube_pod_status_ready", {**named, "condition": condition}, start, end, ready)
    owner = {"owner_kind": kind, "owner_name": controller, "owner_is_controller": "true"}
    f.series("kube_pod_owner", {**named, **owner}, start, end, constant(1))
    if kind == "Job":  # a TPU pod: it holds its node's chips
        held = {"container": "jax", "node": pod["node"], "resource": "google_com_tpu", "unit": "integer"}
        f.series("kube_pod_container_resource_requests", {**named, **held}, start, end, constant(CHIPS))


def constant(value: float) -> Callable[[int], float]:
    return lambda t: value


def in_phase(phases: Mapping[int, str], phase: str) -> Callable[[int], float]:
    """1 while the latest of ``phases`` at or before the time is ``phase``, else 0."""
    return lambda t: float(phases[max(k for k in phases if k <= t)] == phase)


# Each JobSet's pods: those its Job wants; and the nodes of its node pool, by the suffixes of the pods they ran (train's
# first pods' nodes went with their failure; old's pool with its JobSet; eval's node stays, its pod done).
WORKERS = {"train": 4, "tune": 2, "old": 2, "eval": 1}
NODES = {"train": ["0-b", "1-b", "2-b", "3-b"], "tune": ["0", "1"], "eval": ["0"]}


def cluster(f: Fleet) -> None:
    """kube-state-metrics' series of the controllers, and of its own pod (in every cluster it watches)."""
    for jobset, end in (("train", 0), ("tune", 0), ("old", -1800), ("eval", 0)):
        job = {**KSM_TARGET, "namespace": NAMESPACE, "job_name": f"{jobset}-workers-0"}
        f.series("kube_job_created", job, KSM_SINCE, end, constant(1.7e9))  # its creation, long before
        owner = {"owner_kind": "JobSet", "owner_name": jobset, "owner_is_controller": "true"}
        f.series("kube_job_owner", {**job, **owner}, KSM_SINCE, end, constant(1))
        for spec in ("kube_job_spec_parallelism", "kube_job_spec_completions"):
            f.series(spec, job, KSM_SINCE, end, constant(WORKERS[jobset]))
    # The TPU nodes: each Job pod's own, in its JobSet's node pool, and a pool of 2 nodes no pod runs on.
    nodes = {
        f"gke-tpu-node-of-{jobset}-workers-0-{suffix}": jobset
        for jobset, suffixes in NODES.items()
        for suffix in suffixes
    }
    nodes |= {f"gke-tpu-spare-{index}": "spare" for index in range(2)}
    for node, pool in nodes.items():
        labels = {**KSM_TARGET, "node": node}
        f.series("kube_node_labels", {**labels, "label_cloud_google_com_gke_nodepool": pool}, KSM_SINCE, 0, constant(1))
        tpu = {**labels, "resource": "google_com_tpu", "unit": "integer"}
        f.series("kube_node_status_allocatable", tpu, KSM_SINCE, 0, constant(CHIPS))
    # A Job's conditions, once it has them: eval's completed at -20 min.
    finished = {**KSM_TARGET, "namespace": NAMESPACE, "job_name": "eval-workers-0"}
    for condition, value in (("true", 1), ("false", 0), ("unknown", 0)):
        f.series("kube_job_complete", {**finished, "condition": condition}, -1200, 0, constant(value))
    for replicaset, replicas in (("serve-5d8f", 2), ("serve-7c9b", 0)):
        labels = {**KSM_TARGET, "namespace": NAMESPACE, "replicaset": replicaset}
        f.series("kube_replicaset_spec_replicas", labels, KSM_SINCE, 0, constant(replicas))
        owner = {"owner_kind": "Deployment", "owner_name": "serve", "owner_is_controller": "true"}
        f.series("kube_replicaset_owner", {**labels, **owner}, KSM_SINCE, 0, constant(1))
    own = {"pod": "kube-state-metrics-6f7b9-k2x8v", "namespace": "monitoring", "uid": "uid-ksm"}
    f.series("kube_pod_info", {**KSM_TARGET, **own, "created_by_kind": "ReplicaSet"}, KSM_SINCE, 0, constant(1))


def running(f: Fleet, labels: dict[str, str], accelerator: str, peak: float, start: int, end: int) -> None:
    """A host of a workload stepping at MFU from ``start``: its peak, its FLOPs, its goodput."""
    f.series(c.PEAK_FLOPS.name, {**labels, "accelerator": accelerator}, start, end, lambda t: peak)
    f.series(c.MODEL_FLOPS.name, labels, start, end, lambda t: MFU * peak * (t - start))
    f.series(c.GOODPUT.name, {**labels, "category": "productive"}, start, end, lambda t: t - start)
    f.series(c.GOODPUT_WALL.name, labels, start, end, lambda t: t - start)


# Each host's chips as its collectors read them: the same values on every chip of a workload's hosts.
LIBTPU, DEVICE_PLUGIN = "libtpu", "gke-device-plugin"  # the source label's values
TUNE_TOPOLOGY = "2x4"
GIB = 2**30
TRAIN_CHIP = {c.DUTY_CYCLE: 0.8, c.DEVICE_MEMORY_USED: 12 * GIB, c.DEVICE_MEMORY_LIMIT: 16 * GIB}
TUNE_CHIP = {
    c.DUTY_CYCLE: 0.5,
    c.TENSORCORE_UTILIZATION: 0.25,
    c.DEVICE_MEMORY_USED: 8 * GIB,
    c.DEVICE_MEMORY_LIMIT: 32 * GIB,
    c.MEMORY_BANDWIDTH_UTILIZATION: 0.4,
}


def devices(
    f: Fleet, host: dict[str, str], source: str, accelerator: str, chip: Mapping[c.Metric, float], start: int, end: int
) -> None:
    """A host's ``CHIPS`` chips, each with ``chip``'s values, as one collector of its sidecar serves them."""
    for device in range(CHIPS):
        labels = {**host, "device": str(device), "accelerator": accelerator, "source": source}
        for metric, value in chip.items():
            f.series(metric.name, labels, start, end, constant(value))


# Device profiles: seconds per step in each part (compute, exposed_collective, idle), the same step on every worker.
STRAGGLER = 2
PEER_PROFILE = {"compute": 0.08, "exposed_collective": 0.05, "idle": 0.01}
STRAGGLER_PROFILE = {"compute": 0.12, "exposed_collective": 0.01, "idle": 0.01}
CAPTURES = (-1200, -600)  # when the sidecars received each capture
CAPTURE_SECONDS, CAPTURE_BYTES = 0.3, 360e3


# What the straggler costs, as the rules record it from those profiles (tpuscope.alerts.stragglers): each peer waits
# 0.04 s a step beyond the straggler, at a step each 0.14 s, on 4 chips, once an evaluation (a minute) from the first
# capture on.
BEYOND = PEER_PROFILE["exposed_collective"] - STRAGGLER_PROFILE["exposed_collective"]
STEPS_PER_SECOND = 1 / sum(PEER_PROFILE.values())
STRAGGLED_RATE = 3 * BEYOND * STEPS_PER_SECOND  # worker-seconds a second
EVALUATION = 60  # the served Prometheus' global evaluation interval, its default


def straggled(f: Fleet, labels: dict[str, str], worker: int) -> None:
    first, end = CAPTURES[0], 0
    kept = ("namespace", "jobset", "workload", "job", "instance", "slice", "worker")  # the rules' by (...)
    where = {k: v for k, v in labels.items() if k in kept}
    beyond = 0.0 if worker == STRAGGLER else BEYOND
    f.series(conventions.WAIT_BEYOND_LEAST, {**where, "source": "profile"}, first, end, constant(beyond), EVALUATION)
    if worker == STRAGGLER:
        straggler = {**where, "source": "profile", "cause": "compute"}
        f.series(conventions.STRAGGLER, straggler, first, end, constant(STRAGGLED_RATE * CHIPS), EVALUATION)
    if worker == 0:
        # The alerts group's evaluations, once a minute, over the whole hour (and since the fleet began).
        f.series(conventions.EVALUATED, {}, -2 * HOUR, end, constant(1.0), EVALUATION)
        workload = {k: v for k, v in where.items() if k in ("namespace", "jobset", "workload")}
        f.series(conventions.STRAGGLER_RATE, workload, first, end, constant(STRAGGLED_RATE), EVALUATION)
        f.series(conventions.STRAGGLER_CHIPS, workload, first, end, constant(STRAGGLED_RATE * CHIPS), EVALUATION)


# Training health: worker 1's local value goes NaN first, at step 9000; its peers' local values and every loss at the
# next step, up to step 9005; a minute later the job restores the checkpoint of step 8805.
FIRST_TO_GO, ONSET, HIGHEST = "1", 9000, 9005
NONFINITE_AT, RESTORED_AT = -900, -840  # when the sidecars read the first NaN, and the restore
ROLLED_BACK_STEPS, ROLLED_BACK_SECONDS = HIGHEST - 8805, 25.0  # each worker's sidecar counts the restore
LOSS, SPIKE_FROM, SPIKE = 2.0, -600, 8.0  # the loss; its deviation from its baseline from SPIKE_FROM on


def nan_while_diverged(reading: float) -> Callable[[int], float]:
    """``reading``, NaN from the first non-finite reading to the restore."""
    return lambda t: math.nan if NONFINITE_AT <= t < RESTORED_AT else reading


def diverged(f: Fleet, labels: dict[str, str], worker: int, start: int) -> None:
    """A worker's training values, as its sidecar serves them from its start: the loss and local value, NaN from
    NONFINITE_AT to the restore; the non-finite counts (at 0 from the first reading) and onsets; the loss's
    deviation; what the restore threw away (its counters at 0 from the start)."""
    first = str(worker) == FIRST_TO_GO
    # The local value: this worker's share of the loss, before the all-reduce.
    for value, reading in (("loss", LOSS), ("local", LOSS / 4)):
        named = {**labels, "value": value}
        f.series(c.TRAINING_VALUE.name, named, start, 0, nan_while_diverged(reading))
        went = ONSET if value == "local" and first else ONSET + 1
        steps = HIGHEST - went + 1  # non-finite from its onset to the highest step, which the restore threw away
        f.counter(c.TRAINING_NONFINITE.name, named, start, 0, {start: 0, NONFINITE_AT: steps})
        f.series(c.TRAINING_NONFINITE_ONSET.name, named, NONFINITE_AT, 0, constant(went))
    f.series(c.LOSS_DEVIATION.name, labels, start, 0, lambda t: SPIKE if t >= SPIKE_FROM else 0.5)
    f.counter(c.GOODPUT_ROLLED_BACK_STEPS.name, labels, start, 0, {start: 0, RESTORED_AT: ROLLED_BACK_STEPS})
    f.counter(c.GOODPUT_ROLLED_BACK.name, labels, start, 0, {start: 0, RESTORED_AT: ROLLED_BACK_SECONDS})


def profiled(f: Fleet, labels: dict[str, str], parts: dict[str, float]) -> None:
    """A worker's device-profile gauges and capture counters, as its sidecar serves them from the first capture
    on, and what the recording rules record of them (the straggler rule's ratios to the median)."""
    first, end = CAPTURES[0], 0
    for part, seconds in parts.items():
        f.series(c.PROFILE_TIME.name, {**labels, "part": part}, first, end, constant(seconds))
        median = sorted([PEER_PROFILE[part]] * 3 + [STRAGGLER_PROFILE[part]])[1:3]
        over = {**labels, "part": part}
        f.series(conventions.PROFILE_OVER_MEDIAN, over, first, end, constant(seconds / (sum(median) / 2)))
        f.series(conventions.PROFILE_FRESH, over, first, end, constant(seconds))
    f.series(c.PROFILE_STEP.name, labels, first, end, lambda t: sum(parts.values()))
    f.series(c.PROFILE_OVERLAP.name, labels, first, end, lambda t: 0.5)
    f.series(c.PROFILE_IMBALANCE.name, labels, first, end, lambda t: 1.1 if parts is STRAGGLER_PROFILE else 1.0)
    f.series(c.PROFILE_LAST_CAPTURE.name, labels, first, end, lambda t: f.at + max(k for k in CAPTURES if k <= t))
    ok = {**labels, "result": "ok"}
    f.counter(c.PROFILE_CAPTURES.name, ok, first, end, {k: n for n, k in enumerate(CAPTURES, 1)})
    f.counter(
        c.PROFILE_CAPTURE_SECONDS.name, labels, first, end, {k: n * CAPTURE_SECONDS for n, k in enumerate(CAPTURES, 1)}
    )
    f.counter(
        c.PROFILE_CAPTURE_BYTES.name, labels, first, end, {k: n * CAPTURE_BYTES for n, k in enumerate(CAPTURES, 1)}
    )


def recorded(f: Fleet) -> None:
    """The recording rules' 5-minute rates over 40 days, one sample every 5 minutes."""

    def bad_on(day: float, normal: float, bad: float) -> Callable[[int], float]:
        return lambda t: bad if -day * DAY <= t < (-day + 1) * DAY else normal

    def every_5m(name: str, labels: dict[str, str], value: Callable[[int], float]) -> None:
        f.series(name, labels, -40 * DAY, 0, value, every=300)

    def productive(t: int) -> float:  # 4 hosts' seconds a second, half of it lost 10 days ago, all 35 days ago
        return bad_on(35, bad_on(10, 4, 2)(t), 0)(t)

    # Per workload as the rules name one (tpuscope.promql.WORKLOAD): its namespace and JobSet too, where it has them.
    train = {"namespace": NAMESPACE, "jobset": "train", "workload": "train"}
    serve = {"namespace": NAMESPACE, "workload": "serve"}
    rate = conventions.GOODPUT_RATE
    every_5m(rate, {**train, "category": "productive"}, productive)
    every_5m(rate, {**train, "category": "lost"}, lambda t: 4 - productive(t))
    every_5m(conventions.WALL_RATE, train, lambda t: 4)
    # The goodput SLO's two terms, as the rules sum them from the above (no worker went unbooked here).
    every_5m(conventions.BAD_RATE, train, lambda t: 4 - productive(t))
    every_5m(conventions.WALL_ALL_RATE, train, lambda t: 4)
    every_5m(conventions.REQUESTS_RATE, serve, lambda t: 10)
    every_5m(conventions.REQUESTS_FAST_RATE, serve, lambda t: bad_on(35, bad_on(10, 10, 9.7)(t), 0)(t))


# The recording rules the boards read that a rule of the generated file records from raw series alone, with
# the history a panel reads of them: promtool records them from the backfilled fleet, as Prometheus would have.
RECORDED_FROM_RAW = (
    conventions.FAILURES_HOUR,
    conventions.RESTARTS_HOUR,
    conventions.PEAK_FLOPS_SUM,
    conventions.JOB_UNIT,
    conventions.CHIPS_ALLOCATABLE,
    conventions.CHIPS_REQUESTED,
    conventions.CHIPS_HEARD,
)
# ...and those that read the above: recorded once they are (a unit's "ever ready" from its readiness alone, without
# its own past: enough for the board's "ready" share, which reads readiness only).
RECORDED_FROM_RECORDS = (
    (conventions.JOB_READY, conventions.CHIPS_IDLE),
    (conventions.UNIT_READY, conventions.UNIT_QUEUED),
    (conventions.UNIT_STARTED,),
    (conventions.SCHEDULING,),
)


def record_rules(
    api: PrometheusAPI, data: Path, start: int, end: int, directory: Path, records: tuple[str, ...] = RECORDED_FROM_RAW
) -> None:
    """Blocks of ``records`` between ``start`` and ``end``, evaluated by ``promtool tsdb create-blocks-from rules``
    against ``api`` every scrape interval, written into ``data``."""
    rules = [
        rule for group in rule_groups(GeneratorConfig()) for rule in group["rules"] if rule.get("record") in records
    ]
    assert {r["record"] for r in rules} == set(records)
    path = directory / f"recorded-{len(list(directory.glob('recorded-*')))}.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "recorded", "rules": rules}]}))
    command = [require("promtool"), "tsdb", "create-blocks-from", "rules", f"--url={api.url}", "-q"]
    command += [f"--start={start}", f"--end={end}", f"--eval-interval={SCRAPE}s", f"--output-dir={data}", str(path)]
    run = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr


@pytest.fixture(scope="module")
def prometheus(module_tmp: Path) -> Iterator[tuple[PrometheusAPI, int]]:
    """A Prometheus over the fleet's TSDB, and the instant to evaluate at (the TSDB ends there, an hour ago)."""
    at = (int(time.time()) // HOUR - 1) * HOUR
    flags = ("--storage.tsdb.retention.time=100d", f"--query.lookback-delta={LOOKBACK}")  # the blocks go back 40 days
    with backfilled(module_tmp, fleet(at), *flags) as api:
        record_rules(api, module_tmp / "data", at - 2 * HOUR, at, module_tmp)
    for records in RECORDED_FROM_RECORDS:
        with served(module_tmp, *flags) as api:
            record_rules(api, module_tmp / "data", at - 2 * HOUR, at, module_tmp, records)
    with served(module_tmp, *flags) as api:  # again, with the recorded blocks
        yield api, at


def values(
    prometheus: tuple[PrometheusAPI, int],
    board: str,
    title: str,
    ref: str = "A",
    interval: int = RANGE,
    workload: str = ALL,
    by: tuple[str, ...] = (),
    topology: str = ALL,
    ago: int = 0,
) -> dict[tuple[str, ...], float]:
    """The panel's target ``ref`` as Grafana runs it over the last hour, at its last point (or a time series' point
    ``ago`` seconds before): each series' ``by`` labels -> its value. ``interval``: Grafana's ``$__interval`` (a time
    series panel's point; an hour here, so one point holds the whole story)."""
    api, at = prometheus
    (target,) = [t for t in panel_titled(BOARDS[board], title)["targets"] if t["refId"] == ref]
    variables = {name: ALL for name in (queries.SLICE, queries.WORKER, queries.ACCELERATOR, queries.JOB, queries.HOST)}
    chosen = {**variables, queries.WORKLOAD: workload, queries.TPU_TOPOLOGY: topology}
    expr = substitute(target["expr"], chosen, RANGE, interval)
    result = api.query(expr, at=at - ago)
    return {tuple(r["metric"].get(label, "") for label in by): float(r["value"][1]) for r in result}


UID = conventions.DashboardUID
FLEET, ONCALL, JOB, SERVING = str(UID.FLEET), str(UID.ONCALL), str(UID.JOB), str(UID.SERVING)
TRAIN_CRASH = ("train", "crash")  # a failing workload's series: its workload and reason labels


def test_a_restart_of_a_4_host_job_counts_once(prometheus: tuple[PrometheusAPI, int]) -> None:
    """4 new sidecars each report the restart: 1, not 4."""
    by = ("workload", "reason")
    assert values(prometheus, FLEET, "Restarts per hour, by workload and reason", by=by) == {TRAIN_CRASH: 1}
    assert values(prometheus, ONCALL, "Failures and restarts in the last hour", "B", by=by) == {TRAIN_CRASH: 1}


def test_a_failure_of_a_4_host_job_counts_once(prometheus: tuple[PrometheusAPI, int]) -> None:
    """4 sidecars, gone since, each reported the failure: 1, not 4, nor 0."""
    by = ("workload", "reason")
    assert values(prometheus, FLEET, "Failures over the range") == {(): 1}
    assert values(prometheus, FLEET, "Failures per hour, by workload and reason", by=by) == {TRAIN_CRASH: 1}
    assert values(prometheus, ONCALL, "Failures and restarts in the last hour", "A", by=by) == {TRAIN_CRASH: 1}
    assert values(prometheus, ONCALL, "Failures over the range, by workload and reason", by=by) == {TRAIN_CRASH: 1}


def test_compiles_every_host_reports_count_once(prometheus: tuple[PrometheusAPI, int]) -> None:
    """The recompile seen by the first pods (gone since) and the compile after the restart: 2, not 8; the failed
    compile and the recompile's cause, which the first pods reported: 1 each, not 4."""
    assert values(prometheus, JOB, "Compiles", workload="train", by=("workload",)) == {("train",): 2}
    seconds = values(prometheus, JOB, "Compile time by stage", workload="train", by=("stage",))
    assert seconds == {("backend",): 10 + 20, ("tracing",): 1 + 2}
    failed = values(
        prometheus, ONCALL, "Compile failures over the range, by stage and reason", by=("workload", "stage", "reason")
    )
    assert failed == {("train", "backend", "out_of_memory"): 1}
    causes = values(prometheus, ONCALL, "Recompiles over the range, by cause", by=("workload", "cause"))
    assert causes == {("train", "input_types"): 1}


def test_a_checkpoint_every_host_saves_a_part_of_counts_once(prometheus: tuple[PrometheusAPI, int]) -> None:
    """The save of the first pods (gone since) and the save after the restart: 2, not 8."""
    by = ("workload", "operation", "result")
    saves = values(prometheus, JOB, "Checkpoints, by result", workload="train", by=by)
    assert saves == {("train", "save", "ok"): 2}


def test_fleet_mfu_of_two_workloads_at_half_their_peaks_is_half(prometheus: tuple[PrometheusAPI, int]) -> None:
    """``train`` ran 58 of the 60 minutes (down between its pods), ``tune`` the last 40, on chips of other
    peaks: each did half its peak while it ran, so the fleet did half of what its chips could. (A panel
    interval of 10 s, as Grafana gives a stat over an hour; the lookback and the rate's extrapolation
    make about 1% of difference.)"""
    ((_, mfu),) = values(prometheus, FLEET, "Model FLOPs utilization", interval=SCRAPE).items()
    assert mfu == pytest.approx(MFU, abs=0.01)


def test_error_budgets_cover_the_slo_period(prometheus: tuple[PrometheusAPI, int]) -> None:
    """All good in the dashboard's hour, yet 10 days ago ``train`` lost half of a day (1/60 of the 30 days
    against a 10% budget: 1/6 of it spent) and ``serve`` was slow for 3% of a day's requests (0.1% of the
    period against 1%: 1/10 spent). The bad day 35 days ago is older than the period."""
    period = durations.parse(conventions.SLO_PERIOD) / DAY
    goodput_budget = 1 - DEFAULTS.goodput_objective
    budget = values(prometheus, FLEET, "Goodput objective: error budget left", by=("workload",))
    assert budget == {("train",): pytest.approx(1 - (0.5 / period) / goodput_budget, rel=1e-3)}
    latency_budget = 1 - DEFAULTS.inference_latency_objective
    ((_, left),) = values(prometheus, SERVING, "Latency error budget left").items()
    assert left == pytest.approx(1 - (0.03 / period) / latency_budget, rel=1e-3)
    assert not math.isclose(left, 1)


def test_the_budget_panels_say_their_period() -> None:
    for board, title in ((FLEET, "Goodput objective: error budget left"), (SERVING, "Latency error budget left")):
        assert f"last {conventions.SLO_PERIOD}" in panel_titled(BOARDS[board], title)["description"], title


def test_the_device_profile_tells_the_straggler_apart_in_a_fused_step(prometheus: tuple[PrometheusAPI, int]) -> None:
    """Every worker's step is as long (lockstep); worker 2 computes 0.12 s where its peers compute 0.08 s, and
    waits 0.01 s at the collectives where they wait 0.05 s for it."""
    title = "Device profile: compute and exposed collective per step, by worker"
    workers = [str(w) for w in range(4)]
    compute = values(prometheus, JOB, title, "A", workload="train", by=("worker",))
    waiting = values(prometheus, JOB, title, "B", workload="train", by=("worker",))
    assert compute == {(w,): STRAGGLER_PROFILE["compute"] if w == "2" else PEER_PROFILE["compute"] for w in workers}
    assert waiting == {
        (w,): STRAGGLER_PROFILE["exposed_collective"] if w == "2" else PEER_PROFILE["exposed_collective"]
        for w in workers
    }
    over = values(prometheus, JOB, "Device profile: compute over the workload's median, by worker", by=("worker",))
    assert over == {(w,): pytest.approx(1.5 if w == "2" else 1.0) for w in workers}
    slowest = "Device profile: slowest worker of each workload, against the median"
    assert values(prometheus, ONCALL, slowest, by=("workload", "worker")) == {("train", "2"): pytest.approx(1.5)}
    assert max(step_values(panel_titled(BOARDS[ONCALL], slowest))) == DEFAULTS.straggler_factor
    # On-call, every worker's two parts side by side: the straggler computes longest and waits least.
    each = "Device profile: each worker's compute and collective wait per step"
    assert values(prometheus, ONCALL, each, "A", workload="train", by=("worker",)) == compute
    assert values(prometheus, ONCALL, each, "B", workload="train", by=("worker",)) == waiting


def test_what_the_straggler_costs_on_job_debug_and_the_fleet(prometheus: tuple[PrometheusAPI, int]) -> None:
    """Worker 2's 3 peers wait 0.04 s a step beyond it, at 7 steps a second, on 4 chips: 3.4 chips kept waiting,
    for the last 20 minutes of the hour. The straggler is worker 2, its cause its devices' compute."""
    title = "What stragglers cost: chips kept waiting, and the straggler's cause"
    chips = STRAGGLED_RATE * CHIPS
    assert values(prometheus, JOB, title, "A", workload="train", by=("workload",)) == {("train",): pytest.approx(chips)}
    named = values(prometheus, JOB, title, "B", workload="train", by=("worker", "cause"))
    assert named == {("2", "compute"): pytest.approx(chips)}
    beyond = "Wait at the collectives beyond the least-waiting worker, by worker"
    waits = values(prometheus, JOB, beyond, workload="train", by=("worker",))
    assert waits == {(str(w),): pytest.approx(0.0 if w == STRAGGLER else BEYOND) for w in range(4)}
    # Over the hour: 20 of its 60 minutes (21 of the 61 evaluations a closed hour holds, on this Prometheus).
    lost = values(prometheus, FLEET, "Chip-hours lost to stragglers, by workload", by=("workload",))
    assert lost == {("train",): pytest.approx(chips * 1200 / 3600, rel=0.05)}


def test_the_device_profile_split_and_its_captures(prometheus: tuple[PrometheusAPI, int]) -> None:
    """The parts as shares of the profiled step over the 4 workers (0.56 s of step): compute 0.36 s, exposed
    collective 0.16 s, idle 0.04 s; 2 captures of the job (each of its 4 hosts took the same 2), 0.6 s of the
    costliest host's hour, 360 kB each, the latest 10 minutes old."""
    split = values(prometheus, JOB, "Device profile: where the step's device time went", workload="train", by=("part",))
    assert split == {
        ("compute",): pytest.approx(0.36 / 0.56),
        ("exposed_collective",): pytest.approx(0.16 / 0.56),
        ("idle",): pytest.approx(0.04 / 0.56),
    }
    exposed = values(prometheus, JOB, "Device profile: exposed collective share", workload="train")
    assert exposed == {(): pytest.approx(0.16 / 0.56)}
    assert values(prometheus, JOB, "Device profile captures, by result", workload="train", by=("result",)) == {
        ("ok",): 2
    }
    assert values(prometheus, JOB, "Device profile capture cost", workload="train") == {
        (): pytest.approx(2 * CAPTURE_SECONDS / RANGE)
    }
    assert values(prometheus, JOB, "Device trace size per capture", workload="train") == {(): CAPTURE_BYTES}
    assert values(prometheus, JOB, "Age of the latest device profile", workload="train") == {(): 600}
    ((_, overlap),) = values(prometheus, JOB, "Device profile: collective overlap", workload="train").items()
    assert overlap == pytest.approx(0.5)


NONFINITE = "Non-finite values over the range, by worker: how many, and the step each went at"


def test_training_health_names_the_worker_whose_value_went_non_finite_first(
    prometheus: tuple[PrometheusAPI, int],
) -> None:
    """Worker 1's local value went NaN at step 9000, its peers' and every loss at 9001, all up to 9005: the table
    lists each worker's values with their non-finite steps, and sorts worker 1's local value, the lowest onset,
    first. The loss is NaN (a gap) while it diverged, finite after the restore."""
    by = ("worker", "value")
    workers = [str(w) for w in range(4)]
    counts = values(prometheus, JOB, NONFINITE, "A", workload="train", by=by)
    onsets = values(prometheus, JOB, NONFINITE, "B", workload="train", by=by)
    went = {
        (w, v): ONSET if (w, v) == (FIRST_TO_GO, "local") else ONSET + 1 for w in workers for v in ("loss", "local")
    }
    assert onsets == went
    assert counts == {key: HIGHEST - step + 1 for key, step in went.items()}
    assert min(onsets, key=lambda key: onsets[key]) == (FIRST_TO_GO, "local")
    # Each target a column of one table, sorted by the onset column, lowest first: the first to go heads it.
    panel = panel_titled(BOARDS[JOB], NONFINITE)
    (merge, organize) = panel["transformations"]
    assert merge["id"] == "merge" and organize["id"] == "organize"
    onset_column = organize["options"]["renameByName"]["Value #B"]
    assert panel["options"]["sortBy"] == [{"desc": False, "displayName": onset_column}]
    assert panel["fieldConfig"]["defaults"]["unit"] == "none", "a step reads whole: 9000 and 9001, not 9 K twice"
    # The loss: NaN while it diverged (Grafana draws a gap), finite after the restore.
    loss, midway = "Loss, by worker", (NONFINITE_AT + RESTORED_AT) // 2
    during = values(prometheus, JOB, loss, workload="train", by=("worker",), ago=-midway)
    assert set(during) == {(w,) for w in workers} and all(math.isnan(v) for v in during.values())
    assert values(prometheus, JOB, loss, workload="train", by=("worker",)) == {(w,): LOSS for w in workers}


def test_training_health_shows_the_spike_and_what_the_restore_threw_away(prometheus: tuple[PrometheusAPI, int]) -> None:
    """The loss sits 8 robust standard deviations above its baseline, over the spike bound the panel draws; the
    restore threw away 200 steps (each of the 4 workers' sidecars counted them: once per job, not 800) and 25
    productive seconds of each worker (100, as the goodput breakdown books them)."""
    deviation = "Loss against its recent baseline, by worker"
    assert values(prometheus, JOB, deviation, workload="train", by=("worker",)) == {(str(w),): SPIKE for w in range(4)}
    assert max(step_values(panel_titled(BOARDS[JOB], deviation))) == c.LOSS_SPIKE_DEVIATION < SPIKE
    rolled_back = "Rolled back by restores over the range"
    assert values(prometheus, JOB, rolled_back, "A", workload="train", by=("workload",)) == {
        ("train",): ROLLED_BACK_STEPS
    }
    assert values(prometheus, JOB, rolled_back, "B", workload="train", by=("workload",)) == {
        ("train",): 4 * ROLLED_BACK_SECONDS
    }


def test_the_collective_panel_sets_the_last_half_hour_against_the_six_hours_before(tmp_path: Path) -> None:
    """A workload whose workers' median exposed collective time (as the recording rule records it each minute) was
    0.02 s a step for 7 hours, then 0.05 s in its last 20 minutes: the panel's now is 0.05 (the median of the last
    half hour, two thirds of it new), its baseline 0.02 (the 6 hours before), as TpuscopeCollectiveLatencySpike
    compares them."""
    at = (int(time.time()) // HOUR - 1) * HOUR
    f = Fleet(at)
    exposed = {"workload": "train", "part": "exposed_collective"}
    f.series(conventions.PROFILE_MEDIAN, exposed, -7 * HOUR, 0, lambda t: 0.05 if t > -1200 else 0.02, every=60)
    title = "Device profile: exposed collective time against its baseline, by workload"
    with backfilled(tmp_path, f, "--storage.tsdb.retention.time=100d", f"--query.lookback-delta={LOOKBACK}") as api:
        now = values((api, at), ONCALL, title, "A", by=("workload",))
        baseline = values((api, at), ONCALL, title, "B", by=("workload",))
    assert now == {("train",): 0.05}
    assert baseline == {("train",): 0.02}


def recording_rule(name: str) -> str:
    """The expression of the recording rule ``name`` as the generated rule file holds it."""
    groups = yaml.safe_load(RULES.read_text())["groups"]
    exprs = [rule["expr"] for group in groups for rule in group["rules"] if rule.get("record") == name]
    assert len(exprs) == 1, f"{name}: {len(exprs)} rules in {RULES.name} (stale? `make generate`)"
    return str(exprs[0])


def test_kube_state_metrics_says_which_controllers_still_want_their_pods(prometheus: tuple[PrometheusAPI, int]) -> None:
    """The Jobs of the running JobSets and the Deployment's current ReplicaSet, labelled as their pods' sidecars
    name them: not the deleted JobSet's Job (its sidecars seen 30 minutes ago), nor the completed Job, nor the
    ReplicaSet scaled to 0."""
    api, at = prometheus
    result = api.query(recording_rule(conventions.CONTROLLER_WANTED), at=at)
    assert all(set(r["metric"]) == set(CONTROLLER_OF) for r in result), (
        "labelled as a sidecar's target names its controller"
    )
    wanted = {tuple(r["metric"][label] for label in CONTROLLER_OF): float(r["value"][1]) for r in result}
    assert wanted == {
        (NAMESPACE, "Job", "train-workers-0"): 1,
        (NAMESPACE, "Job", "tune-workers-0"): 1,
        (NAMESPACE, "ReplicaSet", "serve-5d8f"): 1,
    }
    # The join with the sidecars: the controllers that the target labels of the sidecars up now name.
    serving = api.query(f'group by ({", ".join(CONTROLLER_OF)}) (up{{job="{kubernetes.JOB}"}})', at=at)
    assert set(wanted) == {tuple(r["metric"][label] for label in CONTROLLER_OF) for r in serving}


def test_each_chip_counts_once_whichever_collector_read_it(prometheus: tuple[PrometheusAPI, int]) -> None:
    """train's 16 chips from libtpu and tune's 8 from the device plugin: 24 chips, each once, on both boards."""
    assert values(prometheus, FLEET, "Chips") == {(): 4 * CHIPS + 2 * CHIPS}
    mean = (4 * TRAIN_CHIP[c.DUTY_CYCLE] + 2 * TUNE_CHIP[c.DUTY_CYCLE]) / 6
    assert values(prometheus, FLEET, "Duty cycle, mean") == {(): pytest.approx(mean)}
    by = ("instance", "source", "device")
    headroom = values(prometheus, ONCALL, "Device memory headroom, by device", by=by)
    plugin = {key: value for key, value in headroom.items() if key[1] == DEVICE_PLUGIN}
    assert len(headroom) == 24 and len(plugin) == 2 * CHIPS
    free = 1 - TUNE_CHIP[c.DEVICE_MEMORY_USED] / TUNE_CHIP[c.DEVICE_MEMORY_LIMIT]
    assert list(plugin.values()) == [pytest.approx(free)] * 2 * CHIPS


def test_the_topology_variable_picks_the_chips_of_its_slices(prometheus: tuple[PrometheusAPI, int]) -> None:
    """tune's sidecars label their series 2x4; train's none (its TPU_TOPOLOGY unset): All shows both."""
    assert values(prometheus, FLEET, "Chips", topology=TUNE_TOPOLOGY) == {(): 2 * CHIPS}
    mean = values(prometheus, FLEET, "Duty cycle, mean", topology=TUNE_TOPOLOGY)
    assert mean == {(): pytest.approx(TUNE_CHIP[c.DUTY_CYCLE])}
    by = ("source", "accelerator")
    headroom = values(prometheus, ONCALL, "Device memory headroom, by device", by=by, topology=TUNE_TOPOLOGY)
    assert set(headroom) == {(DEVICE_PLUGIN, "v6e")}


def test_the_fleet_board_counts_the_chips_no_pod_holds_as_idle(prometheus: tuple[PrometheusAPI, int]) -> None:
    """Issue 57: the nodes of train's 4 running pods and tune's 2 are held; eval's node, its pod done, and the spare
    pool's 2 nodes, no pod's, are idle and paid for; the chips tpuscope's collectors report are the held ones (each
    once, whichever collector read it)."""
    assert values(prometheus, FLEET, "Chips the cluster has") == {(): 9 * CHIPS}
    assert values(prometheus, FLEET, "Requested by running pods") == {(): 6 * CHIPS}
    assert values(prometheus, FLEET, "Reporting to tpuscope") == {(): 6 * CHIPS}
    assert values(prometheus, FLEET, "Idle chips: cost per hour") == {(): pytest.approx(1.20 * 3 * CHIPS)}
    by = ("label_cloud_google_com_gke_nodepool",)
    idle = values(prometheus, FLEET, "Chips by node pool: held, reporting, idle", ref="D", by=by)
    assert idle == {("train",): 0, ("tune",): 0, ("eval",): CHIPS, ("spare",): 2 * CHIPS}


def test_scheduling_goodput_is_the_share_of_its_units_time_with_every_pod_ready(
    prometheus: tuple[PrometheusAPI, int],
) -> None:
    """Over the last hour: train's pods were not all ready from its failure (-31 min) until its new pods ran (-28
    min); tune's from the hour's start until its pods ran (-40 min); old's all ready until it went (-30 min); eval's
    until its Job completed (-20 min), when it stops counting. The stat is the units' ready time over their time."""
    ready = {"train": 3600 - 180, "tune": 2400, "old": 1800, "eval": 2400}
    existed = {"train": 3600, "tune": 3600, "old": 1800, "eval": 2400}
    expected = sum(ready.values()) / sum(existed.values())
    assert values(prometheus, FLEET, "Scheduling goodput of every JobSet") == {(): pytest.approx(expected, abs=0.01)}
