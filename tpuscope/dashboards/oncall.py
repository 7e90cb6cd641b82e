"""On-call: what is broken right now, and is the monitoring itself working?

For the SRE holding the pager: the sidecars and their collectors, stalled
workloads, failures and compile failures by reason, checkpoint staleness,
collectives against their baseline, memory headroom, the hosts (memory pressure,
throttled GPUs), and the alerts firing. Every panel reads well when all is fine (ages, ratios, counts of
zero), so a blank panel always means missing data, never good news.
"""

from __future__ import annotations

from typing import Any

from tpuscope import catalog as c
from tpuscope import conventions as records  # the per-slice and per-job records this board draws
from tpuscope.conventions import (
    ALERT_PREFIX,
    DEFAULT_PORT,
    FAILURES_HOUR,
    PROFILE_MEDIAN,
    RESTARTS_HOUR,
    XID_HOUR,
    AlertName,
    DashboardUID,
)
from tpuscope.dashboards import panels as p
from tpuscope.dashboards import queries as q
from tpuscope.reasons import COMPILE_FAILURE_VALUES, FAILURE_VALUES, RECOMPILE_VALUES
from tpuscope.thresholds import Thresholds

TITLE = "tpuscope / On-call"
DESCRIPTION = (
    "Exporter and collector health, stalled workloads, failures by reason, checkpoint staleness, collectives, "
    "headroom, host memory pressure, throttled GPUs, alerts."
)

# Every sidecar target's scrape, whatever slice and worker are selected: those labels come with the sidecar's own
# series, which Prometheus' up does not carry and a sidecar that is down does not send. Recorded per scrape job: a
# lane per target read every target at each point (2.6 s over 24 h of 1,000 hosts), and a thousand lanes name none.
SIDECARS_DOWN_NOW = f'sum ({records.SIDECARS_DOWN}{{job=~"${q.JOB}"}})'
# tpuscope's alerts, firing now. The same alerts as conventions.OUR_ALERTS matches, but spelt with .* as this
# dashboard always had it, so the panels' queries (and the committed JSON) do not change.
ALERTS = f'ALERTS{{alertstate="firing", alertname=~"{ALERT_PREFIX}.*"}}'
LOST = 'result=~"dropped|invalid"'
STRAGGLER_LEGEND = "{{workload}}: slice {{slice}} worker {{worker}} ({{instance}})"
# TpuscopeCollectiveLatencySpike's windows (tpuscope.alerts.training, which the dashboards may not import): a
# workload's collective time, its median over the last 30 minutes against its median over the 6 hours before.
COLLECTIVE_NOW, COLLECTIVE_BASELINE = "30m", "6h"
EXPOSED = q.eq("part", "exposed_collective")
SM = q.eq("clock", "sm")
# The host panels draw each slice's worst host, from recording rules: per host, a panel of a thousand hosts read
# every host's series at each point, and drew more lines than anyone reads.
ONE_HOST = (
    "Each slice's worst host, from the recording rules. Which host that is, Job debug's Host section shows: a line for "
    "each of the workload's hosts."
)


def per_slice(record: str, by: str = "slice", worst: str = "max") -> str:
    """A per-slice record on the selected jobs and slices (the records keep no worker), one series per ``by``: the
    ``worst`` of the records (or their sum); all in one without ``by``."""
    grouping = f" by ({by})" if by else ""
    return f'{worst}{grouping} ({record}{{job=~"${q.JOB}", slice=~"${q.SLICE}"}})'


def monitoring() -> p.Section:
    return p.Section(
        "Is the monitoring working?",
        [
            p.stat_panel(
                "Sidecars down",
                "tpuscope sidecars Prometheus could not scrape at its last attempt. While one is down, its "
                "host's workloads are invisible and their alerts cannot fire: check the pod (restarts, OOM "
                f"kills) and the network policy between Prometheus and port {DEFAULT_PORT}.",
                "short",
                p.query(SIDECARS_DOWN_NOW),
                limits=p.high_is_bad(1),
                span=4,
            ),
            p.stat_panel(
                "Collectors down",
                "Collectors (libtpu, nvml, host) whose latest collection failed or passed its deadline. The "
                "sidecar keeps serving the rest; Collector errors says why.",
                "short",
                p.query(per_slice(records.COLLECTORS_DOWN, by="", worst="sum")),
                limits=p.high_is_bad(1),
                span=4,
            ),
            p.stat_panel(
                "Events dropped or invalid",
                "Events from jobs the sidecar lost over the range: dropped (the job could not send: sidecar "
                "down or socket full) and invalid (rejected as malformed). Nonzero means the step metrics "
                "undercount.",
                "short",
                p.query(f"sum ({q.increase(c.INGEST_EVENTS, LOST, window=q.RANGE)})", instant=True),
                limits=p.high_is_bad(1),
                span=4,
            ),
            p.timeseries_panel(
                "Sidecars down, by scrape job",
                "Sidecar targets Prometheus could not scrape, per scrape job, from the recording rules. "
                f"{AlertName.EXPORTER_DOWN} names the host.",
                "short",
                p.query(f'sum by (job) ({records.SIDECARS_DOWN}{{job=~"${q.JOB}"}})', "{{job}}"),
                limits=p.high_is_bad(1),
                span=12,
            ),
            p.timeseries_panel(
                "Hosts with a collector down, by slice",
                "How many of each slice's hosts had each collector's latest collection fail. A libtpu collector on a "
                "host with no job connected counts (it has nothing to read), though it pages no one. The "
                f"{AlertName.COLLECTOR_DOWN} alert and Job debug's Host section name the host.",
                "short",
                p.query(
                    per_slice(records.COLLECTORS_DOWN, by="slice, collector", worst="sum"),
                    "{{slice}} {{collector}}",
                ),
                limits=p.high_is_bad(1),
                span=12,
            ),
            p.timeseries_panel(
                "Collector errors, by slice and reason",
                f"Failed collections a second: {', '.join(c.COLLECTOR_ERRORS.values(c.Label.REASON))}. A collector "
                "that keeps failing backs off and retries; Job debug's Host section says how often each host "
                "failed, the sidecar's log the detail.",
                "eps",
                p.query(
                    per_slice(records.COLLECTOR_ERRORS_RATE, by="slice, collector, reason", worst="sum"),
                    "{{slice}} {{collector}} {{reason}}",
                ),
            ),
            p.timeseries_panel(
                "Events received, by result",
                "Events per second from the jobs: accepted, invalid (rejected by the sidecar) and dropped (lost "
                "on the job's side, as the job reports it). From the recording rules' per-slice rates.",
                "eps",
                p.query(per_slice(records.INGEST_RATE, by="result", worst="sum"), "{{result}}"),
            ),
        ],
    )


def workloads(t: Thresholds) -> p.Section:
    return p.Section(
        "Workloads",
        [
            p.bar_gauge_panel(
                "Seconds since the last progress, by workload",
                "Since the last step, checkpoint save or restore, or compile stage ended (what "
                f"{AlertName.WORKLOAD_STALLED} reads). Over {t.stall_seconds:g} s a workload is stalled: a hung "
                "collective, a dead input pipeline, a host gone, a save that never ends. Look at the job's logs and "
                "at its hosts below; a workload that finished stays here until its sidecar forgets it.",
                "s",
                p.query(q.age(c.LAST_PROGRESS), "{{workload}}", instant=True),
                limits=p.high_is_bad(t.stall_seconds, t.stall_seconds / 2),
                span=8,
            ),
            p.bar_gauge_panel(
                "Time since the last good checkpoint, by workload",
                f"The work at risk if the workload failed now. Over {t.checkpoint_age_seconds:g} s: are saves "
                "failing (storage full, permissions)? Infinity: the workload steps and has never saved.",
                "s",
                p.query(q.checkpoint_age(), "{{workload}}", instant=True),
                limits=p.high_is_bad(t.checkpoint_age_seconds, t.checkpoint_age_seconds / 2),
                span=8,
            ),
            p.timeseries_panel(
                "Failures and restarts in the last hour",
                "Failures and restarts per workload over a sliding hour, each counted once per job however "
                "many hosts report it (as the alerts count them, from the same recording rules). A workload in a "
                "crash loop restarts without progress: stop it before it burns its chips.",
                "short",
                p.query(q.hour_once_per_job(FAILURES_HOUR), "failure {{workload}} {{reason}}"),
                p.query(q.hour_once_per_job(RESTARTS_HOUR), "restart {{workload}} {{reason}}"),
                span=8,
            ),
            p.bar_gauge_panel(
                "Host-timed: slowest worker of each workload, against the median",
                "For each workload, the worker with the longest host-timed compute phase per step, as a multiple "
                f"of its workload's median worker. Over {t.straggler_factor:g} it is a straggler "
                f"({AlertName.STRAGGLER}): every other worker waits for it at each collective. The bar names its "
                "slice, worker and host: cordon that host and restart the job elsewhere. Needs three workers or "
                "more to be sharp. A job that runs one fused program a step reads alike on every worker here "
                "(each one's compute holds the wait for the slowest): read the device profile beside it.",
                "none",
                p.query(f"topk by (workload) (1, {q.compute_over_median()})", STRAGGLER_LEGEND, instant=True),
                limits=p.ratio_high_is_bad(t.straggler_factor),
                span=12,
            ),
            p.bar_gauge_panel(
                "Device profile: slowest worker of each workload, against the median",
                "For each workload, the worker with the most compute per step in its latest sampled device "
                "profile (a device trace of a few steps, every 10 minutes by default; Job debug shows its age), "
                f"as a multiple of its workload's median worker. Over {t.straggler_factor:g} it is the straggler "
                "the others wait for, told apart even inside one fused program: it computes longer and waits "
                f"less at the collectives ({AlertName.STRAGGLER} reads the same). Cordon its host. Only recent "
                "captures of running workers count; empty for jobs that do not profile.",
                "none",
                p.query(f"topk by (workload) (1, {q.profiled_compute_over_median()})", STRAGGLER_LEGEND, instant=True),
                limits=p.ratio_high_is_bad(t.straggler_factor),
                span=12,
            ),
            p.bar_gauge_panel(
                "Device profile: each worker's compute and collective wait per step",
                "Every worker's compute and exposed collective time (collective ops no compute covers: the wait "
                "for the other devices and hosts) per step, in its latest sampled device profile. In a "
                "synchronous job the straggler is the worker with the longest compute and the shortest wait: "
                "the others wait for it at every collective. Every worker waiting long, none computing long, is "
                "the interconnect or the sharding instead. Only recent captures of running workers count.",
                "s",
                p.query(q.fresh_profiled("compute"), "compute " + STRAGGLER_LEGEND, instant=True),
                p.query(q.fresh_profiled("exposed_collective"), "collective wait " + STRAGGLER_LEGEND, instant=True),
                span=24,
                height=10,
            ),
            p.timeseries_panel(
                "Device profile: exposed collective time against its baseline, by workload",
                "Each workload's collective time no compute hides per step (its workers' median, from their sampled "
                f"device profiles): its median over the last {COLLECTIVE_NOW}, and its median over the "
                f"{COLLECTIVE_BASELINE} before that, its baseline. {AlertName.COLLECTIVE_LATENCY_SPIKE} fires when "
                f"the first is over {t.collective_spike_factor:g}x the second (with 3.5 hours of history, while "
                f"exposed collectives are over {t.collective_spike_min_share:.0%} of the step): the interconnect or "
                "the network got slower, or a peer did. Only recent captures of running workers count; empty for "
                "jobs that do not profile.",
                "s",
                p.query(
                    f"max by (workload) (quantile_over_time(0.5, {recorded_exposed()}[{COLLECTIVE_NOW}]))",
                    "now {{workload}}",
                ),
                p.query(
                    f"max by (workload) (quantile_over_time(0.5, {recorded_exposed()}[{COLLECTIVE_BASELINE}]"
                    f" offset {COLLECTIVE_NOW}))",
                    "baseline {{workload}}",
                ),
                span=12,
            ),
            p.timeseries_panel(
                "Multislice collective latency p99: the worst and the median host of each slice",
                "The TPU runtime's end-to-end collective latency across slices (megascale's collective_end_to_end, "
                "all buffer sizes), p99 over 5 minutes per host as the recording rule the alert reads keeps it, here "
                "the worst host of each slice and its median host: in a multislice job, the DCN between the slices. "
                "A worst host far above its slice's median has a bad network path; all of them above their own "
                f"past, the network or a peer slice. For a job without device profiles, "
                f"{AlertName.COLLECTIVE_LATENCY_SPIKE} compares each host with its {COLLECTIVE_BASELINE} before. "
                "Job debug's Host section draws the workload's hosts one by one. Empty for single-slice jobs and GPUs.",
                "s",
                p.query(per_slice(records.COLLECTIVE_P99_WORST), "worst {{slice}}"),
                p.query(per_slice(records.COLLECTIVE_P99_MEDIAN), "median {{slice}}"),
                span=12,
            ),
        ],
    )


def recorded_exposed() -> str:
    """The recorded median over a workload's workers of their exposed collective time (fresh profiles only)."""
    return f'{PROFILE_MEDIAN}{{workload=~"${q.WORKLOAD}", {EXPOSED}}}'


def failures(t: Thresholds) -> p.Section:
    return p.Section(
        "Failures and compiles, by reason",
        [
            p.bar_gauge_panel(
                "Failures over the range, by workload and reason",
                "Each workload's failures over the dashboard's range, by the reason the job classified its failure "
                f"({', '.join(FAILURE_VALUES)}), each counted once per job however many hosts report it. vanished: "
                "the process ended without a word (a SIGKILL: the kernel's OOM killer, see the host memory panels). "
                "docs/alerts.md's Failure reasons says what to do for each.",
                "short",
                p.query(
                    q.once_per_job(c.WORKLOAD_FAILURES, by=q.BY_REASON, window=q.RANGE),
                    "{{workload}} {{reason}}",
                    instant=True,
                ),
                limits=p.high_is_bad(1),
                span=8,
            ),
            p.bar_gauge_panel(
                "Compile failures over the range, by stage and reason",
                "Programs that failed to compile over the dashboard's range, by workload, stage (tracing, lowering, "
                f"backend) and reason ({', '.join(COMPILE_FAILURE_VALUES)}), counted once per job. A failed compile "
                f"usually ends the job and fails again on restart ({AlertName.COMPILE_FAILING}); docs/alerts.md's "
                "Compile failure reasons says what to do for each.",
                "short",
                p.query(
                    q.once_per_job(c.COMPILE_FAILURES, by="workload, stage, reason", window=q.RANGE),
                    "{{workload}} {{stage}} {{reason}}",
                    instant=True,
                ),
                limits=p.high_is_bad(1),
                span=8,
            ),
            p.bar_gauge_panel(
                "Recompiles over the range, by cause",
                "Functions JAX traced again over the dashboard's range, by workload and cause "
                f"({', '.join(RECOMPILE_VALUES)}), counted once per job. A few after the start are warm-up; many in "
                f"the steady state cost compile time every time ({AlertName.RECOMPILING}). docs/alerts.md's "
                "Recompile causes says how to avoid each.",
                "short",
                p.query(
                    q.once_per_job(c.RECOMPILES, by="workload, cause", window=q.RANGE),
                    "{{workload}} {{cause}}",
                    instant=True,
                ),
                limits=p.high_is_bad(t.steady_state_compiles),
                span=8,
            ),
        ],
    )


def hosts(t: Thresholds) -> p.Section:
    return p.Section(
        "Devices and hosts",
        [
            p.bar_gauge_panel(
                "Device memory headroom, by device",
                f"Free share of each device's memory (HBM). Below {1 - t.hbm_used_ratio:.0%} a larger batch, a "
                "new program or fragmentation will fail with out-of-memory.",
                "percentunit",
                p.query(f"min by ({q.BY_DEVICE}) (1 - {q.memory_used_ratio()})", q.DEVICE_LEGEND, instant=True),
                limits=p.low_is_bad(1 - t.hbm_used_ratio, 2 * (1 - t.hbm_used_ratio)),
                max_value=1,
                span=8,
            ),
            p.timeseries_panel(
                "Host CPU and iowait: the busiest host of each slice",
                f"Busier than {t.host_cpu_ratio:.0%}, a host cannot feed its chips. High iowait points at the "
                f"disks (input files, checkpoint writes). {ONE_HOST}",
                "percentunit",
                p.query(per_slice(records.HOST_CPU_BUSIEST), "busy {{slice}}"),
                p.query(per_slice(records.HOST_IOWAIT_BUSIEST), "iowait {{slice}}"),
                limits=p.high_is_bad(t.host_cpu_ratio),
                max_value=1,
                span=8,
            ),
            p.memory_available_panel(
                "Host memory available: the least of each slice",
                "Share of host memory still available. Near zero the kernel's OOM killer picks a process, "
                f"likely the training job: under {t.host_memory_available_ratio:.0%} while a workload runs there, "
                f"{AlertName.HOST_MEMORY_PRESSURE} pages. In a container the OOM killer enforces the cgroup's "
                "limit, not the host's memory: see the container's working set against its limit (cAdvisor). "
                f"{ONE_HOST}",
                p.query(per_slice(records.HOST_MEMORY_AVAILABLE_LEAST, worst="min"), "{{slice}}"),
                t.host_memory_available_ratio,
            ),
            p.timeseries_panel(
                "Host swap in and out: the busiest host of each slice",
                "Bytes per second the host swaps in from disk and out to it. Swapping in while the job faults pages "
                f"back from disk (beside) is thrash: over {t.swap_in_bytes_per_second / 2**20:g} MiB/s in, with the "
                f"job's major faults over {t.major_faults_per_second:g} a second, {AlertName.HOST_MEMORY_PRESSURE} "
                f"pages. Swapping out alone is the kernel making room. {ONE_HOST}",
                "Bps",
                p.query(per_slice(records.HOST_SWAP_BUSIEST, by="slice, direction"), "{{direction}} {{slice}}"),
                limits=p.high_is_bad(t.swap_in_bytes_per_second),
                span=8,
            ),
            p.timeseries_panel(
                "Job major page faults per second: the busiest host of each slice",
                "Page faults of the jobs' processes that had to read from disk (swap, or a memory-mapped file). "
                "High with the host swapping in: the job's memory does not fit and it thrashes. High alone: the job "
                f"reads a memory-mapped file (a dataset), which is no memory problem. {ONE_HOST}",
                "short",
                p.query(per_slice(records.MAJOR_FAULTS_BUSIEST), "{{slice}}"),
                limits=p.high_is_bad(t.major_faults_per_second),
                span=8,
            ),
            p.timeseries_panel(
                "GPUs throttled, by reason",
                "GPUs whose clocks the driver holds down, by reason (NVML's clocks-event reasons): power_cap (at its "
                "power limit: as designed when busy), power_brake (the rack or power supply asks it to slow), thermal "
                "(too hot), hardware (hardware slowdown: power supply, board). Except for power_cap, with the SM "
                f"clock under {t.throttle_clock_ratio:.0%} of its maximum for 10 minutes, "
                f"{AlertName.DEVICE_THROTTLED} fires. GPUs only: TPU runtimes report no throttling, power or "
                "temperature.",
                "short",
                p.query(f"sum by (reason) ({q.selector(c.THROTTLED)})", "{{reason}}"),
                limits=p.high_is_bad(1),
                span=8,
            ),
            p.timeseries_panel(
                "GPU SM clock against its maximum, by device",
                "Each GPU's SM clock as a share of the highest it supports. An idle GPU lowers its clock on its own: "
                "a low clock is throttling only while a reason holds it down (beside); a throttled GPU slows every "
                "worker of a synchronous job.",
                "percentunit",
                p.query(
                    f"max by ({q.BY_DEVICE}) ({q.selector(c.CLOCK, SM)} / {q.selector(c.CLOCK_MAX, SM)})",
                    q.DEVICE_LEGEND,
                ),
                limits=p.low_is_bad(t.throttle_clock_ratio),
                max_value=1,
                span=12,
            ),
            p.timeseries_panel(
                "GPU XID errors in the last hour",
                "NVIDIA driver XID errors per GPU over a sliding hour. 79 (fell off the bus), 48 and 95 "
                "(uncontained ECC errors) and 74 (NVLink) mean drain the node; 94 (contained ECC) means restart "
                "the job; 63/64 (row remapping) want a GPU reset soon; 13 and 31 are usually the program's fault.",
                "short",
                p.query(
                    f"sum by (instance, device, xid) ({XID_HOUR}{{{q.host_matchers(q.ACCELERATOR)}}})",
                    "{{instance}} GPU {{device}} XID {{xid}}",
                ),
                limits=p.high_is_bad(1),
                span=12,
            ),
        ],
    )


def alerts() -> p.Section:
    return p.Section(
        "Alerts",
        [
            p.stat_panel(
                "Firing tpuscope alerts",
                f"tpuscope's alerts (alert names starting with {ALERT_PREFIX}, from its generated rules) firing now, "
                "as Prometheus evaluates them. Their runbooks are linked from the notifications Alertmanager sends.",
                "short",
                p.query(f"count ({ALERTS}) or vector(0)"),
                limits=p.high_is_bad(1),
                span=6,
                height=8,
            ),
            p.table_panel(
                "Firing tpuscope alerts",
                "Which alerts fire, for which workload and host, by severity: critical pages, warning makes a ticket.",
                p.query(f"max by (alertname, severity, workload, instance) ({ALERTS})", table=True),
                span=18,
            ),
        ],
    )


def dashboard(t: Thresholds) -> dict[str, Any]:
    sections = [monitoring(), workloads(t), failures(t), hosts(t), alerts()]
    return p.build(DashboardUID.ONCALL, TITLE, DESCRIPTION, sections, p.variables(c.STEPS, job=True))
