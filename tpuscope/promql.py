"""PromQL pieces the dashboards and the alert rules both build on.

The dashboards add Grafana's template variables to their selectors
(:mod:`tpuscope.dashboards.promql`); the rules do not. What a query *means* is
written once, here.
"""

from __future__ import annotations

from tpuscope.catalog import Metric


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
