"""The alerting rules ``tpuscope fleet-sim`` loads: the generated ones, with time compressed K times.

The committed rules read 5-minute rate windows and wait ``for: 10m`` before a
straggler is named; a simulation that a test runs cannot wait that long. So the
expressions are exactly those ``tpuscope.alerts.rules_file`` generates and only
their durations change: every range selector (``[5m]``, a subquery's
``[1h:5m]``), every ``offset`` and every ``for:`` is divided by K.
Recording-rule names stay as they are (``workload:tpuscope_steps:rate5m``
records a 30 s rate at K=10), so every query written against the real rules
reads the compressed ones.

Thresholds that are lengths of time (:data:`TIMED_THRESHOLDS`) are divided
likewise, through :class:`~tpuscope.generator_config.GeneratorConfig`. Those that
are counts are not: 3 recompiles in a 30-minute window stay 3 in its compressed
window, and StepTimeRegression's baseline of 180 evaluations stays 180.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

import yaml

from tpuscope import durations
from tpuscope.alerts import rule_groups
from tpuscope.alerts.rule_file import HEADER
from tpuscope.generator_config import GeneratorConfig

# A range selector or a subquery: [5m], [1h:5m], [1h:].
_RANGE = re.compile(rf"\[\s*({durations.PROMETHEUS})\s*(?::\s*({durations.PROMETHEUS})?\s*)?\]")
_OFFSET = re.compile(rf"\boffset(\s+)(-?)({durations.PROMETHEUS})\b")
# A window in seconds measured back from now ("started in the last hour": time() - 3600).
_AGO = re.compile(r"\btime\(\) - (\d+(?:\.\d+)?)\b")
# Thresholds that are lengths of time: a stall of 600 s becomes one of 60 s at K=10. compile_seconds_per_hour
# is seconds of compiling in a window of an hour: the window shrinks, so does what fits in it.
TIMED_THRESHOLDS = (
    "stall_seconds",
    "hang_seconds",
    "checkpoint_age_seconds",
    "compile_seconds_per_hour",
    "downtime_seconds",
    "model_age_seconds",
)


def scale_duration(text: str, k: float) -> str:
    """``text`` divided by ``k``, to the millisecond (Prometheus' resolution)."""
    ms = round(durations.prometheus_ms(text) / k)
    if ms < 1:
        raise ValueError(f"{text} divided by {k:g} is under a millisecond")
    return durations.prometheus(ms)


def scale_expr(expr: str, k: float) -> str:
    """Every range, subquery resolution, offset and ``time() - seconds`` of a PromQL expression divided by
    ``k``; nothing else."""

    def scaled_range(match: re.Match[str]) -> str:
        window, resolution = match[1], match[2]
        if ":" not in match[0]:
            return f"[{scale_duration(window, k)}]"
        return f"[{scale_duration(window, k)}:{scale_duration(resolution, k) if resolution else ''}]"

    expr = _RANGE.sub(scaled_range, expr)
    expr = _AGO.sub(lambda m: f"time() - {float(m[1]) / k:g}", expr)
    return _OFFSET.sub(lambda m: f"offset{m[1]}{m[2]}{scale_duration(m[3], k)}", expr)


def scaled_config(config: GeneratorConfig, k: float) -> GeneratorConfig:
    """``config`` with its :data:`TIMED_THRESHOLDS` divided by ``k``."""
    t = config.thresholds
    return replace(config, thresholds=replace(t, **{name: getattr(t, name) / k for name in TIMED_THRESHOLDS}))


def scaled_groups(config: GeneratorConfig, k: float) -> list[dict[str, Any]]:
    """The rule groups of ``rules_file(config)`` (``rule_groups``), time compressed ``k`` times.

    Expressions come from the rules generated with the scaled thresholds, durations divided, and a group's own
    interval too. A ``for:``
    comes from the rules generated with ``config``'s own, then divided: CheckpointMissing waits as long
    as ``checkpoint_age_seconds``, which would otherwise be divided twice.
    """
    plain = rule_groups(config)
    timed = rule_groups(scaled_config(config, k))
    for plain_group, group in zip(plain, timed, strict=True):
        if "interval" in group:  # a group of its own pace (the slow SLO windows) keeps it, compressed
            group["interval"] = scale_duration(group["interval"], k)
        for plain_rule, rule in zip(plain_group["rules"], group["rules"], strict=True):
            rule["expr"] = scale_expr(rule["expr"], k)
            if "for" in plain_rule:
                rule["for"] = scale_duration(plain_rule["for"], k)
    return timed


def scaled_rules_file(config: GeneratorConfig, k: float) -> str:
    note = f"# Time compressed {k:g} times for tpuscope fleet-sim: every range, offset and for: divided by {k:g}.\n"
    return HEADER + note + yaml.safe_dump({"groups": scaled_groups(config, k)}, sort_keys=False, width=120)


def ranges_ms(groups: list[dict[str, Any]]) -> list[int]:
    """The length of every range selector in ``groups``' expressions (to hold against the scrape interval)."""
    return [
        durations.prometheus_ms(m[1])
        for group in groups
        for rule in group["rules"]
        for m in _RANGE.finditer(rule["expr"])
    ]
