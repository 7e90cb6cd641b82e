"""Alerts on the monitoring itself and the host it runs on: a collector failing, a sidecar unscraped or
absent, events lost on their way in, a host CPU too busy to feed its chips."""

from __future__ import annotations

from tpuscope import catalog as c
from tpuscope.alerts.rules import Alert
from tpuscope.conventions import LIBTPU_COLLECTOR, SIDECAR_CONTAINER, AlertName, DashboardUID
from tpuscope.generator_config import GeneratorConfig
from tpuscope.promql import series


def alerts(config: GeneratorConfig) -> list[Alert]:
    t = config.thresholds
    sidecars = f'up{{job=~"{config.exporter_job}"}}'
    lost = series(c.INGEST_EVENTS, 'result=~"dropped|invalid"')
    libtpu, not_libtpu = f'collector="{LIBTPU_COLLECTOR}"', f'collector!="{LIBTPU_COLLECTOR}"'
    # A pod running a sidecar container, as kube-state-metrics says (an init container with restartPolicy
    # Always is listed among the init containers).
    running_sidecar = " or ".join(
        f'{metric}{{container="{SIDECAR_CONTAINER}"}} == 1'
        for metric in ("kube_pod_init_container_status_running", "kube_pod_container_status_running")
    )
    return [
        Alert(
            AlertName.COLLECTOR_DOWN,
            "warning",
            # The job serves the TPU runtime's metrics: with no job connected, libtpu has nothing to read.
            f"{series(c.COLLECTOR_UP, not_libtpu)} == 0"
            f" or {series(c.COLLECTOR_UP, libtpu)} == 0"
            f" and on (job, instance) sum by (job, instance) ({series(c.WORKLOAD_PROCESSES)}) > 0",
            "A tpuscope collector fails.",
            "Collector {{ $labels.collector }} of {{ $labels.instance }} has failed for 5 minutes.",
            DashboardUID.ONCALL,
            "5m",
            f"See {c.COLLECTOR_ERRORS.name} for the reason and the sidecar's log for the detail. The "
            f"{LIBTPU_COLLECTOR} collector reads the TPU runtime inside the training process: it counts as down "
            "only while a job is connected.",
        ),
        Alert(
            AlertName.EXPORTER_DOWN,
            "warning",
            # One alert per job (JobSet) and namespace, as kube-prometheus' TargetDown: a job losing its node
            # pool is one ticket, not one per host. A finished job's pods are no targets (the relabeling).
            f"count by (job, namespace, jobset) ({sidecars} == 0)"
            f" / count by (job, namespace, jobset) ({sidecars}) > {t.exporter_down_share:g}",
            "Some of a job's tpuscope sidecars cannot be scraped.",
            "{{ $value | humanizePercentage }} of the tpuscope sidecars{{ with $labels.jobset }} of JobSet {{ . }}"
            "{{ end }}{{ with $labels.namespace }} in namespace {{ . }}{{ end }} have not been scraped for 5 "
            "minutes: the workloads on those hosts are unmonitored.",
            DashboardUID.ONCALL,
            "5m",
            f"Which ones: `{sidecars} == 0`. Check the sidecar containers (restarts, OOM kills), the nodes, and "
            "the network path from Prometheus.",
        ),
        Alert(
            AlertName.EXPORTER_ABSENT,
            "warning",
            # Not absent(up): an idle cluster has no sidecar, and finished pods leave the targets.
            f"count by (namespace) (({running_sidecar}) unless on (namespace, pod) {sidecars})",
            "Pods run tpuscope sidecars that Prometheus does not scrape.",
            "{{ $value }} pods of namespace {{ $labels.namespace }} run a tpuscope sidecar that no target of a "
            f"job matching {config.exporter_job} scrapes: the scrape configuration or the PodMonitor lost them.",
            DashboardUID.ONCALL,
            "15m",
            "Check the PodMonitor's selector (the pods' tpuscope/scrape label) and namespaces, and the scrape "
            "configuration's job name. Read from kube-state-metrics: without it this alert cannot fire.",
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
