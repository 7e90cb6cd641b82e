"""Alerts on device memory: a program that spills to host memory, a device nearly full."""

from __future__ import annotations

from tpuscope import catalog as c
from tpuscope.alerts.rules import Alert, running
from tpuscope.conventions import MEMORY_USED, AlertName, DashboardUID
from tpuscope.generator_config import GeneratorConfig
from tpuscope.promql import WORKLOAD, series


def alerts(config: GeneratorConfig) -> list[Alert]:
    t = config.thresholds
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
            f"{MEMORY_USED} > {t.hbm_used_ratio:g}",
            "A device's memory is nearly full.",
            "Device {{ $labels.device }} ({{ $labels.accelerator }}, {{ $labels.source }}) of {{ $labels.instance }} "
            "uses {{ $value | humanizePercentage }} of its memory.",
            DashboardUID.ONCALL,
            "10m",
            "The next larger program will fail with out-of-memory; reduce the batch or rematerialize.",
        ),
    ]
