"""The rules files the benchmarks measure: their groups and rules, a copy of one at another pace, the series each
rule's expression reads and how far back; and how Prometheus reports evaluating them.

``bench rule-cost`` and ``bench fleet-scale`` give each series a rule reads history as far back as the farthest rule
reads it (:class:`Reads`), and wait on Prometheus' ``/api/v1/rules`` for the rules' evaluations.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import yaml

from tpuscope import durations
from tpuscope.prometheus_api import PrometheusAPI
from tpuscope.testing.waiting import wait_for

# An instant selector reads back this far (Prometheus' default --query.lookback-delta).
LOOKBACK_SECONDS = 300


@dataclass(frozen=True)
class Rule:
    group: str
    name: str  # the record or alert name
    expr: str
    record: bool


@dataclass(frozen=True)
class RulesFile:
    label: str
    path: Path
    rules: tuple[Rule, ...]

    @property
    def groups(self) -> list[str]:
        return list(dict.fromkeys(rule.group for rule in self.rules))

    @property
    def records(self) -> set[str]:
        return {rule.name for rule in self.rules if rule.record}


def paced(rules: RulesFile, directory: Path, interval: str = "") -> RulesFile:
    """A copy of the file whose groups all evaluate every ``interval`` (by default, at Prometheus' global interval,
    ``--interval``), a group of a slower pace of its own too: one evaluation costs what it costs at any pace, and the
    probe and the timings wait for every group's evaluations."""
    document = yaml.safe_load(rules.path.read_text())
    for group in document["groups"]:
        group.pop("interval", None)
        if interval:
            group["interval"] = interval
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{rules.label}.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return RulesFile(rules.label, path, rules.rules)


def load_rules(spec: str) -> RulesFile:
    """``NAME=FILE`` or ``FILE`` (labelled by its name, without the extension)."""
    label, _, path = spec.rpartition("=")
    rules_path = Path(path)
    document = yaml.safe_load(rules_path.read_text())
    rules = tuple(
        Rule(group["name"], rule.get("record") or rule["alert"], str(rule["expr"]), "record" in rule)
        for group in document["groups"]
        for rule in group["rules"]
    )
    return RulesFile(label or rules_path.stem, rules_path, rules)


# A PromQL token this benchmark cares about, left to right: a string (skipped, so that nothing in a
# label_replace's arguments looks like a selector), a grouping clause (its label names are not series),
# or a name with its matchers, range and offset (a negative one, reading later, is left out), and whether a
# bracket or a grouping follows (then it is a function or an aggregation, not a series).
_TOKEN = re.compile(
    r'"(?:\\.|[^"\\])*"'
    r"|\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)"
    r"|(?<![\w.:])(?P<name>[a-zA-Z_:][\w:]*)\s*(?P<matchers>\{(?:\"(?:\\.|[^\"\\])*\"|[^}\"])*\})?"
    r"\s*(?:\[(?P<range>[^\]:]+)\])?(?:\s*offset\s+(?P<offset>\w+))?(?P<call>(?=\s*(?:\(|(?:by|without)\b)))?"
)
_MATCHER = re.compile(r'(?P<label>\w+)\s*(?P<op>=~|!~|!=|=)\s*"(?P<value>(?:\\.|[^"\\])*)"')
_KEYWORDS = {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring", "group_left", "group_right"}
_KEYWORDS |= {"inf", "nan", "atan2", "start", "end"}
_LITERALS = re.compile(r"[\w.:+-]+(?:\|[\w.:+-]+)*")


@dataclass(frozen=True)
class Read:
    """A series name a rule reads, its matchers' literal values, and how far back it reads."""

    name: str
    values: tuple[tuple[str, str], ...]  # (label, value) for every literal value a matcher names
    reach: float  # seconds before the evaluation: range (or lookback) plus offset


def reads(expr: str) -> Iterator[Read]:
    """The series selectors of ``expr`` (not a subquery's reach: tpuscope's rules have none)."""
    for token in _TOKEN.finditer(expr):
        name = token.group("name")
        if not name or token.group("call") is not None or name.lower() in _KEYWORDS:
            continue
        window = durations.parse(token.group("range")) if token.group("range") else LOOKBACK_SECONDS
        offset = durations.parse(token.group("offset")) if token.group("offset") else 0.0
        yield Read(name, tuple(literal_values(token.group("matchers") or "")), window + offset)


def literal_values(matchers: str) -> Iterator[tuple[str, str]]:
    """Every value a matcher names: ``a="x"`` and ``a=~"x|y"`` (and their negations) name x (and y)."""
    for matcher in _MATCHER.finditer(matchers):
        label, op, value = matcher.group("label", "op", "value")
        if op in ("=", "!=") and value:
            yield label, value
        elif op in ("=~", "!~") and _LITERALS.fullmatch(value):
            yield from ((label, part) for part in value.split("|"))


@dataclass(frozen=True)
class Reads:
    """What all the files' rules read: each name's farthest reach, and the label values they name."""

    reach: dict[str, float]
    values: dict[tuple[str, str], set[str]]  # (series name, label) -> values

    @classmethod
    def of(cls, files: Iterable[RulesFile]) -> Reads:
        reach: dict[str, float] = {}
        values: dict[tuple[str, str], set[str]] = {}
        for read in (read for f in files for rule in f.rules for read in reads(rule.expr)):
            reach[read.name] = max(reach.get(read.name, 0.0), read.reach)
            for label, value in read.values:
                values.setdefault((read.name, label), set()).add(value)
        return cls(reach, values)


# --- Prometheus evaluating them ---------------------------------------------------------------------------


def instant(rfc3339: str) -> float:
    """Seconds since the epoch of Prometheus' nanosecond RFC 3339 (Python reads at most microseconds)."""
    return datetime.datetime.fromisoformat(re.sub(r"(\.\d{6})\d+", r"\1", rfc3339).replace("Z", "+00:00")).timestamp()


def last_evaluations(api: PrometheusAPI) -> dict[str, str]:
    return {group["name"]: group["lastEvaluation"] for group in api.get("rules")["groups"]}


def wait_for_round(api: PrometheusAPI, timeout: float) -> None:
    """Until every group has evaluated once more."""
    before = last_evaluations(api)
    wait_for(lambda: all(last_evaluations(api)[g] != t for g, t in before.items()), timeout, "rule evaluation")
