"""Serving: batched inference's latency against its objective, its queue and its batches, its model's age."""

from __future__ import annotations

from typing import Any

from tpuscope import catalog as c
from tpuscope.conventions import REQUESTS_FAST_RATE, REQUESTS_RATE, SLO_PERIOD, AlertName, DashboardUID
from tpuscope.dashboards import panels as p
from tpuscope.dashboards import queries as q
from tpuscope.promql import le
from tpuscope.thresholds import Thresholds

TITLE = "tpuscope / Serving"
DESCRIPTION = (
    "Batched inference: request latency against its objective, request rate, queue depth, batch size, model age."
)


def good_ratio(t: Thresholds, window: str) -> str:
    """Share of requests answered within the latency objective's bound (a bucket of the request histogram)."""
    fast_enough = q.eq("le", le(t.inference_latency_seconds))
    good = f"sum ({q.rate(c.INFERENCE_REQUEST_DURATION, fast_enough, suffix='bucket', window=window)})"
    return f"{good} / sum ({q.rate(c.INFERENCE_REQUEST_DURATION, suffix='count', window=window)})"


def latency(t: Thresholds) -> p.Section:
    budget = 1 - t.inference_latency_objective
    # Over the SLO's period, from the recorded rates, as the burn-rate alerts' long windows read them.
    period_good = f"{q.slo_period_sum(REQUESTS_FAST_RATE)} / {q.slo_period_sum(REQUESTS_RATE)}"
    return p.Section(
        "Latency",
        [
            p.timeseries_panel(
                "Request latency p50 / p95 / p99",
                f"Time from a request's arrival to its answer, per workload. The objective: "
                f"{t.inference_latency_objective:.0%} of requests within {t.inference_latency_seconds:g} s "
                "(the dashed line). A p99 that rises with the queue depth is too little capacity; one that "
                "rises alone is slow batches (see Batch size).",
                "s",
                *[
                    p.query(
                        q.quantile(quantile, c.INFERENCE_REQUEST_DURATION, by="workload"),
                        f"p{quantile * 100:g} {{{{workload}}}}",
                    )
                    for quantile in (0.5, 0.95, 0.99)
                ],
                limits=p.high_is_bad(t.inference_latency_seconds),
                span=12,
            ),
            p.stat_panel(
                "Requests within the objective",
                f"Share of requests answered within {t.inference_latency_seconds:g} s over the range, against "
                f"the {t.inference_latency_objective:.0%} objective.",
                "percentunit",
                p.query(good_ratio(t, q.RANGE)),
                limits=p.low_is_bad(t.inference_latency_objective),
                span=6,
                height=8,
            ),
            p.stat_panel(
                "Latency error budget left",
                f"The share of the error budget ({budget:.1%} of requests may be slow) left over the last "
                f"{SLO_PERIOD} (the SLO's period, whatever the dashboard's range: the burn-rate alerts assume "
                "it); below zero the objective is missed. When it runs low, freeze risky changes and add "
                "capacity. Read from the recording rules' 5-minute rates.",
                "percentunit",
                p.query(f"1 - (1 - {period_good}) / {budget:g}", instant=True),
                limits=p.low_is_bad(0, 0.25),
                span=6,
                height=8,
            ),
        ],
    )


def load() -> p.Section:
    return p.Section(
        "Load and batching",
        [
            p.timeseries_panel(
                "Requests per second",
                "Requests answered per second, per workload.",
                "reqps",
                p.query(f"sum by (workload) ({q.rate(c.INFERENCE_REQUEST_DURATION, suffix='count')})", "{{workload}}"),
                span=8,
            ),
            p.timeseries_panel(
                "Queue depth",
                "Requests waiting for a batch slot, per workload. A queue that grows and does not drain is "
                "demand above capacity: scale out before latency follows.",
                "short",
                p.query(f"max by (workload) ({q.selector(c.INFERENCE_QUEUE_DEPTH)})", "{{workload}}"),
                span=8,
            ),
            p.timeseries_panel(
                "Batch size p50 / p95",
                "Requests per executed batch. Batches far below the configured maximum under load mean the "
                "batching window is too short; always full batches with a growing queue mean too few replicas.",
                "short",
                *[
                    p.query(
                        q.quantile(quantile, c.INFERENCE_BATCH_SIZE, by="workload"),
                        f"p{quantile * 100:g} {{{{workload}}}}",
                    )
                    for quantile in (0.5, 0.95)
                ],
                span=8,
            ),
        ],
    )


def model(t: Thresholds) -> p.Section:
    return p.Section(
        "Model",
        [
            p.bar_gauge_panel(
                "Model age, by workload and version",
                "Time since each serving workload loaded the model version it serves (as its serving process "
                f"reports the load). Over {t.model_age_seconds / 86400:g} days {AlertName.MODEL_STALE} fires: the "
                "pipeline that publishes new models, or the roll-out that loads them, has stopped. Two versions of "
                "one workload: a roll-out under way, or replicas it missed.",
                "s",
                p.query(q.age(c.MODEL_LOADED, by="workload, version"), "{{workload}} {{version}}", instant=True),
                limits=p.high_is_bad(t.model_age_seconds, t.model_age_seconds / 2),
                span=24,
            ),
        ],
    )


def dashboard(t: Thresholds) -> dict[str, Any]:
    sections = [latency(t), load(), model(t)]
    return p.build(DashboardUID.SERVING, TITLE, DESCRIPTION, sections, p.variables(c.INFERENCE_QUEUE_DEPTH))
