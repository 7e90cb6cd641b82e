"""Alerts on the monitoring itself and the host it runs on: a collector failing, a sidecar unscraped or
absent, events lost on their way in, a host CPU too busy to feed its chips."""

from __future__ import annotations

from tpuscope import catalog as c
from tpuscope.alerts.rules import Alert
from tpuscope.conventions import AlertName, DashboardUID
from tpuscope.generator_config import GeneratorConfig
from tpuscope.promql import series


def alerts(config: GeneratorConfig) -> list[Alert]:
    t = config.thresholds
    sidecars = f'up{{job=~"{config.exporter_job}"}}'
    lost = series(c.INGEST_EVENTS, 'result=~"dropped|invalid"')
    return [
        Alert(
            AlertName.COLLECTOR_DOWN,
            "warning",
            f"{series(c.COLLECTOR_UP)} == 0",
            "A tpuscope collector fails.",
            "Collector {{ $labels.collector }} of {{ $labels.instance }} has failed for 5 minutes.",
            DashboardUID.ONCALL,
            "5m",
            f"See {c.COLLECTOR_ERRORS.name} for the reason and the sidecar's log for the detail.",
        ),
        Alert(
            AlertName.EXPORTER_DOWN,
            "critical",
            f"{sidecars} == 0",
            "A tpuscope sidecar cannot be scraped.",
            "Prometheus has not scraped the sidecar {{ $labels.instance }} for 5 minutes: its workloads are "
            "unmonitored.",
            DashboardUID.ONCALL,
            "5m",
            "Check the sidecar container (restarts, OOM kills) and the network path from Prometheus.",
        ),
        Alert(
            AlertName.EXPORTER_ABSENT,
            "warning",
            f"absent({sidecars})",
            "Prometheus has no tpuscope sidecar to scrape.",
            f"No target of a job matching {config.exporter_job} exists: the scrape configuration or the "
            "PodMonitor lost the sidecars.",
            DashboardUID.ONCALL,
            "15m",
            "Check the PodMonitor's selector and the scrape configuration's job name.",
        ),
        Alert(
            AlertName.INGEST_LOSING_EVENTS,
            "warning",
            f"sum by (job, instance) (rate({lost}[5m])) / sum by (job, instance) (rate({series(c.INGEST_EVENTS)}[5m]))"
            f" > {t.ingest_loss_ratio:g}",
            "A sidecar loses events from its jobs.",
            "The sidecar {{ $labels.instance }} lost {{ $value | humanizePercentage }} of its events (dropped or "
            "invalid): the step metrics undercount.",
            DashboardUID.ONCALL,
            "10m",
            "Dropped: the sidecar is too slow or was down. Invalid: a job and sidecar of incompatible versions.",
        ),
        Alert(
            AlertName.HOST_CPU_SATURATED,
            "warning",
            f"avg by (job, instance) ({series(c.HOST_CPU_UTILIZATION)}) > {t.host_cpu_ratio:g}",
            "A training host's CPU is saturated.",
            "The CPU of {{ $labels.instance }} is {{ $value | humanizePercentage }} busy: it cannot feed its chips.",
            DashboardUID.ONCALL,
            "15m",
            f"Find the process ({c.JOB_CPU.name}); move input decoding elsewhere.",
        ),
    ]
