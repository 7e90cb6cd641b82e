"""Alerts on the monitoring itself and the host it runs on: a collector failing, a sidecar unscraped or
absent, events lost on their way in, a host CPU too busy to feed its chips, a host short of memory before the
OOM killer strikes, a GPU whose clocks the driver holds down."""

from __future__ import annotations

from tpuscope import catalog as c
from tpuscope.alerts.rules import HOSTS_NAMED, Alert, HostsOfWorkload
from tpuscope.conventions import LIBTPU_COLLECTOR, SIDECAR_CONTAINER, AlertName, DashboardUID
from tpuscope.generator_config import GeneratorConfig
from tpuscope.promql import TARGET, WORKLOAD, memory_available_ratio, series

# Which of its two signals TpuscopeHostMemoryPressure fires on, a label of the alert.
SIGNAL = "signal"
AVAILABLE, THRASHING = "available", "thrashing"
# The reasons of catalog.THROTTLED that make a ticket. Not power_cap: a busy GPU at its power limit works as
# designed (one whose limit was set low shows on the On-call board's clock panel).
THROTTLE_REASONS = 'reason=~"power_brake|thermal|hardware"'
SM = 'clock="sm"'
SWAP_IN = 'direction="in"'


def host_memory_pressure(config: GeneratorConfig) -> str:
    """A workload's host short of memory, or thrashing: swapping in while its jobs' processes read pages back
    from disk. Per workload, not per host (one job's leak on four hosts is one page): the worst of its hosts,
    each side labelled with its signal."""
    t = config.thresholds
    available = f"{memory_available_ratio(TARGET)} < {t.host_memory_available_ratio:g}"
    swap_in = f"sum by ({TARGET}) (rate({series(c.HOST_SWAP_IO, SWAP_IN)}[5m]))"
    faults = f"sum by ({TARGET}) (rate({series(c.JOB_MAJOR_PAGE_FAULTS)}[5m]))"
    thrashing = (
        f"{swap_in} > {t.swap_in_bytes_per_second:.15g} and on ({TARGET}) {faults} > {t.major_faults_per_second:g}"
    )
    # The workloads with a process on each host: a host's figure, once per workload on it.
    here = f"group by ({TARGET}, {WORKLOAD}) ({series(c.WORKLOAD_PROCESSES)} > 0)"

    def worst(aggregate: str, per_host: str, signal: str) -> str:
        per_workload = f"{aggregate} by ({WORKLOAD}) (({per_host}) * on ({TARGET}) group_right () {here})"
        return f'label_replace({per_workload}, "{SIGNAL}", "{signal}", "", "")'

    return f"{worst('min', available, AVAILABLE)} or {worst('max', thrashing, THRASHING)}"


def alerts(config: GeneratorConfig) -> list[Alert]:
    t = config.thresholds
    sidecars = f'up{{job=~"{config.exporter_job}"}}'
    lost = series(c.INGEST_EVENTS, f'result=~"{c.DROPPED}|{c.INVALID}"')
    libtpu, not_libtpu = f'collector="{LIBTPU_COLLECTOR}"', f'collector!="{LIBTPU_COLLECTOR}"'
    # A pod running a sidecar container, as kube-state-metrics says (an init container with restartPolicy
    # Always is listed among the init containers).
    busy = HostsOfWorkload(f"avg by ({TARGET}) ({series(c.HOST_CPU_UTILIZATION)}) > {t.host_cpu_ratio:g}")
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
            f"sum by ({TARGET}) (rate({lost}[5m])) / sum by ({TARGET}) (rate({series(c.INGEST_EVENTS)}[5m]))"
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
            busy.expr(),
            "A workload's hosts' CPUs are saturated.",
            "Workload {{ $labels.workload }}: {{ $value }} of its hosts have their CPU more than "
            f"{t.host_cpu_ratio:.0%} busy, too busy to feed their chips:" + busy.named() + ".",
            DashboardUID.ONCALL,
            "15m",
            f"Find the process ({c.JOB_CPU.name}); move input decoding elsewhere. One ticket per workload, whatever "
            f"the hosts (the description names the {HOSTS_NAMED} busiest; the On-call board draws each slice's "
            "busiest host, Job debug every host of the workload).",
        ),
        Alert(
            AlertName.HOST_MEMORY_PRESSURE,
            "critical",
            host_memory_pressure(config),
            "A workload's host runs out of memory: the OOM killer is near.",
            f'A host of workload {{{{ $labels.workload }}}} {{{{ if eq $labels.{SIGNAL} "{AVAILABLE}" }}}}has '
            "{{ $value | humanizePercentage }} of its memory available (the least of its hosts){{ else }}swaps in "
            "{{ $value | humanize1024 }}B/s (the most of its hosts) while its processes read more than "
            f"{t.major_faults_per_second:g} pages a second back from disk: their memory does not fit"
            "{{ end }}. The kernel's OOM killer will end the largest process, likely the training job.",
            DashboardUID.ONCALL,
            "2m",
            "One alert per workload and signal, its worst host's figure (the On-call dashboard's host memory "
            "panels say which hosts): one job's leak on many hosts is one page. "
            f"Two signals, the `{SIGNAL}` label says which. `{AVAILABLE}`: the kernel's MemAvailable under "
            f"{t.host_memory_available_ratio:.0%} of the host's memory while a workload runs there. `{THRASHING}`: "
            f"the host swapping in more than {t.swap_in_bytes_per_second / 2**20:g} MiB/s while its jobs' processes "
            f"take more than {t.major_faults_per_second:g} major page faults a second (either alone is no alert: "
            "another process swapping, a job reading a memory-mapped dataset). Both come before the kernel's OOM "
            f"killer ends the largest process, likely the job, which then fails as `vanished` "
            f"({AlertName.WORKLOAD_FAILED}). Act before it: find the process that grows "
            f"({c.JOB_RESIDENT_MEMORY.name}, the On-call dashboard's host memory panels), typically an input "
            "pipeline with too many workers or too large a shuffle or prefetch buffer, host offloading, or a leak; "
            "save a checkpoint if the job can, then restart it smaller or on a larger host. In a container the "
            "OOM killer enforces the container's cgroup memory limit, not the host's memory: a pod at its limit "
            "is killed while the host still has memory to spare, and this alert cannot see it. The complement is "
            "cAdvisor's container_memory_working_set_bytes against the container's limit (kube-state-metrics' "
            'kube_pod_container_resource_limits{resource="memory"}), as the kubernetes-mixin alerts on it.',
        ),
        Alert(
            AlertName.DEVICE_THROTTLED,
            "warning",
            f"({series(c.CLOCK, SM)} / {series(c.CLOCK_MAX, SM)} < {t.throttle_clock_ratio:g})"
            f" * on ({TARGET}, device, accelerator, source) group_right ()"
            f" ({series(c.THROTTLED, THROTTLE_REASONS)} == 1)",
            "A GPU's clocks are held down: it is throttled.",
            "GPU {{ $labels.device }} ({{ $labels.accelerator }}) of {{ $labels.instance }} runs its SM clock at "
            "{{ $value | humanizePercentage }} of its maximum, held down for {{ $labels.reason }} reasons.",
            DashboardUID.ONCALL,
            "10m",
            f"The driver holds the GPU's clocks under {t.throttle_clock_ratio:.0%} of its maximum and says why "
            "(NVML's clocks-event reasons, the `reason` label). `power_brake`: the rack or the power supply asked the "
            f"board to slow: check {c.POWER.name} and the rack's power. "
            f"`thermal`: the GPU too hot: cooling, fans, airflow, {c.TEMPERATURE.name}. `hardware`: a hardware "
            "slowdown (the power supply, an overheating board): drain the node and have it checked. In a "
            f"synchronous job one slow GPU slows every worker ({AlertName.STRAGGLER} may name its host): cordon "
            "the node and restart the job elsewhere if it persists. GPUs only: TPU runtimes expose no thermal, "
            "power or throttle metric, so a TPU that slows down shows only as a straggler or a step time "
            f"regression ({AlertName.STEP_TIME_REGRESSION}). `power_cap` (the software power cap) makes no "
            "ticket: a busy GPU at its power limit runs as designed; one whose limit was set low (nvidia-smi -q -d "
            "POWER) shows on the On-call board as a low clock under power_cap.",
        ),
    ]
