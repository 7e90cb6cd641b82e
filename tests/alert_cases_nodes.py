"""promtool cases for the bad-host ledger (issue 58): the workloads, generations of pods, crashes, stragglers and
devices tests/test_bad_hosts.py reads the ledger of, and TpuscopeNodeSuspect's cases, which tests/test_alerts.py adds.

Each workload runs in generations of pods (a JobSet restarts them all), one sidecar a pod, the pod's node its target
label as the scrape gives it.
"""

from __future__ import annotations

from collections.abc import Callable

from alert_cases import Case, s
from alert_cases_incidents import timeline

from tpuscope import catalog as c
from tpuscope.conventions import STRAGGLER_CHRONIC, AlertName
from tpuscope.promql import SIDECAR_START

MINUTES = 70


def sampled(start: int, end: int, value: Callable[[int], str], minutes: int = MINUTES) -> str:
    """A series from minute ``start`` to ``end``, then a staleness marker (the pod went) and nothing."""
    return timeline(minutes, lambda m: value(m) if start <= m <= end else "stale" if m == end + 1 else "_")


def pod(
    workload: str,
    generation: int,
    node: str,
    worker: int,
    start: int,
    end: int,
    failed_at: float | None = None,
    reason: str = "vanished",
    minutes: int = MINUTES,
) -> dict[str, str]:
    """One pod of ``workload``'s ``generation`` on ``node``, its sidecar scraped from minute ``start`` to ``end``;
    its process failed at ``failed_at`` seconds (for ``reason``), its sidecar lingering to ``end``."""
    target = {
        "job": "tpuscope",
        "instance": f"{workload}-{generation}-{worker}:9478",
        "node": node,
        "namespace": "team-a",
        "jobset": workload,
    }
    host = {**target, "slice": "0", "worker": str(worker)}
    series = {
        s("up", **target): sampled(start, end, lambda m: "1", minutes),
        s(SIDECAR_START, **host): sampled(start, end, lambda m: str(start * 60), minutes),
        s(c.WORKLOAD_START_TIME, workload=workload, **host): sampled(start, end, lambda m: str(start * 60), minutes),
    }
    if failed_at is not None:
        since = int(failed_at // 60) + 1  # the first scrape after it
        series[s(c.WORKLOAD_DOWN_SINCE, workload=workload, **host)] = sampled(
            since, end, lambda m: f"{failed_at:g}", minutes
        )
        series[s(c.WORKLOAD_FAILURES, workload=workload, reason=reason, **host)] = sampled(
            since, end, lambda m: "1", minutes
        )
    return series


def generation(
    workload: str,
    number: int,
    hosts: tuple[str, ...],
    start: int,
    end: int,
    crash: float | None = None,
    together: bool = False,
    reason: str = "vanished",
) -> dict[str, str]:
    """A generation of ``workload`` on ``hosts`` (worker i on hosts[i]); at ``crash`` seconds its first host's
    process fails (for ``reason``), the others 20 s later, as peers that lost it; ``together``: every process at
    once, within a third of a second (a bug at one step)."""
    series: dict[str, str] = {}
    for worker, node in enumerate(hosts):
        failed_at = None
        if crash is not None:
            failed_at = crash + (0.1 * worker if together else 0 if worker == 0 else 20)
        why = reason if worker == 0 or together else "vanished"
        series |= pod(workload, number, node, worker, start, end, failed_at, why)
    return series


def crashes() -> dict[str, str]:
    """Two workloads whose first process crashed on node-a (one after the other, each restarted elsewhere); a bug that
    crashes rank 0 wherever it lands (p, q, r in turn), and another workload's crash on p; a workload failing
    together on s and t, twice, restarted in place, and another together on s and t2; the runtime failing to start
    on u, twice, in one workload that also ran on v; and on z, twice, in a single-host workload that never ran
    elsewhere (its bug or the node: no telling); a 4-host workload whose rank 0 crashes on n1, then on n2, and
    another's crash on n1."""
    return {
        **generation("llama", 0, ("node-a", "node-b", "node-c", "node-d"), 0, 11, crash=600.0),
        **generation("llama", 1, ("node-e", "node-f", "node-g", "node-h"), 12, MINUTES),
        **generation("gemma", 0, ("node-a", "node-i", "node-j", "node-k"), 20, 31, crash=1800.0),
        **generation("gemma", 1, ("node-l", "node-m", "node-n", "node-o"), 32, MINUTES),
        **generation("buggy", 0, ("node-p", "node-q"), 0, 11, crash=600.0),
        **generation("buggy", 1, ("node-q", "node-r"), 12, 21, crash=1200.0),
        **generation("buggy", 2, ("node-r", "node-p"), 22, 31, crash=1800.0),
        **generation("mixtral", 0, ("node-p", "node-w"), 40, 51, crash=3000.0),
        **generation("flaky", 0, ("node-s", "node-t"), 0, 11, crash=600.0, together=True),
        **generation("flaky", 1, ("node-s", "node-t"), 12, 23, crash=1320.0, together=True),
        **generation("broken", 0, ("node-s", "node-t2"), 30, 41, crash=2400.0, together=True),
        **generation("dead", 0, ("node-u", "node-v"), 0, 11, crash=600.0, reason="runtime_init"),
        **generation("dead", 1, ("node-u", "node-v"), 12, 23, crash=1320.0, reason="runtime_init"),
        **generation("dead", 2, ("node-x", "node-v"), 24, MINUTES),
        **generation("pinned", 0, ("node-z",), 0, 11, crash=600.0, reason="runtime_init"),
        **generation("pinned", 1, ("node-z",), 12, 23, crash=1320.0, reason="runtime_init"),
        **generation("wide", 0, ("node-n1", "node-n3", "node-n4", "node-n5"), 0, 11, crash=600.0),
        **generation("wide", 1, ("node-n2", "node-n6", "node-n7", "node-n8"), 12, 23, crash=1320.0),
        **generation("narrow", 0, ("node-n1", "node-n9"), 30, 41, crash=2400.0),
    }


def chronic(workload: str, node: str, worker: int, start: int, end: int) -> dict[str, str]:
    """TpuscopeStraggler's verdict: worker ``worker`` of ``workload`` on ``node`` its chronic straggler."""
    labels = {"namespace": "team-a", "jobset": workload, "workload": workload, "job": "tpuscope"}
    labels |= {"instance": f"{workload}-{start}-{worker}:9478", "node": node, "slice": "0", "worker": str(worker)}
    return {s(STRAGGLER_CHRONIC, **labels): sampled(start, end, lambda m: "0.8")}


def stragglers() -> dict[str, str]:
    """One straggler that follows its job's worker 1 from node-a2 to node-b2 and node-c2, and another job's straggler
    once on node-a2 (the only evidence there that stays); a straggler that stays with node-d2 across two jobs."""
    series = {}
    for number, hosts in enumerate((("node-y2", "node-a2"), ("node-z2", "node-b2"), ("node-x2", "node-c2"))):
        series |= generation("wanderer", number, hosts, 20 * number, 20 * number + 19)
        series |= chronic("wanderer", hosts[1], 1, 20 * number, 20 * number + 19)
    series |= generation("visitor", 0, ("node-a2", "node-w2"), 0, 15) | chronic("visitor", "node-a2", 0, 0, 15)
    series |= generation("first", 0, ("node-d2", "node-e2"), 0, 30) | chronic("first", "node-d2", 0, 0, 30)
    series |= generation("second", 0, ("node-f2", "node-d2"), 35, MINUTES)
    return series | chronic("second", "node-d2", 1, 35, MINUTES)


def devices() -> dict[str, str]:
    """XID 79 (fell off the bus) on node-a3, XID 13 (the application's) on node-b3; a GPU on node-c3 thermally
    throttled under two workloads in turn, one on node-d3 under one only."""
    series = generation("xids", 0, ("node-a3", "node-b3"), 0, MINUTES)
    gpu = {"device": "0", "accelerator": "h100", "source": "nvml", "namespace": "team-a", "job": "tpuscope"}
    for node, xid, worker in (("node-a3", "79", 0), ("node-b3", "13", 1)):
        labels = {**gpu, "jobset": "xids", "instance": f"xids-0-{worker}:9478", "node": node, "xid": xid}
        series[s(c.XID_ERRORS, **labels)] = sampled(20, MINUTES, lambda m: "1")
    for workload, node, start, end in (
        ("hot1", "node-c3", 0, 30),
        ("hot2", "node-c3", 32, 64),
        ("hot3", "node-d3", 0, 64),
    ):
        series |= generation(workload, 0, (node, "node-e3"), start, end)
        labels = {**gpu, "jobset": workload, "instance": f"{workload}-0-0:9478", "node": node, "reason": "thermal"}
        series[s(c.THROTTLED, **labels)] = sampled(start, end, lambda m: "1")
    return series


SAYS = (
    "Node node-a keeps breaking jobs. Its evidence over the last 7d: crash (team-a/gemma); crash (team-a/llama); "
    "cordon it, and have its accelerators checked."
)


def two_crashes(cordoned: bool = False) -> dict[str, str]:
    """Two workloads whose first process crashed on node-a; node-a cordoned since minute 40 if ``cordoned``."""
    series = {
        **generation("llama", 0, ("node-a", "node-b"), 0, 11, crash=600.0),
        **generation("llama", 1, ("node-e", "node-f"), 12, MINUTES),
        **generation("gemma", 0, ("node-a", "node-i"), 20, 31, crash=1800.0),
        **generation("gemma", 1, ("node-l", "node-m"), 32, MINUTES),
    }
    if cordoned:
        ksm = {"job": "kube-state-metrics", "instance": "10.0.0.9:8080", "node": "node-a"}
        series[s("kube_node_spec_unschedulable", **ksm)] = timeline(MINUTES, lambda m: str(int(m >= 40)))
    return series


CASES = [
    Case(AlertName.NODE_SUSPECT, "warning", "45m", two_crashes(), {"node": "node-a"}, SAYS),
    Case(AlertName.NODE_SUSPECT, None, "25m", two_crashes()),  # one workload's crash so far
    Case(AlertName.NODE_SUSPECT, None, "45m", two_crashes(cordoned=True)),  # done: the node takes no new pods
]


def crash_looping() -> dict[str, str]:
    """Scraped every 15 s for 50 minutes: worker 0 of a 2-host job on node-k2 fails to start its runtime at 600 s and,
    its container restarted in place (the same pod), again at 650 s; its peer on node-l2 waits. At 1,200 s the job
    restarts in new pods, worker 0 on node-m2, where it runs."""
    scrapes = 50 * 4

    def every(start: float, end: float, value: Callable[[float], str]) -> str:
        return " ".join(value(i * 15) if start <= i * 15 <= end else "_" for i in range(scrapes + 1))

    down = {615: "600", 630: "_", 645: "_"}  # down from its failure until it runs again (not at 630, 645), then down
    series = {}
    for generation_, nodes_ in ((0, ("node-k2", "node-l2")), (1, ("node-m2", "node-l2"))):
        start, end = (0, 1200) if generation_ == 0 else (1215, scrapes * 15)
        for worker, node in enumerate(nodes_):
            target = {"job": "tpuscope", "instance": f"loop-{generation_}-{worker}:9478", "node": node}
            host = {**target, "namespace": "team-a", "jobset": "loop", "slice": "0", "worker": str(worker)}
            series[s("up", **target)] = every(start, end, lambda t: "1")
            started = every(start, end, lambda t, start=start: str(start))
            series[s(SIDECAR_START, **host)] = started
            series[s(c.WORKLOAD_START_TIME, workload="loop", **host)] = started
            if (generation_, worker) == (0, 0):
                series[s(c.WORKLOAD_DOWN_SINCE, workload="loop", **host)] = every(
                    615, end, lambda t: down.get(int(t), "650")
                )
                series[s(c.WORKLOAD_FAILURES, workload="loop", reason="runtime_init", **host)] = every(
                    615, end, lambda t: "1" if t < 660 else "2"
                )
    return series


def diverged_first() -> dict[str, str]:
    """Two workloads of 4 hosts that went non-finite, each worker reporting its value before the reduction: in
    each, the worker on node-g4 went first (step 500, its peers at 501)."""
    series: dict[str, str] = {}
    for workload, first in (("d1", 2), ("d2", 1)):
        hosts = [f"node-{workload}-{worker}" for worker in range(4)]
        hosts[first] = "node-g4"
        for worker, node in enumerate(hosts):
            target = {"job": "tpuscope", "instance": f"{workload}-{worker}:9478", "node": node}
            host = {**target, "namespace": "team-a", "jobset": workload, "slice": "0", "worker": str(worker)}
            place = {**host, "workload": workload}
            series[s("up", **target)] = "1x30"
            series[s(SIDECAR_START, **host)] = "0x30"
            series[s(c.WORKLOAD_START_TIME, **place)] = "0x30"
            series[s(c.TRAINING_NONFINITE, value="local", **place)] = "0x10 60+60x20"
            onset = 500 if worker == first else 501
            series[s(c.TRAINING_NONFINITE_ONSET, value="local", **place)] = f"_x10 {onset}x20"
            series[s(c.TRAINING_VALUE, value="local", **place)] = "1x30"
    return series
