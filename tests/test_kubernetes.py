"""The Kubernetes manifests: valid for the API server, and wired so that the sidecar is scraped and reached."""

from __future__ import annotations

import argparse
import copy
import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from conftest import assert_promtool_checks_rules
from kubernetes_validate.utils import all_versions

from tpuscope import catalog, kubernetes
from tpuscope.conventions import DEFAULT_PORT
from tpuscope.exporter import config as serve_config
from tpuscope.generator_config import GeneratorConfig

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy/kubernetes"
# Native sidecars (an init container with restartPolicy: Always) are on by default from 1.29: the oldest
# schemas kubernetes-validate ships from there on, and its newest, which catch fields that have changed since.
SHIPPED = [v for v in all_versions() if tuple(map(int, v.split(".")[:2])) >= (1, 29)]
VERSIONS = (SHIPPED[0], SHIPPED[-1])


def documents(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((DEPLOY / name).read_text()) if d]


def one(name: str, kind: str) -> dict[str, Any]:
    (found,) = [d for d in documents(name) if d["kind"] == kind]
    return found


JOBSET = one("jobset.yaml", "JobSet")
JOB = one("job.yaml", "Job")
POD = JOB["spec"]["template"]
SIDECAR = next(c for c in POD["spec"]["initContainers"] if c["name"] == "tpuscope")
TRAIN = next(c for c in POD["spec"]["containers"] if c["name"] == "train")


def jobset_jobs() -> list[dict[str, Any]]:
    """Each replicated Job of the JobSet, as the batch/v1 Job the JobSet controller will create."""
    return [
        {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": f"{JOBSET['metadata']['name']}-{r['name']}-0"}}
        | {"spec": r["template"]["spec"]}
        for r in JOBSET["spec"]["replicatedJobs"]
    ]


def core_resources() -> list[dict[str, Any]]:
    return [*documents("job.yaml"), *jobset_jobs(), *documents("grafana-dashboards.yaml")]


@pytest.mark.parametrize("version", VERSIONS)
def test_the_core_resources_validate_against_the_kubernetes_schemas(version: str) -> None:
    resources = core_resources()
    assert {r["kind"] for r in resources} == {"Job", "Service", "ConfigMap"}
    for resource in resources:
        try:
            kubernetes_validate.validate(resource, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            pytest.fail(f"{resource['kind']}/{resource['metadata']['name']} at {list(e.path)}: {e.message}")


def test_the_validation_is_strict() -> None:
    """A misspelt field fails: proof that the test above checks something."""
    broken = copy.deepcopy(jobset_jobs()[0])
    broken["spec"]["template"]["spec"]["initContainers"][0]["restartPolcy"] = "Always"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, VERSIONS[-1], strict=True)


def test_both_jobs_run_the_same_pods() -> None:
    assert JOBSET["apiVersion"] == "jobset.x-k8s.io/v1alpha2"
    for replicated in JOBSET["spec"]["replicatedJobs"]:
        assert replicated["template"]["spec"] == JOB["spec"], "the JobSet's Job and job.yaml differ"
    assert JOB["spec"]["completionMode"] == "Indexed", "the worker label comes from JOB_COMPLETION_INDEX"
    assert JOB["spec"]["completions"] == JOB["spec"]["parallelism"], "every host of a slice runs at once"
    # The hosts find each other under the pod's subdomain: the JobSet's own name, job.yaml's Service.
    service = one("job.yaml", "Service")
    assert POD["spec"]["subdomain"] == service["metadata"]["name"] == JOBSET["metadata"]["name"]
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["selector"] == {
        "job-name": JOB["metadata"]["name"]
    }


def test_the_sidecar_is_a_native_sidecar() -> None:
    """An init container that keeps running: started first, stopped once training ends, so the Job completes."""
    assert SIDECAR["restartPolicy"] == "Always"
    assert all(c.get("restartPolicy") is None for c in POD["spec"]["containers"])
    assert POD["spec"]["restartPolicy"] in ("Never", "OnFailure"), "a Job's pods"
    probes = [SIDECAR[p]["httpGet"] for p in ("startupProbe", "readinessProbe", "livenessProbe")]
    assert all(p == {"path": "/healthz", "port": kubernetes.PORT_NAME} for p in probes)
    assert SIDECAR["image"] == kubernetes.SIDECAR_IMAGE and SIDECAR["command"] == ["tpuscope"]
    assert SIDECAR["args"][0] == "serve"
    security = SIDECAR["securityContext"]
    assert security["readOnlyRootFilesystem"] and security["runAsNonRoot"]
    assert security["capabilities"] == {"drop": ["ALL"]} and security["allowPrivilegeEscalation"] is False
    assert set(SIDECAR["resources"]["requests"]) == set(SIDECAR["resources"]["limits"]) == {"cpu", "memory"}


def test_the_job_sends_to_the_socket_the_sidecar_listens_on() -> None:
    socket = Path(env_of(TRAIN)["TPUSCOPE_SOCKET"])
    assert socket == serve_options(SIDECAR, {}).socket == Path(kubernetes.SOCKET)
    volumes = {v["name"]: v for v in POD["spec"]["volumes"]}
    mounts = [{m["name"]: m["mountPath"] for m in c["volumeMounts"]} for c in (SIDECAR, TRAIN)]
    shared = [name for name in mounts[0] if mounts[1].get(name) == mounts[0][name]]
    assert len(shared) == 1, "one volume mounted at the same path in both containers"
    (volume,) = shared
    assert "emptyDir" in volumes[volume]
    assert socket.parent == Path(mounts[0][volume]), "the socket lies on the shared volume"
    # Mode 0600 (the default) admits the socket's owner only: both containers must run as one user.
    pod_security = POD["spec"]["securityContext"]
    assert pod_security["runAsNonRoot"] and pod_security["runAsUser"] == kubernetes.UID
    for container in (SIDECAR, TRAIN):
        assert "runAsUser" not in container.get("securityContext", {}), container["name"]
    assert "--socket-mode" not in SIDECAR["args"]


def test_the_sidecar_labels_its_series_with_the_slice_and_worker_kubernetes_gives_it() -> None:
    """The sidecar's own option parsing, fed the environment the kubelet builds for the sidecar."""
    in_jobset = serve_options(SIDECAR, {"jobset.sigs.k8s.io/job-index": "1"}, completion_index="3")
    assert (in_jobset.slice, in_jobset.worker) == ("1", "3")
    assert (in_jobset.listen_host, in_jobset.listen_port) == ("0.0.0.0", DEFAULT_PORT)
    in_job = serve_options(SIDECAR, {}, completion_index="2")  # a plain Job's pods have no JobSet label
    assert (in_job.slice, in_job.worker) == ("0", "2")


def test_the_downward_api_names_the_pod_for_opentelemetry() -> None:
    env = SIDECAR["env"]
    fields = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in env if "valueFrom" in e}
    assert fields["POD_NAME"] == "metadata.name" and fields["POD_NAMESPACE"] == "metadata.namespace"
    assert fields["NODE_NAME"] == "spec.nodeName"
    # Kubernetes expands $(NAME) only for variables defined earlier in the list; a later one stays literal.
    names = [e["name"] for e in env]
    attributes = env_of(SIDECAR)["OTEL_RESOURCE_ATTRIBUTES"]
    for variable in re.findall(r"\$\((\w+)\)", attributes):
        assert names.index(variable) < names.index("OTEL_RESOURCE_ATTRIBUTES"), variable
    assert dict(pair.split("=") for pair in attributes.split(",")) == {
        "k8s.pod.name": "$(POD_NAME)",
        "k8s.namespace.name": "$(POD_NAMESPACE)",
        "k8s.node.name": "$(NODE_NAME)",
    }
    assert {"POD_NAME", "POD_NAMESPACE", "NODE_NAME"} <= {e["name"] for e in TRAIN["env"]}, (
        "the job's spans name the pod too"
    )


def test_the_pods_ask_for_tpus() -> None:
    selector = POD["spec"]["nodeSelector"]
    assert {"cloud.google.com/gke-tpu-accelerator", "cloud.google.com/gke-tpu-topology"} <= set(selector)
    assert TRAIN["resources"]["limits"]["google.com/tpu"] == TRAIN["resources"]["requests"]["google.com/tpu"]
    assert "google.com/tpu" not in SIDECAR["resources"]["limits"], "the sidecar takes no chip"


def test_the_podmonitor_scrapes_the_sidecar() -> None:
    monitor = one("podmonitor.yaml", "PodMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    selector = monitor["spec"]["selector"]["matchLabels"]
    pod_labels = POD["metadata"]["labels"]
    assert selector and selector.items() <= pod_labels.items(), "the selector matches the pods"
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] in {p["name"] for p in SIDECAR["ports"]}, "a named port of the sidecar"
    (port,) = [p for p in SIDECAR["ports"] if p["name"] == endpoint["port"]]
    assert port["containerPort"] == serve_options(SIDECAR, {}).listen_port
    assert endpoint["path"] == "/metrics" and endpoint["interval"] == "15s"
    labels = {r["targetLabel"]: r for r in endpoint["relabelings"]}
    # The rules find the sidecars by job (TpuscopeExporterDown, ...): the relabelled job must match.
    assert re.fullmatch(GeneratorConfig().exporter_job, labels["job"]["replacement"])
    assert labels["pod"]["sourceLabels"] == ["__meta_kubernetes_pod_name"]
    assert labels["namespace"]["sourceLabels"] == ["__meta_kubernetes_namespace"]
    assert labels["node"]["sourceLabels"] == ["__meta_kubernetes_pod_node_name"]
    # Prometheus would rename a series' own label that a target label shadows (to exported_pod, ...).
    assert not set(labels) & {str(label) for label in catalog.Label}


def test_the_prometheusrule_holds_the_rule_file(tmp_path: Path) -> None:
    rule = one("prometheusrule.yaml", "PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    groups = rule["spec"]["groups"]
    assert groups == yaml.safe_load((ROOT / "deploy/prometheus/tpuscope-rules.yaml").read_text())["groups"]
    assert_promtool_checks_rules(groups, tmp_path)


def test_kustomize_applies_the_monitoring_side() -> None:
    kustomization = documents("kustomization.yaml")[0]
    resources = kustomization["resources"]
    assert all((DEPLOY / name).exists() for name in resources)
    assert set(resources) == {"podmonitor.yaml", "prometheusrule.yaml", "grafana-dashboards.yaml"}
    assert not {"job.yaml", "jobset.yaml"} & set(resources), "applying the monitoring must not start training"


def test_every_manifest_says_it_is_generated() -> None:
    files = sorted(DEPLOY.glob("*.yaml"))
    assert {f.name for f in files} >= {*kubernetes.MANIFESTS, "grafana-dashboards.yaml"}
    for path in files:
        assert path.read_text().startswith(kubernetes.HEADER), path.name


# --- helpers ---------------------------------------------------------------------------------


def env_of(container: dict[str, Any]) -> dict[str, str]:
    """The container's plain values (those from the downward API are left out)."""
    return {e["name"]: e["value"] for e in container["env"] if "value" in e}


def serve_options(container: dict[str, Any], pod_labels: dict[str, str], completion_index: str = "0") -> Any:
    """``tpuscope serve``'s settings from the container's args and the environment the kubelet gives it."""
    environ = {"JOB_COMPLETION_INDEX": completion_index}  # set by the Job controller in every container
    for entry in container["env"]:
        if "value" in entry:
            environ[entry["name"]] = re.sub(r"\$\((\w+)\)", lambda m: environ.get(m[1], m[0]), entry["value"])
            continue
        path = entry["valueFrom"]["fieldRef"]["fieldPath"]
        if label := re.fullmatch(r"metadata\.labels\['(.+)'\]", path):
            environ[entry["name"]] = pod_labels.get(label[1], "")  # an absent label reads as empty
        else:
            # status.hostIP: this host's, where no device plugin answers (serve asks one for the topology).
            fields = {"metadata.name": "pod-0", "metadata.namespace": "ml", "spec.nodeName": "n"}
            environ[entry["name"]] = {**fields, "status.hostIP": "127.0.0.1"}[path]
    parser = argparse.ArgumentParser()
    serve_config.add_arguments(parser)
    assert container["args"][0] == "serve"
    return serve_config.resolve(parser.parse_args(container["args"][1:]), environ)
