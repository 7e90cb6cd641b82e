"""Alerts on serving: the inference latency SLO's error budget burning, a model served long after it was loaded."""

from __future__ import annotations

from tpuscope import catalog as c
from tpuscope.alerts.rules import Alert, burn_rate_alerts
from tpuscope.conventions import REQUESTS_RATE, SLOW_REQUESTS_RATIO, AlertName, DashboardUID
from tpuscope.generator_config import GeneratorConfig
from tpuscope.promql import WORKLOAD, series


def alerts(config: GeneratorConfig) -> list[Alert]:
    t = config.thresholds
    return [
        *burn_rate_alerts(
            AlertName.INFERENCE_LATENCY_BUDGET_BURN,
            SLOW_REQUESTS_RATIO,
            1 - t.inference_latency_objective,
            "A serving workload is burning its latency error budget.",
            "latency",
            DashboardUID.SERVING,
            "Add replicas or shorten the batching window; check for slow batches.",
            existed=series(c.INFERENCE_REQUEST_DURATION, suffix="count"),
            volume=(REQUESTS_RATE, t.inference_min_requests),
        ),
        Alert(
            AlertName.MODEL_STALE,
            "warning",
            # Per version (a replica that missed a roll-out still serves the old one), the oldest load of the
            # replicas serving it now: one replica rescheduled, loading the same old model again, is no newer model.
            f"time() - min by ({WORKLOAD}, version) ({series(c.MODEL_LOADED)}"
            f" and on (job, instance, workload) {series(c.WORKLOAD_PROCESSES)} > 0) > {t.model_age_seconds:g}",
            "A serving workload serves an old model.",
            "Workload {{ $labels.workload }} serves model version {{ $labels.version }}, loaded "
            "{{ $value | humanizeDuration }} ago (stale from "
            f"{t.model_age_seconds / 86400:g} days).",
            DashboardUID.SERVING,
            "1h",
            "A replica of the workload serves a model loaded longer ago than model_age_seconds: the pipeline "
            "that trains, evaluates and publishes models has stopped, or the roll-out that loads them did not "
            "reach these replicas (one alert per version still served). Check the latest published version and "
            "the deployment's roll-out; a model meant to be served this long wants a larger model_age_seconds. "
            "Its age counts from the oldest load among the replicas serving it now, as each serving process "
            f"reports it ({c.MODEL_LOADED.name}): a replica rescheduled yesterday that loaded the same version "
            "again does not make it young.",
        ),
    ]
