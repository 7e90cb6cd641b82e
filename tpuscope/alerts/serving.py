"""Alerts on serving: the inference latency SLO's error budget burning."""

from __future__ import annotations

from tpuscope import catalog as c
from tpuscope.alerts.rules import Alert, burn_rate_alerts
from tpuscope.conventions import REQUESTS_RATE, SLOW_REQUESTS_RATIO, AlertName, DashboardUID
from tpuscope.generator_config import GeneratorConfig
from tpuscope.promql import series


def alerts(config: GeneratorConfig) -> list[Alert]:
    return burn_rate_alerts(
        AlertName.INFERENCE_LATENCY_BUDGET_BURN,
        SLOW_REQUESTS_RATIO,
        1 - config.thresholds.inference_latency_objective,
        "A serving workload is burning its latency error budget.",
        "latency",
        DashboardUID.SERVING,
        "Add replicas or shorten the batching window; check for slow batches.",
        existed=series(c.INFERENCE_REQUEST_DURATION, suffix="count"),
        volume=(REQUESTS_RATE, config.thresholds.inference_min_requests),
    )
