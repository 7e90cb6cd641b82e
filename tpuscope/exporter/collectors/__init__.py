"""Collectors that read the accelerators and the host themselves, one per file, registered in one table.

Each runs on its own thread at its own interval (see :mod:`.runner`); what it
reads goes to the sample store that ``/metrics`` serves, and its health to
``collector_up``, ``collector_duration_seconds`` and ``collector_errors_total``.
"""

from __future__ import annotations

from tpuscope.exporter.collectors.base import Collector, CollectorError, Settings
from tpuscope.exporter.collectors.gke_device_plugin import GkeDevicePluginCollector
from tpuscope.exporter.collectors.host import HostCollector
from tpuscope.exporter.collectors.libtpu import LibtpuCollector
from tpuscope.exporter.collectors.nvml import NvmlCollector

# name -> collector class: the names are the values of --collectors and of the `collector` label.
COLLECTORS: dict[str, type[Collector]] = {
    c.name: c for c in (LibtpuCollector, GkeDevicePluginCollector, NvmlCollector, HostCollector)
}

__all__ = ["COLLECTORS", "Collector", "CollectorError", "Settings"]
