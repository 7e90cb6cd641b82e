"""promtool cases of incidents as they really happen (issue 35): scrapes that fail while the pods run on, jobs
that Kubernetes deleted or keeps Pending, a sidecar forgetting a workload, crash loops before any checkpoint,
preemptions, replicas rescheduled, one job's memory leak on many hosts, and the team labels an Alertmanager routes
by. Each case failed on the rules before issue 35 and passes now (the issue's closing note lists which finding
each answers).

``READINGS`` are values the recording rules must read, checked with ``promql_expr_test``: the goodput SLO's ratio
under failed scrapes and over a long outage.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from alert_cases import (
    HOST,
    RUNBOOKS,
    Case,
    W,
    collective_history,
    cores_at,
    generations,
    megascale,
    s,
    sidecar,
)

from tpuscope import catalog as c
from tpuscope.conventions import BADPUT_RATIO, CORE_ELSEWHERE, AlertName

# A worker of JobSet llm in namespace ml, its pod run by the JobSet's Job: the target labels its sidecar's
# series carry (deploy/prometheus/prometheus.yml's relabelings).
JOB_POD = {"namespace": "ml", "jobset": "llm", "controller_kind": "Job", "controller": "llm-workers-0"}
TEAM = {"namespace": "ml", "jobset": "llm"}  # what a workload's alerts keep of them
# A worker of a Kubeflow JAXJob: a kind of controller kube-state-metrics does not describe.
JAX_POD = {"namespace": "ml", "jobset": "llm", "controller_kind": "JAXJob", "controller": "llm"}
POD = "llm-workers-0-0-abcde"
# A serving replica of a Deployment: its pod run by the Deployment's ReplicaSet.
REPLICA_POD = {"namespace": "ml", "controller_kind": "ReplicaSet", "controller": "serve-5d8f"}


def timeline(minutes: int, value: Callable[[int], str]) -> str:
    """A series sampled each minute from 0 to ``minutes``: ``value(minute)`` is a number, ``_`` (no sample) or
    ``stale`` (Prometheus' staleness marker: a failed scrape, a target gone)."""
    return " ".join(value(minute) for minute in range(minutes + 1))


def until(last: int, value: Callable[[int], float], gone: str = "stale") -> Callable[[int], str]:
    """``value`` up to minute ``last``; then a staleness marker (the target went, or failed) and nothing."""
    return lambda minute: f"{value(minute):g}" if minute <= last else (gone if minute == last + 1 else "_")


def worker(
    last: int, minutes: int, labels: dict[str, str], up: Callable[[int], str] | None = None, gone: str = "stale"
) -> dict[str, str]:
    """A training worker stepping once a second up to minute ``last``, its wall time booked productive, when its
    sidecar's series end (``gone``: stale, or ``_`` on a backend without staleness markers) and ``up`` says what
    Prometheus saw of its target (by default, gone with it)."""
    series = {
        s(c.GOODPUT_WALL, **labels): timeline(minutes, until(last, lambda m: 60 * m, gone)),
        s(c.GOODPUT, category="productive", **labels): timeline(minutes, until(last, lambda m: 60 * m, gone)),
        s(c.LAST_STEP, **labels): timeline(minutes, until(last, lambda m: 60 * m, gone)),
        s(c.WORKLOAD_PROCESSES, **labels): timeline(minutes, until(last, lambda m: 1, gone)),
        s(c.STEPS, **labels): timeline(minutes, until(last, lambda m: 60 * m, gone)),
    }
    target = s("up", **HOST)
    series[target] = timeline(minutes, up or until(last, lambda m: 1, gone))
    return series


def kube_state_metrics(minutes: int) -> dict[str, str]:
    """kube-state-metrics scraped, throughout: it lists the namespaces (ml, the jobs', among them) and their
    pods (kube-system's)."""
    return {
        s("kube_namespace_created", namespace="ml"): f"1.7e9x{minutes}",
        s("kube_namespace_created", namespace="kube-system"): f"1.6e9x{minutes}",
        s("kube_pod_info", namespace="kube-system", pod="coredns-0"): f"1x{minutes}",
    }


# When the Job was created (kube_job_created's value): before the test's minute 0.
JOB_CREATED = 1.7e9


def job_exists(last: int, minutes: int, gone: str = "stale", name: str = "llm-workers-0") -> dict[str, str]:
    """The Job llm-workers-0 (JobSet llm's), as kube-state-metrics lists it up to minute ``last``: its
    ``kube_job_created``, which both kube-prometheus' and GMP's recipe for kube-state-metrics keep."""
    job = s("kube_job_created", namespace="ml", job_name=name)
    return {job: timeline(minutes, until(last, lambda m: JOB_CREATED, gone))}


def job_missed(missed: int, minutes: int) -> dict[str, str]:
    """The Job listed throughout, but for the scrape of minute ``missed`` that kube-state-metrics failed."""
    job = s("kube_job_created", namespace="ml", job_name="llm-workers-0")
    return {job: timeline(minutes, lambda m: "stale" if m == missed else f"{JOB_CREATED:g}")}


def failing_every_fifth_scrape(minute: int) -> bool:
    return minute % 5 == 2


def flaky(minutes: int) -> dict[str, str]:
    """A workload at 95 % goodput (3 s of each minute io_wait) whose sidecar fails one scrape in five: the scrape
    writes up 0 and marks every series of the target stale, the next finds them again."""

    def sampled(value: Callable[[int], float]) -> Callable[[int], str]:
        return lambda m: "stale" if failing_every_fifth_scrape(m) else f"{value(m):g}"

    return {
        s("up", **HOST): timeline(minutes, lambda m: "0" if failing_every_fifth_scrape(m) else "1"),
        s(c.GOODPUT_WALL, **W): timeline(minutes, sampled(lambda m: 60 * m)),
        s(c.GOODPUT, category="productive", **W): timeline(minutes, sampled(lambda m: 57 * m)),
        s(c.GOODPUT, category="io_wait", **W): timeline(minutes, sampled(lambda m: 3 * m)),
        s(c.LAST_STEP, **W): timeline(minutes, sampled(lambda m: 60 * m)),
        s(c.WORKLOAD_PROCESSES, **W): timeline(minutes, sampled(lambda m: 1)),
        s(c.STEPS, **W): timeline(minutes, sampled(lambda m: 60 * m)),
    }


def expired(minutes: int) -> dict[str, str]:
    """A workload whose process failed at minute 10 and never came back, on a sidecar that stays up: it says the
    workload is down (and books the downtime) until it expires it, an hour after its last process left (minute
    70), and serves none of its series after."""
    gone = 70
    return {
        s("up", **HOST): f"1x{minutes}",
        s(c.GOODPUT_WALL, **W): timeline(minutes, until(gone, lambda m: 60 * m)),
        s(c.LAST_STEP, **W): timeline(minutes, until(gone, lambda m: 60 * min(m, 10))),
        s(c.WORKLOAD_PROCESSES, **W): timeline(minutes, until(gone, lambda m: 1 if m < 10 else 0)),
        s(c.WORKLOAD_DOWN_SINCE, **W): timeline(minutes, lambda m: "_" if m < 10 else until(gone, lambda _: 600)(m)),
    }


def on_hosts(count: int, series: Callable[[dict[str, str]], dict[str, str]]) -> dict[str, str]:
    """The same series from ``count`` hosts of workload w, worker i on host hi."""
    result: dict[str, str] = {}
    for i in range(count):
        result |= series({"instance": f"h{i}:9478", "worker": str(i)})
    return result


def preempted_slice(**counts: str) -> dict[str, str]:
    """A 4-host job whose worker 0 was preempted (its host told by the metadata server) at minute 5: the other
    three workers' processes ended without a word at once (the job restarts as a whole). ``counts``: more
    failure counters of worker 0, by reason."""
    result = on_hosts(4, lambda where: sidecar(10, instance=where["instance"], worker=where["worker"]))
    result[s(c.WORKLOAD_FAILURES, reason="preemption", instance="h0:9478", **W)] = "_x5 1x5"
    for i in range(1, 4):
        result[s(c.WORKLOAD_FAILURES, reason="vanished", instance=f"h{i}:9478", worker=str(i), **W)] = "_x5 1x5"
    return result


DOWN = (
    "Workload w has been down for {}: a process failed or vanished, or its pod went with its sidecar, and none has "
    "started since."
)

CASES = [
    # 1. A NetworkPolicy stops Prometheus' scrapes at minute 10; the pod runs on, its target listed (up 0). Not a
    # workload down: TpuscopeExporterDown says it (before: paged from minute 25).
    Case(
        AlertName.WORKLOAD_DOWN,
        None,
        "40m",
        worker(10, 40, W, up=lambda m: "1" if m <= 10 else "0"),
    ),
    # 2. The JobSet deleted at minute 10, pods and all, with kube-state-metrics scraped: ended on purpose (before:
    # paged from minute 25 until an hour later).
    Case(
        AlertName.WORKLOAD_DOWN,
        None,
        "40m",
        {**worker(10, 40, {**W, **JOB_POD}), **kube_state_metrics(40), **job_exists(10, 40)},
    ),
    # ... a serving Deployment scaled to zero at minute 10: its ReplicaSet wants no replica.
    Case(
        AlertName.WORKLOAD_DOWN,
        None,
        "40m",
        {
            **worker(10, 40, {**W, **REPLICA_POD}),
            **kube_state_metrics(40),
            s("kube_replicaset_spec_replicas", namespace="ml", replicaset="serve-5d8f"): "1x10 0x30",
        },
    ),
    # ... a JobSet preempted at minute 10 whose new pods stay Pending: still down 90 minutes on, as long as its
    # Job exists (before: forgotten an hour after its last series, the page resolved).
    Case(
        AlertName.WORKLOAD_DOWN,
        "critical",
        "100m",
        {**worker(10, 100, {**W, **JOB_POD}), **kube_state_metrics(100), **job_exists(100, 100)},
        {**W, **TEAM},
        DOWN.format("1h 30m 0s"),
    ),
    # ... without kube-state-metrics, Prometheus' inference as before: forgotten after an hour (docs/alerts.md).
    Case(AlertName.WORKLOAD_DOWN, None, "100m", worker(10, 100, {**W, **JOB_POD})),
    # 3. The sidecar expires a workload down since minute 10 at minute 70: still down, no all-clear (before: quiet
    # from 71 to 75, then paged again).
    Case(AlertName.WORKLOAD_DOWN, "critical", "74m", expired(80), W, DOWN.format("1h 4m 0s")),
    # 4. A job that fails before its first checkpoint, three times in 30 minutes, each time in new pods (a JobSet
    # with restartPolicy Never): no restart event was ever sent (before: never paged).
    Case(
        AlertName.WORKLOAD_CRASH_LOOPING,
        "critical",
        "35m",
        generations(c.WORKLOAD_FAILURES, workers=2, every=10, until=35, reason="out_of_memory", **W),
        W,
        "Workload w failed 3 times in the last hour, preemptions and host maintenance not counted.",
    ),
    # ... three platform events (two preemptions, a maintenance) that the job resumed from, its peers' processes
    # vanishing with each: no crash loop (before: paged on the three "resumed" restarts).
    Case(
        AlertName.WORKLOAD_CRASH_LOOPING,
        None,
        "10m",
        {
            s(c.WORKLOAD_FAILURES, reason="preemption", **W): "_x5 1 2x4",
            s(c.WORKLOAD_FAILURES, reason="maintenance", **W): "_x7 1x3",
            s(c.WORKLOAD_RESTARTS, reason="resumed", **W): "_x5 1 2 3x4",
            s(c.WORKLOAD_FAILURES, reason="vanished", instance="h1:9478", worker="1", **W): "_x5 1 2 3x4",
            **sidecar(10),
            **sidecar(10, instance="h1:9478", worker="1"),
        },
    ),
    # 5. One preempted worker, its three peers vanished with it: no ticket (before: a `vanished` ticket).
    Case(AlertName.WORKLOAD_FAILED, None, "10m", preempted_slice()),
    # ... but an out-of-memory failure in the same hour still makes its ticket.
    Case(
        AlertName.WORKLOAD_FAILED,
        "warning",
        "10m",
        {
            **preempted_slice(),
            s(c.WORKLOAD_FAILURES, reason="out_of_memory", instance="h2:9478", worker="2", **W): "_x7 1x3",
        },
        {**W, "reason": "out_of_memory"},
        f"Workload w failed in the last hour, reason out_of_memory (failures: 1). What to do: {RUNBOOKS}"
        "#failure-reason-out_of_memory",
    ),
    # 6. Two replicas serve model v3: one loaded it 8 days ago, the other was rescheduled yesterday and loaded the
    # same v3 again. The oldest is what is served (before: yesterday's load read as the model's age).
    Case(
        AlertName.MODEL_STALE,
        "warning",
        "70m",
        {
            s(c.MODEL_LOADED, version="v3", **W): "-691200x70",
            s(c.WORKLOAD_PROCESSES, **W): "1x70",
            s(c.MODEL_LOADED, version="v3", instance="r1:9478", worker="1", **W): "-86400x70",
            s(c.WORKLOAD_PROCESSES, instance="r1:9478", worker="1", **W): "1x70",
        },
        {**W, "version": "v3"},
        "Workload w serves model version v3, loaded 8d 1h 10m 0s ago (stale from 7 days).",
    ),
    # 7. One job's leak on four hosts: one page for the workload, the worst host's figure (before: four, one per
    # host, no workload named).
    Case(
        AlertName.HOST_MEMORY_PRESSURE,
        "critical",
        "5m",
        on_hosts(
            4,
            lambda where: {
                s(c.HOST_MEMORY_AVAILABLE, instance=where["instance"]): f"{2 + int(where['worker'])}e9x10",
                s(c.HOST_MEMORY_TOTAL, instance=where["instance"]): "64e9x10",
                s(c.WORKLOAD_PROCESSES, **where, **W): "1x10",
            },
        ),
        {**W, "signal": "available"},
        "A host of workload w has 3.125% of its memory available (the least of its hosts). The kernel's OOM killer "
        "will end the largest process, likely the training job.",
    ),
    # From the review of the above. A pod of a kind kube-state-metrics does not describe (a Kubeflow JAXJob), gone:
    # no word that it was deleted, so inferred down as without kube-state-metrics.
    Case(
        AlertName.WORKLOAD_DOWN,
        "critical",
        "40m",
        {**worker(10, 40, {**W, **JAX_POD}), **kube_state_metrics(40)},
        {**W, **TEAM},
        DOWN.format("30m 0s"),
    ),
    # ... a Job's pods Pending for 80 minutes while kube-state-metrics misses a scrape at minute 90: no all-clear.
    Case(
        AlertName.WORKLOAD_DOWN,
        "critical",
        "92m",
        {**worker(10, 100, {**W, **JOB_POD}), **kube_state_metrics(100), **job_missed(90, 100)},
        {**W, **TEAM},
        DOWN.format("1h 22m 0s"),
    ),
    # ... scrapes stopped by a NetworkPolicy for three hours, the pods running on: still not down.
    Case(
        AlertName.WORKLOAD_DOWN,
        None,
        "200m",
        {
            **worker(10, 200, {**W, **JOB_POD}, up=lambda m: "1" if m <= 10 else "0"),
            **kube_state_metrics(200),
            **job_exists(200, 200),
        },
    ),
    # ... but a host that died, its pod not ready as kube-state-metrics says, is down though its target is listed.
    Case(
        AlertName.WORKLOAD_DOWN,
        "critical",
        "40m",
        {
            **worker(10, 40, {**W, **JOB_POD, "pod": POD}, up=lambda m: "1" if m <= 10 else "0"),
            **kube_state_metrics(40),
            **job_exists(40, 40),
            s("kube_pod_status_ready", namespace="ml", pod=POD, condition="true"): "1x10 0x30",
        },
        {**W, **TEAM},
        DOWN.format("30m 0s"),
    ),
    # 11. A multislice JobSet's collectives slower, its device profiles unchanged: profiles are the measure, in
    # Kubernetes as outside it (the runtime's series carry the team labels too).
    Case(
        AlertName.COLLECTIVE_LATENCY_SPIKE,
        None,
        "280m",
        {**megascale(at=240, minutes=280, team=TEAM), **collective_history(0.3, 0.3, at=240, minutes=280, team=TEAM)},
    ),
    # ... and without profiles its alert names the team.
    Case(
        AlertName.COLLECTIVE_LATENCY_SPIKE,
        "warning",
        "280m",
        megascale(at=240, minutes=280, team=TEAM),
        {**W, **TEAM, "source": "megascale"},
        "Workload w sees its multislice collectives (collective_end_to_end p99) take 10.0x as long as in the 6 hours "
        "before, on its slowest host (a spike from 2x).",
    ),
    # 11. A JobSet's workload stalls: its page carries the namespace and the JobSet, for routing by team (before:
    # the workload alone).
    Case(
        AlertName.WORKLOAD_STALLED,
        "critical",
        "16m",
        {
            s(c.LAST_STEP, **W, **TEAM): "0x20",
            s(c.LAST_PROGRESS, **W, **TEAM): "0x20",
            s(c.WORKLOAD_PROCESSES, **W, **TEAM): "1x20",
        },
        {**W, **TEAM},
        "Workload w has completed no step for 16m 0s, nor any checkpoint or compile stage (counted from the last of "
        "them, or from its start), while its processes are still connected.",
    ),
]


@dataclass(frozen=True)
class Reading:
    """What a recording rule must read at ``eval_time``: ``expr`` (rounded to a hundredth) is ``value``."""

    why: str
    expr: str
    eval_time: str
    series: dict[str, str]
    value: float
    labels: dict[str, str]


READINGS = [
    # 1. One scrape in five fails at 95 % goodput: 5 % bad (before: 21 %, each failed scrape read as an hour's
    # worth of a pod gone).
    Reading("failed scrapes are not downtime", f"round({BADPUT_RATIO}2h, 0.01)", "150m", flaky(150), 0.05, W),
    # 2. Up 130 minutes, then preempted, its Job's pods Pending: 230 of the 6 hours' 360 minutes are bad, 64 %
    # (before: 31 %, the outage forgotten after an hour).
    Reading(
        "an outage longer than an hour is booked in full while Kubernetes wants its pods",
        f"round({BADPUT_RATIO}6h, 0.01)",
        "360m",
        {**worker(130, 360, {**W, **JOB_POD}), **kube_state_metrics(360), **job_exists(360, 360)},
        0.64,
        {**W, **TEAM},
    ),
    # 3. Issue 39: two workers' TPU cores at the all-reduce, one's at a fusion, one's at a copy: both workers that
    # are elsewhere are named, each at its own place.
    Reading(
        "every worker whose TPU cores sit elsewhere than most of its peers' is named",
        f"count by (workload) ({CORE_ELSEWHERE})",
        "16m",
        cores_at("all-reduce.42", "fusion.7", "all-reduce.42", "copy.3"),
        2,
        W,
    ),
]
