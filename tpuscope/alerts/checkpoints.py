"""Alerts on checkpoints: saves failing, none recent or none at all, too much wall time spent saving."""

from __future__ import annotations

from tpuscope import catalog as c
from tpuscope import durations
from tpuscope.alerts.rules import Alert, new_or_increase, running
from tpuscope.conventions import CHECKPOINT_LAST, AlertName, DashboardUID
from tpuscope.generator_config import GeneratorConfig
from tpuscope.promql import WORKLOAD, series

SAVE = 'operation="save"'
ERROR = 'result="error"'
CHECKPOINTING = 'category="checkpoint"'
# How long past its threshold a checkpoint's age pages: a save that ends a few minutes late is no incident.
STALE_FOR = "10m"


def alerts(config: GeneratorConfig) -> list[Alert]:
    t = config.thresholds
    age = durations.human(t.checkpoint_age_seconds)
    return [
        Alert(
            AlertName.CHECKPOINT_FAILING,
            "warning",
            f"{new_or_increase(c.CHECKPOINT_DURATION, '30m', SAVE, ERROR, suffix='count')} > 0",
            "Checkpoint saves fail.",
            "Workload {{ $labels.workload }} failed {{ $value }} checkpoint saves in the last 30 minutes.",
            DashboardUID.JOB,
            runbook="Check the checkpoint storage: quota, permissions, throttling. Work since the last good save is "
            "at risk.",
        ),
        Alert(
            AlertName.CHECKPOINT_STALE,
            "critical",
            f"time() - {CHECKPOINT_LAST} > {t.checkpoint_age_seconds:g} {running()}",
            "A running workload has no recent good checkpoint.",
            "Workload {{ $labels.workload }} last saved a checkpoint {{ $value | humanizeDuration }} ago: that much "
            "work is lost if it fails now.",
            DashboardUID.ONCALL,
            STALE_FOR,
            f"Are saves failing ({AlertName.CHECKPOINT_FAILING}), or was the checkpoint interval set too long? It "
            f"pages once the workload's latest good checkpoint is older than {age} for {STALE_FOR} more, while a "
            f"process of it runs: a job that saves every {age} and takes a few minutes to, pages not. The latest "
            "checkpoint "
            "is the workload's, remembered through its restarts (a restarted job's new pods have saved nothing yet): "
            "a job that restarts and then never saves again pages as if it had not restarted.",
        ),
        Alert(
            AlertName.CHECKPOINT_MISSING,
            "warning",
            f"max by ({WORKLOAD}) ({series(c.STEPS)}) > 0 unless on ({WORKLOAD}) {CHECKPOINT_LAST} {running()}",
            "A training workload has never saved a checkpoint.",
            "Workload {{ $labels.workload }} has been stepping for "
            f"{t.checkpoint_age_seconds / 3600:g} h without a good checkpoint: a failure loses all of it.",
            DashboardUID.ONCALL,
            f"{int(t.checkpoint_age_seconds)}s",
            f"Turn checkpointing on, or find out why every save fails ({AlertName.CHECKPOINT_FAILING}).",
        ),
        Alert(
            AlertName.CHECKPOINT_TIME_HIGH,
            "warning",
            f"sum by ({WORKLOAD}) (rate({series(c.GOODPUT, CHECKPOINTING)}[1h]))"
            f" / sum by ({WORKLOAD}) (rate({series(c.GOODPUT_WALL)}[1h])) > {t.checkpoint_share:g}",
            "Checkpointing takes a large share of wall time.",
            "Workload {{ $labels.workload }} spends {{ $value | humanizePercentage }} of its wall time checkpointing.",
            DashboardUID.JOB,
            "30m",
            "Checkpoint less often, save asynchronously (only the part that holds the loop counts), write only what "
            "a restart needs.",
        ),
    ]
