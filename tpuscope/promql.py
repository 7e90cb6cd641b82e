"""PromQL pieces the dashboards and the alert rules both build on.

The dashboards add Grafana's template variables to their selectors
(:mod:`tpuscope.dashboards.promql`); the rules do not. What a query *means* is
written once, here.
"""

from __future__ import annotations

import re

from tpuscope.catalog import Metric

# Prometheus' duration syntax: one or more number-unit pairs, largest unit first ("1h30m", "30s", "1500ms").
DURATION = r"(?:\d+(?:ms|[ywdhms]))+"
_PART = re.compile(r"(\d+)(ms|[ywdhms])")
_UNITS_MS = {"y": 365 * 86_400_000, "w": 7 * 86_400_000, "d": 86_400_000, "h": 3_600_000, "m": 60_000, "s": 1000}


def series(metric: Metric, *matchers: str, suffix: str = "") -> str:
    """``name{matchers}``: a catalogue metric (a histogram's ``_bucket``/``_sum``/``_count`` by ``suffix``)."""
    name = metric.series(suffix) if suffix else metric.name
    return f"{name}{{{', '.join(matchers)}}}" if matchers else name


def grown(selector: str, window: str) -> str:
    """How much the counters ``selector`` picks grew in ``window``, a series' first event included.

    A labelled counter comes into being at its first event, already at 1, and ``increase()`` never
    counts a series' first sample: the first failure of a kind would read 0. A series that did not
    exist ``window`` ago counts in full (it started from 0); one that went down (the sidecar restarted)
    counts what it has since.
    """
    return f"(({selector} - {selector} offset {window}) >= 0 or {selector})"


def le(bound: float) -> str:
    """A bucket bound as the ``le`` label reads (0.5 -> "0.5", 1 -> "1.0"), for matching one bucket."""
    return repr(float(bound))


def duration_ms(text: str) -> int:
    """``"1h30m"`` -> 5400000."""
    if not re.fullmatch(DURATION, text):
        raise ValueError(f"not a Prometheus duration: {text!r}")
    return sum(int(number) * (1 if unit == "ms" else _UNITS_MS[unit]) for number, unit in _PART.findall(text))


def format_ms(ms: int) -> str:
    """The largest unit that says ``ms`` exactly: 30000 -> ``30s``, 12960000 -> ``216m``, 1500 -> ``1500ms``."""
    for unit in ("d", "h", "m", "s"):
        if ms % _UNITS_MS[unit] == 0:
            return f"{ms // _UNITS_MS[unit]}{unit}"
    return f"{ms}ms"
