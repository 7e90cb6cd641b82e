"""Alerts on device memory: a program that spills to host memory, a device nearly full."""

from __future__ import annotations

from tpuscope import catalog as c
from tpuscope.alerts.rules import HOSTS_NAMED, Alert, HostsOfWorkload, running
from tpuscope.conventions import MEMORY_USED, AlertName, DashboardUID
from tpuscope.generator_config import GeneratorConfig
from tpuscope.promql import TARGET, WORKLOAD, series


def alerts(config: GeneratorConfig) -> list[Alert]:
    t = config.thresholds
    full = HostsOfWorkload(f"max by ({TARGET}) ({MEMORY_USED}) > {t.hbm_used_ratio:g}")
    return [
        Alert(
            AlertName.MEMORY_SPILL,
            "warning",
            f"max by ({WORKLOAD}, program) ({series(c.MEMORY_SPILL)}) > 0 {running()}",
            "A compiled program spills to host memory.",
            "Program {{ $labels.program }} of workload {{ $labels.workload }} places {{ $value | humanize1024 }}B "
            "in host memory.",
            DashboardUID.JOB,
            "10m",
            "The program does not fit in device memory: smaller batch, rematerialization, more sharding.",
        ),
        Alert(
            AlertName.DEVICE_MEMORY_NEAR_LIMIT,
            "warning",
            full.expr(),
            "A workload's devices are nearly out of memory on some of its hosts.",
            "Workload {{ $labels.workload }}: {{ $value }} of its hosts have a device using more than "
            f"{t.hbm_used_ratio:.0%} of its memory (the fullest device of each):" + full.named() + ".",
            DashboardUID.ONCALL,
            "10m",
            "The next larger program will fail with out-of-memory; reduce the batch or rematerialize. One ticket per "
            f"workload, whatever the hosts (the description names the {HOSTS_NAMED} whose fullest device is "
            "fullest; the On-call and Job debug dashboards show every device).",
        ),
    ]
