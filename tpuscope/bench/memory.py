"""A process's memory as the benchmarks read it: from ``/proc``, or as its sidecar serves it to Prometheus."""

from __future__ import annotations

from pathlib import Path

# prometheus_client's process collector, not a catalogue metric: the sidecar's resident memory.
SIDECAR_RSS = "process_resident_memory_bytes"


def status_mb(pid: int, key: str) -> float | None:
    """A ``/proc/PID/status`` memory figure (``VmRSS``, ``VmHWM``: the peak) in MB; None once the process is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024  # kB
    except OSError:
        pass
    return None
