"""The fleet configurations: Prometheus without the operator (deploy/prometheus/prometheus.yml) and the
OpenTelemetry collector for the jobs' spans (deploy/otel-collector/config.yaml)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import urllib.parse
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from conftest import require

from tpuscope import alerts, catalog, kubernetes
from tpuscope.generator_config import GeneratorConfig
from tpuscope.promql import SIDECAR_START
from tpuscope.testing.prometheus import ServerProcess, target_of
from tpuscope.testing.waiting import wait_for
from tpuscope.workload.sidecar import SidecarProcess

ROOT = Path(__file__).resolve().parents[1]
PROMETHEUS = ROOT / "deploy/prometheus/prometheus.yml"
RULES = ROOT / "deploy/prometheus/tpuscope-rules.yaml"
COLLECTOR = ROOT / "deploy/otel-collector/config.yaml"
CONFIG = yaml.safe_load(PROMETHEUS.read_text())
SCRAPES = {scrape["job_name"]: scrape for scrape in CONFIG["scrape_configs"]}
SCRAPE = SCRAPES[kubernetes.JOB]
KSM = SCRAPES["kube-state-metrics"]
# The labels Kubernetes SD gives an endpoint of a Service (role endpointslice): the Service's name label, as
# the kube-state-metrics Helm chart and its own manifests set it, and the port's name.
KSM_SERVICE = "__meta_kubernetes_service_label_app_kubernetes_io_name"
PORT_NAME = "__meta_kubernetes_endpointslice_port_name"


def pod_label(name: str) -> str:
    """The meta label Kubernetes SD gives a pod label: its name with every other character made ``_``."""
    return "__meta_kubernetes_pod_label_" + re.sub(r"[^a-zA-Z0-9_]", "_", name)


def without_kubernetes_sd(directory: Path, targets: Mapping[str, list[dict[str, Any]]], interval: str = "") -> Path:
    """prometheus.yml with each scrape's Kubernetes SD swapped for a file of its ``targets`` (by job name; none
    where not given), written into ``directory`` beside a copy of the rule file, so that its relative
    rule_files resolves as it does in deployment.

    Debian's prometheus and promtool are built without Kubernetes SD (its client library is not packaged),
    so this is how the rest of the file is checked here; the SD block itself is checked below."""
    config = yaml.safe_load(PROMETHEUS.read_text())
    for scrape in config["scrape_configs"]:
        del scrape["kubernetes_sd_configs"]
        found = directory / f"{scrape['job_name']}.json"
        found.write_text(json.dumps(targets.get(scrape["job_name"], [])))
        scrape["file_sd_configs"] = [{"files": [found.name], "refresh_interval": "1s"}]
    if interval:  # a test's Prometheus: quick, and sending nothing off this machine
        config["global"].update(scrape_interval=interval, scrape_timeout=interval, evaluation_interval=interval)
        del config["remote_write"], config["alerting"]
    shutil.copy(RULES, directory / RULES.name)
    (directory / "prometheus.yml").write_text(yaml.safe_dump(config))
    return directory / "prometheus.yml"


def promtool_check(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([require("promtool"), "check", "config", str(path)], capture_output=True, text=True)


def test_promtool_checks_the_config_and_its_rule_file(tmp_path: Path) -> None:
    direct = promtool_check(PROMETHEUS)
    if direct.returncode != 0:  # only Debian's missing Kubernetes SD may stop it
        unknown = re.findall(r"field (\w+) not found", direct.stderr)
        assert set(unknown) == {"kubernetes_sd_configs"}, direct.stdout + direct.stderr
    out = promtool_check(without_kubernetes_sd(tmp_path, {}))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS: 1 rule files found" in out.stdout
    rules = sum(len(g["rules"]) for g in yaml.safe_load(RULES.read_text())["groups"])
    assert f"SUCCESS: {rules} rules found" in out.stdout, "the rules beside it were read and checked"
    assert CONFIG["rule_files"] == [RULES.name], "relative: the rule file sits beside the config"


def test_the_scrape_discovers_pods_as_the_podmonitor_does() -> None:
    assert SCRAPE["job_name"] == kubernetes.JOB
    assert [sd["role"] for sd in SCRAPE["kubernetes_sd_configs"]] == ["pod"]
    assert all("attach_metadata" not in sd for sd in SCRAPE["kubernetes_sd_configs"]), "opt-in: it needs nodes' RBAC"
    assert "# attach_metadata: {node: true}" in PROMETHEUS.read_text(), "the line to uncomment, as docs/fleet.md says"
    relabel = SCRAPE["relabel_configs"]
    filters, labels = relabel[: -len(kubernetes.relabel_configs())], relabel[-len(kubernetes.relabel_configs()) :]
    assert labels == kubernetes.relabel_configs(), "the PodMonitor's relabelings (tpuscope/kubernetes.py)"
    ((label, value),) = kubernetes.SCRAPE_LABEL.items()
    keeps = {tuple(r["source_labels"]): r["regex"] for r in filters if r["action"] == "keep"}
    assert keeps == {(pod_label(label),): value, ("__meta_kubernetes_pod_container_port_name",): kubernetes.PORT_NAME}
    (job,) = (r["replacement"] for r in labels if r["target_label"] == "job")
    assert re.fullmatch(GeneratorConfig().exporter_job, job)
    assert CONFIG["global"]["scrape_interval"] == "15s" and SCRAPE["metrics_path"] == "/metrics"


def test_a_real_prometheus_scrapes_only_the_sidecar_and_labels_it(tmp_path: Path, short_tmp: Path) -> None:
    """Debian's Prometheus, given the targets Kubernetes SD would find in a pod of jobset.yaml."""
    ((label, value),) = kubernetes.SCRAPE_LABEL.items()
    pod = {
        pod_label(label): value,
        "__meta_kubernetes_pod_name": "llm-pretrain-slice-1-2-x7k2p",
        "__meta_kubernetes_namespace": "ml-research",
        "__meta_kubernetes_pod_node_name": "gke-tpu-v5e-pool-1-node-3",
        "__meta_kubernetes_pod_label_jobset_sigs_k8s_io_jobset_name": "llm-pretrain",
        # A JobSet's pod is its Job's: the JobSet owns the Jobs, each Job its pods.
        "__meta_kubernetes_pod_controller_kind": "Job",
        "__meta_kubernetes_pod_controller_name": "llm-pretrain-slice-1",
        "__meta_kubernetes_pod_phase": "Running",
        # The node's own labels, where its metadata is attached (attach_metadata): GKE's topology of it.
        "__meta_kubernetes_node_label_cloud_google_com_gce_topology_block": "block-7",
        "__meta_kubernetes_node_label_cloud_google_com_gce_topology_subblock": "sub-3",
        "__meta_kubernetes_node_label_cloud_google_com_gce_topology_host": "host-12",
    }
    with SidecarProcess(short_tmp / "events.sock") as sidecar:
        targets = [
            {
                "targets": [target_of(sidecar.url)],
                "labels": {**pod, "__meta_kubernetes_pod_container_port_name": "metrics"},
            },
            # the training container's port of the same pod, an unlabelled pod's port, a finished pod's sidecar
            {"targets": ["127.0.0.1:1"], "labels": {**pod, "__meta_kubernetes_pod_container_port_name": "coordinator"}},
            {"targets": ["127.0.0.1:2"], "labels": {"__meta_kubernetes_pod_container_port_name": "metrics"}},
            {
                "targets": ["127.0.0.1:3"],
                "labels": {
                    **pod,
                    "__meta_kubernetes_pod_container_port_name": "metrics",
                    "__meta_kubernetes_pod_phase": "Succeeded",
                },
            },
        ]
        config = without_kubernetes_sd(tmp_path, {kubernetes.JOB: targets}, interval="1s")
        flags = [f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'data'}"]
        with ServerProcess("prometheus", "prometheus", flags, tmp_path) as prometheus:
            wait_for(
                lambda: bool(api(prometheus, "targets")["activeTargets"]),
                20,
                'bool(api(prometheus, "targets")["activeTargets"])',
            )
            found = api(prometheus, "targets")
            (active,) = found["activeTargets"]
            assert active["labels"] == {
                "instance": target_of(sidecar.url),
                "job": "tpuscope",
                "pod": pod["__meta_kubernetes_pod_name"],
                "namespace": pod["__meta_kubernetes_namespace"],
                "node": pod["__meta_kubernetes_pod_node_name"],
                "jobset": "llm-pretrain",
                # the controller the rules join with kube-state-metrics' series of it
                kubernetes.CONTROLLER_KIND: "Job",
                kubernetes.CONTROLLER_NAME: "llm-pretrain-slice-1",
                "topology_block": "block-7",
                "topology_subblock": "sub-3",
                "topology_host": "host-12",
            }
            assert len(found["droppedTargets"]) == 3
            build_info = f'{catalog.BUILD_INFO.name}{{job="tpuscope", pod="{pod["__meta_kubernetes_pod_name"]}"}}'
            wait_for(
                lambda: bool(api(prometheus, "query", query=build_info)["result"]),
                20,
                'bool(api(prometheus, "query", query=build_info)["result"])',
            )
            (up,) = api(prometheus, "query", query=f'up{{job=~"{GeneratorConfig().exporter_job}"}}')["result"]
            assert up["value"][1] == "1"
            assert {g["name"] for g in api(prometheus, "rules")["groups"]} == {
                g["name"] for g in alerts.rule_groups(GeneratorConfig())
            }


def test_the_kube_state_metrics_scrape_keeps_its_labels() -> None:
    """Its series' namespace and pod are the objects', which the rules join with the sidecars' own; and its
    targets are the endpoints of a Service, whose meta labels the test below gives them."""
    assert KSM["honor_labels"] is True
    assert [sd["role"] for sd in KSM["kubernetes_sd_configs"]] == ["endpointslice"]


def text_blocks(markdown: str, after: str) -> list[str]:
    """The ```text blocks of a markdown document after the heading ``after``, up to its next heading of two."""
    section = markdown[markdown.index(after) :]
    section = section[: section.index("\n## ", 1)]
    return re.findall(r"```text\n(.*?)\n```", section, re.S)


def test_the_node_labels_allowlist_in_the_docs_serves_every_node_label_the_rules_read() -> None:
    """docs/fleet.md's --metric-labels-allowlist for kube-state-metrics: each node label the rules read of
    kube_node_labels (the pools' names, the topology GMP's scrape cannot attach) is in it, as kube-state-metrics
    names it."""
    (allowlist,) = re.findall(r"--metric-labels-allowlist=nodes=\[([^\]]+)\]", (ROOT / "docs/fleet.md").read_text())
    served = {"label_" + re.sub(r"[^A-Za-z0-9_]", "_", label) for label in allowlist.split(",")}
    read = set(re.findall(r"\blabel_cloud_google_com_[a-z_]+", RULES.read_text()))
    assert {"label_cloud_google_com_gke_nodepool", "label_cloud_google_com_gce_topology_block"} <= read, read
    assert read <= served, read - served


def test_the_gmp_keep_regex_in_the_docs_keeps_every_kube_state_metrics_series_the_rules_read() -> None:
    """docs/fleet.md quotes Google's recipe's keep regex and gives the one to use where Kueue queues jobs: the
    second keeps every kube_* name the generated rules read; the first lacks exactly the Job's completion, failure,
    suspension, spec and owner (what the docs say it costs), and keeps what a preempted JobSet's page needs."""
    recipe, ours = text_blocks((ROOT / "docs/fleet.md").read_text(), "### kube-state-metrics on GMP")
    read = set(re.findall(r"\bkube_[a-z_]+", RULES.read_text()))
    assert {"kube_job_created", "kube_namespace_created", "kube_job_status_suspended"} <= read, read
    assert {name for name in read if not re.fullmatch(ours, name)} == set()
    assert {name for name in read if not re.fullmatch(recipe, name)} == {
        "kube_job_complete",
        "kube_job_failed",
        "kube_job_owner",
        "kube_job_spec_completions",
        "kube_job_spec_parallelism",
        "kube_job_status_suspended",
    }


def test_a_real_prometheus_scrapes_kube_state_metrics_only_where_it_serves_the_objects(tmp_path: Path) -> None:
    """Debian's Prometheus, given the endpoints Kubernetes SD would find: of kube-state-metrics' Services, as
    its Helm chart and its own manifests name their ports, only the ports of the objects' metrics."""
    endpoints = {
        "127.0.0.1:11": ("kube-state-metrics", "http"),  # the Helm chart's
        "127.0.0.1:12": ("kube-state-metrics", "http-metrics"),  # kube-state-metrics' own manifests'
        "127.0.0.1:13": ("kube-state-metrics", "metrics"),  # the Helm chart's self-monitoring port
        "127.0.0.1:14": ("kube-state-metrics", "telemetry"),  # the manifests' self-monitoring port
        "127.0.0.1:15": ("node-exporter", "http-metrics"),  # another Service's port of the same name
        "127.0.0.1:16": ("", "http"),  # a Service without the label
    }
    targets = [
        {"targets": [address], "labels": {KSM_SERVICE: service, PORT_NAME: port}}
        for address, (service, port) in endpoints.items()
    ]
    config = without_kubernetes_sd(tmp_path, {KSM["job_name"]: targets}, interval="1s")
    flags = [f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'data'}"]
    with ServerProcess("prometheus", "prometheus", flags, tmp_path) as prometheus:
        wait_for(
            lambda: len(api(prometheus, "targets")["droppedTargets"]) == 4,
            20,
            'len(api(prometheus, "targets")["droppedTargets"]) == 4',
        )
        found = api(prometheus, "targets")
    kept = [{"instance": address, "job": KSM["job_name"]} for address in ("127.0.0.1:11", "127.0.0.1:12")]
    assert (
        sorted((target["labels"] for target in found["activeTargets"]), key=lambda labels: labels["instance"]) == kept
    )


def test_remote_write_sends_tpuscope_series_and_the_recording_rules_only() -> None:
    (remote,) = CONFIG["remote_write"]
    assert urlsplit(remote["url"]).path in ("/api/v1/push", "/api/v1/receive")
    for path in ("/api/v1/push", "/api/v1/receive"):
        assert path in PROMETHEUS.read_text(), "the comment says which backend takes which path"
    assert CONFIG["global"]["external_labels"]["cluster"], "clusters kept apart in the central store"
    (keep,) = remote["write_relabel_configs"]
    assert keep["action"] == "keep" and keep["source_labels"] == ["__name__", "job"]

    def kept(name: str, job: str = "") -> bool:  # Prometheus anchors the regex at both ends, as fullmatch
        return re.fullmatch(keep["regex"], f"{name}{keep['separator']}{job}") is not None

    series = [m.name for m in catalog.CATALOG] + [
        m.series(s) for m in catalog.CATALOG if m.kind is catalog.Kind.HISTOGRAM for s in ("bucket", "sum", "count")
    ]
    assert all(kept(name, "tpuscope") for name in series)
    recorded = [r["record"] for g in alerts.rule_groups(GeneratorConfig()) for r in g["rules"] if "record" in r]
    assert recorded and all(kept(name) for name in recorded), "recording rules' results carry no job"
    assert kept("up", "tpuscope") and not kept("up", "node-exporter")
    # The rules' count of rare events reads when each sidecar started (tpuscope.promql.grown).
    assert kept(SIDECAR_START, "tpuscope") and not kept(SIDECAR_START, "node-exporter")
    assert not kept("node_cpu_seconds_total", "node-exporter") and not kept("ALERTS")
    # The rules that read kube-state-metrics run in each cluster: their results are sent, its series are not.
    assert not kept("kube_job_info", KSM["job_name"]) and not kept("kube_pod_info", KSM["job_name"])
    queue = remote["queue_config"]
    assert queue["max_shards"] >= 10 and queue["capacity"] >= queue["max_samples_per_send"]


# --- the OpenTelemetry collector ---------------------------------------------------------------
# No collector binary can be installed here (otelcol-contrib is neither a Debian nor a PyPI package), so
# the file is checked as the collector reads it: every component a pipeline names must be defined.

SECTIONS = ("receivers", "processors", "exporters", "extensions", "connectors")


def test_every_component_a_pipeline_names_is_defined() -> None:
    collector = yaml.safe_load(COLLECTOR.read_text())
    assert set(collector) <= {*SECTIONS, "service"}
    service = collector["service"]
    assert set(service["extensions"]) <= set(collector["extensions"])
    assert service["pipelines"], "at least one pipeline"
    for name, pipeline in service["pipelines"].items():
        assert name.split("/")[0] in ("traces", "metrics", "logs"), name
        assert pipeline["receivers"] and pipeline["exporters"], name
        for section in ("receivers", "processors", "exporters"):
            for component in pipeline.get(section, []):
                assert component in collector.get(section, {}) or component in collector.get("connectors", {}), (
                    f"{name}: {section[:-1]} {component} is not defined"
                )
    for section in SECTIONS:  # a defined component's type is its id up to the slash; ids are unique
        for component in collector.get(section, {}):
            assert re.fullmatch(r"[a-z0-9_]+(/[\w.-]+)?", component), component


def test_the_collector_receives_what_the_jobs_send() -> None:
    collector = yaml.safe_load(COLLECTOR.read_text())
    traces = collector["service"]["pipelines"]["traces"]
    assert "otlp" in traces["receivers"]
    protocols = collector["receivers"]["otlp"]["protocols"]
    assert protocols["grpc"]["endpoint"].endswith(":4317") and protocols["http"]["endpoint"].endswith(":4318")
    # memory_limiter first (refuse before running out of memory), batch last (k8sattributes needs the
    # connection's address, which batching loses).
    assert traces["processors"][0] == "memory_limiter" and traces["processors"][-1] == "batch"
    assert all(e.split("/")[0] in ("otlp", "otlphttp") for e in traces["exporters"]), "OTLP to the backend"
    # The job sends OTLP/HTTP (the SDK's default protocol) to the port of the http receiver.
    (train,) = [c for c in kubernetes.pod_template()["spec"]["containers"] if c["name"] == "train"]
    endpoint = next(e["value"] for e in train["env"] if e["name"] == "OTEL_EXPORTER_OTLP_ENDPOINT")
    assert "OTEL_EXPORTER_OTLP_PROTOCOL" not in {e["name"] for e in train["env"]}
    assert str(urlsplit(endpoint).port) == protocols["http"]["endpoint"].rsplit(":", 1)[1]
    assert endpoint in COLLECTOR.read_text(), "the comment names the endpoint the jobs use"


def api(server: ServerProcess, endpoint: str, **parameters: str) -> Any:
    url = f"{server.url}/api/v1/{endpoint}?" + urllib.parse.urlencode(parameters)
    with urllib.request.urlopen(url, timeout=10) as response:
        body = json.load(response)
    if body.get("status") != "success":
        pytest.fail(f"{endpoint}: {body}")
    return body["data"]
