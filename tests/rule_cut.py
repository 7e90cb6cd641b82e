"""A rule file cut to what one alert needs, for promtool: it evaluates every rule of its file at every step."""

from __future__ import annotations

import re
from typing import Any

NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")  # a metric name, a recorded series' among them, in an expression


def reads(rule: dict[str, Any]) -> list[str]:
    """The names in a rule's expression and in its annotations' templates (a description may query a record)."""
    return NAME.findall(" ".join([rule["expr"], *rule.get("annotations", {}).values()]))


def rules_behind(alert: str, groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The groups of ``groups`` cut to the rules of ``alert`` and the recording rules its expressions read, directly
    or through other records, in their groups and order. A rule reads another only by the series it records, so the
    alert evaluates as in the whole file; promtool evaluates every rule of its file at every step, and the whole file
    for each of the 125 cases was most of this file's time (115 s of a loaded fresh-clone run)."""
    recorders = {rule["record"]: rule for group in groups for rule in group["rules"] if "record" in rule}
    wanted = [rule for group in groups for rule in group["rules"] if rule.get("alert") == alert]
    assert wanted, f"no rule alerts {alert}"
    kept: dict[int, dict[str, Any]] = {}
    while wanted:
        rule = wanted.pop()
        if id(rule) not in kept:
            kept[id(rule)] = rule
            wanted += [recorders[name] for name in reads(rule) if name in recorders]
    cut = [{**group, "rules": [rule for rule in group["rules"] if id(rule) in kept]} for group in groups]
    return [group for group in cut if group["rules"]]
