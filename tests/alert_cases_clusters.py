"""promtool cases of issue 53: alerts as real clusters present their series. kube-state-metrics as Google's recipe
for a GMP install scrapes it (only ``kube_job_created`` of a Job's series) and as kube-prometheus does (every series
of a Job), preempted slices of one JobSet, a JobSet applied again with its workload renamed, one a queue suspended,
kube-state-metrics itself down, hundreds of hosts of one job, restarts before a checkpoint, the end of a long outage,
a sidecar restarted in place.

Each case failed on the rules of ``0ae2591`` and passes now, or is the quiet or firing twin of one that did (the
issue's closing note lists which). The scenarios on routing, the inhibitions of one JobSet silencing another's page
and the one cause that made two tickets, run on a live Alertmanager in tests/test_alert_routing.py.
"""

from __future__ import annotations

from collections.abc import Callable

from alert_cases import HOST, PLACE, Case, W, s, sidecar, values
from alert_cases_incidents import JOB_CREATED, JOB_POD, TEAM, kube_state_metrics, timeline, until, worker

from tpuscope import catalog as c
from tpuscope.conventions import AlertName
from tpuscope.promql import SIDECAR_START

# The Job's series as kube-state-metrics serves them when its JobSet is deleted at minute 10 and applied again at
# minute 12: gone for a scrape, then a Job of the same name, created anew.
reapplied = timeline(100, lambda m: "1.7e9" if m < 11 else "stale" if m == 11 else "1.8e9")

DOWN = (
    "Workload {} has been down for {}: a process failed or vanished, or its pod went with its sidecar, and none has "
    "started since."
)


def served(
    labels: dict[str, str], first: int, last: int, minutes: int, host: str = "h:9478", io_wait: float = 0.0
) -> dict[str, str]:
    """A worker stepping once a second on a sidecar of ``host`` from minute ``first`` to ``last`` (its counters born
    at ``first``; a staleness marker after ``last`` as its pod goes), ``io_wait`` of its time waiting for input."""

    def sampled(value: Callable[[int], float]) -> str:
        return timeline(minutes, lambda m: "_" if m < first else until(last, value)(m))

    where = {**labels, "instance": host}
    return {
        s(c.GOODPUT_WALL, **where): sampled(lambda m: 60 * (m - first)),
        s(c.GOODPUT, category="productive", **where): sampled(lambda m: (1 - io_wait) * 60 * (m - first)),
        s(c.GOODPUT, category="io_wait", **where): sampled(lambda m: io_wait * 60 * (m - first)),
        s(c.LAST_STEP, **where): sampled(lambda m: 60 * m),
        s(c.STEPS, **where): sampled(lambda m: 60 * (m - first)),
        s(c.WORKLOAD_PROCESSES, **where): sampled(lambda m: 1),
        s("up", **{**HOST, "instance": host}): sampled(lambda m: 1),
    }


def job(minutes: int, name: str = "llm-workers-0", kube_prometheus: bool = True, **at: str) -> dict[str, str]:
    """A Job as kube-state-metrics serves it for ``minutes``: ``kube_job_created`` always (Google's GMP recipe keeps
    it and no other series of a Job), and with ``kube_prometheus`` what kube-prometheus scrapes besides
    (``kube_job_info``, the ``kube_job_complete`` conditions). ``at``: any of these series' samples, whole."""
    series = {s("kube_job_created", namespace="ml", job_name=name): f"{JOB_CREATED:g}x{minutes}"}
    if kube_prometheus:
        series[s("kube_job_info", namespace="ml", job_name=name)] = f"1x{minutes}"
        for condition, value in (("true", 0), ("false", 1)):
            series[s("kube_job_complete", namespace="ml", job_name=name, condition=condition)] = f"{value}x{minutes}"
    return {**series, **{s(metric, namespace="ml", job_name=name): samples for metric, samples in at.items()}}


def gmp_recipe(minutes: int) -> dict[str, str]:
    """kube-state-metrics as prometheus-engine's examples/kube-state-metrics keeps it: namespaces and pods, and of
    Jobs only kube_job_created (its keep regex: ``kube_(daemonset|deployment|replicaset|pod|namespace|node|
    statefulset|persistentvolume|horizontalpodautoscaler|job_created)(_.+)?``)."""
    return {**kube_state_metrics(minutes), **job(minutes, kube_prometheus=False)}


def ksm_down(start: int, end: int, minutes: int) -> dict[str, str]:
    """kube-state-metrics (kube-prometheus' set, the Job wanted throughout) not scraped from ``start`` to ``end``:
    its series end with a staleness marker and come back."""

    def sampled(value: float) -> str:
        return timeline(minutes, lambda m: "stale" if m == start else "_" if start < m < end else f"{value:g}")

    return {
        s("kube_namespace_created", namespace="ml"): sampled(1.7e9),
        s("kube_job_created", namespace="ml", job_name="llm-workers-0"): sampled(JOB_CREATED),
        s("kube_job_info", namespace="ml", job_name="llm-workers-0"): sampled(1),
    }


def slices(events: dict[int, int | None], minutes: int, count: int = 6) -> dict[str, str]:
    """A JobSet of ``count`` one-host slices (worker 0 of slice i on host si), restarted as a whole in place at each
    event: ``events`` maps a minute to the slice the platform preempted then (its host told, a ``preemption``), or to
    None (nobody told: every process ``vanished``). At each event every other host's process vanishes."""
    result: dict[str, str] = {}
    for index in range(count):
        where = {"instance": f"s{index}:9478", "slice": str(index), "worker": "0"}
        result |= sidecar(minutes, instance=where["instance"])
        told = sorted(m for m, preempted in events.items() if preempted == index)
        vanished = sorted(m for m, preempted in events.items() if preempted != index)
        for reason, at in (("preemption", told), ("vanished", vanished)):
            if at:
                counts = timeline(minutes, lambda m, at=at: f"{sum(1 for t in at if t <= m)}" if m >= at[0] else "_")
                result[s(c.WORKLOAD_FAILURES, reason=reason, **where, **W)] = counts
    return result


DEVICE = {"device": "0", "accelerator": "v5e", "source": "libtpu"}


def hosts_of_w(
    count: int, metric: c.Metric, value: Callable[[int], float], minutes: int, **labels: str
) -> dict[str, str]:
    """``count`` hosts of workload w (worker i on host hi), host i's ``metric`` at ``value(i)``, a process
    connected."""
    result: dict[str, str] = {}
    for i in range(count):
        where = {"instance": f"h{i}:9478", "worker": str(i)}
        result[s(metric, **where, **labels)] = f"{value(i):g}x{minutes}"
        result[s(c.WORKLOAD_PROCESSES, **where, **W)] = f"1x{minutes}"
    return result


def restarted_before_saving(minutes: int, saved_again: int | None = None) -> dict[str, str]:
    """Workload w saved a checkpoint at minute 0; its pod failed at minute 30 and the JobSet's new one (host h2)
    steps from minute 32, and saves again at ``saved_again`` (None: never). Its new sidecar serves no last save until
    it saves."""
    series = {
        **served(W, 0, 30, minutes),
        **served(W, 32, minutes, minutes, host="h2:9478"),
        s(c.CHECKPOINT_LAST_SUCCESS, **W): timeline(minutes, until(30, lambda m: 0)),
    }
    if saved_again is not None:
        saved = timeline(minutes, lambda m: "_" if m < saved_again else f"{60 * saved_again}")
        series[s(c.CHECKPOINT_LAST_SUCCESS, **W, instance="h2:9478")] = saved
    return series


def outage_then_back(minutes: int, down: range, io_wait_after: float = 0.0) -> dict[str, str]:
    """Workload w of JobSet llm steps productively until its pod is preempted for the minutes of ``down`` (its Job
    wanting its pods throughout: kube-prometheus' kube-state-metrics), then a new pod (host h2) steps from
    ``down.stop``, ``io_wait_after`` of its time waiting for input."""
    labels = {**W, **JOB_POD}
    return {
        **served(labels, 0, down.start, minutes),
        **served(labels, down.stop, minutes, minutes, host="h2:9478", io_wait=io_wait_after),
        **kube_state_metrics(minutes),
        **job(minutes),
    }


def restarted_in_place(failed_after: bool) -> dict[str, str]:
    """A sidecar that counted 3 failed saves in its first minutes restarts in place at minute 40 (the same target;
    its start time moves), the job's saves going on; one save fails at minute 45 if ``failed_after``."""

    def count(m: int) -> str:
        if m < 40:
            return "3"
        if m == 40:
            return "stale"
        return "1" if failed_after and m >= 45 else "_"

    return {
        s("up", **HOST): values(1, 50),
        s(SIDECAR_START, **HOST, **PLACE): timeline(50, lambda m: "0" if m < 40 else "2400"),
        s(c.CHECKPOINT_DURATION, "count", operation="save", result="error", **W): timeline(50, count),
    }


# JobSet llm preempted at minute 10 by Kueue (its Job suspended), resumed at minute 30, its pods not served since.
QUEUED_THEN_RESUMED = {
    **served({**W, **JOB_POD}, 0, 10, 60),
    **job(60, kube_job_status_suspended="0x9 1x20 0x30"),
    **kube_state_metrics(60),
}
# A JobSet preempted at minute 10, its pods Pending, while kube-state-metrics is not scraped from minute 80 to 100.
KSM_SILENT_WHILE_DOWN = {**worker(10, 120, {**W, **JOB_POD}), **ksm_down(80, 100, 120)}

BURN = (
    "Workload w is burning its goodput error budget fast: {} was bad over the last 2h or 6h, against a budget of "
    "10.00%."
)

CASES = [
    # 1. GMP's recipe for kube-state-metrics keeps kube_job_created, not kube_job_info: a JobSet preempted at minute
    # 10, its pods Pending, pages as long as its Job wants them (before: every Job read as deleted, no page).
    Case(
        AlertName.WORKLOAD_DOWN,
        "critical",
        "100m",
        {**worker(10, 100, {**W, **JOB_POD}), **gmp_recipe(100)},
        {**W, **TEAM},
        DOWN.format("w", "1h 30m 0s"),
    ),
    # ... and the JobSet deleted at minute 10 under the same recipe: ended on purpose.
    Case(
        AlertName.WORKLOAD_DOWN,
        None,
        "40m",
        {
            **worker(10, 40, {**W, **JOB_POD}),
            **kube_state_metrics(40),
            s("kube_job_created", namespace="ml", job_name="llm-workers-0"): timeline(
                40, until(10, lambda m: JOB_CREATED)
            ),
        },
    ),
    # 2. A 6-slice JobSet whose slices 1 to 4 are preempted one after another: four platform events, each slice's
    # peers vanishing with it: no crash loop (before: paged at the fourth) and no `vanished` ticket (before: at the
    # second).
    Case(AlertName.WORKLOAD_CRASH_LOOPING, None, "40m", slices({5: 1, 15: 2, 25: 3, 35: 4}, 40)),
    Case(AlertName.WORKLOAD_FAILED, None, "20m", slices({5: 1, 15: 2}, 20)),
    # ... but two preemptions and three restarts that no platform event explains page.
    Case(
        AlertName.WORKLOAD_CRASH_LOOPING,
        "critical",
        "40m",
        slices({5: 1, 15: 2, 25: None, 30: None, 35: None}, 40),
        W,
        "Workload w failed 3 times in the last hour, preemptions and host maintenance not counted.",
    ),
    # 3. JobSet llm (workload a) deleted at minute 10 and applied again at minute 12 with its workload renamed b;
    # its Job has the same name, and wants its pods. b runs from minute 15 and is preempted at minute 30, its pods
    # Pending since: b pages, a does not (before: a paged too, for as long as the Job lived).
    Case(
        AlertName.WORKLOAD_DOWN,
        "critical",
        "100m",
        {
            **served({"workload": "a", **JOB_POD}, 0, 10, 100),
            **served({"workload": "b", **JOB_POD}, 15, 30, 100, host="h2:9478"),
            **kube_state_metrics(100),
            **job(100, **{metric: reapplied for metric in ("kube_job_created", "kube_job_info")}),
        },
        {"workload": "b", **TEAM},
        DOWN.format("b", "1h 10m 0s"),
    ),
    # 4. Kueue suspends JobSet llm at minute 10 (a higher-priority workload preempts it): its Job suspended, its pods
    # deleted, their processes gone without a word. Queued on purpose: no page and no ticket (before: WorkloadDown
    # re-paged hourly while it waited, and a `vanished` ticket). JobSet llm2, preempted at minute 10 with nobody
    # suspending it, pages.
    Case(
        AlertName.WORKLOAD_DOWN,
        "critical",
        "100m",
        {
            **worker(10, 100, {**W, **JOB_POD}),
            **job(100, kube_job_status_suspended="0x9 1x90"),
            **worker(
                10,
                100,
                {"workload": "w2", **JOB_POD, "jobset": "llm2", "controller": "llm2-workers-0", "instance": "g:9478"},
            ),
            **job(100, name="llm2-workers-0"),
            **kube_state_metrics(100),
        },
        {"workload": "w2", "namespace": "ml", "jobset": "llm2"},
        DOWN.format("w2", "1h 30m 0s"),
    ),
    Case(
        AlertName.WORKLOAD_FAILED,
        None,
        "12m",
        {
            **served({**W, **JOB_POD}, 0, 10, 12),
            s(c.WORKLOAD_FAILURES, reason="vanished", **W, **JOB_POD): timeline(
                12, lambda m: "1" if m == 10 else "stale" if m == 11 else "_"
            ),
            s(SIDECAR_START, **HOST, **PLACE): timeline(12, until(10, lambda m: 0)),
            **job(12, kube_job_status_suspended="0x9 1x2"),
            **kube_state_metrics(12),
        },
    ),
    # ... Kueue resumes it at minute 30: its pods not served yet at 32 are no outage of 22 minutes (the queue's wait),
    Case(
        AlertName.WORKLOAD_DOWN,
        None,
        "32m",
        QUEUED_THEN_RESUMED,
    ),
    # ... but pods that stay Pending after it are down from the resumption.
    Case(
        AlertName.WORKLOAD_DOWN,
        "critical",
        "50m",
        QUEUED_THEN_RESUMED,
        {**W, **TEAM},
        DOWN.format("w", "20m 0s"),
    ),
    # 5. kube-state-metrics down from minute 80 to 100 while a JobSet preempted at minute 10 waits for its pods: still
    # down, no all-clear (before: resolved at minute 85, paged again at 100) ...
    Case(
        AlertName.WORKLOAD_DOWN,
        "critical",
        "95m",
        KSM_SILENT_WHILE_DOWN,
        {**W, **TEAM},
        DOWN.format("w", "1h 25m 0s"),
    ),
    # ... and when it comes back.
    Case(
        AlertName.WORKLOAD_DOWN,
        "critical",
        "110m",
        KSM_SILENT_WHILE_DOWN,
        {**W, **TEAM},
        DOWN.format("w", "1h 40m 0s"),
    ),
    # ... but down longer than an hour it no longer vouches for anything: forgotten, as without kube-state-metrics.
    Case(AlertName.WORKLOAD_DOWN, None, "150m", {**worker(10, 160, {**W, **JOB_POD}), **ksm_down(80, 155, 160)}),
    # 6. 40 hosts of one workload with their chips idle, 40 with their devices nearly full, 40 with their CPUs
    # saturated: one ticket each for the workload, naming its worst hosts (before: 40 tickets each).
    Case(
        AlertName.LOW_DUTY_CYCLE,
        "warning",
        "40m",
        hosts_of_w(40, c.DUTY_CYCLE, lambda i: 0.1 + i / 100, 40, device="0", accelerator="v5e", source="libtpu"),
        W,
        "Workload w: the chips of 40 of its hosts were busy less than 50% of the time: h0:9478 (10%), h1:9478 (11%), "
        "h2:9478 (12%), h3:9478 (13%), h4:9478 (14%).",
    ),
    Case(
        AlertName.DEVICE_MEMORY_NEAR_LIMIT,
        "warning",
        "20m",
        {
            **hosts_of_w(40, c.DEVICE_MEMORY_USED, lambda i: 15e9 + i * 1e7, 20, **DEVICE),
            **hosts_of_w(40, c.DEVICE_MEMORY_LIMIT, lambda i: 16e9, 20, **DEVICE),
        },
        W,
        "Workload w: 40 of its hosts have a device using more than 90% of its memory (the fullest device of each): "
        "h35:9478 (95.94%), h36:9478 (96%), h37:9478 (96.06%), h38:9478 (96.12%), h39:9478 (96.19%).",
    ),
    Case(
        AlertName.HOST_CPU_SATURATED,
        "warning",
        "20m",
        hosts_of_w(40, c.HOST_CPU_UTILIZATION, lambda i: 0.91 + i / 500, 20, cpu="0"),
        W,
        "Workload w: 40 of its hosts have their CPU more than 90% busy, too busy to feed their chips: h35:9478 "
        "(98%), h36:9478 (98.2%), h37:9478 (98.4%), h38:9478 (98.6%), h39:9478 (98.8%).",
    ),
    # ... and hosts with no job on them make none.
    Case(AlertName.HOST_CPU_SATURATED, None, "20m", {s(c.HOST_CPU_UTILIZATION, cpu="0"): "0.95x20"}),
    # 7. Saved at minute 0, restarted at minute 30 before its next save, never saving again: pages (before: the new
    # pods' sidecar had no save to read, and nothing paged).
    Case(
        AlertName.CHECKPOINT_STALE,
        "critical",
        "75m",
        restarted_before_saving(80),
        W,
        "Workload w last saved a checkpoint 1h 15m 0s ago: that much work is lost if it fails now.",
    ),
    # ... saving again at minute 40: no page.
    Case(AlertName.CHECKPOINT_STALE, None, "75m", restarted_before_saving(80, saved_again=40)),
    # ... nor a ticket that it never saved.
    Case(AlertName.CHECKPOINT_MISSING, None, "100m", restarted_before_saving(100)),
    # 8. A job saving every hour, its save landing 5 minutes late: past the threshold, not for 10 minutes (before:
    # paged every hour).
    Case(
        AlertName.CHECKPOINT_STALE,
        None,
        "128m",
        {
            s(c.CHECKPOINT_LAST_SUCCESS, **W): timeline(130, lambda m: f"{60 * (m // 65) * 65}"),
            s(c.WORKLOAD_PROCESSES, **W): "1x130",
        },
    ),
    # 9. A JobSet down for 5 hours, WorkloadDown paging, back at minute 400: the goodput burn of that outage stays
    # quiet as the page resolves (before: paged for the same outage).
    Case(AlertName.GOODPUT_BUDGET_BURN, None, "410m", outage_then_back(420, range(100, 400))),
    # ... but a job that comes back burning its budget on its own pages once its short window is past the outage (here
    # its long one too, so that the figure is the job's own, whatever order promtool evaluates the groups in).
    Case(
        AlertName.GOODPUT_BUDGET_BURN,
        "critical",
        "530m",
        outage_then_back(540, range(100, 400), io_wait_after=0.9),
        {**W, **TEAM},
        BURN.format("90%"),
    ),
    # 10. A sidecar restarted in place (its pod kept) counts one failed save after its restart: a ticket (before:
    # the failures its previous life counted hid it).
    Case(
        AlertName.CHECKPOINT_FAILING,
        "warning",
        "50m",
        restarted_in_place(failed_after=True),
        W,
        "Workload w failed 1 checkpoint saves in the last 30 minutes.",
    ),
    # ... and none after it: no ticket (nor its previous life's 3 counted again).
    Case(AlertName.CHECKPOINT_FAILING, None, "50m", restarted_in_place(failed_after=False)),
]
