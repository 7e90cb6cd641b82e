"""Alertmanager's routing of tpuscope's alerts, live: one cause, one notification (issue 35, finding 9).

One straggler opened three tickets and one outage paged twice: no inhibit rule related the alerts that one
cause fires together. Each test posts such a set straight to a real Alertmanager running the generated
configuration (deploy/alertmanager/alertmanager.yml, read as the test runs, its webhooks pointed here) and
checks both what reached the page and ticket webhooks and which alerts Alertmanager holds inhibited.

Absence is proven, not hoped for: once the notifications that must come have come and Alertmanager lists
every posted alert, a sentinel alert of a group of its own is posted and its notification awaited; every
group of the test's alerts has flushed since, so whatever it would have sent has been sent.
"""

from __future__ import annotations

import itertools
import subprocess
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from alertmanager import AlertmanagerServer, Webhook
from conftest import require

from tpuscope.alerts.alertmanager import PAGE, TICKET
from tpuscope.conventions import AlertName
from tpuscope.testing.waiting import wait_for

pytestmark = pytest.mark.long

ALERTMANAGER = Path(__file__).resolve().parents[1] / "deploy/alertmanager/alertmanager.yml"
CRITICAL, WARNING = "critical", "warning"
JOBSET = "llm"
# The straggling worker's place, as the per-worker Straggler alert carries it.
WORKER = {"job": "tpuscope", "instance": "h3:9478", "slice": "0", "worker": "3"}
# A test's patience, not an on-call's: a new group notifies after group_wait, an old one again after group_interval.
PATIENCE = "1s"
WAIT = 30.0  # seconds for a notification due in one PATIENCE, on a loaded machine
# No scenario posts it, in a namespace no scenario uses: the sentinel inhibits nothing and nothing inhibits it.
SENTINEL, SENTINEL_NAMESPACE = AlertName.MODEL_STALE, "sentinel"
SENTINELS = itertools.count()
# What a stalled workload keeps quiet, as the policy says it: typed here again on purpose, since a test that read
# the generator's own list would pass whatever that list held.
STALL_SAYS_IT = (
    AlertName.STEP_TIME_REGRESSION,
    AlertName.INPUT_BOUND,
    AlertName.SYNC_BOUND,
    AlertName.STRAGGLER,
    AlertName.LOW_MFU,
    AlertName.CHECKPOINT_STALE,
    AlertName.COLLECTIVE_LATENCY_SPIKE,
)

Labels = Mapping[str, str]


def alert(name: AlertName, severity: str, workload: str, namespace: str = "ml", **labels: str) -> Labels:
    """An alert's labels as tpuscope's rules give them to a workload of JobSet llm (``jobset=""``: run by none)."""
    place = {"namespace": namespace, "workload": workload, "jobset": JOBSET} | labels
    return {"alertname": name, "severity": severity, **{k: v for k, v in place.items() if v}}


def named(labels: Labels) -> str:
    """An alert as the assertions say it: ``TpuscopeStraggler/warning ml/llm/w`` (``ml/w``: run by no JobSet). The
    JobSet is part of it: two JobSets of one namespace may each run a workload of the same name."""
    place = "/".join(labels[key] for key in ("namespace", "jobset", "workload") if key in labels)
    return f"{labels['alertname']}/{labels['severity']} {place}"


@dataclass(frozen=True)
class Scenario:
    """Alerts posted together, and what Alertmanager must make of them."""

    posted: tuple[Labels, ...]
    notified: tuple[tuple[str, Labels], ...]  # (receiver, alert): each notification that must come, and no other
    inhibited: tuple[Labels, ...] = ()  # the posted alerts it must hold inhibited; the others active

    def expected(self) -> list[tuple[str, str]]:
        return sorted((receiver, named(labels)) for receiver, labels in self.notified)


@dataclass
class Outcome:
    """What Alertmanager made of a scenario's alerts, once every group of them had flushed."""

    notifications: list[tuple[str, dict[str, Any]]]  # (receiver, webhook body) of the firing ones
    statuses: dict[str, dict[str, Any]] = field(default_factory=dict)  # by named(): its GET /api/v2/alerts status

    def notified(self) -> list[tuple[str, str]]:
        """(receiver, alert) for each alert of each notification."""
        return sorted((receiver, named(a["labels"])) for receiver, body in self.notifications for a in body["alerts"])

    def inhibited(self) -> list[str]:
        return sorted(name for name, status in self.statuses.items() if status["inhibitedBy"])

    def __str__(self) -> str:
        statuses = "\n".join(f"  {name}: {status}" for name, status in sorted(self.statuses.items()))
        return f"notified: {self.notified()}\nstatuses:\n{statuses}"


@dataclass
class Routing:
    alertmanager: AlertmanagerServer
    webhook: Webhook

    def firing(self, names: set[str]) -> list[tuple[str, dict[str, Any]]]:
        """(receiver, body) of the firing notifications of the alerts ``names``: each receiver's webhook path is
        its name."""
        return [
            (path.removeprefix("/"), body)
            for path, body in list(self.webhook.received)
            if body["status"] == "firing" and any(named(a["labels"]) in names for a in body["alerts"])
        ]

    def statuses(self, names: set[str]) -> dict[str, dict[str, Any]]:
        return {
            named(a["labels"]): a["status"]
            for a in self.alertmanager.alerts_status()
            if named(a["labels"]) in names and a["status"]["state"] in ("active", "suppressed")
        }


def patient(route: dict[str, Any]) -> None:
    """Every route of the tree waits PATIENCE, wherever the generated file sets its timers."""
    route.update(group_wait=PATIENCE, group_interval=PATIENCE)
    for child in route.get("routes", []):
        patient(child)


def configuration(webhook: Webhook) -> str:
    """The generated Alertmanager configuration, each receiver's webhooks posting to ``webhook`` under the
    receiver's name, its timers at a test's patience."""
    document = yaml.safe_load(ALERTMANAGER.read_text())
    for receiver in document["receivers"]:
        for hook in receiver.get("webhook_configs", []):
            hook["url"] = f"{webhook.url}/{receiver['name']}"
    patient(document["route"])
    return yaml.safe_dump(document)


@pytest.fixture(scope="module")
def routing(module_tmp: Path) -> Iterator[Routing]:
    """One Alertmanager for the module (the scenarios' workloads are all distinct, so they do not meet)."""
    require("prometheus-alertmanager")
    webhook = Webhook()
    try:
        with AlertmanagerServer(module_tmp / "am", configuration(webhook)) as alertmanager:
            yield Routing(alertmanager, webhook)
    finally:
        webhook.stop()


def post(alertmanager: AlertmanagerServer, alerts: list[Labels]) -> None:
    """Post ``alerts`` firing, as Prometheus does, lasting beyond the module (none resolves during a test)."""
    now = datetime.now(UTC)
    alertmanager.post_alerts(
        [
            {
                "labels": dict(labels),
                "annotations": {"summary": f"{labels['alertname']} for the routing tests"},
                "startsAt": now.isoformat(),
                "endsAt": (now + timedelta(hours=1)).isoformat(),
            }
            for labels in alerts
        ]
    )


def route(routing: Routing, scenario: Scenario) -> Outcome:
    """Post the scenario's alerts; what Alertmanager notified and holds, once every group of them has flushed."""
    names = {named(labels) for labels in scenario.posted}
    post(routing.alertmanager, list(scenario.posted))

    def came(due: list[tuple[str, str]], among: set[str]) -> bool:
        got = set(Outcome(routing.firing(among)).notified())
        return all(notification in got for notification in due)

    def held(due: list[tuple[str, str]]) -> bool:
        """An alert due to notify is held inhibited: it never will, no use waiting for it (check says so)."""
        statuses = routing.statuses(names)
        return any(statuses[name]["inhibitedBy"] for _, name in due if name in statuses)

    def outcome() -> Outcome:
        return Outcome(routing.firing(names), routing.statuses(names))

    expected = scenario.expected()
    wait_for(lambda: came(expected, names) or held(expected), WAIT, f"notification {expected}", detail=outcome)
    wait_for(lambda: routing.statuses(names).keys() == names, WAIT, "listing of every alert", detail=outcome)
    sentinels = {
        receiver: alert(SENTINEL, severity, f"sentinel-{next(SENTINELS)}", SENTINEL_NAMESPACE)
        for receiver, severity in ((PAGE, CRITICAL), (TICKET, WARNING))
    }
    post(routing.alertmanager, list(sentinels.values()))
    due = sorted((receiver, named(labels)) for receiver, labels in sentinels.items())
    wait_for(lambda: came(due, {name for _, name in due}), WAIT, f"sentinel {due}", detail=outcome)
    return outcome()


def check(routing: Routing, scenario: Scenario) -> Outcome:
    """Exactly the scenario's notifications came, and exactly its inhibited alerts are held inhibited."""
    outcome = route(routing, scenario)
    assert outcome.notified() == scenario.expected(), f"expected notified {scenario.expected()}\n{outcome}"
    inhibited = sorted(named(labels) for labels in scenario.inhibited)
    assert outcome.inhibited() == inhibited, f"expected inhibited {inhibited}\n{outcome}"
    return outcome


# --- one cause, one notification ---------------------------------------------------------------
def test_a_straggler_opens_one_ticket_its_own(routing: Routing) -> None:
    """The straggler is the cause; its peers' wait at the collectives (SyncBound, CollectiveLatencySpike) the
    symptom."""
    straggler = alert(AlertName.STRAGGLER, WARNING, "straggling", **WORKER, source="profile")
    sync = alert(AlertName.SYNC_BOUND, WARNING, "straggling", source="profile")
    spike = alert(AlertName.COLLECTIVE_LATENCY_SPIKE, WARNING, "straggling", source="profile")
    check(routing, Scenario((straggler, sync, spike), ((TICKET, straggler),), (sync, spike)))


@pytest.mark.parametrize("symptom", [AlertName.STEP_TIME_REGRESSION, AlertName.LOW_MFU])
def test_a_straggler_is_also_the_cause_of_its_workloads_slower_steps_and_lower_mfu(
    routing: Routing, symptom: AlertName
) -> None:
    workload = f"slowed-{symptom.lower()}"
    straggler = alert(AlertName.STRAGGLER, WARNING, workload, **WORKER, source="profile")
    slower = alert(symptom, WARNING, workload)
    check(routing, Scenario((straggler, slower), ((TICKET, straggler),), (slower,)))


@pytest.mark.parametrize(
    "cause", [AlertName.WORKLOAD_STALLED, AlertName.WORKLOAD_HUNG, AlertName.WORKLOAD_CRASH_LOOPING]
)
def test_a_hang_or_a_crash_loop_pages_once_not_again_for_the_budget_it_burns(
    routing: Routing, cause: AlertName
) -> None:
    workload = f"burnt-by-{cause.lower()}"
    page = alert(cause, CRITICAL, workload)
    burn = alert(AlertName.GOODPUT_BUDGET_BURN, CRITICAL, workload)
    check(routing, Scenario((page, burn), ((PAGE, page),), (burn,)))


def test_a_hung_workload_pages_once_for_the_hang_not_again_for_its_stall_nor_its_steps(routing: Routing) -> None:
    """Issue 54: every worker stuck pages at once, naming where; the stall it also is pages minutes later, and its
    steps' symptoms say nothing while it hangs."""
    hung = alert(AlertName.WORKLOAD_HUNG, CRITICAL, "hung")
    stalled = alert(AlertName.WORKLOAD_STALLED, CRITICAL, "hung")
    said = tuple(alert(name, WARNING, "hung") for name in STALL_SAYS_IT)
    check(routing, Scenario((hung, stalled, *said), ((PAGE, hung),), (stalled, *said)))


def test_an_outage_pages_once_for_the_workload_being_down(routing: Routing) -> None:
    """A workload that is down burns its goodput budget: the burn, fast or slow, says nothing the page did not."""
    down = alert(AlertName.WORKLOAD_DOWN, CRITICAL, "down")
    fast = alert(AlertName.GOODPUT_BUDGET_BURN, CRITICAL, "down")
    slow = alert(AlertName.GOODPUT_BUDGET_BURN, WARNING, "down")
    check(routing, Scenario((down, fast, slow), ((PAGE, down),), (fast, slow)))


def test_a_crash_loop_pages_once_and_nothing_else_notifies(routing: Routing) -> None:
    """A crash loop is failures, a workload down between them, and the budget they burn: one page."""
    looping = alert(AlertName.WORKLOAD_CRASH_LOOPING, CRITICAL, "crashing")
    failed = alert(AlertName.WORKLOAD_FAILED, WARNING, "crashing", reason="other")
    down = alert(AlertName.WORKLOAD_DOWN, CRITICAL, "crashing")
    burn = alert(AlertName.GOODPUT_BUDGET_BURN, CRITICAL, "crashing")
    check(routing, Scenario((looping, failed, down, burn), ((PAGE, looping),), (failed, down, burn)))


@pytest.mark.parametrize(
    ("cause", "labels"),
    [(AlertName.INPUT_BOUND, {"phase": "io"}), (AlertName.COMPILE_TIME_HIGH, {}), (AlertName.RECOMPILING, {})],
    ids=["input-bound", "compile-time-high", "recompiling"],
)
def test_waiting_for_input_or_the_compiler_opens_one_ticket_not_another_for_the_mfu_it_costs(
    routing: Routing, cause: AlertName, labels: dict[str, str]
) -> None:
    """Chips that wait for their input, or for a compile, sit idle and reach little of their peak: the wait is the
    cause. (Its hosts' idle chips are one alert of the workload, as the rules make it.)"""
    workload = f"idle-for-{cause.lower()}"
    waiting = alert(cause, WARNING, workload, **labels)
    low = alert(AlertName.LOW_MFU, WARNING, workload)
    idle = alert(AlertName.LOW_DUTY_CYCLE, WARNING, workload)
    check(routing, Scenario((waiting, low, idle), ((TICKET, waiting),), (low, idle)))


def test_a_failing_compile_opens_one_ticket_not_another_for_the_job_it_ends(routing: Routing) -> None:
    """A program that fails to compile ends its job with reason compile_error: CompileFailing's ticket names the
    stage and why, the failure's would add nothing."""
    failing = alert(AlertName.COMPILE_FAILING, WARNING, "uncompiled", stage="backend", reason="invalid_program")
    failed = alert(AlertName.WORKLOAD_FAILED, WARNING, "uncompiled", reason="compile_error")
    check(routing, Scenario((failing, failed), ((TICKET, failing),), (failed,)))


def test_a_failing_compile_keeps_quiet_no_failure_of_another_reason(routing: Routing) -> None:
    """A job that ran out of memory failed of another cause than its failing compile: each opens its ticket."""
    failing = alert(AlertName.COMPILE_FAILING, WARNING, "uncompiled-and-oom", stage="backend", reason="invalid_program")
    oom = alert(AlertName.WORKLOAD_FAILED, WARNING, "uncompiled-and-oom", reason="out_of_memory")
    check(routing, Scenario((failing, oom), ((TICKET, failing), (TICKET, oom))))


def test_a_crash_loop_keeps_quiet_its_own_outage_not_a_namesakes_of_another_jobset(routing: Routing) -> None:
    """Two JobSets of one namespace often run a workload of the same name: JobSet A's crash loop is no cause of
    JobSet B's outage, which pages on its own, while A's own outage is held."""
    looping = alert(AlertName.WORKLOAD_CRASH_LOOPING, CRITICAL, "namesake", jobset="llm-a")
    its_down = alert(AlertName.WORKLOAD_DOWN, CRITICAL, "namesake", jobset="llm-a")
    namesakes_down = alert(AlertName.WORKLOAD_DOWN, CRITICAL, "namesake", jobset="llm-b")
    posted = (looping, its_down, namesakes_down)
    check(routing, Scenario(posted, ((PAGE, looping), (PAGE, namesakes_down)), (its_down,)))


def apart(first: Labels, second: Labels) -> Scenario:
    """Two alerts of different workloads (or one name in two namespaces, or in two JobSets of one namespace): each
    notifies, neither inhibited."""
    receiver = {CRITICAL: PAGE, WARNING: TICKET}
    return Scenario((first, second), tuple((receiver[labels["severity"]], labels) for labels in (first, second)))


@pytest.mark.parametrize(
    "scenario",
    [
        apart(
            alert(AlertName.STRAGGLER, WARNING, "apart-1", **WORKER, source="profile"),
            alert(AlertName.SYNC_BOUND, WARNING, "apart-2", source="profile"),
        ),
        apart(
            alert(AlertName.WORKLOAD_DOWN, CRITICAL, "apart-3"),
            alert(AlertName.GOODPUT_BUDGET_BURN, CRITICAL, "apart-4"),
        ),
        # One workload name in two namespaces, the same JobSet name too: two workloads, whatever the rule.
        apart(
            alert(AlertName.WORKLOAD_DOWN, CRITICAL, "twin-1"),
            alert(AlertName.GOODPUT_BUDGET_BURN, CRITICAL, "twin-1", "research"),
        ),
        apart(
            alert(AlertName.STRAGGLER, WARNING, "twin-2", **WORKER, source="profile"),
            alert(AlertName.SYNC_BOUND, WARNING, "twin-2", "research", source="profile"),
        ),
        apart(
            alert(AlertName.WORKLOAD_CRASH_LOOPING, CRITICAL, "twin-3"),
            alert(AlertName.WORKLOAD_DOWN, CRITICAL, "twin-3", "research"),
        ),
        apart(
            alert(AlertName.WORKLOAD_STALLED, CRITICAL, "twin-4"),
            alert(AlertName.STEP_TIME_REGRESSION, WARNING, "twin-4", "research"),
        ),
        apart(
            alert(AlertName.GOODPUT_BUDGET_BURN, CRITICAL, "twin-5"),
            alert(AlertName.GOODPUT_BUDGET_BURN, WARNING, "twin-5", "research"),
        ),
        apart(
            alert(AlertName.WORKLOAD_CRASH_LOOPING, CRITICAL, "twin-6"),
            alert(AlertName.WORKLOAD_FAILED, WARNING, "twin-6", "research", reason="other"),
        ),
        # One workload name in two JobSets of one namespace: two workloads too.
        apart(
            alert(AlertName.STRAGGLER, WARNING, "sibling-1", jobset="llm-a", **WORKER, source="profile"),
            alert(AlertName.SYNC_BOUND, WARNING, "sibling-1", jobset="llm-b", source="profile"),
        ),
        apart(
            alert(AlertName.WORKLOAD_STALLED, CRITICAL, "sibling-2", jobset="llm-a"),
            alert(AlertName.STEP_TIME_REGRESSION, WARNING, "sibling-2", jobset="llm-b"),
        ),
        apart(
            alert(AlertName.WORKLOAD_HUNG, CRITICAL, "sibling-5", jobset="llm-a"),
            alert(AlertName.WORKLOAD_STALLED, CRITICAL, "sibling-5", jobset="llm-b"),
        ),
        apart(
            alert(AlertName.INPUT_BOUND, WARNING, "sibling-3", jobset="llm-a", phase="io"),
            alert(AlertName.LOW_MFU, WARNING, "sibling-3", jobset="llm-b"),
        ),
        apart(
            alert(AlertName.COMPILE_FAILING, WARNING, "sibling-4", jobset="llm-a", stage="backend", reason="internal"),
            alert(AlertName.WORKLOAD_FAILED, WARNING, "sibling-4", jobset="llm-b", reason="compile_error"),
        ),
    ],
    ids=[
        "straggler-and-another-workloads-sync",
        "outage-and-another-workloads-burn",
        "outage-and-a-namesakes-burn",
        "straggler-and-a-namesakes-sync",
        "crash-loop-and-a-namesakes-outage",
        "stall-and-a-namesakes-regression",
        "fast-burn-and-a-namesakes-slow-burn",
        "crash-loop-and-a-namesakes-failure",
        "straggler-and-another-jobsets-sync",
        "stall-and-another-jobsets-regression",
        "input-bound-and-another-jobsets-low-mfu",
        "compile-failure-and-another-jobsets-compile-error",
        "hang-and-another-jobsets-stall",
    ],
)
def test_causes_stay_apart_across_workloads_namespaces_and_jobsets(routing: Routing, scenario: Scenario) -> None:
    check(routing, scenario)


# --- grouping and routing ------------------------------------------------------------------------
def test_a_notification_is_grouped_by_namespace_and_jobset(routing: Routing) -> None:
    """A receiver (or a team's route in front of it) can tell whose workload it is, as with kube-prometheus'
    alerts: the group's labels carry its namespace, and its JobSet where the alert has one."""
    stalled = alert(AlertName.WORKLOAD_STALLED, CRITICAL, "grouped-1")
    unmanaged = alert(AlertName.INPUT_BOUND, WARNING, "grouped-2", jobset="", phase="io")
    outcome = check(routing, Scenario((stalled, unmanaged), ((PAGE, stalled), (TICKET, unmanaged))))
    groups = {receiver: body["groupLabels"] for receiver, body in outcome.notifications}
    assert (
        groups[PAGE]["namespace"] == "ml"
        and groups[PAGE]["jobset"] == JOBSET
        and groups[PAGE]["workload"] == stalled["workload"]
    ), groups
    assert groups[TICKET]["namespace"] == "ml" and "jobset" not in groups[TICKET], groups


@pytest.mark.parametrize(
    ("name", "severity", "receiver"),
    [
        (AlertName.WORKLOAD_DOWN, CRITICAL, PAGE),
        (AlertName.WORKLOAD_HUNG, CRITICAL, PAGE),
        (AlertName.STRAGGLER, WARNING, TICKET),
    ],
)
def test_amtool_routes_a_namespaced_alert_to_page_or_ticket(name: AlertName, severity: str, receiver: str) -> None:
    labels = alert(name, severity, "w", **WORKER)
    routed = subprocess.run(
        [
            require("amtool"),
            "config",
            "routes",
            "test",
            f"--config.file={ALERTMANAGER}",
            f"--verify.receivers={receiver}",
            *(f"{key}={value}" for key, value in labels.items()),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert routed.returncode == 0, f"{labels}: {routed.stdout}{routed.stderr}"


# --- the inhibitions there were before ---------------------------------------------------------
def stall_silences(workload: str) -> Scenario:
    """A stalled workload has no step time to speak of: each alert about its steps is held."""
    stalled = alert(AlertName.WORKLOAD_STALLED, CRITICAL, workload)
    said = tuple(alert(name, WARNING, workload) for name in STALL_SAYS_IT)
    return Scenario((stalled, *said), ((PAGE, stalled),), said)


def one_page(source: Labels, target: Labels) -> Scenario:
    return Scenario((source, target), ((PAGE, source),), (target,))


@pytest.mark.parametrize(
    "scenario",
    [
        stall_silences("stalled"),
        one_page(  # a fast burn is a slow one too
            alert(AlertName.INFERENCE_LATENCY_BUDGET_BURN, CRITICAL, "burning"),
            alert(AlertName.INFERENCE_LATENCY_BUDGET_BURN, WARNING, "burning"),
        ),
        one_page(
            alert(AlertName.WORKLOAD_CRASH_LOOPING, CRITICAL, "looping"),
            alert(AlertName.WORKLOAD_FAILED, WARNING, "looping", reason="other"),
        ),
    ],
    ids=["stall-over-its-symptoms", "critical-over-warning-of-one-alert", "crash-loop-over-its-failures"],
)
def test_the_inhibitions_there_were_hold(routing: Routing, scenario: Scenario) -> None:
    check(routing, scenario)
