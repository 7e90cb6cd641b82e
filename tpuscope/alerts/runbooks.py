"""``docs/alerts.md``: every alert, what it means and what to do, and what each value of the reason labels means.

The alerts' ``runbook_url`` points at this page, and their descriptions link the anchor of the reason they fire for
(:data:`tpuscope.alerts.rules.FAILURE_REASON_ANCHOR` and its siblings): both stay stable.
"""

from __future__ import annotations

from tpuscope import catalog as c
from tpuscope.alerts import nodes
from tpuscope.alerts.causes import CAUSES, INHIBITIONS, SAME_WORKLOAD, inhibited_by
from tpuscope.alerts.rules import (
    COMPILE_FAILURE_REASON_ANCHOR,
    FAILURE_REASON_ANCHOR,
    RECOMPILE_CAUSE_ANCHOR,
    Alert,
)
from tpuscope.conventions import NODE_WINDOWS, AlertName
from tpuscope.reasons import (
    COMPILE_FAILURE_REASONS,
    FAILURE_REASONS,
    LEGACY_FAILURE_REASONS,
    RECOMPILE_CAUSES,
    Reason,
)


def render(alerts: list[Alert], evidence_group: str, ledger_group: str) -> str:
    """The page of ``alerts`` (:func:`tpuscope.alerts.alerts`), whose bad-host ledger records its evidence in the
    group ``evidence_group`` and the ledger itself in ``ledger_group``."""
    lines = [
        "# Alerts and runbooks",
        "",
        "Generated from `tpuscope/alerts/` by `tpuscope generate`; do not edit by hand. `critical` pages,",
        "`warning` makes a ticket. Thresholds are the defaults of `tpuscope/thresholds.py`; override them in the",
        "`tpuscope alerts --config` file. After the alerts, what each value of the reason labels means and what to",
        "do: [Failure reasons](#failure-reasons), [Compile failure reasons](#compile-failure-reasons), [Recompile",
        "causes](#recompile-causes).",
        "",
    ]
    by_name: dict[str, list[Alert]] = {}
    for alert in alerts:  # a burn-rate alert is one name with two severities
        by_name.setdefault(alert.name, []).append(alert)
    for same in by_name.values():
        alert, severities = same[0], "/".join(a.severity for a in same)
        lines += [
            f"## {alert.name}",
            "",
            f"**{severities}**, {'at once' if alert.for_ == '0m' else 'after ' + alert.for_}. {alert.summary}",
            "",
            f"**The cause it stands for:** {CAUSES[alert.name]}.{_quiet_while(alert.name)}",
            "",
            f"```promql\n{alert.expr}\n```",
            "",
            alert.runbook,
            "",
        ]
    lines += _inhibitions()
    lines += _ledger(evidence_group, ledger_group)
    for title, label, anchor, reasons, about in REASON_SECTIONS:
        lines += _reasons(title, label, anchor, reasons, about)
    return "\n".join(lines)


def _quiet_while(name: AlertName) -> str:
    """The sentence of an alert's runbook that names the alerts that keep it quiet."""
    sources = inhibited_by(name)
    if not sources:
        return ""
    return " Quiet for a workload while " + " or ".join(sorted(sources)) + " fires for it: that one says the cause."


def _inhibitions() -> list[str]:
    """The section on the inhibit rules of the generated Alertmanager configuration."""
    lines = [
        "## One cause, one notification",
        "",
        "An incident fires several rules at once. The generated Alertmanager configuration "
        "(`deploy/alertmanager/alertmanager.yml`) keeps the symptoms of a workload quiet while the alert that "
        f"names their cause fires for the same workload (the same {' and '.join(f'`{x}`' for x in SAME_WORKLOAD)}):",
        "",
        "| While this fires | these notify nobody | because |",
        "|---|---|---|",
    ]
    for rule in INHIBITIONS:
        only = f" (`{rule.only}`)" if rule.only else ""
        lines.append(f"| {', '.join(rule.source)} | {', '.join(rule.targets)}{only} | {rule.why} |")
    return [
        *lines,
        "",
        "And a page keeps quiet the ticket of the same alert and workload (a fast burn is a slow one too). An alert "
        "kept quiet still shows in Alertmanager, marked inhibited, and on the dashboards.",
        "",
    ]


def _ledger(evidence_group: str, ledger_group: str) -> list[str]:
    """The section on the bad-host ledger's records: each record and why (:data:`tpuscope.alerts.nodes.REASONING`)."""
    windows = " and ".join(f"`{w}`" for w in NODE_WINDOWS)
    lines = [
        "## The bad-host ledger",
        "",
        f"The records {AlertName.NODE_SUSPECT} reads, in the order they read each other (`{nodes.WINDOW}`: each of "
        f"{windows}). The evidence is recorded each evaluation (group `{evidence_group}`), the ledger every 5 minutes "
        f"(group `{ledger_group}`).",
        "",
        "| record | what it holds, and why |",
        "|---|---|",
    ]
    lines += [f"| `{record}` | {why} |" for record, why in nodes.REASONING]
    return [*lines, ""]


# The sections on the values of a reason label (tpuscope.reasons), after the alerts: (heading, the
# label, the anchor prefix of each value's runbook, the values, what the label is on).
REASON_SECTIONS: tuple[tuple[str, str, str, tuple[Reason, ...], str], ...] = (
    (
        "Failure reasons",
        "reason",
        FAILURE_REASON_ANCHOR,
        FAILURE_REASONS + LEGACY_FAILURE_REASONS,
        f"`{c.WORKLOAD_FAILURES.name}`, and {AlertName.WORKLOAD_FAILED} (one alert per reason): why a process of the "
        "workload failed, as the job classified its failure (`vanished`: the sidecar's, for a process that ended "
        "without a word).",
    ),
    (
        "Compile failure reasons",
        "reason",
        COMPILE_FAILURE_REASON_ANCHOR,
        COMPILE_FAILURE_REASONS,
        f"`{c.COMPILE_FAILURES.name}`, and {AlertName.COMPILE_FAILING}: why a program failed to trace, lower or "
        "compile (the `stage` label says which).",
    ),
    (
        "Recompile causes",
        "cause",
        RECOMPILE_CAUSE_ANCHOR,
        RECOMPILE_CAUSES,
        f"`{c.RECOMPILES.name}`: why JAX traced a function again (its explanation of the tracing-cache miss); "
        f"many of them in the steady state fire {AlertName.RECOMPILING}.",
    ),
)


def _reasons(title: str, label: str, anchor: str, reasons: tuple[Reason, ...], about: str) -> list[str]:
    """A section on each value of a reason label: what it means, what to do. Each value's anchor
    (``anchor`` + the value) is stable: the alerts' descriptions link it."""
    lines = [f"## {title}", "", f"The values of the `{label}` label of {about}", ""]
    for reason in reasons:
        lines += [
            f'<a id="{anchor}{reason.value}"></a>',
            "",
            f"### `{reason.value}`",
            "",
            reason.meaning,
            "",
            f"**What to do.** {reason.runbook}",
            "",
        ]
    return lines
