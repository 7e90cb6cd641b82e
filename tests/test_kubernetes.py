"""The Kubernetes manifests: valid for the API server, and wired so that the sidecar is scraped and reached.

Every object they hold, in the files and as ``kubectl kustomize`` renders them, is validated: the custom resources
against the real CRDs' schemas and CEL rules (tests/crd_schemas.py), Kubernetes' own kinds against the schemas
kubernetes-validate ships. The tests below check what no schema can say.
"""

from __future__ import annotations

import argparse
import copy
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import crd_schemas
import kubernetes_validate
import pytest
import yaml
from conftest import assert_promtool_checks_rules, require
from kubernetes_validate.utils import all_versions

from tpuscope import catalog, events, kubernetes
from tpuscope.conventions import DEFAULT_PORT, GKE_TOPOLOGY
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


@pytest.fixture(scope="module")
def rendered() -> list[tuple[str, dict[str, Any]]]:
    """Every API object of the manifests, with where it comes from: each file under deploy/kubernetes/ and gmp/, and
    what `kubectl kustomize` renders of both folders (the Kustomizations themselves are no API objects)."""
    found = [
        (str(path.relative_to(ROOT)), document)
        for path in sorted([*DEPLOY.glob("*.yaml"), *(DEPLOY / kubernetes.GMP_DIR).glob("*.yaml")])
        for document in yaml.safe_load_all(path.read_text())
        if document and document["kind"] != "Kustomization"
    ]
    for folder in (DEPLOY, DEPLOY / kubernetes.GMP_DIR):
        out = subprocess.run(
            [require("kubectl"), "kustomize", str(folder)], capture_output=True, text=True, timeout=120, check=True
        )
        source = f"kubectl kustomize {folder.relative_to(ROOT)}"
        found += [(source, document) for document in yaml.safe_load_all(out.stdout) if document]
    # The JobSet's Jobs, as its controller will create them: Kubernetes' newer schemas check their pods too.
    found += [("jobset.yaml, as its controller makes it", job) for job in jobset_jobs()]
    return found


def named(source: str, document: dict[str, Any]) -> str:
    return f"{source}: {document['kind']}/{document['metadata']['name']}"


def test_every_custom_resource_validates_against_its_crd(rendered: list[tuple[str, dict[str, Any]]]) -> None:
    custom = [(source, d) for source, d in rendered if crd_schemas.is_custom(d)]
    assert {d["kind"] for _, d in custom} == {
        "JobSet", "PodMonitor", "PrometheusRule", "ClusterPodMonitoring", "ClusterRules",
    }  # fmt: skip
    refused = {named(source, d): crd_schemas.errors(d) for source, d in custom}
    assert not {name: why for name, why in refused.items() if why}


@pytest.mark.parametrize("version", VERSIONS)
def test_every_core_resource_validates_against_the_kubernetes_schemas(
    rendered: list[tuple[str, dict[str, Any]]], version: str
) -> None:
    core = [(source, d) for source, d in rendered if not crd_schemas.is_custom(d)]
    assert {d["kind"] for _, d in core} == {"Job", "Service", "ConfigMap"}
    for source, resource in core:
        try:
            kubernetes_validate.validate(resource, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            pytest.fail(f"{named(source, resource)} at {list(e.path)}: {e.message}")


def test_the_kubernetes_validation_is_strict() -> None:
    """A misspelt field fails: proof that the test above checks something."""
    broken = copy.deepcopy(jobset_jobs()[0])
    broken["spec"]["template"]["spec"]["initContainers"][0]["restartPolcy"] = "Always"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, VERSIONS[-1], strict=True)


def test_the_crd_validation_refuses_an_unknown_field_a_wrong_type_and_a_broken_rule() -> None:
    """Proof that the CRD test above checks something: each breach, planted in the JobSet, is named."""
    broken = copy.deepcopy(JOBSET)
    pod = broken["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    pod["initContainers"][0]["restartPolcy"] = "Always"  # pruned by the server: a plain init container, never done
    pod["volumes"][0]["emptyDir"]["sizeLimit"] = "a lot"  # int-or-string, and a quantity's pattern
    pod["containers"][0]["ports"] = [{"containerPort": 1}, {"containerPort": 1}]  # a list-map's key twice
    broken["spec"]["failurePolicy"]["maxRestarts"] = "3"
    broken["metadata"]["lables"] = {}  # ObjectMeta's
    # A CEL rule of the JobSet's: an in-order start and dependsOn exclude each other.
    broken["spec"]["startupPolicy"] = {"startupPolicyOrder": "InOrder"}
    broken["spec"]["replicatedJobs"][0]["dependsOn"] = [{"name": "slice", "status": "Ready"}]
    refused = "\n".join(crd_schemas.errors(broken))
    pod_path = "spec.replicatedJobs.0.template.spec.template.spec"
    for expected in (
        f"{pod_path}.initContainers.0: Additional properties are not allowed ('restartPolcy' was unexpected)",
        f"{pod_path}.volumes.0.emptyDir.sizeLimit: 'a lot' does not match",
        f"{pod_path}.containers.0.ports: duplicate keys",
        "spec.failurePolicy.maxRestarts: '3' is not of type 'integer'",
        "metadata: Additional properties are not allowed ('lables' was unexpected)",
        'spec: CEL rule "!(has(self.startupPolicy)',
    ):
        assert expected in refused, refused
    assert crd_schemas.errors(JOBSET) == []


def test_the_crd_schema_reads_as_the_api_server_does() -> None:
    """Pruning, preserved unknown fields, int-or-string, nullable, defaults and the CEL binding, on small schemas."""
    strict = crd_schemas.json_schema({"type": "object", "properties": {"a": {"type": "string"}}})
    preserving = crd_schemas.json_schema({"type": "object", "x-kubernetes-preserve-unknown-fields": True})
    assert crd_schemas.Validator(strict).is_valid({"a": "x"})
    assert not crd_schemas.Validator(strict).is_valid({"a": "x", "b": 1})
    assert crd_schemas.Validator(preserving).is_valid({"b": {"c": 1}})
    port = crd_schemas.Validator(
        crd_schemas.json_schema(
            {"x-kubernetes-int-or-string": True, "anyOf": [{"type": "integer"}, {"type": "string"}]}
        )
    )
    assert port.is_valid(8080) and port.is_valid("metrics")
    assert not port.is_valid(1.5) and not port.is_valid(None)
    nullable = crd_schemas.json_schema({"type": "string", "nullable": True})
    assert crd_schemas.Validator(nullable).is_valid(None)
    defaulted = {"type": "object", "properties": {"a": {"type": "object", "default": {}, "properties": {
        "b": {"type": "string", "default": "x"}}}}}  # fmt: skip
    assert crd_schemas.with_defaults({}, crd_schemas.json_schema(defaulted)) == {"a": {"b": "x"}}
    # Kubernetes escapes a field named as a CEL keyword, and binds a duration as a duration: as strings, "5s" would
    # sort after "15s" and GMP's rule that the timeout not exceed the interval would refuse a 5 s timeout.
    rules = {
        "type": "object",
        "properties": {
            "namespace": {"type": "string"},
            "timeout": {"type": "string", "format": "duration"},
            "interval": {"type": "string", "format": "duration"},
        },
        "x-kubernetes-validations": [
            {"rule": "!has(self.__namespace__)", "message": "no namespace"},
            {"rule": "self.timeout <= self.interval", "message": "timeout over interval"},
            {"rule": "self == oldSelf", "message": "a transition rule: not on a create"},
        ],
    }
    check = crd_schemas.Validator(crd_schemas.json_schema(rules), format_checker=crd_schemas.FORMATS)
    assert check.is_valid({"timeout": "5s", "interval": "15s"})
    assert [e.message for e in check.iter_errors({"timeout": "1m", "interval": "15s", "namespace": "x"})] == [
        "CEL rule '!has(self.__namespace__)' fails: no namespace",
        "CEL rule 'self.timeout <= self.interval' fails: timeout over interval",
    ]
    assert not check.is_valid({"timeout": "soon", "interval": "15s"}), "not a duration"


def test_the_crds_are_required(tmp_path: Path) -> None:
    """Without ../shared/reference/crds the CRD test fails, saying where it looked, rather than passing or skipping."""
    with pytest.raises(pytest.fail.Exception, match="no CRDs at"):
        crd_schemas.crds(tmp_path)


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
    assert security["runAsUser"] == security["runAsGroup"] == kubernetes.UID
    assert security["capabilities"] == {"drop": ["ALL"]} and security["allowPrivilegeEscalation"] is False
    assert security["seccompProfile"] == {"type": "RuntimeDefault"}
    assert set(SIDECAR["resources"]["requests"]) == set(SIDECAR["resources"]["limits"]) == {"cpu", "memory"}


def test_the_job_sends_to_the_socket_the_sidecar_listens_on() -> None:
    socket = Path(env_of(TRAIN)["TPUSCOPE_SOCKET"])
    assert socket == serve_options(SIDECAR, {}).socket == Path(kubernetes.SOCKET)
    volumes = {v["name"]: v for v in POD["spec"]["volumes"]}
    mounts = [{m["name"]: m["mountPath"] for m in c["volumeMounts"]} for c in (SIDECAR, TRAIN)]
    shared = [name for name in mounts[0] if mounts[1].get(name) == mounts[0][name]]
    assert len(shared) == 1, "one volume mounted at the same path in both containers"
    (volume,) = shared
    assert socket.parent == Path(mounts[0][volume]), "the socket lies on the shared volume"
    # In memory: the socket, and the profile spool beside it, with room for a trace at its cap and more.
    empty_dir = volumes[volume]["emptyDir"]
    assert empty_dir["medium"] == "Memory"
    assert int(empty_dir["sizeLimit"].removesuffix("Mi")) << 20 >= 2 * events.PROFILE_MAX_BYTES
    # Mode 0600 (the default) admits the sidecar's user and root: a root training container sends as it is.
    assert "--socket-mode" not in SIDECAR["args"]


def test_the_training_container_runs_as_its_image_says() -> None:
    """No securityContext but the sidecar's: most TPU images expect root, a pod-level fsGroup would have the kubelet
    chown the job's volumes, and no_new_privs would break an image's setuid tools."""
    for pod in [POD, *(r["template"]["spec"]["template"] for r in JOBSET["spec"]["replicatedJobs"])]:
        assert "securityContext" not in pod["spec"], "no pod-level securityContext"
        (train,) = pod["spec"]["containers"]
        assert "securityContext" not in train


def test_the_platform_sets_the_tpu_metrics_ports() -> None:
    """GKE's device plugin gives the training container TPU_RUNTIME_METRICS_PORTS, a port per chip: set here, it
    would override that list, and the sidecar reads the plugin's ports without it."""
    for pod in [POD, *(r["template"]["spec"]["template"] for r in JOBSET["spec"]["replicatedJobs"])]:
        for container in [*pod["spec"]["initContainers"], *pod["spec"]["containers"]]:
            assert "TPU_RUNTIME_METRICS_PORTS" not in {e["name"] for e in container["env"]}, container["name"]


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
    # The node's GKE topology (the bad-host ledger's roll-up), from the node's labels where the scrape is given them;
    # not by default: attaching them needs nodes' list and watch, without which pod discovery finds no target.
    assert "attachMetadata" not in monitor["spec"]
    for label, node_label in GKE_TOPOLOGY.items():
        meta = "__meta_kubernetes_node_label_" + re.sub(r"[./-]", "_", node_label)
        assert labels[label]["sourceLabels"] == [meta], label
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


def test_generate_with_a_teams_config_sets_the_sidecars_flags_from_its_thresholds(tmp_path: Path) -> None:
    """The sidecar judges a stuck process and asks the TPU cores' state at the thresholds the alerts fire at: a
    team's config reaches the manifests' sidecar flags, not only the rules (its values typed again here)."""
    config = tmp_path / "team.yaml"
    config.write_text("thresholds:\n  stall_seconds: 900\n  hang_seconds: 90\n")
    done = subprocess.run(
        [sys.executable, "-m", "tpuscope", "generate", "--config", str(config), "--root", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    for name in ("jobset.yaml", "job.yaml"):
        manifests = yaml.safe_load_all((tmp_path / "out/deploy/kubernetes" / name).read_text())
        (workload,) = [d for d in manifests if d and d["kind"] in ("JobSet", "Job")]
        spec = workload["spec"]
        pod = (spec["replicatedJobs"][0]["template"]["spec"] if "replicatedJobs" in spec else spec)["template"]
        (sidecar,) = [c for c in pod["spec"]["initContainers"] if c["name"] == "tpuscope"]
        assert {"--core-state-after=15m", "--hang-after=90s"} <= set(sidecar["args"]), sidecar["args"]
        options = serve_options(sidecar, {})
        assert (options.core_state_after, options.hang_after) == (900.0, 90.0)
    rules = (tmp_path / "out/deploy/prometheus/tpuscope-rules.yaml").read_text()
    stalled = r"\(tpuscope_last_progress_timestamp_seconds\) > (\d+)"
    assert re.findall(stalled, rules) == ["900"], "the stall alert at the team's threshold too"
    runbooks = (tmp_path / "out/docs/alerts.md").read_text()
    assert "15 min" in runbooks and "10 min" not in runbooks, "the runbooks at the team's thresholds too"
    # The committed manifests carry the built-in thresholds, as the sidecar's own defaults are.
    assert serve_options(SIDECAR, {}).core_state_after == 600.0 and "--core-state-after=10m" in SIDECAR["args"]
