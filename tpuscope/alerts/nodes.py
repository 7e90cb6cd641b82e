"""The bad-host ledger: which node keeps breaking the jobs that land on it, and never a node for a bug in the code.

A bad host fails whatever job it is given; a bug fails its job wherever it runs. The sidecars see each failure,
straggler and XID by workload and worker; these rules key them by the node (the scrape's target label; outside
Kubernetes, the host of the target's address), each evaluation (:func:`evidence_rules`), and keep them for a day and
a week, across jobs (:func:`ledger_rules`, every few minutes). :data:`REASONING` says what each record holds and
why; docs/alerts.md prints it. TpuscopeNodeSuspect opens one ticket per suspect node of the week that left evidence
in the last day, naming the evidence and the workloads it hurt, until the node is cordoned.
"""

from __future__ import annotations

from tpuscope import catalog as c
from tpuscope.alerts.divergence import first_to_go
from tpuscope.alerts.health import THROTTLE_REASONS
from tpuscope.alerts.rules import Alert
from tpuscope.conventions import (
    EVIDENCE_SPREAD,
    FIRST_FAILURE,
    FIRST_FAILURES,
    GKE_TOPOLOGY,
    HOST_EVIDENCE,
    HOST_EVIDENCE_KINDS,
    HOST_EVIDENCE_NOW,
    HOST_SUSPECT,
    HOST_SUSPICION_BASES,
    NODE_TOPOLOGY,
    NODE_WINDOWS,
    RAN_ON,
    STRAGGLER_CHRONIC,
    TOPOLOGY_LABELS,
    WORKLOAD_NODES,
    AlertName,
    DashboardUID,
    node_record,
    sanitized,
)
from tpuscope.generator_config import GeneratorConfig
from tpuscope.promql import PLACEMENT, WORKLOAD, grown, series
from tpuscope.reasons import HOST_FAILURE_REASONS
from tpuscope.thresholds import Thresholds

CRASH, STRAGGLER, DIVERGED_FIRST, THROTTLED, XID = HOST_EVIDENCE_KINDS
# One node's target: the evidence keeps the target, so that a node-less one (outside Kubernetes) is named by its host;
# and a worker of a workload there, so that a verdict can be told to stay with the node or move with the worker.
AT = "node, instance"
PLACE = f"{AT}, slice, worker"
# How far apart a workload's first failure and its next must be for the first to be alone.
ALONE_SECONDS = 1
# How long after a failure its verdict waits for the peers' failures to be scraped, and how long it is read after.
SETTLE_SECONDS = 60
FAILURE_WINDOW = "5m"
# How long a throttle must hold to count, as TpuscopeDeviceThrottled waits.
THROTTLED_FOR = "10m"
# The XIDs NVIDIA's catalogue lays on the hardware: ECC (48, 63, 64, 92, 94, 95, 140), the micro-controller (61, 62),
# NVLink (74), the GPU fallen off the bus (79), the GSP (119, 120). The others may be the application's.
HARDWARE_XIDS = ("48", "61", "62", "63", "64", "74", "79", "92", "94", "95", "119", "120", "140")
# How many workloads' evidence makes a node suspect, and how many first failures of one worker there.
WORKLOADS, RESTARTS = 2, 2
BY_WORKLOADS, BY_RESTARTS, BY_XID = HOST_SUSPICION_BASES
# GKE's node labels of its topology, as kube-state-metrics names them once allowlisted.
KSM_TOPOLOGY = {label: "label_" + sanitized(node_label) for label, node_label in GKE_TOPOLOGY.items()}
# The node label from a target's address, outside Kubernetes: its host, with or without a port.
HOST_OF = "(.+?)(?::[0-9]+)?"
# Each record of the ledger and why it is so, for docs/alerts.md ("{window}" for each of NODE_WINDOWS).
WINDOW = "{window}"
REASONING: tuple[tuple[str, str], ...] = (
    (
        FIRST_FAILURE,
        "Each evaluation, per node and worker of a workload: the time of the workload's first failure where the "
        f"node's process failed first and alone (the workload's next failure {ALONE_SECONDS} s or more after it, or "
        f"none), for a reason that may be the host's ({', '.join(HOST_FAILURE_REASONS)}), judged {SETTLE_SECONDS} s "
        f"after it so that its peers' failures are scraped, and read over {FAILURE_WINDOW} from the earliest (a "
        "container restarted in place may fail again within the minute). A bug fails every process of a synchronous "
        "job at the same step, together; a host that dies takes its own process first, and its peers fail later, "
        "when the collective or the JobSet gives up on them (together, as JobSet deletes them at once: a host that "
        "dies whole, its sidecar with it, leaves no crash evidence).",
    ),
    (
        HOST_EVIDENCE_NOW,
        "Each evaluation, per node, target and workload, 1 for each kind of evidence that holds now: `crash` (the "
        "above), `straggler` (the workload's chronic straggler, as TpuscopeStraggler judges it), `diverged_first` "
        "(the worker TpuscopeNonFiniteFirstWorker names), `throttled` (a GPU's clocks held down for a power-brake, "
        f"thermal or hardware reason for {THROTTLED_FOR}), `xid` (an XID NVIDIA's catalogue lays on the hardware: "
        f"{', '.join(HARDWARE_XIDS)}). A GPU's evidence counts for each workload its sidecar serves.",
    ),
    (WORKLOAD_NODES, "Every 5 minutes, per node and worker of a workload: the worker ran there."),
    (
        NODE_TOPOLOGY,
        "Each node's GKE topology (block, sub-block, host): from its sidecars' target labels where the scrape "
        "attaches the node's labels, else from kube-state-metrics' `kube_node_labels` (GMP).",
    ),
    (
        HOST_EVIDENCE + WINDOW,
        "The evidence over the window, per node, workload and kind. A target with no node label (outside "
        "Kubernetes) is named by its host.",
    ),
    (RAN_ON + WINDOW, "The nodes each worker of each workload ran on over the window."),
    (
        FIRST_FAILURES + WINDOW,
        "Per node and worker of a workload, how many of the workload's failures the worker's process on the node was "
        "first in (the distinct failure times recorded).",
    ),
    (
        EVIDENCE_SPREAD + WINDOW,
        "Per workload, each kind of evidence it left on two nodes or more: the nodes it left it on. A verdict names "
        "one worker at a time, so a multi-host job that fails the same way wherever it runs leaves it on one node "
        "after another, moving with the worker (its code, its data, its rank's extra work), where a bad host keeps "
        "it: that kind of the workload's evidence counts on none of them.",
    ),
    (
        HOST_SUSPECT + WINDOW,
        f"The suspect nodes, one series per basis: `workloads` ({WORKLOADS} workloads or more left evidence on it, "
        "not counting the kinds a workload spread over several nodes, nor evidence of no workload), `restarts` (one "
        f"worker's process failed first on it {RESTARTS} times or more, and the same worker ran on another node "
        "without failing first there: a job pinned to its nodes cannot tell its rank's bug from the node), `xid` (an "
        "XID of the hardware's names its node alone). The value: the workloads, the first failures, the XID "
        "evidence.",
    ),
)


def labelled(expr: str, value: str, label: str = "evidence") -> str:
    return f'label_replace({expr}, "{label}", "{value}", "", "")'


def with_workloads(per_target: str) -> str:
    """A target's evidence (``per_target``, by ``job, instance``) on each workload its sidecar serves, or on none."""
    workloads = f"group by (job, {AT}, {WORKLOAD}) (last_over_time({series(c.WORKLOAD_START_TIME)}[5m]))"
    alone = f"max by (job, {AT}, {PLACEMENT}) ({per_target}) unless on (job, instance) {workloads}"
    return f"max by (job, instance) ({per_target}) * on (job, instance) group_right () {workloads} or {alone}"


def first_failures() -> str:
    """Per node and worker of a workload, the time of the workload's first failure where it was the node's process,
    alone, for a reason that may be the host's (:data:`REASONING`)."""
    down = f"min_over_time({series(c.WORKLOAD_DOWN_SINCE)}[{FAILURE_WINDOW}])"
    earliest = f"min by ({WORKLOAD}) ({down})"
    settled = f"({down} < time() - {SETTLE_SECONDS})"
    first = f"{settled} == on ({WORKLOAD}) group_left () {earliest}"
    together = f"count by ({WORKLOAD}) ({down} < on ({WORKLOAD}) group_left () ({earliest} + {ALONE_SECONDS}))"
    reasons = f'reason=~"{"|".join(HOST_FAILURE_REASONS)}"'
    failed = grown(series(c.WORKLOAD_FAILURES, reasons), FAILURE_WINDOW)
    alone = f"{first} and on ({WORKLOAD}) ({together} == 1) and on (job, instance, workload) ({failed} > 0)"
    return f"max by ({PLACE}, {WORKLOAD}) ({alone})"


def evidence_rules(t: Thresholds) -> list[dict[str, str]]:
    """The evidence each evaluation (:data:`REASONING`), the straggler chronic as TpuscopeStraggler judges it."""
    held = series(c.THROTTLED, THROTTLE_REASONS)
    throttled = f"({held} == 1 and min_over_time({held}[{THROTTLED_FOR}]) == 1 and {held} offset {THROTTLED_FOR} == 1)"
    hardware_xids = 'xid=~"' + "|".join(HARDWARE_XIDS) + '"'
    xid = f"{grown(series(c.XID_ERRORS, hardware_xids), '5m')} > 0"
    kinds = {
        # Of the same expression, not read back from FIRST_FAILURE: a rule evaluator that writes through a remote
        # store (vmalert) cannot read a record of its own group's evaluation, and a first failure lasts minutes.
        CRASH: first_failures(),
        STRAGGLER: f"max by ({PLACE}, {WORKLOAD}) ({STRAGGLER_CHRONIC} > {t.straggler_chronic:g})",
        DIVERGED_FIRST: f"max by ({PLACE}, {WORKLOAD}) ({first_to_go()})",
        THROTTLED: with_workloads(throttled),
        XID: with_workloads(xid),
    }
    return [
        {"record": FIRST_FAILURE, "expr": first_failures()},
        {
            "record": HOST_EVIDENCE_NOW,
            "expr": " or ".join(labelled(f"({expr}) * 0 + 1", kind) for kind, expr in kinds.items()),
        },
    ]


def by_node(over_time: str, record: str, window: str) -> str:
    """``over_time`` of ``record`` over ``window``, each series on its node: the target's host where it has none."""
    named = f'{over_time}({record}{{node!=""}}[{window}])'
    unnamed = f'{over_time}({record}{{node=""}}[{window}])'
    return f'({named} or label_replace({unnamed}, "node", "$1", "instance", "{HOST_OF}"))'


def ledger_rules() -> list[dict[str, str]]:
    """The ledger over each window (:data:`REASONING`), read every few minutes, and the nodes' topology."""
    worker = f"{WORKLOAD}, slice, worker"
    rules = [
        {
            "record": WORKLOAD_NODES,
            "expr": f"group by ({PLACE}, {WORKLOAD}) (last_over_time({series(c.WORKLOAD_START_TIME)}[5m]))",
        },
        {"record": NODE_TOPOLOGY, "expr": topology()},
    ]
    for window in NODE_WINDOWS:
        evidence, ran = node_record(HOST_EVIDENCE, window), node_record(RAN_ON, window)
        spread, first = node_record(EVIDENCE_SPREAD, window), node_record(FIRST_FAILURES, window)

        def spread_of(kind: str, evidence: str = evidence) -> str:
            covered = f'{evidence}{{evidence="{kind}", workload!=""}}'
            return labelled(f"count by ({WORKLOAD}) ({covered}) >= 2", kind)

        counted = f'{evidence}{{evidence!="{XID}", workload!=""}} unless on ({WORKLOAD}, evidence) {spread}'
        moved = f"({ran} unless on (node, {worker}) {first})"  # the worker elsewhere, not failing first there
        located = f'({first} >= {RESTARTS} unless on ({WORKLOAD}) {spread}{{evidence="{CRASH}"}})'
        bases = {
            BY_WORKLOADS: f"count by (node) (group by (node, {WORKLOAD}) ({counted})) >= {WORKLOADS}",
            BY_RESTARTS: f"max by (node) ({located} and on ({worker}) {moved})",
            BY_XID: f'count by (node) ({evidence}{{evidence="{XID}"}})',
        }
        rules += [
            {
                "record": evidence,
                "expr": f"max by (node, {WORKLOAD}, evidence) ({by_node('max_over_time', HOST_EVIDENCE_NOW, window)})",
            },
            {"record": ran, "expr": f"max by (node, {worker}) ({by_node('max_over_time', WORKLOAD_NODES, window)})"},
            {"record": first, "expr": f"sum by (node, {worker}) ({by_node('changes', FIRST_FAILURE, window)} + 1)"},
            {"record": spread, "expr": " or ".join(spread_of(kind) for kind in HOST_EVIDENCE_KINDS if kind != XID)},
            {
                "record": node_record(HOST_SUSPECT, window),
                "expr": " or ".join(labelled(expr, basis, "basis") for basis, expr in bases.items()),
            },
        ]
    return rules


def topology() -> str:
    """Each node's topology labels: from the sidecars' targets where the scrape gives them, else from
    kube-state-metrics' node labels (GMP's scrape cannot read a node's labels)."""
    labels = ", ".join(TOPOLOGY_LABELS)
    with_topology = series(c.BUILD_INFO, TOPOLOGY_LABELS[0] + '!=""')
    scraped = f"max by (node, {labels}) (last_over_time({with_topology}[5m]))"
    served = f'kube_node_labels{{{KSM_TOPOLOGY[TOPOLOGY_LABELS[0]]}!=""}}'
    for ours, theirs in KSM_TOPOLOGY.items():
        served = f'label_replace({served}, "{ours}", "$1", "{theirs}", "(.*)")'
    # One set a node, should its labels change within the lookback: the board joins on it.
    return f"topk by (node) (1, {scraped} or (max by (node, {labels}) ({served}) unless on (node) {scraped}))"


def alerts(config: GeneratorConfig) -> list[Alert]:
    week, day = NODE_WINDOWS[-1], NODE_WINDOWS[0]
    suspect, evidence = node_record(HOST_SUSPECT, week), node_record(HOST_EVIDENCE, week)
    fresh = f"{node_record(HOST_EVIDENCE, day)} unless on ({WORKLOAD}, evidence) {node_record(EVIDENCE_SPREAD, day)}"
    cordoned = "max by (node) (kube_node_spec_unschedulable) == 1"
    listed = (
        f'{{{{ range query (printf "{evidence}{{node=%q}}" $labels.node) | sortByLabel "workload" }}}}'
        "{{ .Labels.evidence }}{{ if .Labels.workload }} ({{ .Labels.namespace }}/{{ .Labels.workload }}){{ end }}; "
        "{{ end }}"
    )
    return [
        Alert(
            AlertName.NODE_SUSPECT,
            "warning",
            f"max by (node) ({suspect}) and on (node) max by (node) ({fresh}) unless on (node) ({cordoned})",
            "A node keeps breaking the jobs that land on it: cordon it.",
            "Node {{ $labels.node }} keeps breaking jobs. Its evidence over the last "
            + week
            + ": "
            + listed
            + "cordon "
            "it, and have its accelerators checked.",
            DashboardUID.FLEET,
            runbook="The bad-host ledger keeps, per node, for a day and a week, the evidence that its hardware breaks "
            "the jobs that land on it, whichever job: a process that failed first and alone for a reason that may be "
            "the host's (the runtime would not start, or the process died without a word), a chronic straggler, the "
            "worker that went non-finite first, a GPU throttled for power, heat or hardware, an XID of the "
            "hardware's. A node is suspect when two workloads or more left evidence on it, or one workload's "
            "process failed first on it twice while the workload ran elsewhere without failing first there, or an "
            "XID of the hardware's was reported on it. A workload that left the same kind of evidence on every node "
            "it ran on (two or more) left it with its code, not the nodes: it counts nowhere. The ticket fires for a "
            "node suspect over the week that left evidence in the last day, and resolves once the node is cordoned "
            "(kube-state-metrics' `kube_node_spec_unschedulable`) or a day passes with no new evidence. What to "
            "do: read the evidence and the workloads in the ticket and on the Fleet board's suspect nodes (are the "
            "suspects in one block or sub-block? then suspect the rack, its power or its network, not the hosts); "
            "`kubectl cordon` the node and drain it; run the accelerator's diagnostics (on TPU, the TPU VM's health "
            "checks; on GPU, DCGM's level-3 diagnostics), and have the host repaired or replaced. What the ledger "
            "cannot know: a node drained, repaired and returned under the same name keeps its evidence until it "
            "ages out of the week (silence the ticket for the node); a node pool recreated gives its nodes new names, "
            "so their evidence starts again; a single-host job pinned to one node cannot tell its bug from the "
            "node; a hardware fault that kills every process of a job at once reads as a bug.",
        )
    ]
