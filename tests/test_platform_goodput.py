"""Issue 57: the platform owner's goodput, on series as kube-state-metrics and Kueue serve them (promtool cases).

- Scheduling goodput: a JobSet waits 20 minutes for admission (Kueue holds its Jobs suspended), its pods become
  ready, one pod is lost for 5 minutes and replaced: the recorded share reads what a hand ledger of the same
  timeline computes, within 0.5 pp, and so does a plain Job's; its time splits into queued, starting and
  recovering; the workload's product is that share times its runtime and program goodput.
- The fleet's chips: a node pool with no pod has all its chips idle; a chip two sources report counts once.
- Exclusion windows (``tpuscope exclusion``, run as a user runs it): the burn-rate page stays quiet for the
  workloads a window covers (by workload and by namespace) while it lasts, and fires for the others, and for a
  covered one once its window is over.

The series are in kube-state-metrics' v2 formats (internal/store/{job,pod,node}.go at v2.20.0) and Kueue's
(pkg/metrics/metrics.go at v0.19.2); their labels as the scrape adds them.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from alert_cases import s
from alert_cases_clusters import served
from alert_cases_incidents import timeline
from conftest import require

from tpuscope import alerts
from tpuscope import catalog as c
from tpuscope.conventions import (
    CHIPS_ALLOCATABLE,
    CHIPS_HEARD,
    CHIPS_IDLE,
    CHIPS_REQUESTED,
    ML_PRODUCTIVITY_GOODPUT,
    PROGRAM_GOODPUT,
    QUEUE_ADMISSION_WAIT,
    RUNTIME_GOODPUT,
    SCHEDULING,
    SCHEDULING_GOODPUT,
    SCHEDULING_STATES,
    SLO_EXCLUDED,
    AlertName,
)
from tpuscope.generator_config import GeneratorConfig

ROOT = Path(__file__).resolve().parent.parent
KSM = {"job": "kube-state-metrics", "instance": "10.0.0.9:8080"}
MINUTES = 130
LOOKED_AT = 120  # minutes after the JobSet's creation


def ksm(metric: str, **labels: str) -> str:
    return s(metric, **KSM, **labels)


def job(
    namespace: str,
    name: str,
    pods: int,
    suspended_until: int,
    owner: str = "",
    owner_kind: str = "JobSet",
    failed_at: int = MINUTES + 1,
) -> dict[str, str]:
    """A Job of ``pods`` pods created at minute 0, suspended by a queue until ``suspended_until``, owned by
    ``owner`` (a JobSet, or ``owner_kind``) if any, failed for good from ``failed_at``."""
    labels = {"namespace": namespace, "job_name": name}
    series = {
        ksm("kube_job_created", **labels): f"0x{MINUTES}",
        ksm("kube_job_spec_parallelism", **labels): f"{pods}x{MINUTES}",
        ksm("kube_job_spec_completions", **labels): f"{pods}x{MINUTES}",
        ksm("kube_job_status_suspended", **labels): timeline(MINUTES, lambda m: "1" if m < suspended_until else "0"),
        ksm("kube_job_complete", condition="true", **labels): f"0x{MINUTES}",
        ksm("kube_job_failed", condition="true", **labels): timeline(MINUTES, lambda m: str(int(m >= failed_at))),
    }
    kind, owner_name = (owner_kind, owner) if owner else ("", "")
    series[
        ksm(
            "kube_job_owner",
            owner_is_controller="true" if owner else "",
            owner_kind=kind,
            owner_name=owner_name,
            **labels,
        )
    ] = f"1x{MINUTES}"
    return series


def pod(namespace: str, name: str, job_name: str, created: int, ready_from: int, last: int = MINUTES) -> dict[str, str]:
    """A pod of Job ``job_name`` from minute ``created`` to ``last`` (deleted after: its series end), ready from
    ``ready_from``."""
    labels = {"namespace": namespace, "pod": name, "uid": f"uid-{name}"}

    def sampled(value: Callable[[int], int]) -> str:
        return timeline(
            MINUTES, lambda m: "_" if m < created or m > last + 1 else "stale" if m > last else str(value(m))
        )

    return {
        ksm("kube_pod_owner", owner_is_controller="true", owner_kind="Job", owner_name=job_name, **labels): sampled(
            lambda m: 1
        ),
        ksm("kube_pod_status_ready", condition="true", **labels): sampled(lambda m: int(m >= ready_from)),
        ksm("kube_pod_status_ready", condition="false", **labels): sampled(lambda m: int(m < ready_from)),
        ksm("kube_pod_status_phase", phase="Running", **labels): sampled(lambda m: 1),
    }


# The JobSet's timeline, minutes from its creation, and its hand ledger: ready from when every pod first is, less the
# 5 minutes a replacement pod took to be ready after a node took its predecessor.
ADMITTED, ALL_READY, LOST, RECOVERED = 20, 22, 60, 65
LEDGER = (LOOKED_AT - ALL_READY - (RECOVERED - LOST)) / LOOKED_AT
# A plain Job (no JobSet) of one pod, never queued, ready 3 minutes after its creation.
PLAIN_READY = 3
PLAIN_LEDGER = (LOOKED_AT - PLAIN_READY) / LOOKED_AT
FAILED = 40  # the minute mixed's first Job fails for good
RUNTIME, PROGRAM = 0.8, 0.5  # the JobSet's workload's productive share of its wall time, and its MFU


def scheduling_series() -> dict[str, str]:
    series = {}
    for index in (0, 1):
        name = f"llama-slice-{index}"
        series |= job("team-a", name, 2, ADMITTED, owner="llama")
        for worker in (0, 1):
            pod_name = f"{name}-{worker}-x"
            if (index, worker) == (1, 0):  # lost with its node: a replacement pod, ready 5 minutes later
                series |= pod("team-a", pod_name, name, ADMITTED, ALL_READY, last=LOST - 1)
                series |= pod("team-a", f"{name}-{worker}-y", name, LOST, RECOVERED)
            else:
                series |= pod("team-a", pod_name, name, ADMITTED, ALL_READY)
    series |= job("team-b", "sweep", 1, 0)
    series |= pod("team-b", "sweep-0-z", "sweep", 1, PLAIN_READY)
    # A CronJob's Job, never ready: no scheduling unit (not what the platform owner runs training in).
    series |= job("team-b", "nightly-29012", 1, 0, owner="nightly", owner_kind="CronJob")
    series |= pod("team-b", "nightly-29012-q", "nightly-29012", 0, MINUTES + 1)
    # A JobSet of two Jobs, the first failed for good at FAILED (its pod gone), the other's pod ready throughout: the
    # JobSet is no longer ready, though its one live Job is.
    for index, failed_at in ((0, FAILED), (1, MINUTES + 1)):
        name = f"mixed-slice-{index}"
        series |= job("team-c", name, 1, 0, owner="mixed", failed_at=failed_at)
        series |= pod("team-c", f"{name}-0-v", name, 0, 1, last=failed_at - 1 if index == 0 else MINUTES)
    # The JobSet's workload, served from the sidecars of its 4 pods once ready: each worker's productive share and
    # its model FLOPs against its chips' peak.
    workload = {"namespace": "team-a", "jobset": "llama", "controller_kind": "Job", "workload": "llama-run"}
    for worker in range(4):
        labels = {**workload, "controller": f"llama-slice-{worker // 2}", "worker": str(worker)}
        where = {**labels, "instance": f"h{worker}:9478"}
        series |= {
            name: " ".join(["_"] * ALL_READY + values.split(" ")[: MINUTES + 1 - ALL_READY])
            for name, values in served(labels, 0, MINUTES, MINUTES, f"h{worker}:9478", io_wait=1 - RUNTIME).items()
        }
        series[s(c.PEAK_FLOPS, accelerator="v5e", **where)] = " ".join(
            ["_"] * ALL_READY + ["1e15"] * (MINUTES + 1 - ALL_READY)
        )
        series[s(c.MODEL_FLOPS, **where)] = " ".join(
            ["_"] * ALL_READY + [f"{PROGRAM * 1e15 * 60 * m:g}" for m in range(MINUTES + 1 - ALL_READY)]
        )
    # Kueue's admission wait of its ClusterQueue: 2 workloads admitted in the hour, after 1,200 s and 60 s.
    queue = {"cluster_queue": "team-a-cq", "priority_class": "", "replica_role": "leader"}
    series[s("kueue_admission_wait_time_seconds_sum", job="kueue", **queue)] = timeline(
        MINUTES, lambda m: "0" if m < ADMITTED else "1260"
    )
    series[s("kueue_admission_wait_time_seconds_count", job="kueue", **queue)] = timeline(
        MINUTES, lambda m: "0" if m < ADMITTED else "2"
    )
    return series


def within(expr: str, expected: float, tolerance: float) -> dict[str, Any]:
    """A check that ``expr`` reads ``expected`` within ``tolerance`` at the ledger's minute."""
    check = f"min(abs({expr} - {expected!r}) <= bool {tolerance!r})"
    return {"expr": check, "eval_time": f"{LOOKED_AT}m", "exp_samples": [{"labels": "{}", "value": 1}]}


def state_shares() -> list[dict[str, Any]]:
    """Every evaluation since the JobSet's creation is in one state: 20 queued, 2 starting, 5 recovering."""
    evaluations = LOOKED_AT + 1
    shares = {"queued": 20 / evaluations, "starting": 2 / evaluations, "recovering": 5 / evaluations}
    unit = f'{SCHEDULING}{{{{state="{{}}", controller="llama"}}}}'
    return [within(f"avg_over_time({unit.format(state)}[3d])", share, 1e-9) for state, share in shares.items()]


def product() -> list[dict[str, Any]]:
    """The JobSet's workload: its scheduling goodput is its JobSet's, its runtime and program goodput what its
    sidecars served (the program a little under: the first 5-minute rates of its FLOPs extrapolate from a minute),
    and the product what the hand ledger's share times those two gives."""
    factor = {
        name: f'workload:{name}3d{{workload="llama-run"}}'
        for name in (SCHEDULING_GOODPUT, RUNTIME_GOODPUT, PROGRAM_GOODPUT, ML_PRODUCTIVITY_GOODPUT)
    }
    return [
        within(factor[SCHEDULING_GOODPUT], LEDGER, 0.005),
        within(factor[RUNTIME_GOODPUT], RUNTIME, 1e-9),
        within(factor[PROGRAM_GOODPUT], PROGRAM, 0.015),
        within(factor[ML_PRODUCTIVITY_GOODPUT], LEDGER * RUNTIME * PROGRAM, 0.01),
    ]


def scheduling_test() -> dict[str, Any]:
    ready = f'avg_over_time({SCHEDULING}{{{{state="ready", controller="{{}}"}}}}[3d])'
    return {
        "name": "scheduling goodput against a hand ledger",
        "interval": "1m",
        "input_series": [{"series": k, "values": v} for k, v in scheduling_series().items()],
        "promql_expr_test": [
            within(ready.format("llama"), LEDGER, 0.005),
            within(ready.format("sweep"), PLAIN_LEDGER, 0.005),
            within(f'namespace:{SCHEDULING_GOODPUT}3d{{namespace="team-a"}}', LEDGER, 0.005),
            {  # a CronJob's Job is no unit
                "expr": f'count ({SCHEDULING}{{controller=~"nightly.*"}}) or vector(0)',
                "eval_time": f"{LOOKED_AT}m",
                "exp_samples": [{"labels": "{}", "value": 0}],
            },
            {  # a JobSet one of whose Jobs failed is not ready while its other Job lives: it recovers (JobSet restarts)
                "expr": f'sum by (state) ({SCHEDULING}{{controller="mixed"}})',
                "eval_time": f"{FAILED + 10}m",
                "exp_samples": [
                    {"labels": f'{{state="{state}"}}', "value": int(state == "recovering")}
                    for state in SCHEDULING_STATES
                ],
            },
            *state_shares(),
            {  # Kueue's mean wait per ClusterQueue: its histograms name no workload
                "expr": f"{QUEUE_ADMISSION_WAIT}",
                "eval_time": "40m",
                "exp_samples": [
                    {"labels": f'{{__name__="{QUEUE_ADMISSION_WAIT}", cluster_queue="team-a-cq"}}', "value": 630}
                ],
            },
            *product(),
        ],
    }


@pytest.fixture(scope="module")
def rules(module_tmp: Path) -> Path:
    path = module_tmp / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": alerts.rule_groups(GeneratorConfig())}, sort_keys=False))
    return path


def promtool(rule_files: list[Path], tests: list[dict[str, Any]], directory: Path) -> None:
    file = directory / "platform.tests.yaml"
    document = {"rule_files": [str(p) for p in rule_files], "evaluation_interval": "1m", "tests": tests}
    file.write_text(yaml.safe_dump(document, sort_keys=False))
    out = subprocess.run([require("promtool"), "test", "rules", str(file)], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-2000:]


def replicated(series: dict[str, str]) -> dict[str, str]:
    """``series`` with kube-state-metrics' served twice, by a second replica (HA, or a rollout's old and new pod)."""
    second = KSM["instance"].replace(".9:", ".10:")
    return series | {
        name.replace(KSM["instance"], second): values for name, values in series.items() if "kube_" in name
    }


@pytest.mark.parametrize("replicas", [1, 2])
def test_scheduling_goodput_reads_the_hand_ledger_within_half_a_point(
    replicas: int, rules: Path, tmp_path: Path
) -> None:
    assert abs(LEDGER - 93 / 120) < 1e-9 and 0.0 < PLAIN_LEDGER < 1.0
    test = scheduling_test()
    if replicas == 2:
        test["input_series"] = [{"series": k, "values": v} for k, v in replicated(scheduling_series()).items()]
    promtool([rules], [test], tmp_path)


def chip_series() -> dict[str, str]:
    series = {}
    for pool, nodes in (("busy", ("busy-0", "busy-1")), ("idle", ("idle-0", "idle-1"))):
        for node in nodes:
            pool_labels = {
                "label_cloud_google_com_gke_nodepool": pool,
                "label_cloud_google_com_gke_tpu_topology": "2x2",
                "label_cloud_google_com_gke_tpu_accelerator": "tpu-v5-lite-podslice",
            }
            series[ksm("kube_node_labels", node=node, **pool_labels)] = "1x10"
            for resource, unit, value in (("google_com_tpu", "integer", 4), ("cpu", "core", 224)):
                series[ksm("kube_node_status_allocatable", node=node, resource=resource, unit=unit)] = f"{value}x10"
    for index, node in enumerate(("busy-0", "busy-1")):
        labels = {"namespace": "team-a", "pod": f"p{index}", "uid": f"u{index}"}
        series[ksm("kube_pod_status_phase", phase="Running", **labels)] = "1x10"
        for resource, unit, value in (("google_com_tpu", "integer", 4), ("cpu", "core", 8)):
            requests = ksm(
                "kube_pod_container_resource_requests",
                container="jax",
                node=node,
                resource=resource,
                unit=unit,
                **labels,
            )
            series[requests] = f"{value}x10"
    # tpuscope's sidecar on busy-0 hears its 4 chips, each from the runtime and from the device plugin.
    for device in range(4):
        for source in (c.LIBTPU, c.GKE_DEVICE_PLUGIN):
            series[s(c.DUTY_CYCLE, node="busy-0", device=str(device), accelerator="v5e", source=source)] = "0.9x10"
    return series


def pool_samples(record: str, chips: dict[str, float], labelled: bool) -> dict[str, Any]:
    """What ``record`` reads per pool (all in one unnamed pool where the nodes' labels are not served)."""
    samples = []
    for pool, value in chips.items():
        labels = {"__name__": record, "resource": "google_com_tpu"}
        if labelled:
            labels |= {
                "label_cloud_google_com_gke_nodepool": pool,
                "label_cloud_google_com_gke_tpu_accelerator": "tpu-v5-lite-podslice",
                "label_cloud_google_com_gke_tpu_topology": "2x2",
            }
        samples.append(
            {"labels": "{" + ", ".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}", "value": value}
        )
    return {"expr": record, "eval_time": "5m", "exp_samples": samples}


@pytest.mark.parametrize("labelled", [True, False])
def test_a_node_pool_with_no_pod_has_all_its_chips_idle(labelled: bool, rules: Path, tmp_path: Path) -> None:
    """Two pools of 2 nodes of 4 chips, one running 2 pods of 4 chips, the other none; one sidecar hears its 4. Where
    kube-state-metrics serves no node labels (no allowlist given), every chip is counted, in one pool."""
    series = chip_series()
    if not labelled:
        series = {name: values for name, values in series.items() if not name.startswith("kube_node_labels")}
    pools: list[dict[str, float]] = [{"busy": 8, "idle": 8}, {"busy": 8}, {"busy": 0, "idle": 8}, {"busy": 4}]
    if not labelled:
        pools = [{"": sum(chips.values())} for chips in pools]
    test = {
        "name": "the fleet's chips",
        "interval": "1m",
        "input_series": [{"series": k, "values": v} for k, v in replicated(series).items()],
        "promql_expr_test": [
            pool_samples(record, chips, labelled)
            for record, chips in zip((CHIPS_ALLOCATABLE, CHIPS_REQUESTED, CHIPS_IDLE, CHIPS_HEARD), pools, strict=True)
        ],
    }
    promtool([rules], [test], tmp_path)


def tpuscope_on_path() -> dict[str, str]:
    """The environment with this interpreter's scripts first on PATH: ``tpuscope`` as a user's install has it."""
    return {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}


EPOCH = datetime(1970, 1, 1, tzinfo=UTC)  # promtool's tests start at Unix time 0


def exclusion_file(directory: Path, name: str, start: int, end: int, *scope: str) -> Path:
    """``tpuscope exclusion`` run as a user runs it, for minutes ``start`` to ``end`` of the test."""
    out = directory / f"{name}.yaml"
    begin, finish = ((EPOCH + timedelta(minutes=m)).isoformat() for m in (start, end))
    command = [sys.executable, "-m", "tpuscope", "exclusion", f"--start={begin}", f"--end={finish}"]
    run = subprocess.run(
        [*command, "--reason=maintenance", *scope, f"--out={out}"], capture_output=True, text=True, cwd=ROOT
    )
    assert run.returncode == 0, run.stderr
    return out


BURN = 200  # minutes every workload below burns all of its time


def burning(
    rules: Path, workloads: dict[tuple[str, str, str], Path | None], tmp_path: Path, checks: dict[int, list[str]]
) -> None:
    """Each workload (namespace, JobSet, name) burns all of its time; at each minute of ``checks`` the burn-rate page
    fires for those workloads alone, with the rules of every exclusion given."""
    series = {}
    for index, (namespace, jobset, workload) in enumerate(workloads):
        labels = {"namespace": namespace, "jobset": jobset, "workload": workload}
        series |= served({k: v for k, v in labels.items() if v}, 0, BURN, BURN, f"h{index}:9478", io_wait=1.0)
    firing = f'ALERTS{{alertname="{AlertName.GOODPUT_BUDGET_BURN}", alertstate="firing", severity="critical"}}'
    test = {
        "name": "exclusion windows",
        "interval": "1m",
        "input_series": [{"series": k, "values": v} for k, v in series.items()],
        "promql_expr_test": [
            {
                "expr": f"count by (workload) ({firing})",
                "eval_time": f"{at}m",
                "exp_samples": [{"labels": f'{{workload="{name}"}}', "value": 1} for name in names],
            }
            for at, names in checks.items()
        ],
    }
    promtool([rules, *{path for path in workloads.values() if path}], [test], tmp_path)


def test_an_exclusion_window_silences_the_burn_it_covers_and_no_other(rules: Path, tmp_path: Path) -> None:
    whole, first_hour = (0, BURN), (0, 60)

    def excluded(name: str, window: tuple[int, int], *scope: str) -> Path:
        return exclusion_file(tmp_path, name, *window, *scope)

    in_jobset = excluded("e", whole, "--namespace=team-e", "--jobset=js-e", "--workload=in-jobset")
    workloads = {  # namespace, JobSet, workload: the exclusion that covers it, if any
        ("team-a", "js-a", "by-name-in-namespace"): excluded(
            "a", whole, "--namespace=team-a", "--workload=by-name-in-namespace"
        ),
        ("team-b", "js-b", "by-namespace"): excluded("b", whole, "--namespace=team-b"),
        ("team-c", "js-c", "after-its-window"): excluded(
            "c", first_hour, "--namespace=team-c", "--workload=after-its-window"
        ),
        ("team-e", "js-e", "in-jobset"): in_jobset,
        ("team-e", "js-e2", "in-jobset"): None,  # the same name in another JobSet: not covered
        ("team-f", "js-f", "by-jobset"): excluded("f", whole, "--namespace=team-f", "--jobset=js-f"),
        ("", "", "anywhere"): excluded("g", whole, "--workload=anywhere"),  # outside Kubernetes
        ("team-d", "js-d", "not-covered"): None,
    }
    # At 150 minutes the 2-hour window holds 30 excluded minutes of after-its-window's and 90 not: all bad.
    covered_not = ["after-its-window", "in-jobset", "not-covered"]
    burning(rules, workloads, tmp_path, {150: covered_not, 195: covered_not})


def test_an_exclusion_of_the_fleet_silences_every_burn(rules: Path, tmp_path: Path) -> None:
    fleet = exclusion_file(tmp_path, "fleet", 0, BURN)
    workloads = {("team-a", "js-a", "one"): fleet, ("", "", "two"): fleet}
    burning(rules, workloads, tmp_path, {150: [], 195: []})
    burning(rules, {("team-a", "js-a", "one"): None}, tmp_path, {150: ["one"]})  # and without it, it fires


def test_the_exclusion_command_of_the_docs_writes_a_rule_promtool_and_kubernetes_accept(tmp_path: Path) -> None:
    """docs/goodput.md's command, run exactly as written: a PrometheusRule whose rules promtool checks clean and
    which records the exclusion for the namespace it names, from its start to its end."""
    docs = (ROOT / "docs/goodput.md").read_text()
    section = docs[docs.index("## Exclusions") :]
    (command,) = re.findall(r"```sh\n(tpuscope exclusion .*?)\n```", section)
    run = subprocess.run(command, shell=True, capture_output=True, text=True, cwd=ROOT, env=tpuscope_on_path())
    assert run.returncode == 0, run.stderr
    document = yaml.safe_load(run.stdout)
    assert document["kind"] == "PrometheusRule" and document["apiVersion"] == "monitoring.coreos.com/v1"
    (rule,) = document["spec"]["groups"][0]["rules"]
    assert rule["record"] == SLO_EXCLUDED and rule["labels"] == {"namespace": "team-a", "reason": "maintenance"}
    start, end = (datetime(2026, 12, 1, hour, tzinfo=UTC).timestamp() for hour in (2, 4))
    assert f">= {start:.0f} < {end:.0f}" in rule["expr"]
    rules = tmp_path / "exclusion.yaml"
    rules.write_text(yaml.safe_dump({"groups": document["spec"]["groups"]}))
    check = subprocess.run([require("promtool"), "check", "rules", str(rules)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr


@pytest.mark.parametrize(
    ("arguments", "said"),
    [
        (["--start=2026-12-01T02:00", "--end=2026-12-01T04:00Z"], "with their zone"),
        (["--start=2026-12-01T04:00Z", "--end=2026-12-01T02:00Z"], "no later than it starts"),
        (["--start=2026-12-01T02:00Z", "--end=2026-12-01T04:00Z", "--jobset=llama"], "give --namespace too"),
    ],
)
def test_a_wrong_exclusion_is_said_at_once_and_writes_nothing(arguments: list[str], said: str, tmp_path: Path) -> None:
    out = tmp_path / "rule.yaml"
    command = [sys.executable, "-m", "tpuscope", "exclusion", *arguments, "--reason=maintenance", f"--out={out}"]
    run = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    assert run.returncode == 2 and said in run.stderr and not out.exists(), run.stderr
