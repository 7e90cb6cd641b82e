"""On-call: what is broken right now, and is the monitoring itself working?

For the SRE holding the pager: the sidecars and their collectors, stalled
workloads, failures, checkpoint staleness, memory headroom, the hosts, and the
alerts firing. Every panel reads well when all is fine (ages, ratios, counts of
zero), so a blank panel always means missing data, never good news.
"""

from __future__ import annotations

from typing import Any

from tpuscope import catalog as c
from tpuscope.conventions import ALERT_PREFIX, DEFAULT_PORT, AlertName, DashboardUID
from tpuscope.dashboards import panels as p
from tpuscope.dashboards import promql as q
from tpuscope.thresholds import Thresholds

TITLE = "tpuscope / On-call"
DESCRIPTION = "Exporter and collector health, stalled workloads, failures, checkpoint staleness, headroom, alerts."

# Every sidecar target, whatever slice and worker are selected: those labels come with the sidecar's own
# series, which Prometheus' up does not carry and a sidecar that is down does not send.
UP = f'up{{job=~"${q.JOB}"}}'
# tpuscope's alerts, firing now. The same alerts as conventions.OUR_ALERTS matches, but spelt with .* as this
# dashboard always had it, so the panels' queries (and the committed JSON) do not change.
ALERTS = f'ALERTS{{alertstate="firing", alertname=~"{ALERT_PREFIX}.*"}}'
LOST = 'result=~"dropped|invalid"'
UP_DOWN = [("1", "up", p.GOOD), ("0", "down", p.BAD)]
STRAGGLER_LEGEND = "{{workload}}: slice {{slice}} worker {{worker}} ({{instance}})"


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
                p.query(f"count ({UP} == 0) or vector(0)"),
                limits=p.high_is_bad(1),
                span=4,
            ),
            p.stat_panel(
                "Collectors down",
                "Collectors (libtpu, nvml, host) whose latest collection failed or passed its deadline. The "
                "sidecar keeps serving the rest; Collector errors says why.",
                "short",
                p.query(f"count ({q.selector(c.COLLECTOR_UP)} == 0) or vector(0)"),
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
            p.state_panel(
                "Sidecar scrapes",
                "Prometheus' up for each sidecar target: red while it cannot be scraped.",
                p.query(UP, "{{instance}}"),
                mappings=UP_DOWN,
                span=12,
            ),
            p.state_panel(
                "Collectors",
                "Each collector's state on each host: red while its collections fail.",
                p.query(f"max by (instance, collector) ({q.selector(c.COLLECTOR_UP)})", "{{instance}} {{collector}}"),
                mappings=UP_DOWN,
                span=12,
            ),
            p.timeseries_panel(
                "Collector errors, by reason",
                "Failed collections: unavailable (the runtime or driver is not answering), deadline (too slow), "
                "unknown_metrics, invalid_response, not_supported, process_gone, error. A collector that keeps "
                "failing backs off and retries; the sidecar log has the detail.",
                "short",
                p.query(
                    f"sum by (instance, collector, reason) ({q.increase(c.COLLECTOR_ERRORS)})",
                    "{{instance}} {{collector}} {{reason}}",
                ),
            ),
            p.timeseries_panel(
                "Events received, by result",
                "Events per second from the jobs: accepted, invalid (rejected by the sidecar) and dropped (lost "
                "on the job's side, as the job reports it).",
                "eps",
                p.query(f"sum by (result) ({q.rate(c.INGEST_EVENTS)})", "{{result}}"),
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
                "many hosts report it (as the alerts count them). A workload in a crash loop restarts without "
                "progress: stop it before it burns its chips.",
                "short",
                p.query(
                    q.once_per_job(c.WORKLOAD_FAILURES, by=q.BY_REASON, window=q.HOUR),
                    "failure {{workload}} {{reason}}",
                ),
                p.query(
                    q.once_per_job(c.WORKLOAD_RESTARTS, by=q.BY_REASON, window=q.HOUR),
                    "restart {{workload}} {{reason}}",
                ),
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
                "Host CPU and iowait, by host",
                f"Busier than {t.host_cpu_ratio:.0%}, a host cannot feed its chips. High iowait points at the "
                "disks (input files, checkpoint writes).",
                "percentunit",
                p.query(f"avg by (instance) ({q.selector(c.HOST_CPU_UTILIZATION)})", "busy {{instance}}"),
                p.query(f"max by (instance) ({q.selector(c.HOST_CPU_IOWAIT)})", "iowait {{instance}}"),
                limits=p.high_is_bad(t.host_cpu_ratio),
                max_value=1,
                span=8,
            ),
            p.timeseries_panel(
                "Host memory available, by host",
                "Share of host memory still available. Near zero the kernel's OOM killer picks a process, "
                "likely the training job.",
                "percentunit",
                p.query(
                    f"max by (instance) ({q.selector(c.HOST_MEMORY_AVAILABLE)})"
                    f" / max by (instance) ({q.selector(c.HOST_MEMORY_TOTAL)})",
                    "{{instance}}",
                ),
                limits=p.low_is_bad(0.05, 0.15),
                max_value=1,
                span=8,
            ),
            p.timeseries_panel(
                "GPU XID errors in the last hour",
                "NVIDIA driver XID errors per GPU over a sliding hour. 79 (fell off the bus), 48 and 95 "
                "(uncontained ECC errors) and 74 (NVLink) mean drain the node; 94 (contained ECC) means restart "
                "the job; 63/64 (row remapping) want a GPU reset soon; 13 and 31 are usually the program's fault.",
                "short",
                p.query(
                    f"sum by (instance, device, xid) ({q.events(c.XID_ERRORS, window=q.HOUR)})",
                    "{{instance}} GPU {{device}} XID {{xid}}",
                ),
                limits=p.high_is_bad(1),
                span=24,
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
    sections = [monitoring(), workloads(t), hosts(t), alerts()]
    return p.build(DashboardUID.ONCALL, TITLE, DESCRIPTION, sections, p.variables(c.STEPS, job=True))
