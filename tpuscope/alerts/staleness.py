"""The rules for a backend without staleness markers: Google Cloud Managed Service for Prometheus (GMP).

Prometheus marks a series stale when its target goes or stops exporting it, and from the next evaluation an
instant selector no longer sees it. GMP writes no staleness marker (its exporter drops them:
GoogleCloudPlatform/prometheus-engine ``pkg/export/transform.go``; Google's "PromQL differences" page says staleness
is not supported), neither for scraped series nor for its rule evaluator's own results: an instant selector answers
with a series' last sample for the whole lookback, five minutes, after it ended, and a record that reads another
record adds its own five. tpuscope's rules read "present" as "alive" in many places (a process connected, a
sidecar's target up, a worker served), so on GMP they paged for jobs that had ended: a JobSet deleted while it ran,
a hung job killed, a job that crashed just before its checkpoint turned stale (docs/fleet.md).

So on GMP every instant selector of a series is read through ``last_over_time(selector[window])``: a series not
written for a window counts as gone, the nearest a backend without staleness gets to Prometheus. The window is a few
of the series' own intervals: the scrape's for what the sidecars serve, the rule evaluation's for records, more for
kube-state-metrics. Range selectors (``rate(x[5m])``, ``last_over_time(x[1h])``) and ``offset`` reads stay as they
are: staleness never changed them. On a backend with staleness the rewrite would only delay an ending by up to a
window, so the other rule files keep the plain selectors.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tpuscope import durations
from tpuscope.catalog import PREFIX

_NAME = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
_OFFSET = re.compile(r"offset\b")


@dataclass(frozen=True)
class Windows:
    """How long a series may go unwritten and still be read as there: a few of its own intervals."""

    scraped: str  # the sidecars' series and their targets' up
    recorded: str  # the records of the rules themselves
    kube_state_metrics: str

    def of(self, name: str) -> str | None:
        """The window for a metric name; None for what is not a series' name (a label, a function, a keyword)."""
        if ":" in name:  # level:metric:operations, as every record of ours is named
            return self.recorded
        if name == "up" or name.startswith(PREFIX):
            return self.scraped
        if name.startswith("kube_"):
            return self.kube_state_metrics
        return None


def rule_groups(groups: list[dict[str, Any]], windows: Windows) -> list[dict[str, Any]]:
    """``groups`` with every rule's expression read as :func:`fresh` reads it. A record of a group with an interval
    of its own is read over two of its intervals: it is written no more often."""
    own = {
        rule["record"]: durations.prometheus(2 * durations.prometheus_ms(group["interval"]))
        for group in groups
        if "interval" in group
        for rule in group["rules"]
        if "record" in rule
    }
    rewritten = copy.deepcopy(groups)
    for group in rewritten:
        for rule in group["rules"]:
            rule["expr"] = fresh(rule["expr"], lambda name: own.get(name) or windows.of(name))
    return rewritten


def fresh(expr: str, window_of: Callable[[str], str | None]) -> str:
    """``expr`` with each instant selector of a series ``window_of`` gives a window read through ``last_over_time``
    over that window. A name followed by ``(`` is a function, by ``[`` a range, by ``offset`` a read of the past;
    label matchers and strings are copied as they are."""
    out: list[str] = []
    i = 0
    while i < len(expr):
        char = expr[i]
        if char in "\"'`":
            end = _closing_quote(expr, i)
            out.append(expr[i:end])
            i = end
            continue
        if char == "{":
            end = _closing_brace(expr, i)
            out.append(expr[i:end])
            i = end
            continue
        starts_name = i == 0 or not (expr[i - 1].isalnum() or expr[i - 1] in "_:.")
        match = _NAME.match(expr, i) if starts_name else None
        if match is None:
            out.append(char)
            i += 1
            continue
        end = match.end()
        if end < len(expr) and expr[end] == "{":
            end = _closing_brace(expr, end)
        after = expr[end:].lstrip()
        window = window_of(match.group())
        if window is None or after.startswith(("(", "[")) or _OFFSET.match(after):
            out.append(expr[i:end])
        else:
            out.append(f"last_over_time({expr[i:end]}[{window}])")
        i = end
    return "".join(out)


def _closing_quote(expr: str, start: int) -> int:
    """The index after the string literal that opens at ``start`` (backslash escapes, but for a raw backquote)."""
    quote, i = expr[start], start + 1
    while i < len(expr) and expr[i] != quote:
        i += 2 if expr[i] == "\\" and quote != "`" else 1
    return i + 1


def _closing_brace(expr: str, start: int) -> int:
    """The index after the label matchers that open at ``start``, strings inside them skipped."""
    i = start + 1
    while i < len(expr) and expr[i] != "}":
        i = _closing_quote(expr, i) if expr[i] in "\"'`" else i + 1
    return i + 1
