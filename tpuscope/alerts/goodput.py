"""Alerts on training time lost: the goodput SLO's error budget burning, a workload down, failing, crash looping."""

from __future__ import annotations

from tpuscope import catalog as c
from tpuscope.alerts.rules import FAILURE_REASON_ANCHOR, Alert, burn_rate_alerts, new_or_increase, reason_runbook
from tpuscope.conventions import BADPUT_RATIO, DOWN_SINCE, AlertName, DashboardUID
from tpuscope.failures import PLATFORM_REASONS
from tpuscope.generator_config import GeneratorConfig
from tpuscope.promql import series

PLANNED = 'reason!="preemption"'  # a preemption is the platform's doing, not a crash
NOT_THE_PLATFORM = f'reason!~"{"|".join(PLATFORM_REASONS)}"'  # failures the job is to answer for


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
            "Find the largest badput category (Fleet overview) and fix it: restarts and lost work first.",
            existed=series(c.STEPS),
        ),
        Alert(
            AlertName.WORKLOAD_DOWN,
            "critical",
            f"time() - min by (workload) ({DOWN_SINCE}) > {t.downtime_seconds:g}",
            "A workload is down and has not started again.",
            "Workload {{ $labels.workload }} has been down for {{ $value | humanizeDuration }}: a process failed or "
            "vanished, or its pod went with its sidecar, and none has started since.",
            DashboardUID.ONCALL,
            runbook="Is the job being rescheduled (pending pods, quota, a preempted slice), or did it give up? Every "
            "minute down is badput (downtime). A workload that never comes back is forgotten, and its outage with "
            "it: by its sidecar an hour after its last process left (--workload-expiry), by Prometheus an hour "
            "after its last series.",
        ),
        Alert(
            AlertName.WORKLOAD_FAILED,
            "warning",
            f"{new_or_increase(c.WORKLOAD_FAILURES, '1h', NOT_THE_PLATFORM, by='workload, reason')} > 0",
            "A workload failed.",
            "Workload {{ $labels.workload }} failed in the last hour, reason {{ $labels.reason }} (failures: "
            "{{ $value }}). What to do: " + reason_runbook(config, FAILURE_REASON_ANCHOR),
            DashboardUID.ONCALL,
            runbook="The job classified its failure: one alert per `reason`, each one of the [Failure reasons]"
            "(#failure-reasons) below, with what to do for it (the description links it). `vanished` is the "
            "sidecar's word for a process that ended without one and that no metadata server said the platform "
            "ended: a signal, often the kernel's OOM killer's SIGKILL "
            f"({AlertName.HOST_MEMORY_PRESSURE} fires before it, if it can), or a preemption where nothing tells "
            "(docs/failures.md, Preemption and maintenance without a handler in the job). The work since the last "
            "checkpoint "
            "was lost; read the job's logs for the failure. A preemption or a host maintenance event is the "
            f"platform's doing and makes no ticket: {AlertName.WORKLOAD_DOWN} pages if the job does not come back.",
        ),
        Alert(
            AlertName.WORKLOAD_CRASH_LOOPING,
            "critical",
            f"{new_or_increase(c.WORKLOAD_RESTARTS, '1h', PLANNED)} >= {t.crash_loop_restarts:g}",
            "A workload restarts over and over.",
            "Workload {{ $labels.workload }} restarted {{ $value }} times in the last hour, preemptions not counted.",
            DashboardUID.ONCALL,
            runbook="A crash loop burns chips without progress: stop it, read the first failure's logs.",
        ),
    ]
