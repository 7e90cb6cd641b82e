"""What Grafana does to a board's queries before Prometheus sees them: the values its variables open with, escaped
as its Prometheus datasource escapes them, and the template and interval variables replaced.

The fleet-scale harness times the boards' queries as Grafana sends them, and the dashboard tests run them so:
both through this, so that what one measures is what the other checks."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

# What a variable query lists: Prometheus' label values of ``label`` on the series ``match`` selects.
ListValues = Callable[[str, str], list[str]]
EVERYTHING = ".*"  # what a variable sends for All when nothing tells it more


def regex_escape(value: str) -> str:
    """How Grafana's Prometheus datasource escapes a variable's value inside a regex matcher."""
    return re.sub(r"([\\^$*+?.()|{}\[\]])", r"\\\\\1", value)


def substitute(
    expr: str, values: dict[str, str], range_seconds: int, interval_seconds: int, rate_interval_seconds: int
) -> str:
    """The query as it leaves Grafana: each variable's value, then the interval variables (the longer names first:
    ``$__range_s`` is not ``$__range`` followed by ``_s``, nor ``$slice_x`` ``$slice``)."""
    for name, value in sorted(values.items(), key=lambda item: -len(item[0])):
        expr = expr.replace(f"${{{name}}}", value).replace(f"${name}", value)
    return (
        expr.replace("$__rate_interval", f"{rate_interval_seconds}s")
        .replace("$__interval_ms", f"{interval_seconds * 1000}")
        .replace("$__interval", f"{interval_seconds}s")
        .replace("$__range_s", f"{range_seconds}")
        .replace("$__range", f"{range_seconds}s")
    )


@dataclass
class Variables:
    """A board's variables as it opens: what each sends (``sent``), and what each query variable listed."""

    sent: dict[str, str] = field(default_factory=dict)
    listed: dict[str, list[str]] = field(default_factory=dict)


def variables(board: dict[str, Any], list_values: ListValues | None = None) -> Variables:
    """Each variable as Grafana sends it for a board opened with its defaults: All where it offers All (its custom
    all value, else the values it lists joined, as Grafana expands All without one); the first value it lists where
    it offers one at a time; a custom, constant or text variable at its current value. A variable's query reads the
    values of those before it. Without ``list_values`` nothing is listed, and All is the custom all value or
    everything."""
    found = Variables()
    for variable in board["templating"]["list"]:
        name, kind = variable["name"], variable["type"]
        if kind == "query":
            listed: list[str] = []
            if list_values is not None:
                match, label = re.fullmatch(r"label_values\((.*), (\w+)\)", variable["query"]).groups()  # type: ignore[union-attr]
                listed = found.listed[name] = sorted(list_values(label, substitute(match, found.sent, 3600, 60, 60)))
            escaped = [regex_escape(value) for value in listed]
            if not variable.get("includeAll", True):
                found.sent[name] = escaped[0] if escaped else EVERYTHING
            elif variable.get("allValue") or not escaped:
                found.sent[name] = variable.get("allValue") or EVERYTHING
            else:
                found.sent[name] = f"({'|'.join(escaped)})"
        elif kind in ("textbox", "constant", "custom"):  # its current value, else its default
            found.sent[name] = str((variable.get("current") or {}).get("value") or variable["query"])
    return found


def queries(board: dict[str, Any]) -> Iterator[tuple[str, str, bool]]:
    """(panel title and ref, expression, instant) of every panel's every target, rows' panels included."""

    def panels(items: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        for panel in items:
            yield panel
            yield from panels(panel.get("panels", []))

    for panel in panels(board["panels"]):
        for target in panel.get("targets", []):
            if target.get("expr"):
                yield f"{panel['title']} ({target.get('refId', '')})", target["expr"], bool(target.get("instant"))
