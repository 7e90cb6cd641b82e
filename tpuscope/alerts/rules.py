"""Prometheus recording and alert rules for tpuscope's SLIs, from the catalogue and the thresholds.

Recording rules are named ``level:metric:operations`` (the Prometheus convention):
``workload:`` aggregates a workload across its workers, ``instance:`` stays per
sidecar. Alerts follow the monitoring-mixin style: CamelCase names with the
``Tpuscope`` prefix; ``severity: critical`` pages, ``warning`` makes a ticket,
``info`` is not routed; a static ``summary``, a templated ``description``, and
``runbook_url`` and ``dashboard_url`` annotations.

SLO alerts are multiwindow, multi-burn-rate (the SRE workbook): a long and a
short window must both burn the error budget faster than 14.4x (1 h / 5 m) or 6x
(6 h / 30 m) to page, 3x (1 d / 2 h) or 1x (3 d / 6 h) to make a ticket. A budget
larger than 1/14.4 of the time (goodput's 10 %) cannot burn at 14.4x: the
threshold is then "nearly all of it" (0.99), so the fast page still means
something: no goodput at all for an hour.

The ratios over windows longer than an hour are built from recorded per-workload
5-minute rates, as Sloth and Pyrra do: a 3-day ``rate()`` of every host's raw
counters would read 17,280 samples a series at each evaluation, a cost that
grows with the fleet; the recorded rates grow with the number of workloads.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tpuscope import catalog as c
from tpuscope.generator_config import GeneratorConfig
from tpuscope.promql import grown, le, series

PREFIX = "Tpuscope"
UNITS = {"m": 60, "h": 3600, "d": 86400}


def seconds(window: str) -> int:
    return int(window[:-1]) * UNITS[window[-1]]


WINDOWS = ("5m", "30m", "1h", "2h", "6h", "1d", "3d")
# (long window, short window, burn rate, severity)
BURN_RATES = (
    ("1h", "5m", 14.4, "critical"),
    ("6h", "30m", 6, "critical"),
    ("1d", "2h", 3, "warning"),
    ("3d", "6h", 1, "warning"),
)
WORKER = "job, instance, slice, worker"
COMPUTE = 'phase="compute"'
PRODUCTIVE = 'category="productive"'
CHECKPOINTING = 'category="checkpoint"'
BACKEND = 'stage="backend"'
HIT = 'result="hit"'
SAVE = 'operation="save"'
ERROR = 'result="error"'
PLANNED = 'reason!="preemption"'
# Recording rules the alerts read.
STEPS_RATE = "workload:tpuscope_steps:rate5m"
COMPUTE_PER_WORKER = "worker:tpuscope_step_phase_duration_seconds:compute_mean5m"
COMPUTE_MEDIAN = "workload:tpuscope_step_phase_duration_seconds:compute_median5m"
COMPUTE_OVER_MEDIAN = "worker:tpuscope_step_phase_duration_seconds:compute_over_median5m"
MEMORY_USED = "device:tpuscope_device_memory_used_bytes:ratio_limit"
GOODPUT_RATE = f"workload_category:{c.GOODPUT.base_name}:rate5m"
REQUESTS_FAST_RATE = f"workload:{c.INFERENCE_REQUEST_DURATION.name}_within_objective:rate5m"
REQUESTS_RATE = f"workload:{c.INFERENCE_REQUEST_DURATION.name}_count:rate5m"
RAW_UP_TO = "1h"  # SLO windows up to this read the raw counters; longer ones the recorded 5m rates


def new_or_increase(counter: c.Metric, window: str, *matchers: str, suffix: str = "") -> str:
    """How much a workload's counter of rare events grew in ``window``, a series born in it counted in
    full (``increase()`` never counts a series' first sample, so a first failure would read 0).

    The most any one process saw, not the sum: every worker of a multi-host job reports the same
    restart, the same recompile.
    """
    grew = grown(series(counter, *matchers, suffix=suffix), window)
    return f"max by (workload) (sum by (workload, job, instance) {grew})"


def per_workload(function: str, selector: str, window: str, by: str = "workload") -> str:
    """``sum by (workload) (function(selector[window]))``: a range function's result per workload."""
    return f"sum by ({by}) ({function}({selector}[{window}]))"


def running(what: str = "workload") -> str:
    """``and`` the workloads with a process connected: a finished job's gauges linger in its sidecar."""
    return f"and on ({what}) max by ({what}) ({series(c.WORKLOAD_PROCESSES)}) > 0"


@dataclass(frozen=True)
class Alert:
    name: str
    severity: str  # critical pages, warning makes a ticket, info is not routed
    expr: str
    summary: str
    description: str  # a Go template: {{ $labels.x }}, {{ $value }}
    dashboard: str  # the dashboard's uid, linked from the alert
    for_: str = "0m"
    runbook: str = ""  # what to do, for docs/alerts.md
    labels: dict[str, str] = field(default_factory=dict)

    def rule(self, config: GeneratorConfig) -> dict[str, Any]:
        anchor = self.name.lower()
        dashboard = f"{config.grafana_url}/d/{self.dashboard}"
        if "$labels.workload" in self.description:
            dashboard += "?var-workload={{ $labels.workload }}"
        rule: dict[str, Any] = {"alert": self.name, "expr": self.expr}
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


def recording_rules(config: GeneratorConfig) -> list[dict[str, str]]:
    t = config.thresholds
    phase_sum = series(c.STEP_PHASE_DURATION, suffix="sum")
    rules = [
        {
            "record": STEPS_RATE,
            "expr": f"max by (workload) (rate({series(c.STEPS)}[5m]))",
        },
        {
            "record": "workload:tpuscope_step_duration_seconds:mean5m",
            "expr": f"sum by (workload) (rate({series(c.STEP_DURATION, suffix='sum')}[5m]))"
            f" / sum by (workload) (rate({series(c.STEP_DURATION, suffix='count')}[5m]))",
        },
        {
            "record": "workload:tpuscope_step_duration_seconds:p99_5m",
            "expr": "histogram_quantile(0.99, sum by (workload, le)"
            f" (rate({series(c.STEP_DURATION, suffix='bucket')}[5m])))",
        },
        {
            "record": "workload_phase:tpuscope_step_phase_duration_seconds:share5m",
            "expr": f"sum by (workload, phase) (rate({phase_sum}[5m])) / ignoring (phase) group_left"
            f" sum by (workload) (rate({series(c.STEP_DURATION, suffix='sum')}[5m]))",
        },
        {
            "record": COMPUTE_PER_WORKER,
            "expr": f"sum by (workload, {WORKER}) (rate({series(c.STEP_PHASE_DURATION, COMPUTE, suffix='sum')}[5m]))"
            f" / sum by (workload, {WORKER}) (rate({series(c.STEP_PHASE_DURATION, COMPUTE, suffix='count')}[5m]))",
        },
        {
            "record": COMPUTE_MEDIAN,
            "expr": f"quantile by (workload) (0.5, {COMPUTE_PER_WORKER})",
        },
        {  # the straggler's measure, for the alert and for a fleet's own panels
            "record": COMPUTE_OVER_MEDIAN,
            "expr": f"{COMPUTE_PER_WORKER} / on (workload) group_left () {COMPUTE_MEDIAN}",
        },
        {
            "record": MEMORY_USED,
            "expr": f"{series(c.DEVICE_MEMORY_USED)} / {series(c.DEVICE_MEMORY_LIMIT)}",
        },
    ]
    slow = f'le="{le(t.inference_latency_seconds)}"'
    # The SLO ratios' inputs per workload over 5 minutes: the windows over an hour are sums of these, so a
    # 3-day ratio reads a few series of workload rates, not 3 days of every host's raw counters.
    # Each SLO ratio's inputs: the raw series, and the recorded 5-minute rate that stands for it in the
    # windows over RAW_UP_TO.
    inputs = {
        "productive": (series(c.GOODPUT, PRODUCTIVE), f"{GOODPUT_RATE}{{{PRODUCTIVE}}}"),
        "wall": (series(c.GOODPUT), GOODPUT_RATE),
        "within": (series(c.INFERENCE_REQUEST_DURATION, slow, suffix="bucket"), REQUESTS_FAST_RATE),
        "total": (series(c.INFERENCE_REQUEST_DURATION, suffix="count"), REQUESTS_RATE),
    }
    rules += [
        {"record": GOODPUT_RATE, "expr": per_workload("rate", inputs["wall"][0], "5m", by="workload, category")},
        {"record": REQUESTS_FAST_RATE, "expr": per_workload("rate", inputs["within"][0], "5m")},
        {"record": REQUESTS_RATE, "expr": per_workload("rate", inputs["total"][0], "5m")},
    ]
    for window in WINDOWS:
        # Sums, not averages, of the 5-minute rates: a category that began mid-window counts 0 before.
        raw = seconds(window) <= seconds(RAW_UP_TO)
        x = {
            name: per_workload("rate", selector, window) if raw else per_workload("sum_over_time", recorded, window)
            for name, (selector, recorded) in inputs.items()
        }
        rules += [
            {"record": f"workload:tpuscope_badput:ratio_rate{window}", "expr": f"1 - {x['productive']} / {x['wall']}"},
            {
                "record": f"workload:tpuscope_inference_slow_requests:ratio_rate{window}",
                "expr": f"1 - {x['within']} / {x['total']}",
            },
        ]
    return rules


def burn_rate_alerts(
    name: str,
    ratio_rule: str,
    budget: float,
    summary: str,
    what: str,
    dashboard: str,
    runbook: str,
    shortest: str = "5m",
    existed: str = "",
) -> list[Alert]:
    """Page on a fast burn, ticket on a slow one: one alert name, two severities.

    ``shortest``: no window shorter than this (goodput is booked at checkpoints, so shorter windows read
    all badput between two). ``existed``: a series the workload must have had a long window ago, so a
    young workload's start-up is not judged over a window it was not alive for.
    """
    result = []
    for severity in ("critical", "warning"):
        conditions = []
        for long, short, rate, level in BURN_RATES:
            if level != severity:
                continue
            bound = min(0.99, rate * budget)
            short = max(short, shortest, key=seconds)
            condition = f"{ratio_rule}{long} > {bound:g} and {ratio_rule}{short} > {bound:g}"
            if existed:
                condition += f" and on (workload) max by (workload) ({existed} offset {long}) >= 0"
            conditions.append(f"({condition})")
        windows = "1h or 6h" if severity == "critical" else "1d or 3d"
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


def alerts(config: GeneratorConfig) -> list[Alert]:
    t = config.thresholds
    last_step = series(c.LAST_STEP)
    connected = series(c.WORKLOAD_PROCESSES)
    share = "workload_phase:tpuscope_step_phase_duration_seconds:share5m"
    mean_step = "workload:tpuscope_step_duration_seconds:mean5m"
    lost = series(c.INGEST_EVENTS, 'result=~"dropped|invalid"')
    lookups = new_or_increase(c.COMPILE_CACHE_REQUESTS, "1h")
    return [
        Alert(
            f"{PREFIX}WorkloadStalled",
            "critical",
            f"time() - max by (workload) ({last_step}) > {t.stall_seconds:g} {running()}",
            "A workload has stopped completing steps.",
            "Workload {{ $labels.workload }} has completed no step for {{ $value | humanizeDuration }} (or not "
            "one since it started) while its processes are still connected.",
            "tpuscope-job",
            runbook="A hung collective (one host down or stuck), a dead input pipeline, or a deadlock. Check the job's "
            "logs on every worker, the On-call dashboard's sidecars and collectors, and the last kept trace.",
        ),
        Alert(
            f"{PREFIX}StepTimeRegression",
            "warning",
            f"{mean_step} > {t.step_regression_factor:g} * avg_over_time({mean_step}[6h] offset 30m)"
            f" and count_over_time({mean_step}[6h] offset 30m) > 180",  # a baseline of 3 hours at least
            "A workload's steps are slower than its own baseline.",
            "Workload {{ $labels.workload }} takes {{ $value | humanizeDuration }} a step, more than "
            f"{t.step_regression_factor:g}x its mean of the 6 hours before.",
            "tpuscope-job",
            "30m",
            "Compare the phase breakdown before and after: io (input), sync (collectives, a straggler), compute "
            "(a new program, throttled chips).",
        ),
        Alert(
            f"{PREFIX}InputBound",
            "warning",
            f'{share}{{phase="io"}} > {t.io_share:g}',
            "A workload waits for its input.",
            "Workload {{ $labels.workload }} spends {{ $value | humanizePercentage }} of its step time waiting for "
            "input.",
            "tpuscope-job",
            "15m",
            "Add input workers, prefetch more batches, move decoding off the training host, check the storage.",
        ),
        Alert(
            f"{PREFIX}SyncBound",
            "warning",
            f'{share}{{phase="sync"}} > {t.sync_share:g}',
            "A workload spends much of its steps in collectives.",
            "Workload {{ $labels.workload }} spends {{ $value | humanizePercentage }} of its step time in "
            "collective sync.",
            "tpuscope-job",
            "15m",
            "Look for a straggler first (TpuscopeStraggler); then the interconnect and the sharding.",
        ),
        Alert(
            f"{PREFIX}Straggler",
            "warning",
            f"{COMPUTE_OVER_MEDIAN} > {t.straggler_factor:g}",
            "One worker is much slower than the rest of its workload.",
            "Worker {{ $labels.worker }} ({{ $labels.instance }}, slice {{ $labels.slice }}) of workload "
            '{{ $labels.workload }} takes {{ printf "%.2f" $value }}x its workload\'s median compute time per '
            f"step (a straggler from {t.straggler_factor:g}x).",
            "tpuscope-job",
            "10m",
            "Every worker waits for it at each collective. Check the host: thermal throttling, a failing chip, a "
            "noisy neighbour. Cordon it and restart the job on a healthy host.",
        ),
        Alert(
            f"{PREFIX}LowDutyCycle",
            "warning",
            f"avg by (job, instance) ({series(c.DUTY_CYCLE)}) < {t.duty_cycle_low:g}"
            f" and on (job, instance) {connected}",
            "A host's chips are mostly idle while a workload runs on it.",
            "The chips of {{ $labels.instance }} were busy {{ $value | humanizePercentage }} of the time.",
            "tpuscope-fleet",
            "30m",
            "Paid-for chips waiting: on input, on the host, on a straggler. See the workload's phase breakdown.",
        ),
        Alert(
            f"{PREFIX}LowMFU",
            "warning",
            f"avg by (workload) ({series(c.MFU)}) < {t.mfu_low:g} {running()}",
            "A workload uses a small share of its chips' peak FLOP/s.",
            "Workload {{ $labels.workload }} reaches {{ $value | humanizePercentage }} model FLOPs utilization.",
            "tpuscope-job",
            "30m",
            "Profile the step: fusion, padding, small batches, host-bound phases.",
        ),
        Alert(
            f"{PREFIX}CompileTimeHigh",
            "warning",
            f"{new_or_increase(c.COMPILE_DURATION, '1h', BACKEND, suffix='sum')} > {t.compile_seconds_per_hour:g}",
            "A workload spends a lot of time compiling.",
            "Workload {{ $labels.workload }} compiled for {{ $value | humanizeDuration }} in the last hour.",
            "tpuscope-job",
            runbook="Use the persistent compilation cache; keep shapes and static arguments fixed.",
        ),
        Alert(
            f"{PREFIX}Recompiling",
            "warning",
            f"{new_or_increase(c.COMPILE_DURATION, '30m', BACKEND, suffix='count')} > {t.steady_state_compiles:g}"
            f" and on (workload) sum by (workload) ({series(c.STEPS)} offset 1h) > 0",
            "A workload keeps recompiling in its steady state.",
            "Workload {{ $labels.workload }} compiled {{ $value }} programs in 30 minutes, an hour after it began "
            "stepping.",
            "tpuscope-job",
            runbook="Shapes or static arguments change between steps: pad to fixed shapes, bucket sequence lengths.",
        ),
        Alert(
            f"{PREFIX}CompileCacheHitRatioLow",
            "warning",
            f"({new_or_increase(c.COMPILE_CACHE_REQUESTS, '1h', HIT)} or on (workload) {lookups} * 0)"
            f" / {lookups} < {t.compile_cache_hit_ratio:g} and {lookups} >= 10",
            "The persistent compilation cache misses.",
            "Workload {{ $labels.workload }} hit the compilation cache for {{ $value | humanizePercentage }} of its "
            "look-ups in the last hour.",
            "tpuscope-job",
            runbook="Check that the cache directory is shared and persistent, and that JAX and its flags did not "
            "change.",
        ),
        Alert(
            f"{PREFIX}MemorySpill",
            "warning",
            f"max by (workload, program) ({series(c.MEMORY_SPILL)}) > 0 {running()}",
            "A compiled program spills to host memory.",
            "Program {{ $labels.program }} of workload {{ $labels.workload }} places {{ $value | humanize1024 }}B "
            "in host memory.",
            "tpuscope-job",
            "10m",
            "The program does not fit in device memory: smaller batch, rematerialization, more sharding.",
        ),
        Alert(
            f"{PREFIX}DeviceMemoryNearLimit",
            "warning",
            f"{MEMORY_USED} > {t.hbm_used_ratio:g}",
            "A device's memory is nearly full.",
            "Device {{ $labels.device }} ({{ $labels.accelerator }}, {{ $labels.source }}) of {{ $labels.instance }} "
            "uses {{ $value | humanizePercentage }} of its memory.",
            "tpuscope-oncall",
            "10m",
            "The next larger program will fail with out-of-memory; reduce the batch or rematerialize.",
        ),
        Alert(
            f"{PREFIX}CheckpointFailing",
            "warning",
            f"{new_or_increase(c.CHECKPOINT_DURATION, '30m', SAVE, ERROR, suffix='count')} > 0",
            "Checkpoint saves fail.",
            "Workload {{ $labels.workload }} failed {{ $value }} checkpoint saves in the last 30 minutes.",
            "tpuscope-job",
            runbook="Check the checkpoint storage: quota, permissions, throttling. Work since the last good save is "
            "at risk.",
        ),
        Alert(
            f"{PREFIX}CheckpointStale",
            "critical",
            f"time() - max by (workload) ({series(c.CHECKPOINT_LAST_SUCCESS)}) > {t.checkpoint_age_seconds:g}"
            f" {running()}",
            "A running workload has no recent good checkpoint.",
            "Workload {{ $labels.workload }} last saved a checkpoint {{ $value | humanizeDuration }} ago: that much "
            "work is lost if it fails now.",
            "tpuscope-oncall",
            runbook="Are saves failing (TpuscopeCheckpointFailing), or was the checkpoint interval set too long?",
        ),
        Alert(
            f"{PREFIX}CheckpointMissing",
            "warning",
            f"max by (workload) ({series(c.STEPS)}) > 0 unless on (workload) {series(c.CHECKPOINT_LAST_SUCCESS)}"
            f" {running()}",
            "A training workload has never saved a checkpoint.",
            "Workload {{ $labels.workload }} has been stepping for "
            f"{t.checkpoint_age_seconds / 3600:g} h without a good checkpoint: a failure loses all of it.",
            "tpuscope-oncall",
            f"{int(t.checkpoint_age_seconds)}s",
            "Turn checkpointing on, or find out why every save fails (TpuscopeCheckpointFailing).",
        ),
        Alert(
            f"{PREFIX}CheckpointTimeHigh",
            "warning",
            f"sum by (workload) (rate({series(c.GOODPUT, CHECKPOINTING)}[1h]))"
            f" / sum by (workload) (rate({series(c.GOODPUT)}[1h])) > {t.checkpoint_share:g}",
            "Checkpointing takes a large share of wall time.",
            "Workload {{ $labels.workload }} spends {{ $value | humanizePercentage }} of its wall time checkpointing.",
            "tpuscope-job",
            "30m",
            "Checkpoint less often, save asynchronously, write only what a restart needs.",
        ),
        *burn_rate_alerts(
            f"{PREFIX}GoodputBudgetBurn",
            "workload:tpuscope_badput:ratio_rate",
            1 - t.goodput_objective,
            "A workload is burning its goodput error budget.",
            "goodput",
            "tpuscope-fleet",
            "Find the largest badput category (Fleet overview) and fix it: restarts and lost work first.",
            shortest="1h",  # productive time is booked when a checkpoint covers it
            existed=series(c.STEPS),
        ),
        Alert(
            f"{PREFIX}WorkloadFailed",
            "warning",
            f"{new_or_increase(c.WORKLOAD_FAILURES, '1h')} > 0",
            "A workload failed.",
            "Workload {{ $labels.workload }} failed in the last hour (failures: {{ $value }}).",
            "tpuscope-oncall",
            runbook="Read the job's logs for the failure; the work since its last checkpoint was lost.",
        ),
        Alert(
            f"{PREFIX}WorkloadCrashLooping",
            "critical",
            f"{new_or_increase(c.WORKLOAD_RESTARTS, '1h', PLANNED)} >= {t.crash_loop_restarts:g}",
            "A workload restarts over and over.",
            "Workload {{ $labels.workload }} restarted {{ $value }} times in the last hour, preemptions not counted.",
            "tpuscope-oncall",
            runbook="A crash loop burns chips without progress: stop it, read the first failure's logs.",
        ),
        Alert(
            f"{PREFIX}CollectorDown",
            "warning",
            f"{series(c.COLLECTOR_UP)} == 0",
            "A tpuscope collector fails.",
            "Collector {{ $labels.collector }} of {{ $labels.instance }} has failed for 5 minutes.",
            "tpuscope-oncall",
            "5m",
            "See tpuscope_collector_errors_total for the reason and the sidecar's log for the detail.",
        ),
        Alert(
            f"{PREFIX}ExporterDown",
            "critical",
            f'up{{job=~"{config.exporter_job}"}} == 0',
            "A tpuscope sidecar cannot be scraped.",
            "Prometheus has not scraped the sidecar {{ $labels.instance }} for 5 minutes: its workloads are "
            "unmonitored.",
            "tpuscope-oncall",
            "5m",
            "Check the sidecar container (restarts, OOM kills) and the network path from Prometheus.",
        ),
        Alert(
            f"{PREFIX}ExporterAbsent",
            "warning",
            f'absent(up{{job=~"{config.exporter_job}"}})',
            "Prometheus has no tpuscope sidecar to scrape.",
            f"No target of a job matching {config.exporter_job} exists: the scrape configuration or the "
            "PodMonitor lost the sidecars.",
            "tpuscope-oncall",
            "15m",
            "Check the PodMonitor's selector and the scrape configuration's job name.",
        ),
        Alert(
            f"{PREFIX}IngestLosingEvents",
            "warning",
            f"sum by (job, instance) (rate({lost}[5m])) / sum by (job, instance) (rate({series(c.INGEST_EVENTS)}[5m]))"
            f" > {t.ingest_loss_ratio:g}",
            "A sidecar loses events from its jobs.",
            "The sidecar {{ $labels.instance }} lost {{ $value | humanizePercentage }} of its events (dropped or "
            "invalid): the step metrics undercount.",
            "tpuscope-oncall",
            "10m",
            "Dropped: the sidecar is too slow or was down. Invalid: a job and sidecar of incompatible versions.",
        ),
        Alert(
            f"{PREFIX}HostCPUSaturated",
            "warning",
            f"avg by (job, instance) ({series(c.HOST_CPU_UTILIZATION)}) > {t.host_cpu_ratio:g}",
            "A training host's CPU is saturated.",
            "The CPU of {{ $labels.instance }} is {{ $value | humanizePercentage }} busy: it cannot feed its chips.",
            "tpuscope-oncall",
            "15m",
            "Find the process (tpuscope_job_cpu_seconds_total); move input decoding elsewhere.",
        ),
        *burn_rate_alerts(
            f"{PREFIX}InferenceLatencyBudgetBurn",
            "workload:tpuscope_inference_slow_requests:ratio_rate",
            1 - t.inference_latency_objective,
            "A serving workload is burning its latency error budget.",
            "latency",
            "tpuscope-serving",
            "Add replicas or shorten the batching window; check for slow batches.",
        ),
    ]
