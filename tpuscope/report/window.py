"""The time window a report covers: ``--since`` and ``--until`` as the command line gives them."""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime

from tpuscope import durations

# About this many points across a chart: enough for a 6-hour post-mortem at a minute and a bit a point.
POINTS = 300
DEFAULT_SINCE = 6 * 3600.0  # a night's shift: what a report covers when nothing says otherwise


def parse_time(value: str) -> float:
    """Unix seconds from ``1700000000`` or an RFC 3339 time (``2026-11-23T03:10:00Z``; no zone: UTC)."""
    try:
        return float(value)
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"expected Unix seconds or RFC 3339 time like 2026-11-23T03:10:00Z, got {value!r}") from None
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()


def utc(moment: float) -> str:
    return datetime.fromtimestamp(moment, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


@dataclass(frozen=True)
class Window:
    """``since`` seconds up to ``until``; either may be left to the source (None)."""

    since: float | None = None
    until: float | None = None

    @classmethod
    def parse(cls, since: str | None, until: str | None) -> Window:
        seconds = durations.parse(since) if since else None
        if seconds is not None and seconds <= 0:
            raise ValueError(f"--since must be longer than 0, got {since!r}")
        return cls(seconds, parse_time(until) if until else None)

    def resolve(self, first: float | None = None, last: float | None = None) -> tuple[float, float, float]:
        """Start, end and the seconds a chart's point stands for. What the window leaves open comes from the
        data (``first``/``last``, a recording's span), else ends now and reaches back :data:`DEFAULT_SINCE`."""
        end = self.until if self.until is not None else last if last is not None else time.time()
        if self.since is not None:
            start = end - self.since
        elif first is not None and first < end:
            start = first
        else:
            start = end - DEFAULT_SINCE
        return start, end, max(1.0, (end - start) / POINTS)

    @staticmethod
    def describe(start: float, end: float) -> str:
        return f"{utc(start)} and {utc(end)}"
