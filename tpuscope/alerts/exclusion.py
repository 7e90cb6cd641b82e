"""``tpuscope exclusion``: a window the goodput SLO does not count, as a rule the owner applies beside tpuscope's.

Planned maintenance, a pause the owner chose: the rule records :data:`tpuscope.conventions.SLO_EXCLUDED`, 1 from
the window's start to its end, labelled with what it covers (a workload, a JobSet, a namespace, or nothing: the
fleet). The goodput SLO's two terms skip what it covers (:func:`tpuscope.alerts.rules.excluded`), so the burn rates
read neither its bad time nor its wall time, and no burn-rate alert fires for it. A window is known ahead or while it
lasts: the terms are recorded as time goes, so a rule applied after the window changes nothing already recorded.
"""

from __future__ import annotations

import argparse
import re
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from tpuscope import kubernetes
from tpuscope.conventions import SLO_EXCLUDED

KINDS = ("rules", "prometheusrule", "clusterrules")  # a rules file, the Prometheus Operator's object, GMP's


def exclusion_group(
    start: datetime, end: datetime, reason: str, namespace: str = "", jobset: str = "", workload: str = ""
) -> dict[str, Any]:
    """The rule group that excludes ``start`` to ``end`` (aware datetimes) from the goodput SLO of what the labels
    name (none of them: the fleet's)."""
    if start.tzinfo is None or end.tzinfo is None:
        raise ValueError("give the window's times with their zone, e.g. 2026-12-01T02:00:00Z")
    if end <= start:
        raise ValueError(f"the window ends ({end.isoformat()}) no later than it starts ({start.isoformat()})")
    if jobset and not namespace:
        raise ValueError("a JobSet is named within its namespace: give --namespace too")
    labels = {"namespace": namespace, "jobset": jobset, "workload": workload, "reason": reason}
    within = f"vector(time()) >= {start.timestamp():.0f} < {end.timestamp():.0f}"
    rule = {"record": SLO_EXCLUDED, "expr": f"({within}) * 0 + 1", "labels": {k: v for k, v in labels.items() if v}}
    named = [value for value in (namespace, jobset, workload) if value] or ["fleet"]
    window = f"{start.astimezone(UTC):%Y%m%dT%H%MZ}-{end.astimezone(UTC):%Y%m%dT%H%MZ}"
    return {"name": ".".join(["tpuscope-exclusion", *named, window]), "rules": [rule]}


def document(group: dict[str, Any], kind: str) -> dict[str, Any]:
    """``group`` as a rules file, or as the Kubernetes object that carries rules to Prometheus or to GMP."""
    if kind == "rules":
        return {"groups": [group]}
    # A Kubernetes object's name: lower-case letters, digits and "-", at most 253 characters.
    name = re.sub(r"[^a-z0-9-]+", "-", group["name"].lower()).strip("-")[:253].rstrip("-")
    if kind == "prometheusrule":
        metadata = {"name": name, "labels": {"prometheus": "k8s", "role": "alert-rules", **kubernetes.PART_OF}}
        return {
            "apiVersion": "monitoring.coreos.com/v1",
            "kind": "PrometheusRule",
            "metadata": metadata,
            "spec": {"groups": [group]},
        }
    interval = {"interval": kubernetes.GMP_RULE_INTERVAL}
    return {
        "apiVersion": kubernetes.GMP_API,
        "kind": "ClusterRules",
        "metadata": {"name": name, "labels": kubernetes.PART_OF},
        "spec": {"groups": [{**group, **interval}]},
    }


def _moment(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Write a rule that excludes a window (planned maintenance, a pause) from the goodput SLO of a workload, a "
        "JobSet, a namespace or the whole fleet: apply it beside tpuscope's rules (docs/goodput.md, Exclusions)."
    )
    parser.add_argument("--start", type=_moment, required=True, help="ISO 8601 with its zone: 2026-12-01T02:00Z")
    parser.add_argument("--end", type=_moment, required=True, help="ISO 8601 with its zone")
    parser.add_argument("--reason", required=True, help="a word the rule keeps as a label: maintenance, pause")
    parser.add_argument("--namespace", default="", help="what it covers: a namespace (with --jobset: a JobSet)")
    parser.add_argument("--jobset", default="", help="a JobSet, within --namespace")
    parser.add_argument(
        "--workload",
        default="",
        help="a workload: within --jobset or --namespace where given, else of that name anywhere",
    )
    parser.add_argument("--kind", choices=KINDS, default="rules", help="what to write (default: a rules file)")
    parser.add_argument("--out", type=Path, help="the file to write (default: standard output)")


def main(args: argparse.Namespace) -> int:
    try:
        group = exclusion_group(args.start, args.end, args.reason, args.namespace, args.jobset, args.workload)
    except ValueError as error:
        print(f"tpuscope exclusion: {error}", file=sys.stderr)
        return 2
    text = yaml.safe_dump(document(group, args.kind), sort_keys=False, width=120)
    if args.out:
        args.out.write_text(text)
    else:
        sys.stdout.write(text)
    return 0
