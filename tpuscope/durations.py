"""Lengths of time as people and Prometheus write them: one parser and the formatters, for every part.

A flag (``--workload-expiry 15m``, ``report --since 6h``), a rule's window (``5m``, ``1h30m``), a
target's scrape interval and a reader's figure all go through here, so ``90s`` means the same
everywhere and a window is written back in the form Prometheus reads.
"""

from __future__ import annotations

import math
import re

# Prometheus' duration syntax: one or more number-unit pairs, largest unit first ("1h30m", "30s", "1500ms").
PROMETHEUS = r"(?:\d+(?:ms|[ywdhms]))+"
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|[ywdhms])")
_FLEXIBLE = re.compile(r"(?:\d+(?:\.\d+)?(?:ms|[ywdhms]))+")
_MS = {"y": 365 * 86_400_000, "w": 7 * 86_400_000, "d": 86_400_000, "h": 3_600_000, "m": 60_000, "s": 1000, "ms": 1}


def parse(text: str) -> float:
    """Seconds from a bare number of seconds (``90``, ``2.5``) or a duration (``90s``, ``15m``, ``1h30m``, ``1.5h``).

    A ValueError names what was expected.
    """
    value = text.strip().lower()
    try:
        return float(value)
    except ValueError:
        pass
    if not _FLEXIBLE.fullmatch(value):
        raise ValueError(f"expected seconds or a duration such as 90s, 15m, 1h30m, got {text!r}")
    return sum(float(number) * _MS[unit] for number, unit in _PART.findall(value)) / 1000


def prometheus_ms(text: str) -> int:
    """Milliseconds from Prometheus' own syntax alone (whole numbers, no bare seconds): ``"1h30m"`` -> 5400000."""
    if not re.fullmatch(PROMETHEUS, text):
        raise ValueError(f"not a Prometheus duration: {text!r}")
    return sum(int(number) * _MS[unit] for number, unit in _PART.findall(text))


def prometheus(ms: int) -> str:
    """Prometheus' syntax in the largest unit that says ``ms`` exactly: 30000 -> ``30s``, 1500 -> ``1500ms``."""
    for unit in ("d", "h", "m", "s"):
        if ms % _MS[unit] == 0:
            return f"{ms // _MS[unit]}{unit}"
    return f"{ms}ms"


def prometheus_seconds(seconds: float) -> str:
    """``seconds`` in Prometheus' syntax, to the millisecond: 600 -> ``10m``, 1.5 -> ``1500ms``."""
    return prometheus(round(seconds * 1000))


def human(seconds: float) -> str:
    """For a reader's eye, about three figures: ``38 ms``, ``4.2 s``, ``17 min``, ``3.5 h``; ``never`` for no time."""
    if math.isnan(seconds) or math.isinf(seconds):
        return "never"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
