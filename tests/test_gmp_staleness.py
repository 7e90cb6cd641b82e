"""The rules on a backend without staleness markers (GMP): real events, with series as GMP keeps them, in promtool.

On Google Cloud Managed Service for Prometheus a series that ends leaves no staleness marker: an instant selector
reads its last sample for the whole lookback (five minutes). promtool's input series that simply end, with no
``stale``, are what GMP's rule evaluator reads of the scraped series. (promtool still writes markers for the records
it evaluates itself, so a record read through another record lingers less here than on GMP; the GMP rules read every
record through ``last_over_time``, which markers do not change, so for them promtool is faithful.)

Each scenario is an event on a real cluster: the plain rules, given these series, page where the review of issue 51
found they do on GMP (so the test can fail); the GMP ClusterRules (tpuscope/alerts/staleness.py) do not; and a real
incident of the same kind still pages with the GMP rules.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from alert_cases import HOST, PLACE, W, s
from alert_cases_incidents import JOB_POD, job_exists, kube_state_metrics, worker
from conftest import require
from rule_cut import rules_behind

from tpuscope import catalog as c
from tpuscope import kubernetes
from tpuscope.alerts import staleness
from tpuscope.conventions import AlertName

ROOT = Path(__file__).resolve().parents[1]
PLAIN = yaml.safe_load((ROOT / "deploy/prometheus/tpuscope-rules.yaml").read_text())["groups"]
GMP = next(d for d in yaml.safe_load_all((ROOT / "deploy/kubernetes/gmp/clusterrules.yaml").read_text()) if d)["spec"][
    "groups"
]
SCRAPE = "15s"  # the ClusterPodMonitoring's
TEAM = {"namespace": "ml", "jobset": "llm"}
TARGET = {**HOST, **TEAM}


def firing(alert: AlertName) -> str:
    return f'count(ALERTS{{alertname="{alert}", alertstate="firing"}})'


def scenario(
    alert: AlertName, series: dict[str, str], fires_at: dict[str, bool], interval: str = SCRAPE
) -> dict[str, Any]:
    """A promtool test: ``series`` sampled every ``interval``, and at each time whether ``alert`` fires."""
    return {
        "interval": interval,
        "input_series": [{"series": name, "values": values} for name, values in series.items()],
        "promql_expr_test": [
            {
                "expr": firing(alert),
                "eval_time": at,
                "exp_samples": [{"labels": "{}", "value": 1}] if fires else [],
            }
            for at, fires in fires_at.items()
        ],
    }


def promtool_test(alert: AlertName, groups: list[dict[str, Any]], tests: list[dict[str, Any]], tmp: Path) -> str:
    """promtool's verdict ("" when every test passes) on ``tests`` against the rules ``alert`` reads."""
    rules = tmp / f"{alert}.{id(groups)}.rules.yaml"
    rules.write_text(yaml.safe_dump({"groups": rules_behind(alert, groups)}, sort_keys=False))
    file = tmp / f"{alert}.{id(groups)}.tests.yaml"
    # The evaluation interval of the GMP rules (GMP_RULE_INTERVAL), for both.
    file.write_text(
        yaml.safe_dump(
            {"rule_files": [str(rules)], "evaluation_interval": kubernetes.GMP_RULE_INTERVAL, "tests": tests},
            sort_keys=False,
        )
    )
    out = subprocess.run([require("promtool"), "test", "rules", str(file)], capture_output=True, text=True, timeout=300)
    return "" if out.returncode == 0 else out.stdout + out.stderr


def sidecar_target(instance: str, values: str) -> str:
    return s("up", **{**TARGET, "instance": instance}), values


# --- the scenarios: (alert, events as GMP keeps them, the plain rules' wrong answer, a real incident) ----------

# A sidecar of two fails three scrapes while its pod terminates, then leaves service discovery. On GMP its last
# up 0 answers for five more minutes: a share of sidecars down past the alert's for.
EXPORTER_LEFT = dict((sidecar_target("a:9478", "1x100"), sidecar_target("b:9478", "1x40 0 0 0")))
EXPORTER_OUTAGE = dict((sidecar_target("a:9478", "1x100"), sidecar_target("b:9478", "1x40 0x60")))

# A hung job (no progress since its start) killed at minute 11, before the stall's 10 minutes and 5 of for.
PROGRESS = {s(c.LAST_PROGRESS, **W, **TEAM): "0x100"}
STALL_KILLED = {**PROGRESS, s(c.WORKLOAD_PROCESSES, **W, **TEAM): "1x44"}
STALL_HUNG = {**PROGRESS, s(c.WORKLOAD_PROCESSES, **W, **TEAM): "1x100"}

# A job whose last checkpoint is from its start crashes at minute 67, its checkpoint older than the hour but not for
# the 10 minutes more the alert waits.
CHECKPOINT = {s(c.CHECKPOINT_LAST_SUCCESS, **W, **TEAM): "0x320"}
CHECKPOINT_CRASHED = {**CHECKPOINT, s(c.WORKLOAD_PROCESSES, **W, **TEAM): "1x268"}
CHECKPOINT_RUNNING = {**CHECKPOINT, s(c.WORKLOAD_PROCESSES, **W, **TEAM): "1x320"}

CASES = [
    (AlertName.EXPORTER_DOWN, EXPORTER_LEFT, {"15m30s": True}, EXPORTER_OUTAGE, {"14m": False, "16m": True}),
    (AlertName.WORKLOAD_STALLED, STALL_KILLED, {"15m30s": True}, STALL_HUNG, {"14m": False, "16m": True}),
    (AlertName.CHECKPOINT_STALE, CHECKPOINT_CRASHED, {"71m": True}, CHECKPOINT_RUNNING, {"69m": False, "71m": True}),
]


@pytest.mark.parametrize(("alert", "ended", "plain_misfires", "real", "pages"), CASES, ids=[str(c[0]) for c in CASES])
def test_an_ended_job_pages_on_gmp_with_the_plain_rules_and_not_with_the_gmp_rules_which_still_page_a_real_one(
    alert: AlertName,
    ended: dict[str, str],
    plain_misfires: dict[str, bool],
    real: dict[str, str],
    pages: dict[str, bool],
    tmp_path: Path,
) -> None:
    quiet = {at: False for at in plain_misfires}
    assert promtool_test(alert, PLAIN, [scenario(alert, ended, plain_misfires)], tmp_path) == "", (
        "the plain rules no longer misfire on these series: is the scenario still GMP's?"
    )
    assert promtool_test(alert, GMP, [scenario(alert, ended, quiet), scenario(alert, real, pages)], tmp_path) == ""


def test_a_jobset_deleted_while_it_runs_does_not_page_on_gmp_and_a_preempted_one_still_does(tmp_path: Path) -> None:
    """The JobSet deleted at minute 10, pods, Job and all, with kube-state-metrics scraped; and one preempted at
    minute 10, its Job still wanting its pods (they stay Pending). Every series ends without a marker."""
    labels = {**W, **JOB_POD, **PLACE}
    deleted = {**worker(10, 45, labels, gone="_"), **kube_state_metrics(45), **job_exists(10, 45, gone="_")}
    preempted = {**worker(10, 45, labels, gone="_"), **kube_state_metrics(45), **job_exists(45, 45, gone="_")}
    minutes = {f"{m}m": False for m in (15, 20, 25, 30, 35, 40, 45)}
    tests = [
        scenario(AlertName.WORKLOAD_DOWN, deleted, minutes, interval="1m"),
        scenario(AlertName.WORKLOAD_DOWN, preempted, {"20m": False, "30m": True, "45m": True}, interval="1m"),
    ]
    assert promtool_test(AlertName.WORKLOAD_DOWN, GMP, tests, tmp_path) == ""


def test_every_instant_read_of_a_series_is_bounded_and_nothing_else_is_touched() -> None:
    windows = staleness.Windows(scraped="1m", recorded="1m", kube_state_metrics="2m")
    expr = (
        'max by (workload) (tpuscope_workload_processes{job=~"tpuscope.*", x="up"}) > 0'
        " and on (job, instance) up == 0 unless kube_pod_status_ready == 0"
        " or rate(tpuscope_steps_total[5m]) or last_over_time(worker:tpuscope_x:y[1h])"
        " or tpuscope_last_step_timestamp_seconds offset 1h or worker:tpuscope_x:y"
        ' or label_replace(vector(1), "a", "tpuscope_steps_total", "", "")'
    )
    assert staleness.fresh(expr, windows.of) == (
        'max by (workload) (last_over_time(tpuscope_workload_processes{job=~"tpuscope.*", x="up"}[1m])) > 0'
        " and on (job, instance) last_over_time(up[1m]) == 0 unless last_over_time(kube_pod_status_ready[2m]) == 0"
        " or rate(tpuscope_steps_total[5m]) or last_over_time(worker:tpuscope_x:y[1h])"
        " or tpuscope_last_step_timestamp_seconds offset 1h or last_over_time(worker:tpuscope_x:y[1m])"
        ' or label_replace(vector(1), "a", "tpuscope_steps_total", "", "")'
    )
