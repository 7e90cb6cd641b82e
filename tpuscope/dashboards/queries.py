"""PromQL for the dashboards, built from the catalogue's metric objects.

Every selector filters by the dashboard's template variables, and only by those the metric can carry:
``workload`` where the catalogue gives it a workload label, ``accelerator`` and ``tpu_topology`` on per-device
series, and always ``slice`` and ``worker`` (``catalog.HOST_LABELS``, on every series a sidecar serves). All
match with ``=~`` and *All* is ``.*``, which also matches a series without the label, so node_exporter's show.
"""

from __future__ import annotations

from tpuscope.catalog import (
    CHECKPOINT_LAST_SUCCESS,
    DEVICE_MEMORY_LIMIT,
    DEVICE_MEMORY_USED,
    HOST_LABELS,
    LAST_STEP,
    PROFILE_TIME,
    STEP_PHASE_DURATION,
    Label,
    Metric,
)
from tpuscope.conventions import EVALUATED, PROFILE_FRESH, PROFILE_OVER_MEDIAN, SLO_PERIOD
from tpuscope.promql import each_worker_once, grown, series

# Grafana's interval variables.
RATE = "$__rate_interval"  # at least four scrape intervals: a rate always has two samples
RANGE = "$__range"  # the dashboard's time range: for stats over the whole view
INTERVAL = "$__interval"  # one point's width: for counts of rare events, each counted on one point
HOUR = "1h"  # goodput becomes productive only when a checkpoint covers it: shorter windows swing
# The same windows in seconds, for the queries that compare a time with time() (Grafana has no $__interval_s).
SECONDS = {RANGE: "$__range_s", INTERVAL: "($__interval_ms / 1000)"}

# Template variable names.
WORKLOAD = "workload"
SLICE = str(Label.SLICE)
WORKER = str(Label.WORKER)
ACCELERATOR = "accelerator"
TPU_TOPOLOGY = str(Label.TPU_TOPOLOGY)
JOB = "job"  # the Prometheus job(s) scraping tpuscope sidecars
HOST = "host"  # Job debug's hidden variable: the chosen workload's scrape targets (instance), All as their list
# A host's series (its devices, its CPU) have no workload label: this reads the chosen workload's hosts only.
WORKLOAD_HOSTS = f'instance=~"${HOST}"'
PRICE = "chip_hour_price"

# The labels that tell one worker (one sidecar, one host) from another.
BY_WORKER = "job, instance, slice, worker"
WORKER_LEGEND = "{{slice}} {{worker}} {{instance}}"
BY_DEVICE = "job, instance, accelerator, source, device"
BY_REASON = "workload, reason"  # failures and restarts
DEVICE_LEGEND = "{{instance}} {{accelerator}} {{device}} ({{source}})"


def selector(metric: Metric, *matchers: str, suffix: str = "") -> str:
    """``name{...}`` with the template variables' matchers and any extra ones (``'phase="io"'``)."""
    labels = []
    if Label.WORKLOAD in metric.labels:
        labels.append(f'workload=~"${WORKLOAD}"')
    if Label.DEVICE in metric.labels:  # the accelerator and topology variables pick devices, not workloads
        labels += [f'accelerator=~"${ACCELERATOR}"', f'{TPU_TOPOLOGY}=~"${TPU_TOPOLOGY}"']
    labels += [f'{label}=~"${label}"' for label in HOST_LABELS]
    return series(metric, *labels, *matchers, suffix=suffix)


def eq(label: str, value: str) -> str:
    """An equality matcher: ``eq("phase", "io")`` -> ``phase="io"``."""
    return f'{label}="{value}"'


def ne(label: str, value: str) -> str:
    return f'{label}!="{value}"'


def rate(metric: Metric, *matchers: str, suffix: str = "", window: str = RATE) -> str:
    return f"rate({selector(metric, *matchers, suffix=suffix)}[{window}])"


def increase(metric: Metric, *matchers: str, suffix: str = "", window: str = RATE) -> str:
    return f"increase({selector(metric, *matchers, suffix=suffix)}[{window}])"


def events(counter: Metric, *matchers: str, suffix: str = "", window: str = INTERVAL, targets: str = "") -> str:
    """How much a counter of rare events (failures, XID errors, checkpoints) grew in ``window``, per series, as
    :func:`tpuscope.promql.grown` counts it (the first event and a sidecar gone since included)."""
    return grown(selector(counter, *matchers, suffix=suffix), window, SECONDS.get(window, ""), targets)


def once_per_job(
    counter: Metric, *matchers: str, by: str = "workload", suffix: str = "", window: str = INTERVAL, targets: str = ""
) -> str:
    """:func:`events` of a counter that every worker of a job reports alike (a failure, a restart, a compile of
    the SPMD program), counted once per job per ``by`` (which must hold ``workload``), as
    :func:`tpuscope.promql.each_worker_once` counts."""
    return each_worker_once(events(counter, *matchers, suffix=suffix, window=window, targets=targets), by=by)


def slo_period_sum(recorded: str, *matchers: str, by: str = "") -> str:
    """A recorded per-workload 5-minute rate (``conventions.GOODPUT_RATE``) summed over the SLO's period, per
    ``by``, as the alerts' long windows sum it: proportional to the period's events, and cheap where a ``rate()``
    of the raw counters would read every host's every scrape. By workload only: recorded series have no host labels."""
    labels = ", ".join([f'workload=~"${WORKLOAD}"', *matchers])
    per = f" by ({by})" if by else ""
    return f"sum{per} (sum_over_time({recorded}{{{labels}}}[{SLO_PERIOD}]))"


def recorded_hour(recorded: str, *matchers: str, by: str = "") -> str:
    """A recorded per-workload 5-minute rate (``conventions.GOODPUT_RATE``) averaged over the last hour, per
    ``by``: what ``rate()`` of the raw counters over the hour gives, read from a series a workload instead of every
    host's every scrape at each point (docs/fleet.md, "A thousand hosts"). Filtered by workload only."""
    labels = ", ".join([f'workload=~"${WORKLOAD}"', *matchers])
    per = f" by ({by})" if by else ""
    return f"sum{per} (avg_over_time({recorded}{{{labels}}}[{HOUR}]))"


def recorded_total(recorded: str, by: str, window: str = RANGE) -> str:
    """A recorded per-workload rate (a second a second, e.g. ``conventions.STRAGGLER_CHIPS``) summed over ``window``,
    per ``by``: its samples' sum over the evaluations of its group the window holds (``conventions.EVALUATED``),
    times the window's seconds. A series that began within the window counts 0 before."""
    labels = f'workload=~"${WORKLOAD}"'
    evaluations = f"scalar(count_over_time({EVALUATED}[{window}]))"
    return f"sum by ({by}) (sum_over_time({recorded}{{{labels}}}[{window}])) / {evaluations} * {SECONDS[window]}"


def host_matchers(*variables: str) -> str:
    """The matchers of the host variables (slice, worker) and ``variables``, for a recorded series that keeps them."""
    return ", ".join(f'{label}=~"${label}"' for label in (SLICE, WORKER, *variables))


def hour_once_per_job(recorded: str) -> str:
    """A recorded per-worker count of the last hour (``conventions.FAILURES_HOUR``), once per job per reason: the
    most any one worker saw, as :func:`tpuscope.promql.each_worker_once` counts it."""
    return f'max by ({BY_REASON}) ({recorded}{{workload=~"${WORKLOAD}", {host_matchers()}}})'


def quantile(
    q: float,
    histogram: Metric,
    *matchers: str,
    by: str = "",
    window: str = RATE,
    rare: bool = False,
    targets: str = "",
) -> str:
    """The ``q`` quantile of a histogram's observations in ``window``, per ``by``; ``rare`` for histograms of rare
    events (checkpoints), whose first observation ``rate()`` would miss (read as :func:`events`)."""
    grouping = f"le, {by}" if by else "le"
    if rare:
        buckets = events(histogram, *matchers, suffix="bucket", window=window, targets=targets)
    else:
        buckets = rate(histogram, *matchers, suffix="bucket", window=window)
    return f"histogram_quantile({q}, sum by ({grouping}) ({buckets}))"


def mean(histogram: Metric, *matchers: str, by: str = "", window: str = RATE) -> str:
    """The mean observation in ``window``, per ``by``: sum over count."""
    per = f" by ({by})" if by else ""
    return (
        f"sum{per} ({rate(histogram, *matchers, suffix='sum', window=window)})"
        f" / sum{per} ({rate(histogram, *matchers, suffix='count', window=window)})"
    )


def compute_over_median(window: str = RATE) -> str:
    """Each worker's mean compute phase over its workload's median worker's. In lockstep every worker
    waits for the slowest at the next collective: one far above 1 is the straggler slowing them all."""
    compute = mean(STEP_PHASE_DURATION, eq("phase", "compute"), by=f"workload, {BY_WORKER}", window=window)
    return f"({compute}) / on (workload) group_left () quantile by (workload) (0.5, {compute})"


def profiled(part: str) -> str:
    """Each worker's seconds per step in one part of its latest device profile (compute, exposed_collective,
    idle): the sampled gauge, one series per workload and worker."""
    return f"max by (workload, {BY_WORKER}) ({selector(PROFILE_TIME, eq('part', part))})"


def profiled_compute_over_median() -> str:
    """:func:`compute_over_median` from the device profiles: where one fused program runs the whole step, every
    worker's host-timed compute is the same step (the straggler wait is inside it), while the device trace tells
    the straggler's compute from its peers' collective wait. The straggler alert's recording rule
    :data:`~tpuscope.conventions.PROFILE_OVER_MEDIAN`: fresh captures of running workers only, so a finished
    job's last profile does not linger as a straggler."""
    return _recorded_part(PROFILE_OVER_MEDIAN, "compute")


def fresh_profiled(part: str) -> str:
    """:func:`profiled` from the recording rule :data:`~tpuscope.conventions.PROFILE_FRESH`: fresh captures of
    running workers only, the ones the straggler alert compares."""
    return _recorded_part(PROFILE_FRESH, part)


def _recorded_part(recorded: str, part: str) -> str:
    """One part of a per-worker recording rule over the device profiles, for the workers the variables select."""
    matchers = [f'workload=~"${WORKLOAD}"', *(f'{label}=~"${label}"' for label in HOST_LABELS), eq("part", part)]
    return f"max without (part) ({recorded}{{{', '.join(matchers)}}})"


def age(timestamp: Metric, by: str = "workload") -> str:
    """Seconds since a ``*_timestamp_seconds`` gauge's latest value, the freshest across workers."""
    return f"time() - max by ({by}) ({selector(timestamp)})"


def checkpoint_age() -> str:
    """Seconds since each workload's last good checkpoint; +Inf for a stepping workload that never saved."""
    never = f"max by (workload) ({selector(LAST_STEP)}) * 0 + Inf"
    return f"{age(CHECKPOINT_LAST_SUCCESS)} or {never}"


def on_workload_hosts(expr: str) -> str:
    """Per-host series (devices, the host) kept only for the hosts where the chosen workloads run now (``expr``
    reads them with :data:`WORKLOAD_HOSTS`, the hosts where they ran in the range)."""
    return f"({expr}) and on (job, instance) {selector(LAST_STEP)}"


def share(part: str, whole: str, ignoring: str = "") -> str:
    """``part / whole``, where ``part`` has one more label than ``whole`` (a phase, a category)."""
    return f"{part} / ignoring ({ignoring}) group_left {whole}" if ignoring else f"{part} / {whole}"


def memory_used_ratio(*matchers: str) -> str:
    """Device memory used over its limit, per device and per source (the job and a collector may both
    report a chip, each with its own numbering)."""
    return f"{selector(DEVICE_MEMORY_USED, *matchers)} / {selector(DEVICE_MEMORY_LIMIT, *matchers)}"
