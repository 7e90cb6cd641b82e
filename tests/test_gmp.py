"""The Google Cloud Managed Service for Prometheus (GMP) objects: the same scrape, labels and rules as the operator's.

GMP's CRDs are not carried here; the field names, the allowed metadata labels, the protected labels and how GMP
fills each metadata label are those of its v1 API (pkg/operator/apis/monitoring/v1 in GoogleCloudPlatform/
prometheus-engine), written down below.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import yaml
from conftest import assert_promtool_checks_rules, require

from tpuscope import kubernetes

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy/kubernetes"
GMP = DEPLOY / kubernetes.GMP_DIR

SPEC_FIELDS = {"selector", "endpoints", "targetLabels", "filterRunning", "limits"}
ENDPOINT_FIELDS = {"port", "path", "interval", "timeout", "scheme", "params", "metricRelabeling", "proxyUrl"}
RELABEL_FIELDS = {"action", "sourceLabels", "targetLabel", "regex", "replacement", "separator", "modulus"}
GROUP_FIELDS = {"name", "interval", "rules"}
RULE_FIELDS = {"record", "alert", "expr", "for", "labels", "annotations"}
# GMP's relabelings may not write these; its rule evaluator sets the first four on every rule's result itself.
PROTECTED = {"project_id", "location", "cluster", "namespace", "job", "instance", "top_level_controller_type"}
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


def test_the_objects_use_only_the_fields_of_gmps_api() -> None:
    assert MONITORING["apiVersion"] == RULES["apiVersion"] == "monitoring.googleapis.com/v1"
    assert set(MONITORING["spec"]) <= SPEC_FIELDS and {"selector", "endpoints"} <= set(MONITORING["spec"])
    assert set(ENDPOINT) <= ENDPOINT_FIELDS and {"port", "interval"} <= set(ENDPOINT)
    assert all(set(r) <= RELABEL_FIELDS for r in ENDPOINT["metricRelabeling"])
    assert set(MONITORING["spec"]["targetLabels"]["metadata"]) <= set(GMP_METADATA_SOURCES)
    written = [r["targetLabel"] for r in ENDPOINT["metricRelabeling"] if "targetLabel" in r]
    written += [m["to"] for m in MONITORING["spec"]["targetLabels"]["fromPod"]]
    assert not set(written) & PROTECTED
    assert all("regex" in r for r in ENDPOINT["metricRelabeling"] if r["action"] == "labeldrop")
    for group in RULES["spec"]["groups"]:
        assert set(group) <= GROUP_FIELDS
        assert all(set(rule) <= RULE_FIELDS for rule in group["rules"]), "no keep_firing_for: GMP has none"
        assert not {label for rule in group["rules"] for label in rule.get("labels", {})} & PROTECTED


def test_gmp_scrapes_what_the_podmonitor_scrapes() -> None:
    assert MONITORING["spec"]["selector"] == PODMONITOR["spec"]["selector"]
    assert {k: ENDPOINT[k] for k in ("port", "path", "interval")} == {
        k: PODMONITOR_ENDPOINT[k] for k in ("port", "path", "interval")
    }
    # GMP sets job to the object's name.
    job = next(r for r in PODMONITOR_ENDPOINT["relabelings"] if r["targetLabel"] == "job")
    assert MONITORING["metadata"]["name"] == job["replacement"]


def test_the_target_labels_are_the_podmonitors() -> None:
    ours = {r["targetLabel"]: r["sourceLabels"][0] for r in PODMONITOR_ENDPOINT["relabelings"] if "sourceLabels" in r}
    assert gmp_target_sources() == ours


def test_the_clusterrules_hold_the_rule_file(tmp_path: Path) -> None:
    groups = RULES["spec"]["groups"]
    rules_file = yaml.safe_load((ROOT / "deploy/prometheus/tpuscope-rules.yaml").read_text())["groups"]
    assert [{k: v for k, v in g.items() if k != "interval"} for g in groups] == rules_file
    assert {g["interval"] for g in groups} == {kubernetes.GMP_RULE_INTERVAL}
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
