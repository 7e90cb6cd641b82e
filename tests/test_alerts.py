"""The alert and recording rules and the Alertmanager configuration: linted, unit-tested, routed."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from alert_cases import CASES as ONE_BY_ONE
from alert_cases import REGRESSION_STEPS, REGRESSION_SUM, Case, s
from alert_cases_clusters import CASES as CLUSTERS
from alert_cases_divergence import CASES as DIVERGENCE
from alert_cases_divergence import READINGS as DIVERGENCE_READINGS
from alert_cases_freshness import CASES as FRESHNESS
from alert_cases_incidents import CASES as INCIDENTS
from alert_cases_incidents import READINGS
from alert_cases_nodes import CASES as NODES
from alertmanager import AlertmanagerServer, Webhook
from conftest import require
from rule_cut import reads, rules_behind

from tpuscope import alerts, catalog, conventions, durations, positions
from tpuscope.alerts import recording
from tpuscope.alerts.causes import CAUSES, INHIBITIONS
from tpuscope.alerts.rules import slo_windows
from tpuscope.conventions import (
    ALERT_PREFIX,
    BAD_RATE,
    BADPUT_RATIO,
    HANG_ELSEWHERE,
    PROFILE_FRESH,
    WALL_ALL_RATE,
    AlertName,
)
from tpuscope.fleetsim.rules import scale_expr
from tpuscope.generator_config import GeneratorConfig
from tpuscope.promql import WORKLOAD
from tpuscope.testing import bench as testing_bench
from tpuscope.testing.prometheus import PrometheusServer, target_of
from tpuscope.testing.waiting import wait_for
from tpuscope.thresholds import Thresholds
from tpuscope.tracing import profile_sampler as profiles
from tpuscope.workload.sidecar import SidecarProcess

pytestmark = pytest.mark.long

ROOT = Path(__file__).resolve().parents[1]
RULES = ROOT / "deploy/prometheus/tpuscope-rules.yaml"
CASES = ONE_BY_ONE + FRESHNESS + INCIDENTS + CLUSTERS + DIVERGENCE + NODES
ALERTMANAGER = ROOT / "deploy/alertmanager/alertmanager.yml"


def generated_alerts() -> list[dict[str, Any]]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"] if "alert" in rule]


def run(*command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, capture_output=True, text=True, timeout=600)


def test_promtool_lints_the_rules_clean() -> None:
    out = run(require("promtool"), "check", "rules", "--lint=all", "--lint-fatal", str(RULES))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout


def test_rules_follow_the_mixin_conventions() -> None:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    for rule in (r for g in groups for r in g["rules"] if "record" in r):
        level, metric, operation = rule["record"].split(":")
        assert level and metric.startswith("tpuscope_") and operation, rule["record"]
    for rule in generated_alerts():
        assert rule["alert"].startswith(ALERT_PREFIX) and rule["alert"][len(ALERT_PREFIX)].isupper()
        assert rule["labels"]["severity"] in ("critical", "warning", "info")
        annotations = rule["annotations"]
        assert set(annotations) == {"summary", "description", "runbook_url", "dashboard_url"}
        assert "{{" not in annotations["summary"], "the summary is static"
        assert "{{" in annotations["description"] or "absent" in rule["expr"], "the description says which"
        assert annotations["runbook_url"].endswith("#" + rule["alert"].lower())
        assert f"## {rule['alert']}" in (ROOT / "docs/alerts.md").read_text()
    assert {rule["alert"] for rule in generated_alerts()} == set(AlertName), "AlertName lists every alert, no other"


def promtool_tests(cases: list[Case], rules: Path) -> dict[str, Any]:
    by_name = {}
    for rule in generated_alerts():
        by_name.setdefault(rule["alert"], {})[rule["labels"]["severity"]] = rule
    tests = []
    for case in cases:
        name = str(case.alert)  # YAML cannot write an enum
        expected = []
        firing = ((case.severity, case.description), *case.also) if case.severity else ()
        for severity, description in firing:
            annotations = dict(by_name[name][severity]["annotations"])
            annotations["description"] = description
            annotations["dashboard_url"] = annotations["dashboard_url"].replace(
                "{{ $labels.workload }}", case.labels.get("workload", "")
            )
            expected.append({"exp_labels": {"severity": severity, **case.labels}, "exp_annotations": annotations})
        tests.append(
            {
                "name": f"{name} {case.severity or 'quiet'}",
                "interval": "1m",
                "input_series": [{"series": series, "values": values} for series, values in case.series.items()],
                "alert_rule_test": [{"eval_time": case.eval_time, "alertname": name, "exp_alerts": expected}],
            }
        )
    return {"rule_files": [str(rules)], "evaluation_interval": "1m", "tests": tests}


# promtool evaluates every rule at each evaluation interval up to a case's time: the cases that need a day of
# history (the slow burn-rate pairs) are evaluated every 5 minutes, the rest every minute.
LONG = durations.parse("6h")


def test_every_alert_fires_with_exact_labels_and_annotations_and_stays_quiet_when_it_should(tmp_path: Path) -> None:
    """Each alert's cases against its own rules (see rules_behind), every minute, the long ones every 5 minutes."""
    groups = yaml.safe_load(RULES.read_text())["groups"]
    for alert in sorted({case.alert for case in CASES}):
        rules = tmp_path / f"{alert}.rules.yaml"
        rules.write_text(yaml.safe_dump({"groups": rules_behind(alert, groups)}, sort_keys=False))
        for name, interval, cases in (
            ("short", "1m", [c for c in CASES if c.alert == alert and durations.parse(c.eval_time) < LONG]),
            ("long", "5m", [c for c in CASES if c.alert == alert and durations.parse(c.eval_time) >= LONG]),
        ):
            if not cases:
                continue
            tests = tmp_path / f"{alert}.{name}.yaml"
            tests.write_text(
                yaml.safe_dump({**promtool_tests(cases, rules), "evaluation_interval": interval}, sort_keys=False)
            )
            out = run(require("promtool"), "test", "rules", str(tests))
            assert out.returncode == 0, f"{alert}, {name} cases: " + out.stdout[-6000:] + out.stderr[-3000:]


def test_each_alerts_rules_are_the_whole_files_rules_it_reads() -> None:
    """rules_behind keeps what an alert reads, in its expression and its description's queries, through records of
    records, and nothing else."""
    groups = yaml.safe_load(RULES.read_text())["groups"]
    straggler = rules_behind(AlertName.STRAGGLER, groups)
    kept = {rule.get("record") or rule["alert"] for group in straggler for rule in group["rules"]}
    assert AlertName.STRAGGLER in kept and AlertName.WORKLOAD_STALLED not in kept, kept
    assert 1 < len(kept) < sum(len(group["rules"]) for group in groups) / 2, kept
    recorded = {rule["record"]: rule["expr"] for group in groups for rule in group["rules"] if "record" in rule}
    for group in straggler:  # every record an expression kept reads is kept, and only such records
        for rule in group["rules"]:
            assert all(name in kept for name in reads(rule) if name in recorded), rule
    reached = {name for group in straggler for rule in group["rules"] for name in reads(rule) if name in recorded}
    assert kept - {AlertName.STRAGGLER} == reached, kept


def test_the_recording_rules_read_what_they_should_under_failed_scrapes_and_long_outages(tmp_path: Path) -> None:
    tests = []
    for reading in READINGS + DIVERGENCE_READINGS:
        labels = "{" + ", ".join(f'{k}="{v}"' for k, v in reading.labels.items()) + "}"
        expected = [{"labels": labels, "value": reading.value}]
        tests.append(
            {
                "name": reading.why,
                "interval": "1m",
                "input_series": [{"series": name, "values": values} for name, values in reading.series.items()],
                "promql_expr_test": [{"expr": reading.expr, "eval_time": reading.eval_time, "exp_samples": expected}],
            }
        )
    readings = tmp_path / "readings.yaml"
    readings.write_text(yaml.safe_dump({"rule_files": [str(RULES)], "evaluation_interval": "1m", "tests": tests}))
    out = run(require("promtool"), "test", "rules", str(readings))
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]


# Where workers can be stuck, (step, phase), and workloads of a worker per letter: one worker elsewhere, two, a tie,
# all at one place, every one at its own, one worker alone, before the first step.
STUCK_AT = {"A": ("41", "sync"), "B": ("41", "io"), "C": ("40", "sync"), "D": ("", "compile")}
LAYOUTS = ("AABA", "AABC", "AABB", "AAAA", "ABCD", "A", "AABBC", "DDA", "ABCDD", "AAABBC")


def test_the_rules_name_the_workers_stuck_elsewhere_as_tpuscope_hangs_does(tmp_path: Path) -> None:
    """Issue 54: the recorded verdict and positions.elsewhere (what ``tpuscope hangs`` reads the sidecars' logs
    with) name the same workers, over workloads of each shape; each worker's frames differ, and count for nothing."""
    tests = []
    for layout in LAYOUTS:
        where = {str(worker): STUCK_AT[letter] for worker, letter in enumerate(layout)}
        series = {}
        for worker, (step, phase) in where.items():
            host = {"instance": f"h{worker}:9478", "worker": worker, "workload": "w"}
            labels = {"step": step, "phase": phase, "frames": f"wait (job.py:{worker})", **host}
            series[s(catalog.STUCK_POSITION, **labels)] = "1x5"
        named = positions.elsewhere(where)
        tests.append(
            {
                "name": layout,
                "interval": "1m",
                "input_series": [{"series": name, "values": values} for name, values in series.items()],
                "promql_expr_test": [
                    {
                        "expr": f"group by (worker) ({HANG_ELSEWHERE})",
                        "eval_time": "2m",
                        "exp_samples": [{"labels": f'{{worker="{worker}"}}', "value": 1} for worker in named],
                    }
                ],
            }
        )
    shapes = {len(positions.elsewhere({i: STUCK_AT[x] for i, x in enumerate(layout)})) for layout in LAYOUTS}
    assert {0, 1, 2} <= shapes, "nobody named, one, several"
    rules = tmp_path / "hang.rules.yaml"
    rules.write_text(yaml.safe_dump({"groups": [{"name": "hang", "rules": recording.hang_rules()}]}))
    cases = tmp_path / "hang.yaml"
    cases.write_text(yaml.safe_dump({"rule_files": [str(rules)], "evaluation_interval": "1m", "tests": tests}))
    out = run(require("promtool"), "test", "rules", str(cases))
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]


def test_the_goodput_ratios_read_each_workloads_two_terms_once_and_no_workers_series() -> None:
    """Issue 35: the ratios summed the per-worker unbooked series four times over windows up to 3 days (72 M
    samples a cycle at 1,000 hosts). Each window's ratio now reads two per-workload series, once each; the cost
    itself is measured by `tpuscope bench rule-cost` (docs/bench.md)."""
    groups = yaml.safe_load(RULES.read_text())["groups"]
    recorded = {rule["record"]: rule["expr"] for group in groups for rule in group["rules"] if "record" in rule}
    ratios = {name: expr for name, expr in recorded.items() if name.startswith(BADPUT_RATIO)}
    assert len(ratios) == len(slo_windows(1 - Thresholds().goodput_objective))
    for name, expr in ratios.items():
        window = name.removeprefix(BADPUT_RATIO)
        assert expr == f"sum_over_time({BAD_RATE}[{window}]) / sum_over_time({WALL_ALL_RATE}[{window}])", name
    for term in (BAD_RATE, WALL_ALL_RATE):  # the terms are per workload: no worker's series reaches a ratio
        assert "sum by (namespace, jobset, workload)" in recorded[term] or "+ on (" in recorded[term], term


def test_every_alert_names_its_one_cause_and_every_inhibition_relates_alerts_that_exist() -> None:
    assert set(CAUSES) == set(AlertName)
    for rule in INHIBITIONS:
        assert rule.source and rule.targets and not set(rule.source) & set(rule.targets), rule
    text = (ROOT / "docs/alerts.md").read_text()
    assert "## One cause, one notification" in text
    for name, cause in CAUSES.items():
        assert f"**The cause it stands for:** {cause}." in text, name


def test_a_step_time_baseline_is_three_hours_long_whatever_the_evaluation_interval(tmp_path: Path) -> None:
    """2.5 hours of history, then steps twice as slow: no baseline yet, at Prometheus' 30 s evaluation
    interval as at promtool's 1 m (a count of 180 recorded samples was 3 hours at 1 m, 90 minutes at 30 s)."""
    history = {REGRESSION_STEPS: "0+60x240", REGRESSION_SUM: "0+60x150 9060+120x90"}
    for interval in ("30s", "1m"):
        quiet = Case(AlertName.STEP_TIME_REGRESSION, None, "235m", history)
        tests = tmp_path / f"baseline-{interval}.yaml"
        tests.write_text(yaml.safe_dump({**promtool_tests([quiet], RULES), "evaluation_interval": interval}))
        out = run(require("promtool"), "test", "rules", str(tests))
        assert out.returncode == 0, f"at {interval}: " + out.stdout[-3000:] + out.stderr[-2000:]


def test_every_alert_and_severity_has_a_firing_case_and_a_quiet_one() -> None:
    """Computed from the generated rules: a new alert without unit tests fails here."""
    needed = {(rule["alert"], rule["labels"]["severity"]) for rule in generated_alerts()}
    firing = {(case.alert, case.severity) for case in CASES if case.severity}
    quiet = {case.alert for case in CASES if not case.severity}
    assert needed - firing == set(), "alerts with no case where they fire"
    assert {name for name, _ in needed} - quiet == set(), "alerts with no case where they must stay quiet"


def test_a_device_profile_counts_for_three_of_the_jobs_default_periods_in_real_and_simulated_time() -> None:
    """A capture is fresh for three of the periods its job exports; from a job too old to export one, for three of
    the default periods. The rules may not import the in-job library, which sets the default: this ties the two,
    and the catalogue's help to both. The fleet simulator compresses the constant window with the rest of time,
    and leaves the exported period, in the job's own seconds, as it is (not its factor either)."""
    fresh_periods, fresh_seconds = conventions.PROFILE_FRESH_PERIODS, conventions.PROFILE_FRESH_SECONDS
    assert fresh_periods * profiles.DEFAULT_PERIOD == fresh_seconds
    help_says = f"fresh for {fresh_periods} of them; from a job too old to say it, for "
    assert help_says + f"{durations.human(fresh_seconds)}." in catalog.PROFILE_PERIOD.help
    (fresh,) = (rule["expr"] for rule in recording.profile_rules(Thresholds()) if rule["record"] == PROFILE_FRESH)
    period = f"> time() - {catalog.PROFILE_PERIOD.name} * {fresh_periods} "
    assert period in fresh
    assert f"> time() - {fresh_seconds} unless {catalog.PROFILE_PERIOD.name}" in fresh
    simulated = scale_expr(fresh, 10)
    assert period in simulated
    assert f"> time() - {fresh_seconds / 10:g} unless {catalog.PROFILE_PERIOD.name}" in simulated


def test_a_device_profile_counts_once_it_is_a_mean_of_the_configured_steps() -> None:
    """Issue 36: the rules judge a worker's profile once the sidecar's mean holds ``profile_min_steps`` steps, the
    threshold from the one config; a sidecar that does not say how many is judged as before (``unless``)."""
    thresholds = Thresholds(profile_min_steps=7)
    (fresh,) = (rule["expr"] for rule in recording.profile_rules(thresholds) if rule["record"] == PROFILE_FRESH)
    too_few = f" unless on ({WORKLOAD}, {recording.WORKER}) {catalog.PROFILE_STEPS.name} < 7"
    assert fresh.endswith(too_few)
    with pytest.raises(ValueError, match="profile_min_steps"):
        Thresholds(profile_min_steps=0)


def test_amtool_accepts_the_configuration_and_routes_pages_and_tickets() -> None:
    amtool = require("amtool")
    out = run(amtool, "check-config", str(ALERTMANAGER))
    assert out.returncode == 0, out.stdout + out.stderr
    for labels, receiver in (
        (["severity=critical", f"alertname={AlertName.WORKLOAD_STALLED}", "workload=w"], "page"),
        (["severity=warning", f"alertname={AlertName.INPUT_BOUND}", "workload=w"], "ticket"),
        (["severity=info", f"alertname={ALERT_PREFIX}Something"], "null"),
    ):
        routed = run(
            amtool,
            "config",
            "routes",
            "test",
            f"--config.file={ALERTMANAGER}",
            "--verify.receivers=" + receiver,
            *labels,
        )
        assert routed.returncode == 0, f"{labels}: {routed.stdout}{routed.stderr}"


def test_thresholds_and_webhooks_come_from_a_yaml_file(tmp_path: Path) -> None:
    config = tmp_path / "alerting.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "thresholds": {"stall_seconds": 42, "hang_seconds": 21},  # a hang's limit is below the stall's
                "page_webhook_url": "http://pager.test/hook",
                "exporter_job": "sidecars",
            }
        )
    )
    out = subprocess.run(
        [sys.executable, "-m", "tpuscope", "alerts", "--out", str(tmp_path / "out"), "--config", str(config)],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    rules = (tmp_path / "out/tpuscope-rules.yaml").read_text()
    assert "> 42" in rules and 'up{job=~"sidecars"}' in rules
    assert "http://pager.test/hook" in (tmp_path / "out/alertmanager.yml").read_text()
    assert rules == alerts.rules_file(GeneratorConfig.load(config))


@pytest.mark.parametrize(
    ("content", "complaint"),
    [
        ({"thresholds": {"stall_secs": 1}}, "unknown thresholds: stall_secs"),
        ({"thresholds": {"stall_seconds": "soon"}}, "must be numbers"),
        ({"pager": "x"}, "unknown settings pager"),
        # The latency SLI counts a histogram bucket: an objective between buckets would match no series.
        ({"thresholds": {"inference_latency_seconds": 0.3}}, "inference_latency_seconds must be one of (0.005"),
    ],
)
def test_a_bad_config_file_is_a_clear_error(content: dict[str, Any], complaint: str, tmp_path: Path) -> None:
    config = tmp_path / "alerting.yaml"
    config.write_text(yaml.safe_dump(content))
    out = subprocess.run(
        [sys.executable, "-m", "tpuscope", "alerts", "--out", str(tmp_path / "out"), "--config", str(config)],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 2 and complaint in out.stderr, out.stderr
    assert not (tmp_path / "out").exists()


# --- a real page, end to end -----------------------------------------------------------------
def notifications(webhook: Webhook, path: str, status: str) -> list[dict[str, Any]]:
    return [body for where, body in webhook.received if where == path and body["status"] == status]


def waited(condition: Callable[[], bool], timeout: float, what: str, log: Callable[[], str]) -> float:
    """Seconds until ``condition`` held; fails naming ``what`` (and the logs) after ``timeout``."""
    began = time.monotonic()
    wait_for(condition, timeout, what, detail=log)
    return time.monotonic() - began


def test_a_stalled_workload_pages_through_alertmanager_and_resolves_when_it_recovers(short_tmp: Path) -> None:
    require("prometheus")
    require("prometheus-alertmanager")
    webhook = Webhook()
    config = GeneratorConfig(
        thresholds=Thresholds.override({"stall_seconds": 3, "hang_seconds": 1}),  # a hang's below the stall's
        exporter_job="tpuscope",
        page_webhook_url=f"{webhook.url}/page",
        ticket_webhook_url=f"{webhook.url}/ticket",
    )
    rules = short_tmp / "rules.yaml"
    rules.write_text(alerts.rules_file(config))
    routing = yaml.safe_load(alerts.alertmanager_file(config))
    routing["route"].update(group_wait="1s", group_interval="1s")  # a test's patience, not an on-call's
    with (
        SidecarProcess(short_tmp / "s.sock", "127.0.0.1:0", "--collectors=none") as sidecar,
        AlertmanagerServer(short_tmp / "am", yaml.safe_dump(routing)) as alertmanager,
        PrometheusServer(
            short_tmp / "prom", [target_of(sidecar.url)], rule_files=[rules], alertmanager=alertmanager.address
        ) as prom,
    ):

        def logs() -> str:
            return f"webhook got: {webhook.received}\n{prom.log_path.read_text()}\n{alertmanager.log_path.read_text()}"

        job = subprocess.Popen(
            testing_bench.command(
                "--inject=stall=20",
                workload="e2e",
                steps=300,
                checkpoint_every=0,
                socket=sidecar.socket,
                run_dir=short_tmp / "run",
            ),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:
            stepping = waited(
                lambda: bool(prom.query(f'{catalog.STEPS.name}{{workload="e2e"}} > 5')), 120, "no steps", logs
            )
            paged = waited(lambda: bool(notifications(webhook, "/page", "firing")), 40, "no page", logs)
            page = notifications(webhook, "/page", "firing")[0]
            resolved = waited(lambda: bool(notifications(webhook, "/page", "resolved")), 60, "no resolve", logs)
            # Resolved because steps resumed, not because the job went away (150 steps remain after the stall).
            assert job.poll() is None, "the job ended before the resolution: nothing shows it recovered"
        finally:
            output, _ = job.communicate(timeout=180)
        assert job.returncode == 0, output[-3000:]
    webhook.stop()
    assert page["receiver"] == "page" and page["groupLabels"]["workload"] == "e2e"
    (alert,) = page["alerts"]
    assert alert["labels"] == {"alertname": AlertName.WORKLOAD_STALLED, "severity": "critical", "workload": "e2e"}
    assert alert["annotations"]["runbook_url"].endswith("#" + AlertName.WORKLOAD_STALLED.lower())
    assert "has completed no step for" in alert["annotations"]["description"]
    resolution = notifications(webhook, "/page", "resolved")[0]["alerts"][0]
    assert resolution["labels"] == alert["labels"] and resolution["status"] == "resolved"
    assert not notifications(webhook, "/ticket", "firing"), "a stall is a page, and nothing else here a ticket"
    print(f"steps after {stepping:.1f} s; page {paged:.1f} s later; resolved {resolved:.1f} s after the page")
