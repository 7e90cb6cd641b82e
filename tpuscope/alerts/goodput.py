"""Alerts on training time lost: the goodput SLO's error budget burning, a workload down, failing, crash looping."""

from __future__ import annotations

from tpuscope import catalog as c
from tpuscope import durations
from tpuscope.alerts.recording import down_for, jobs_suspended
from tpuscope.alerts.rules import FAILURE_REASON_ANCHOR, Alert, burn_rate_alerts, reason_runbook
from tpuscope.conventions import (
    BADPUT_RATIO,
    CONTROLLER,
    DOWN_FOR,
    FAILURES_HOUR,
    RUN_MEMORY,
    RUNNING_INFERRED,
    AlertName,
    DashboardUID,
)
from tpuscope.generator_config import GeneratorConfig
from tpuscope.promql import RUN, WORKLOAD, add, series
from tpuscope.reasons import PLATFORM_REASONS, VANISHED

PLATFORM = f'reason=~"{"|".join(PLATFORM_REASONS)}"'  # the platform's doing, not the job's
NOT_THE_PLATFORM = f'reason!~"{"|".join((*PLATFORM_REASONS, VANISHED))}"'  # failures the job named itself
VANISHED_HERE = f'reason="{VANISHED}"'  # processes that ended without a word


def failed(matcher: str, by: str = RUN) -> str:
    """Each worker's failures of the last hour that ``matcher`` picks, over its successive sidecars (recorded:
    :func:`tpuscope.alerts.recording.failure_rules`)."""
    return f"sum by ({by}) ({FAILURES_HOUR}{{{matcher}}})"


def vanished_on_its_own() -> str:
    """Each worker's processes of the last hour that ended without a word (``vanished``), less those the platform
    explains. When the platform preempts one slice of a job, or takes a host for maintenance, its peers' processes
    end without a word too (the job restarts as a whole), and only the preempted hosts are told: each platform event
    of the workload accounts for one vanishing of each worker. The events are counted per slice (the most any host
    of the slice was told of; one preemption tells every host of its slice) and summed over the slices: six slices
    preempted one after another are six events, not one. And a worker whose Job a queue suspended in the hour (Kueue:
    its pods deleted on purpose, kube-state-metrics says) vanished for that."""
    per_slice = f"max by ({WORKLOAD}, {c.Label.SLICE}) ({failed(PLATFORM)})"
    platform = f"sum by ({WORKLOAD}) ({per_slice})"
    suspended = f"{RUNNING_INFERRED} and on (namespace, {CONTROLLER}) {jobs_suspended(RUN_MEMORY)}"
    vanished = f"({failed(VANISHED_HERE)} unless on ({RUN}) ({suspended}))"
    return f"(clamp_min({vanished} - on ({WORKLOAD}) group_left () {platform}, 0) or {vanished})"


def own_failures() -> str:
    """Each worker's failures of the last hour that the job answers for: those it named, and its processes that
    vanished on their own."""
    return add(failed(NOT_THE_PLATFORM), vanished_on_its_own(), on=RUN)


def alerts(config: GeneratorConfig) -> list[Alert]:
    t = config.thresholds
    return [
        *burn_rate_alerts(
            AlertName.GOODPUT_BUDGET_BURN,
            BADPUT_RATIO,
            1 - t.goodput_objective,
            "A workload is burning its goodput error budget.",
            "goodput",
            DashboardUID.FLEET,
            "Find the largest badput category (Fleet overview) and fix it: restarts and lost work first. Each pair "
            f"of windows stays quiet while its short window holds an outage {AlertName.WORKLOAD_DOWN} paged for "
            f"(down longer than {durations.human(t.downtime_seconds)}): that page said it, and the burn it leaves "
            "in the long window would otherwise page again as the outage ends and its page resolves. A job that "
            "comes back and burns its budget on its own pages once its short window is past the outage. Planned "
            "work (maintenance, a pause the owner chose) is kept out of the budget with an exclusion window "
            "(`tpuscope exclusion`, docs/goodput.md): the windows' ratios read neither its bad nor its wall time, so "
            "no pair fires for it, and a pair fires again only for what is bad outside it.",
            existed=series(c.STEPS),
            paged_outage=(DOWN_FOR, t.downtime_seconds),
        ),
        Alert(
            AlertName.WORKLOAD_DOWN,
            "critical",
            f"{down_for()} > {t.downtime_seconds:g}",
            "A workload is down and has not started again.",
            "Workload {{ $labels.workload }} has been down for {{ $value | humanizeDuration }}: a process failed or "
            "vanished, or its pod went with its sidecar, and none has started since.",
            DashboardUID.ONCALL,
            # A restarted Prometheus evaluates its rules before its first scrapes: a moment when nothing is served.
            for_="2m",
            runbook="Is the job being rescheduled (pending pods, quota, a preempted slice), or did it give up? Every "
            "minute down is badput (downtime). Down means: its sidecar says so (a process failed or vanished, none "
            "started since), or no sidecar has served a worker of it for 5 minutes while its run had not ended "
            "cleanly (its pod went, sidecar and all, or its sidecar expired it). A sidecar that Prometheus cannot "
            "scrape (`up == 0`: a NetworkPolicy, an overloaded Prometheus) is not a worker down: "
            f"{AlertName.EXPORTER_DOWN} says that. Where kube-state-metrics is scraped (with its default resources; "
            "deploy/prometheus/prometheus.yml), Kubernetes says more: a workload whose pods' controller is gone (a "
            "JobSet or Job deleted, a Deployment or StatefulSet scaled to zero) ended on purpose and is not down; a "
            "Job's workload whose Job still wants its pods is down until they run again, however long they stay "
            "Pending; a pod that kube-state-metrics says is not ready (its node dead) is down though its target is "
            "still listed. A Job that failed for good (its backoff limit, its JobSet's restarts spent) is still "
            "wanted: it pages until someone deletes it. A Job a queue suspended (Kueue, `kube_job_status_suspended`) "
            "is not: its workload waits in the queue on purpose, and is not down. A Job is known by "
            "`kube_job_created`, which Google's recipe for kube-state-metrics on GMP keeps too (docs/fleet.md says "
            "what else to keep there). A JobSet deleted and applied again under its name, its workload renamed, has "
            "Jobs of the same names: once the new workload is served, the old one is gone, not down (until then, "
            "its Jobs want pods and none runs: the old name reads down). Through an outage of kube-state-metrics "
            "itself, an outage it vouched for is remembered for up to an hour: no all-clear, and no second page "
            "when it returns. Pods of a kind "
            "kube-state-metrics does not describe (a Kubeflow JAXJob, a RayCluster) are inferred as without it. "
            "Without kube-state-metrics, Prometheus infers: a worker not seen for an hour (the sidecar's "
            "--workload-expiry, the rules' memory) is forgotten, and its outage with it, so a job deleted while down "
            "pages for up to that hour, and one whose pods stay Pending longer stops paging. A replica removed by a "
            "scale-down that did not end cleanly reads down for that hour, with or without it.",
        ),
        Alert(
            AlertName.WORKLOAD_FAILED,
            "warning",
            # One alert per reason, each worker's failures of the job's own counted once (the most any worker saw).
            f"max by ({WORKLOAD}, reason) ({FAILURES_HOUR}{{{NOT_THE_PLATFORM}}}) > 0"
            f' or label_replace(max by ({WORKLOAD}) ({vanished_on_its_own()}) > 0, "reason", "{VANISHED}", "", "")',
            "A workload failed.",
            "Workload {{ $labels.workload }} failed in the last hour, reason {{ $labels.reason }} (failures: "
            "{{ $value }}). What to do: " + reason_runbook(config, FAILURE_REASON_ANCHOR),
            DashboardUID.ONCALL,
            # The preempted host's verdict waits on its metadata server (seconds); its peers' `vanished` does not.
            "1m",
            runbook="The job classified its failure: one alert per `reason`, each one of the [Failure reasons]"
            "(#failure-reasons) below, with what to do for it (the description links it). `vanished` is the "
            "sidecar's word for a process that ended without one and that no metadata server said the platform "
            "ended: a signal, often the kernel's OOM killer's SIGKILL "
            f"({AlertName.HOST_MEMORY_PRESSURE} fires before it, if it can), or a preemption where nothing tells "
            "(docs/failures.md, Preemption and maintenance without a handler in the job). When the platform "
            "preempts one slice of a job, or takes one host for maintenance, the other workers' processes end "
            "without a word too: each such event of the workload in the hour accounts for one `vanished` of each "
            "worker, which makes no ticket. The events are counted per slice (the most any host of the slice was "
            "told of) and summed over the slices: four slices preempted one after another are four events. A worker "
            "whose Job a queue suspended in the hour (Kueue; `kube_job_status_suspended`) vanished for that: no "
            "ticket either. The work since the last checkpoint was lost; read the job's logs for "
            "the failure. A preemption or a host maintenance event is the platform's doing and makes no ticket: "
            f"{AlertName.WORKLOAD_DOWN} pages if the job does not come back.",
        ),
        Alert(
            AlertName.WORKLOAD_CRASH_LOOPING,
            "critical",
            f"max by ({WORKLOAD}) ({own_failures()}) >= {t.crash_loop_failures:g}",
            "A workload fails over and over.",
            "Workload {{ $labels.workload }} failed {{ $value }} times in the last hour, preemptions and host "
            "maintenance not counted.",
            DashboardUID.ONCALL,
            "1m",
            runbook="A crash loop burns chips without progress: stop it, read the first failure's logs. It counts "
            "the job's own failures in the hour, those it named and its processes that vanished on their own, "
            "however the job restarts (a JobSet's new pods, a process restarted in place, before its first "
            "checkpoint or after): not the platform's preemptions and maintenance (each slice's counted once), nor "
            "the peers' processes that ended with them, nor those a queue's suspension of their Job ended "
            f"(`kube_job_status_suspended`). Its {AlertName.WORKLOAD_FAILED} tickets and {AlertName.WORKLOAD_DOWN} "
            "page are inhibited while it fires. A pod deleted under a running job (a redeploy, a drain) ends its "
            "processes without a word: `vanished`, counted; three in an hour page.",
        ),
    ]
