"""Issue 58: the bad-host ledger names the node that keeps breaking jobs, and never a node for a bug in the code
(promtool cases on the generated rules, cut to what TpuscopeNodeSuspect reads).

Each workload runs in generations of pods (a JobSet restarts them all), one sidecar a pod, the pod's node its target
label as the scrape gives it. A crash is the first process's failure, its peers' some seconds later (the collective,
or the JobSet, gives up on them); a bug fails every process at the same step, together.

- Repeated crashes on one node across two workloads name that node only.
- A workload whose code fails wherever it runs names none: its first process (rank 0, wherever it lands) crashes
  alone on one node after another, in a 2-host job over every node it ran on, in a 4-host job on two of them; a
  second workload's crash on one of them is then that node's only evidence. A workload failing together on every
  host, twice, names none either; nor one pinned to its node, whose two failures there could be its own.
- A worker's container crash-looping in place (scraped every 15 s) counts each failure.
- The worker that went non-finite first names its node when it does so in two workloads.
- A chronic straggler that follows a job from node to node names no node; one that stays with a node across two jobs
  does. XIDs of the hardware's on one node name it; an XID NVIDIA lays on the application does not. A throttled GPU
  under two workloads names its node.
- Evidence older than the window leaves it: a day's ledger forgets an XID after a day, the week's keeps it, and the
  ticket (which wants evidence in the last day) resolves.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from alert_cases import s
from alert_cases_nodes import MINUTES, crash_looping, crashes, devices, diverged_first, stragglers
from conftest import require
from rule_cut import rules_behind

from tpuscope import alerts
from tpuscope import catalog as c
from tpuscope.alerts import nodes
from tpuscope.conventions import (
    EVIDENCE_SPREAD,
    HOST_EVIDENCE,
    HOST_SUSPECT,
    NODE_TOPOLOGY,
    NODE_WINDOWS,
    AlertName,
    DashboardUID,
    node_record,
)
from tpuscope.dashboards.panels import panels_of
from tpuscope.generator_config import GeneratorConfig
from tpuscope.promql import SIDECAR_START
from tpuscope.thresholds import Thresholds

LOOKED_AT = "65m"
DAY, WEEK = node_record(HOST_SUSPECT, "1d"), node_record(HOST_SUSPECT, "7d")
WEEK_EVIDENCE = node_record(HOST_EVIDENCE, "7d")
ROOT = Path(__file__).resolve().parent.parent


def suspects(expected: dict[str, tuple[str, int]], at: str = LOOKED_AT, record: str = DAY) -> dict[str, Any]:
    """The suspect nodes ``record`` reads at ``at``: node -> (basis, value: the workloads, the first failures, the XID
    evidence), and no other."""
    samples = [
        {"labels": f'{{basis="{basis}", node="{node}"}}', "value": value}
        for node, (basis, value) in sorted(expected.items())
    ]
    return {"expr": f"max by (node, basis) ({record})", "eval_time": at, "exp_samples": samples}


def promtool(tests: list[dict[str, Any]], directory: Path, interval: str = "1m") -> None:
    generated = alerts.rule_groups(GeneratorConfig())
    behind = {
        rule.get("record") or rule["alert"]
        for group in rules_behind(AlertName.NODE_SUSPECT, generated)
        for rule in group["rules"]
    }
    wanted = behind | {rule["record"] for rule in nodes.ledger_rules()}  # the day's ledger too, which no alert reads
    groups = [{**g, "rules": [r for r in g["rules"] if (r.get("record") or r["alert"]) in wanted]} for g in generated]
    groups = [group for group in groups if group["rules"]]
    rules = directory / "nodes.rules.yaml"
    rules.write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))
    file = directory / "nodes.tests.yaml"
    document = {"rule_files": [str(rules)], "evaluation_interval": interval, "tests": tests}
    file.write_text(yaml.safe_dump(document, sort_keys=False))
    out = subprocess.run([require("promtool"), "test", "rules", str(file)], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-2000:]


def case(name: str, series: dict[str, str], checks: list[dict[str, Any]], interval: str = "1m") -> dict[str, Any]:
    return {
        "name": name,
        "interval": interval,
        "input_series": [{"series": k, "values": v} for k, v in series.items()],
        "promql_expr_test": checks,
    }


def test_crashes_name_the_node_two_workloads_crashed_on_and_no_node_for_a_bug(tmp_path: Path) -> None:
    spread = node_record(EVIDENCE_SPREAD, "1d")
    checks = [
        # node-a: two workloads; node-u: worker 0's two first failures there, the worker unharmed on node-x since.
        suspects({"node-a": ("workloads", 2), "node-u": ("restarts", 2)}),
        {  # rank 0's bug crashed first wherever it landed: its own, counted on none of those nodes
            "expr": spread,
            "eval_time": LOOKED_AT,
            "exp_samples": [
                {
                    "labels": f'{{__name__="{spread}", evidence="crash", jobset="{w}", namespace="team-a", '
                    f'workload="{w}"}}',
                    "value": nodes_crashed,
                }
                for w, nodes_crashed in (("buggy", 3), ("wide", 2))
            ],
        },
        {  # the evidence the ticket lists: node-a's two crashes
            "expr": f'{WEEK_EVIDENCE}{{node="node-a"}}',
            "eval_time": LOOKED_AT,
            "exp_samples": [
                {
                    "labels": f'{{__name__="{WEEK_EVIDENCE}", evidence="crash", jobset="{w}", '
                    f'namespace="team-a", node="node-a", workload="{w}"}}',
                    "value": 1,
                }
                for w in ("gemma", "llama")
            ],
        },
    ]
    promtool([case("crashes", crashes(), checks)], tmp_path)


def test_a_worker_crash_looping_in_place_counts_each_failure(tmp_path: Path) -> None:
    """Scraped every 15 s and evaluated every 30 s, as deployed: worker 0's container fails to start its runtime
    twice, 50 s apart, restarted in place (one pod, one target) on node-k2, its peer waiting; the worker runs on
    node-m2 unharmed afterwards. Both failures count: node-k2 is suspect on its restarts."""
    checks = [suspects({"node-k2": ("restarts", 2)}, "40m")]
    promtool([case("in place", crash_looping(), checks, "15s")], tmp_path, "30s")


def test_the_first_to_diverge_names_the_node_two_workloads_went_first_on(tmp_path: Path) -> None:
    promtool([case("diverged first", diverged_first(), [suspects({"node-g4": ("workloads", 2)}, "25m")])], tmp_path)


def test_a_straggler_names_the_node_it_stays_with_not_the_nodes_its_job_takes_it_to(tmp_path: Path) -> None:
    promtool([case("stragglers", stragglers(), [suspects({"node-d2": ("workloads", 2)})])], tmp_path)


def test_xids_of_the_hardware_name_their_node_and_a_throttle_under_two_workloads_names_its(tmp_path: Path) -> None:
    checks = [suspects({"node-a3": ("xid", 1), "node-c3": ("workloads", 2)})]
    promtool([case("devices", devices(), checks)], tmp_path)


def test_evidence_older_than_its_window_expires(tmp_path: Path) -> None:
    """An XID at minute 20, looked at every 5 minutes for 26 hours: the day's ledger names the node until a day
    has passed, the week's still does, and the ticket, which wants evidence in the last day, resolves."""
    minutes = 26 * 60 // 5
    series = {
        s("up", job="tpuscope", instance="h:9478", node="node-old"): f"1x{minutes}",
        s(SIDECAR_START, job="tpuscope", instance="h:9478", node="node-old"): f"0x{minutes}",
        s(c.XID_ERRORS, instance="h:9478", node="node-old", device="0", accelerator="h100", source="nvml", xid="48"): (
            f"_x4 1x{minutes - 4}"
        ),
    }
    checks = [
        suspects({"node-old": ("xid", 1)}, "23h"),
        suspects({}, "25h"),
        suspects({"node-old": ("xid", 1)}, "25h", WEEK),
    ]
    test = case("expiry", series, checks, interval="5m")
    test["alert_rule_test"] = [
        {"eval_time": "23h", "alertname": str(AlertName.NODE_SUSPECT), "exp_alerts": [ticket("node-old", XID_SAYS)]},
        {"eval_time": "25h", "alertname": str(AlertName.NODE_SUSPECT), "exp_alerts": []},
    ]
    promtool([test], tmp_path, interval="5m")


XID_SAYS = (
    "Node node-old keeps breaking jobs. Its evidence over the last 7d: xid; cordon it, and have its accelerators "
    "checked."
)


def ticket(node: str, description: str) -> dict[str, Any]:
    (rule,) = (
        r for g in alerts.rule_groups(GeneratorConfig()) for r in g["rules"] if r.get("alert") == AlertName.NODE_SUSPECT
    )
    annotations = {**rule["annotations"], "description": description}
    return {"exp_labels": {"severity": "warning", "node": node}, "exp_annotations": annotations}


@pytest.mark.parametrize("named", [True, False])
def test_a_node_outside_kubernetes_is_named_by_its_host_and_the_topology_by_either_source(
    named: bool, tmp_path: Path
) -> None:
    """A TPU VM's sidecar has no node label: its target's host names it. The topology comes from the targets where
    the scrape attaches the node's labels, else from kube-state-metrics' node labels."""
    labels = {"job": "tpuscope", "instance": "tpu-vm-7:9478", "device": "0", "accelerator": "h100", "source": "nvml"}
    topology = {"topology_block": "b1", "topology_subblock": "sb2", "topology_host": "h3"}
    series = {
        s("up", job="tpuscope", instance="tpu-vm-7:9478"): "1x30",
        s(SIDECAR_START, job="tpuscope", instance="tpu-vm-7:9478"): "0x30",
        s(c.XID_ERRORS, xid="79", **labels): "_x10 1x20",
    }
    if named:
        series[s(c.BUILD_INFO, version="1", node="gke-n1", instance="p:9478", **topology)] = "1x30"
    else:
        ksm = {f"label_cloud_google_com_gce_{k}": v for k, v in topology.items()}
        series[s("kube_node_labels", job="kube-state-metrics", node="gke-n1", **ksm)] = "1x30"
    checks = [
        suspects({"tpu-vm-7": ("xid", 1)}, "20m"),
        {
            "expr": NODE_TOPOLOGY,
            "eval_time": "20m",
            "exp_samples": [
                {
                    "labels": f'{{__name__="{NODE_TOPOLOGY}", node="gke-n1", topology_block="b1", '
                    'topology_host="h3", topology_subblock="sb2"}',
                    "value": 1,
                }
            ],
        },
    ]
    promtool([case("outside kubernetes", series, checks)], tmp_path)


def fleet_board_query(title: str) -> str:
    board = json.loads((ROOT / "deploy/grafana" / f"{DashboardUID.FLEET}.json").read_text())
    (panel,) = (panel for panel in panels_of(board) if panel["title"] == title)
    (target,) = panel["targets"]
    return str(target["expr"])


EVIDENCE_ROWS = (("node-a3", "xids", "xid"), ("node-c3", "hot1", "throttled"), ("node-c3", "hot2", "throttled"))


def test_the_fleet_board_lists_the_suspect_nodes_their_evidence_and_their_blocks(tmp_path: Path) -> None:
    """The board's three panels of the ledger, their queries as the committed board has them, on the devices' case
    with node-a3 and node-c3 in one sub-block of block b1 (the scrape's node labels on node-a3's sidecar,
    kube-state-metrics' for node-c3)."""
    series = devices()
    topology = {"topology_block": "b1", "topology_subblock": "s1"}
    series[s(c.BUILD_INFO, version="1", instance="xids-0-0:9478", node="node-a3", topology_host="h1", **topology)] = (
        f"1x{MINUTES}"
    )
    ksm = {f"label_cloud_google_com_gce_{k}": v for k, v in {**topology, "topology_host": "h2"}.items()}
    series[s("kube_node_labels", job="kube-state-metrics", node="node-c3", **ksm)] = f"1x{MINUTES}"
    rows = {
        "Suspect nodes, last 7d": [
            ('{basis="workloads", node="node-c3", topology_block="b1", topology_host="h2", topology_subblock="s1"}', 2),
            ('{basis="xid", node="node-a3", topology_block="b1", topology_host="h1", topology_subblock="s1"}', 1),
        ],
        "Evidence on the suspect nodes, last 7d": [
            (
                f'{{__name__="{WEEK_EVIDENCE}", evidence="{kind}", jobset="{w}", namespace="team-a", node="{n}", '
                f'workload="{w}"}}',
                1,
            )
            for n, w, kind in EVIDENCE_ROWS
        ],
        "Suspect nodes by block and sub-block": [('{topology_block="b1", topology_subblock="s1"}', 2)],
    }
    checks = [
        {
            "expr": fleet_board_query(title),
            "eval_time": LOOKED_AT,
            "exp_samples": [{"labels": labels, "value": value} for labels, value in expected],
        }
        for title, expected in rows.items()
    ]
    promtool([case("the fleet board", series, checks)], tmp_path)


def test_docs_alerts_md_says_why_of_every_record_of_the_ledger() -> None:
    """Each record the ledger's rules write has its reasoning in docs/alerts.md, and none is said that is not
    written."""
    written = {rule["record"] for rule in nodes.evidence_rules(Thresholds()) + nodes.ledger_rules()}
    said = {
        record.replace(nodes.WINDOW, window) if nodes.WINDOW in record else record
        for record, _ in nodes.REASONING
        for window in NODE_WINDOWS
    }
    assert said == written
    text = (ROOT / "docs/alerts.md").read_text()
    assert all(f"| `{record}` | {why} |" in text for record, why in nodes.REASONING)
