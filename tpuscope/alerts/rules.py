"""The building blocks every area of alerts uses: the ``Alert`` itself, the PromQL idioms, the burn-rate pair.

Alerts follow the monitoring-mixin style: CamelCase names with the ``Tpuscope`` prefix
(:class:`tpuscope.conventions.AlertName`); ``severity: critical`` pages, ``warning`` makes a ticket,
``info`` is not routed; a static ``summary``, a templated ``description``, and ``runbook_url`` and
``dashboard_url`` annotations.

SLO alerts are multiwindow, multi-burn-rate (the SRE workbook): a long and a
short window must both burn the error budget faster than 14.4x (1 h / 5 m) or 6x
(6 h / 30 m) to page, 3x (1 d / 2 h) or 1x (3 d / 6 h) to make a ticket. Each pair
spends a share of the 30-day budget before it fires (14.4 x 1 h = 2 %, 6 x 6 h = 5 %,
3 x 1 d = 10 %, 1 x 3 d = 10 %). A burn rate cannot pass 1 / budget (all of the time
bad): goodput's 10 % budget burns at 10x at most, so its 14.4x pair could never fire.
Such a pair is stretched (:func:`burn_rates`): both windows times the smallest factor
k that brings rate / k within reach (at most MOST_BAD of the time bad), which keeps
the share of the budget it spends: goodput pages at 7.2x over 2 h and 10 m.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tpuscope import catalog as c
from tpuscope import durations
from tpuscope.conventions import SLO_EXCLUDED, AlertName, DashboardUID
from tpuscope.generator_config import GeneratorConfig
from tpuscope.promql import PLACEMENT, WORKLOAD, each_worker_once, grown, series

# The anchors of docs/alerts.md's runbooks for each value of a closed set of reasons (tpuscope.reasons), the value
# appended: an alert that keeps the reason label links the runbook of the reason it fires for.
FAILURE_REASON_ANCHOR = "failure-reason-"
COMPILE_FAILURE_REASON_ANCHOR = "compile-failure-reason-"
RECOMPILE_CAUSE_ANCHOR = "recompile-cause-"


def reason_runbook(config: GeneratorConfig, anchor: str, label: str = "reason") -> str:
    """The link to the runbook of the value of ``label`` an alert fires for, for its description."""
    return f"{config.runbook_url}#{anchor}{{{{ $labels.{label} }}}}"


# (long window, short window, burn rate, severity)
BURN_RATES = (
    ("1h", "5m", 14.4, "critical"),
    ("6h", "30m", 6, "critical"),
    ("1d", "2h", 3, "warning"),
    ("3d", "6h", 1, "warning"),
)
# How often the ratios over the windows only tickets read (a day and more) are recorded, in a group of their own:
# each reads days of recorded rates, and a ticket that waits 15 minutes loses nothing by a ratio up to 5 minutes old.
SLOW_INTERVAL = "5m"
# A pair needing more than this share of the time bad is out of reach in practice: its windows are stretched.
MOST_BAD = 0.9
STRETCH = (1, 2, 3, 4, 6, 8, 12)


def burn_rates(budget: float) -> list[tuple[str, str, float, str]]:
    """The workbook's pairs for an error budget of ``budget`` (a share), each stretched until it can fire."""
    pairs = []
    for long, short, rate, severity in BURN_RATES:
        k = next((k for k in STRETCH if rate / k * budget <= MOST_BAD), None)
        if k is None:
            raise ValueError(f"an error budget of {budget:.0%} is too large for a {rate:g}x burn-rate pair")
        long, short = (durations.prometheus(durations.prometheus_ms(window) * k) for window in (long, short))
        pairs.append((long, short, rate / k, severity))
    return pairs


def slo_windows(budget: float, slow: bool | None = None) -> tuple[str, ...]:
    """Every window an SLO's ratio is recorded over (tpuscope.alerts.recording): those the burn rates of an SLO
    with this budget read, shortest first. ``slow``: only those no page reads (True), which are recorded at
    :data:`SLOW_INTERVAL`, or only the others (False)."""
    pairs = burn_rates(budget)
    windows = {window for long, short, _, _ in pairs for window in (long, short)}
    paged = {window for long, short, _, severity in pairs if severity == "critical" for window in (long, short)}
    if slow is not None:
        windows = windows - paged if slow else windows & paged
    return tuple(sorted(windows, key=durations.parse))


@dataclass(frozen=True)
class Alert:
    name: AlertName
    severity: str  # critical pages, warning makes a ticket, info is not routed
    expr: str
    summary: str
    description: str  # a Go template: {{ $labels.x }}, {{ $value }}
    dashboard: DashboardUID  # linked from the alert
    for_: str = "0m"
    runbook: str = ""  # what to do, for docs/alerts.md
    labels: dict[str, str] = field(default_factory=dict)

    def rule(self, config: GeneratorConfig) -> dict[str, Any]:
        anchor = self.name.lower()
        dashboard = f"{config.grafana_url}/d/{self.dashboard}"
        if "$labels.workload" in self.description:
            dashboard += "?var-workload={{ $labels.workload }}"
        rule: dict[str, Any] = {"alert": str(self.name), "expr": self.expr}  # str: YAML cannot write an enum
        if self.for_ != "0m":
            rule["for"] = self.for_
        rule["labels"] = {"severity": self.severity, **self.labels}
        rule["annotations"] = {
            "summary": self.summary,
            "description": self.description,
            "runbook_url": f"{config.runbook_url}#{anchor}",
            "dashboard_url": dashboard,
        }
        return rule


def new_or_increase(
    counter: c.Metric, window: str, *matchers: str, suffix: str = "", only: str = "", by: str = WORKLOAD
) -> str:
    """How much a workload's counter of rare events grew in ``window``, a series born in it counted in
    full and a sidecar gone since counted too (:func:`tpuscope.promql.grown`).

    Once per job, not once per host: every worker of a multi-host job reports the same restart, the same
    recompile, and a restarted pod is a new sidecar (:func:`tpuscope.promql.each_worker_once`). ``only``:
    a condition on each sidecar's series (``and on (job, instance) ...``). ``by``: the labels kept, ``workload``
    and any of the counter's own (``workload, reason``).
    """
    grew = grown(series(counter, *matchers, suffix=suffix), window)
    return each_worker_once(f"{grew} {only}" if only else grew, by=by)


def per_workload(function: str, selector: str, window: str, by: str = WORKLOAD) -> str:
    """``sum by (namespace, jobset, workload) (function(selector[window]))``: a range function's result per workload."""
    return f"sum by ({by}) ({function}({selector}[{window}]))"


def excluded(expr: str) -> str:
    """``expr`` (a per-workload record's expression) less the workloads an exclusion window covers now: its own
    (``workload`` set: within its JobSet where the window names one, else within its namespace where it names one,
    else of that name anywhere), its JobSet's (``jobset``, no workload), its namespace's (``namespace`` alone), or
    the fleet's (no label)."""
    scopes = (
        (WORKLOAD, 'workload!="", jobset!=""'),
        ("namespace, workload", 'workload!="", jobset="", namespace!=""'),
        ("workload", 'workload!="", jobset="", namespace=""'),
        (PLACEMENT, 'workload="", jobset!=""'),
        ("namespace", 'workload="", jobset="", namespace!=""'),
        ("", 'workload="", jobset="", namespace=""'),
    )
    for on, matchers in scopes:
        expr = f"({expr}) unless on ({on}) {SLO_EXCLUDED}{{{matchers}}}"
    return expr


def running(what: str = WORKLOAD) -> str:
    """``and`` the workloads with a process connected: a finished job's gauges linger in its sidecar."""
    return f"and on ({what}) max by ({what}) ({series(c.WORKLOAD_PROCESSES)}) > 0"


def workload_on_host(*matchers: str) -> str:
    """1 per host, labelled with the workload running there: the TPU runtime's series carry no workload label, and
    one job holds a host's chips (the one with a process connected to its sidecar). ``matchers``: only the hosts of
    the workloads they pick."""
    return f"(topk by (job, instance) (1, {series(c.WORKLOAD_PROCESSES, *matchers)} > 0) * 0 + 1)"


# The matchers of the alert's own workload in a template's query (:func:`query_of_the_alerts_workload`).
THE_ALERTS_WORKLOAD = ("namespace=%q", "jobset=%q", "workload=%q")


def query_of_the_alerts_workload(query: str) -> str:
    """A description's template query of the alert's own workload: ``query`` holds :data:`THE_ALERTS_WORKLOAD`'s
    three ``%q``, filled with its namespace, jobset and workload. ``or ... ""``: a label the alert lacks is "" to
    Prometheus' templates but nil to vmalert's, which %q prints as %!q(<nil>) and the query then fails
    (tests/test_victoriametrics.py)."""
    return f'query (printf `{query}` (or $labels.namespace "") (or $labels.jobset "") $labels.workload)'


# How many of a workload's hosts a description names.
HOSTS_NAMED = 5


@dataclass(frozen=True)
class HostsOfWorkload:
    """An alert on a condition of hosts, one per workload with hosts where it holds (its value: how many), not one per
    host: a 256-host job whose chips idle is one ticket, not 256. Its description names the worst hosts.

    ``per_host``: the condition, a vector per scrape target (:data:`tpuscope.promql.TARGET`) whose value is the
    host's figure; ``worst``: ``topk`` or ``bottomk``, which hosts are the worst; ``figure``: how a host's figure
    reads (a template function of ``.Value``)."""

    per_host: str
    worst: str = "topk"
    figure: str = "humanizePercentage"

    def expr(self) -> str:
        return f"count by ({WORKLOAD}) ({self._joined()})"

    def named(self) -> str:
        """Description text: `` h1:9478 (12%), h2:9478 (20%)`` for the alert's workload, by instance."""
        hosts = query_of_the_alerts_workload(f"{self.worst}({HOSTS_NAMED}, {self._joined(*THE_ALERTS_WORKLOAD)})")
        return (
            f'{{{{ range $i, $host := {hosts} | sortByLabel "instance" }}}}{{{{ if $i }}}},{{{{ end }}}}'
            f" {{{{ $host.Labels.instance }}}} ({{{{ $host.Value | {self.figure} }}}}){{{{ end }}}}"
        )

    def _joined(self, *matchers: str) -> str:
        return f"({self.per_host}) * on (job, instance) group_left ({c.Label.WORKLOAD}) {workload_on_host(*matchers)}"


def burn_rate_alerts(
    name: AlertName,
    ratio_rule: str,
    budget: float,
    summary: str,
    what: str,
    dashboard: DashboardUID,
    runbook: str,
    existed: str = "",
    volume: tuple[str, float] | None = None,
    paged_outage: tuple[str, float] | None = None,
) -> list[Alert]:
    """Page on a fast burn, ticket on a slow one: one alert name, two severities.

    ``ratio_rule``: the recorded ratio's name without its window (:data:`tpuscope.conventions.BADPUT_RATIO`).
    ``existed``: a series the workload must have had a long window ago, so a
    young workload's start-up is not judged over a window it was not alive for. ``volume``: a recorded
    per-workload rate of events and the fewest events a long window must hold to be judged (a few slow
    requests of a nearly idle service are no outage). ``paged_outage``: a recorded per-workload outage's length and
    the length from which it pages; a pair stays quiet while its short window holds such an outage, whose burn the
    page said (the short window would otherwise fire it as the outage ends and its page resolves).
    """
    result = []
    for severity in ("critical", "warning"):
        conditions = []
        for long, short, rate, level in burn_rates(budget):
            if level != severity:
                continue
            bound = rate * budget
            condition = f"{ratio_rule}{long} > {bound:g} and {ratio_rule}{short} > {bound:g}"
            if existed:
                condition += f" and on ({WORKLOAD}) max by ({WORKLOAD}) ({existed} offset {long}) >= 0"
            if volume:
                recorded, fewest = volume
                events = f"avg_over_time({recorded}[{long}]) * {durations.parse(long):g}"
                condition += f" and on ({WORKLOAD}) {events} >= {fewest:g}"
            if paged_outage:
                outage, paged = paged_outage
                condition += f" unless on ({WORKLOAD}) max_over_time({outage}[{short}]) > {paged:g}"
            conditions.append(f"({condition})")
        windows = " or ".join(long for long, _, _, level in burn_rates(budget) if level == severity)
        result.append(
            Alert(
                name,
                severity,
                " or ".join(conditions),
                summary,
                f"Workload {{{{ $labels.workload }}}} is burning its {what} error budget "
                f"{'fast' if severity == 'critical' else 'steadily'}: {{{{ $value | humanizePercentage }}}} "
                f"was bad over the last {windows}, against a budget of {budget:.2%}.",
                dashboard,
                "2m" if severity == "critical" else "15m",
                runbook,
            )
        )
    return result
