"""The Google Cloud Managed Service for Prometheus (GMP) objects: the same scrape, labels and rules as the operator's.

Their fields, the metadata labels GMP allows and the labels its relabelings may not write are GMP's CRDs' (its
schemas and CEL rules, in ../shared/reference/crds): tests/test_kubernetes.py validates both objects against them,
and the breaches below prove the CEL rules are evaluated. What no schema says is written down here: how GMP fills
each metadata label, and the labels its rule evaluator sets on every result (pkg/operator/apis/monitoring/v1 and the
rule evaluator in GoogleCloudPlatform/prometheus-engine).
"""

from __future__ import annotations

import copy
import re
import subprocess
from pathlib import Path
from typing import Any

import crd_schemas
import pytest
import yaml
from conftest import assert_promtool_checks_rules, require

from tpuscope import kubernetes
from tpuscope.alerts import staleness
from tpuscope.alerts.rules import SLOW_INTERVAL
from tpuscope.conventions import TOPOLOGY_LABELS

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy/kubernetes"
GMP = DEPLOY / kubernetes.GMP_DIR

# GMP's rule evaluator sets these on every rule's result itself: a rule's own would be overwritten.
EVALUATOR_LABELS = {"project_id", "location", "cluster", "namespace"}
# Each metadata target label GMP allows, and the service-discovery label it copies (for the top-level
# controller, of a Job's or a StatefulSet's pod; a Deployment's and a CronJob's differ, docs/fleet.md).
GMP_METADATA_SOURCES = {
    "container": "__meta_kubernetes_pod_container_name",
    "namespace": "__meta_kubernetes_namespace",
    "node": "__meta_kubernetes_pod_node_name",
    "pod": "__meta_kubernetes_pod_name",
    "top_level_controller_name": "__meta_kubernetes_pod_controller_name",
    "top_level_controller_type": "__meta_kubernetes_pod_controller_kind",
}


def one(path: Path, kind: str) -> dict[str, Any]:
    found: dict[str, Any]
    (found,) = [d for d in yaml.safe_load_all(path.read_text()) if d and d["kind"] == kind]
    return found


MONITORING = one(GMP / "clusterpodmonitoring.yaml", "ClusterPodMonitoring")
RULES = one(GMP / "clusterrules.yaml", "ClusterRules")
PODMONITOR = one(DEPLOY / "podmonitor.yaml", "PodMonitor")
(ENDPOINT,) = MONITORING["spec"]["endpoints"]
(PODMONITOR_ENDPOINT,) = PODMONITOR["spec"]["podMetricsEndpoints"]


def gmp_target_sources() -> dict[str, str]:
    """Each label a GMP-scraped series carries from its target -> the service-discovery label it came from."""
    labels = MONITORING["spec"]["targetLabels"]
    sources = {name: GMP_METADATA_SOURCES[name] for name in labels["metadata"]}
    sources |= {m["to"]: kubernetes.pod_label_meta(m["from"]) for m in labels["fromPod"]}
    for relabel in ENDPOINT["metricRelabeling"]:
        if relabel["action"] == "replace":
            (source,) = relabel["sourceLabels"]
            sources[relabel["targetLabel"]] = sources[source]
    dropped = [r["regex"] for r in ENDPOINT["metricRelabeling"] if r["action"] == "labeldrop"]
    return {name: meta for name, meta in sources.items() if not any(_full(regex, name) for regex in dropped)}


def _full(regex: str, name: str) -> bool:
    return re.fullmatch(regex, name) is not None


def test_the_objects_are_gmps_v1_and_set_no_label_its_evaluator_overwrites() -> None:
    assert MONITORING["apiVersion"] == RULES["apiVersion"] == "monitoring.googleapis.com/v1"
    assert crd_schemas.errors(MONITORING) == crd_schemas.errors(RULES) == []
    for group in RULES["spec"]["groups"]:
        assert not {label for rule in group["rules"] for label in rule.get("labels", {})} & EVALUATOR_LABELS


def breach(document: dict[str, Any], plant: Any) -> str:
    broken = copy.deepcopy(document)
    plant(broken)
    return "\n".join(crd_schemas.errors(broken))


@pytest.mark.parametrize(
    ("document", "plant", "refused"),
    [
        # A field GMP does not have (the operator's rules do): the server would drop it without a word.
        (RULES, lambda d: d["spec"]["groups"][0]["rules"][0].update({"keep_firing_for": "5m"}), "'keep_firing_for'"),
        (RULES, lambda d: d["spec"]["groups"][0]["rules"][0].update({"alert": "A", "record": "a"}), "exactly one"),
        (MONITORING, lambda d: d["spec"]["endpoints"][0].update({"port": 0}), "Port is required"),
        (MONITORING, lambda d: d["spec"]["endpoints"][0].update({"timeout": "20s"}), "self.timeout <= self.interval"),
        (MONITORING, lambda d: d["spec"]["endpoints"][0].update({"interval": "often"}), "is not a 'duration'"),
        (MONITORING, lambda d: d["spec"]["targetLabels"]["fromPod"][0].update({"to": "job"}), "protected label"),
        (MONITORING, lambda d: d["spec"]["targetLabels"]["metadata"].append("container_id"), "is not one of"),
        (MONITORING, lambda d: d["spec"]["endpoints"][0]["metricRelabeling"][-1].pop("regex"), "has(self.regex)"),
    ],
    ids=["unknown field", "record and alert", "port 0", "timeout over interval", "not a duration", "protected label",
         "metadata label", "labeldrop without regex"],
)  # fmt: skip
def test_gmps_schema_and_rules_refuse_a_planted_breach(document: dict[str, Any], plant: Any, refused: str) -> None:
    assert refused in breach(document, plant)


def test_gmp_scrapes_what_the_podmonitor_scrapes() -> None:
    assert MONITORING["spec"]["selector"] == PODMONITOR["spec"]["selector"]
    assert {k: ENDPOINT[k] for k in ("port", "path", "interval")} == {
        k: PODMONITOR_ENDPOINT[k] for k in ("port", "path", "interval")
    }
    # GMP sets job to the object's name.
    job = next(r for r in PODMONITOR_ENDPOINT["relabelings"] if r["targetLabel"] == "job")
    assert MONITORING["metadata"]["name"] == job["replacement"]


def test_the_target_labels_are_the_podmonitors_but_the_nodes_topology() -> None:
    """GMP gives each series its pod's node as the PodMonitor does; it cannot read the node's own labels (its CRD's
    metadata allows none), so the bad-host ledger reads the topology from kube-state-metrics' node labels there."""
    ours = {r["targetLabel"]: r["sourceLabels"][0] for r in PODMONITOR_ENDPOINT["relabelings"] if "sourceLabels" in r}
    assert gmp_target_sources() == {name: meta for name, meta in ours.items() if name not in TOPOLOGY_LABELS}
    assert gmp_target_sources()["node"] == "__meta_kubernetes_pod_node_name"
    schema = crd_schemas.crds()[(MONITORING["apiVersion"], MONITORING["kind"])]
    target_labels = schema["properties"]["spec"]["properties"]["targetLabels"]
    permitted = set(target_labels["properties"]["metadata"]["items"]["enum"])
    assert "node" in permitted and not any("label" in name for name in permitted), permitted


def test_the_clusterrules_hold_the_rule_file_read_without_staleness(tmp_path: Path) -> None:
    """The rule file's groups, each instant read of a series bounded as tests/test_gmp_staleness.py checks."""
    groups = RULES["spec"]["groups"]
    rules_file = yaml.safe_load((ROOT / "deploy/prometheus/tpuscope-rules.yaml").read_text())["groups"]
    fresh = staleness.rule_groups(rules_file, kubernetes.GMP_FRESH)
    assert groups == [{**g, "interval": g.get("interval", kubernetes.GMP_RULE_INTERVAL)} for g in fresh]
    assert fresh != rules_file
    # the GMP evaluator's 60 s default is never left to apply; a group of its own pace keeps it
    assert {g["interval"] for g in groups} == {kubernetes.GMP_RULE_INTERVAL, SLOW_INTERVAL}
    assert_promtool_checks_rules(groups, tmp_path)


def test_kustomize_renders_the_gmp_install() -> None:
    kustomization = yaml.safe_load((GMP / "kustomization.yaml").read_text())
    assert kustomization["resources"] == list(kubernetes.GMP_MANIFESTS)
    assert "namespace" not in kustomization, "both objects are cluster-scoped"
    out = subprocess.run(
        [require("kubectl"), "kustomize", str(GMP)], capture_output=True, text=True, timeout=120, check=True
    )
    rendered = [d for d in yaml.safe_load_all(out.stdout) if d]
    assert sorted(d["kind"] for d in rendered) == ["ClusterPodMonitoring", "ClusterRules"]
    assert not any(d["apiVersion"].startswith("monitoring.coreos.com") for d in rendered)
