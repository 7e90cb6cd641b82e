"""``tpuscope bench rule-cost``: every rule group, and every goodput ratio rule, reads samples on the backfilled fleet.

A tiny run (4 hosts, 3 hours of history, the rules evaluated every 2 s) whose figures mean nothing, but which goes
through every part on a real Prometheus and promtool: the probe of what the rules record, the backfill, the
evaluations and the queries. The goodput ratio rules read recorded series over their windows: were the recorded
history missing, they would read nothing, and a long window no more than a short one.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tpuscope import durations
from tpuscope.bench.rule_cost import ALL_GROUPS, FileCost, RuleCost, group_costs
from tpuscope.conventions import BADPUT_RATIO
from tpuscope.testing.bench import report as bench_report

pytestmark = pytest.mark.long

RULES = Path(__file__).resolve().parents[1] / "deploy/prometheus/tpuscope-rules.yaml"
LABEL = "shipped"
TINY = ("--hosts", "4", "--days", "0.125", "--interval", "2s", "--scrape-interval", "5s")


def printed_groups(out: str) -> dict[str, list[str]]:
    """The per-group table as printed: group -> its cells after the group's name (rules, samples read, ...)."""
    (table,) = [part for part in out.split("\n\n") if part.startswith("Per group")]
    return {cells[1]: cells[2:] for cells in map(str.split, table.splitlines()) if cells[0] == LABEL}


def test_every_group_and_every_goodput_ratio_rule_reads_samples(
    short_tmp: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    figures = bench_report("rule-cost", "--rules", f"{LABEL}={RULES}", *TINY, directory=short_tmp, timeout=240)
    printed = printed_groups(capsys.readouterr().out)
    groups = [group["name"] for group in yaml.safe_load(RULES.read_text())["groups"]]
    assert groups and set(groups) <= set(printed), printed
    for group in groups:
        assert int(printed[group][1].replace(",", "")) > 0, (group, printed[group])
    (measured,) = figures["files"]
    assert all(measured["group_eval_seconds"][group] > 0 for group in groups), measured["group_eval_seconds"]
    ratios = {rule["name"]: rule["samples"] for rule in measured["rules"] if rule["name"].startswith(BADPUT_RATIO)}
    assert len(ratios) >= 2 and all(samples > 0 for samples in ratios.values()), ratios
    shortest, *_, longest = sorted(ratios, key=lambda name: durations.parse(name.removeprefix(BADPUT_RATIO)))
    assert ratios[longest] > ratios[shortest], ratios


def test_a_group_is_compared_with_the_baseline_group_of_its_name() -> None:
    before = FileCost(
        "before",
        "before.yaml",
        [RuleCost("slo", "a", samples=100, query_seconds=0.2), RuleCost("other", "b", samples=10, query_seconds=0.1)],
        group_eval_seconds={"slo": 0.4, "other": 0.1},
    )
    after = FileCost(
        "after",
        "after.yaml",
        [RuleCost("slo", "a", samples=25, query_seconds=0.1), RuleCost("new", "c", samples=5, query_seconds=0.1)],
        group_eval_seconds={"slo": 0.1, "new": 0.05},
    )
    rows = {(row.file, row.group): row for row in group_costs([before, after])}
    assert rows["before", "slo"].ratios == {}  # the baseline
    assert rows["after", "slo"].ratios == {"samples": 0.25, "query_seconds": 0.5, "eval_seconds": 0.25}
    assert rows["after", "new"].ratios == {}  # no group of its name to compare with
    every = rows["after", ALL_GROUPS]
    assert (every.rules, every.samples, every.ratios["samples"]) == (2, 30, 30 / 110)
