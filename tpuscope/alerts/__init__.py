"""Alerting: Prometheus recording and alert rules, an Alertmanager configuration, and their runbooks.

This package composes; it renders nothing itself. The alerts are written area by area, a module each
(``training``, ``compilation``, ``memory``, ``checkpoints``, ``goodput``, ``health``, ``serving``, ``divergence``,
``nodes``), from the building blocks of ``rules``; the records they read are in ``recording``, ``stragglers``,
``platform`` and ``nodes``, each beside what it means; every name they share with the rest of tpuscope is in
:mod:`tpuscope.conventions`. Here they are gathered into rule groups (:func:`rule_groups`), and the groups into
three files, each written by a module named for it:

- ``tpuscope-rules.yaml`` (:mod:`~tpuscope.alerts.rule_file`), for Prometheus' ``rule_files``;
- ``alertmanager.yml`` (:mod:`~tpuscope.alerts.alertmanager`), the routing of pages and tickets;
- ``docs/alerts.md`` (:mod:`~tpuscope.alerts.runbooks`), the runbooks the alerts link.

``tpuscope alerts --out DIR [--config FILE]`` writes the first two (:data:`FILES`) with a team's settings;
``tpuscope generate`` keeps the committed defaults under ``deploy/prometheus/`` and ``deploy/alertmanager/``, and
the runbooks, current.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tpuscope import generator_config
from tpuscope.alerts import (
    alertmanager,
    checkpoints,
    compilation,
    divergence,
    goodput,
    health,
    memory,
    nodes,
    rule_file,
    runbooks,
    serving,
    training,
)
from tpuscope.alerts.platform import platform_rules, product_rules
from tpuscope.alerts.recording import hang_rules, recording_rules, slo_ratios
from tpuscope.alerts.rules import SLOW_INTERVAL, Alert
from tpuscope.alerts.stragglers import straggler_rules
from tpuscope.generator_config import GeneratorConfig

# The rule groups: the records every evaluation, the platform owner's (kube-state-metrics' view: a group of its own, so
# its cost at a fleet's size is seen apart), the bad-host ledger's evidence (the same), the SLO ratios, the platform's
# factors and the bad-host ledger over days, which only tickets and boards read, less often, the alerts (and the
# records one of them must read of its own evaluation).
RECORDING_GROUP, PLATFORM_GROUP, NODES_GROUP = "tpuscope.recording", "tpuscope.platform", "tpuscope.nodes"
SLOW_GROUP, ALERTS_GROUP = "tpuscope.slo-slow", "tpuscope.alerts"
# Each area's alerts, in the order of the committed rules and runbooks: a new area goes at the end, so that
# the generated files change by what it adds and nothing else.
AREAS: tuple[Callable[[GeneratorConfig], list[Alert]], ...] = (
    training.alerts,
    compilation.alerts,
    memory.alerts,
    checkpoints.alerts,
    goodput.alerts,
    health.alerts,
    serving.alerts,
    divergence.alerts,
    nodes.alerts,
)


def alerts(config: GeneratorConfig) -> list[Alert]:
    """Every alert of the generated rules, area after area."""
    return [alert for area in AREAS for alert in area(config)]


def rule_groups(config: GeneratorConfig) -> list[dict[str, Any]]:
    """The rule groups as data: for the rule file and for the PrometheusRule (tpuscope/kubernetes.py)."""
    return [
        {"name": RECORDING_GROUP, "rules": recording_rules(config)},
        {"name": PLATFORM_GROUP, "rules": platform_rules()},
        {"name": NODES_GROUP, "rules": nodes.evidence_rules(config.thresholds)},
        {
            "name": SLOW_GROUP,
            "interval": SLOW_INTERVAL,
            "rules": slo_ratios(config, slow=True) + product_rules() + nodes.ledger_rules(),
        },
        # The hang records ahead of the alerts: TpuscopeWorkloadHung fires at once and names a worker from them
        # (recording.hang_rules), so they must be of its own evaluation, which only its own group guarantees. The
        # straggler's too: TpuscopeStraggler reads their history up to its own evaluation (alerts.stragglers).
        {
            "name": ALERTS_GROUP,
            "rules": hang_rules()
            + straggler_rules(config.thresholds)
            + [alert.rule(config) for alert in alerts(config)],
        },
    ]


def rules_file(config: GeneratorConfig) -> str:
    """``tpuscope-rules.yaml``: every rule group."""
    return rule_file.render(rule_groups(config))


def alertmanager_file(config: GeneratorConfig) -> str:
    """``alertmanager.yml``: the routing of every alert."""
    return alertmanager.render(config)


def runbooks_markdown(config: GeneratorConfig | None = None) -> str:
    """``docs/alerts.md``: every alert's runbook, and the ledger's records in the groups they are evaluated in."""
    return runbooks.render(alerts(config or GeneratorConfig()), evidence_group=NODES_GROUP, ledger_group=SLOW_GROUP)


# The files ``tpuscope alerts --out`` writes, by name (the runbooks are the repository's: ``tpuscope generate``).
FILES: dict[str, Callable[[GeneratorConfig], str]] = {
    "tpuscope-rules.yaml": rules_file,
    "alertmanager.yml": alertmanager_file,
}


def write(out: Path, config: GeneratorConfig) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, render in FILES.items():
        (out / name).write_text(render(config))
        written.append(out / name)
    return written


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Write tpuscope-rules.yaml (recording and alert rules) and alertmanager.yml (page and ticket routing), "
        "with the thresholds, webhooks and links of --config."
    )
    generator_config.add_arguments(parser, out="the two files")


def main(args: argparse.Namespace) -> int:
    return generator_config.write_files("alerts", args, write)
