"""The machine a benchmark ran on, written beside its figures: a loaded or smaller machine's are slower."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import psutil


def machine() -> dict[str, Any]:
    return {
        "cpus": os.cpu_count(),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "cpu_model": next(
            (
                line.split(":", 1)[1].strip()
                for line in Path("/proc/cpuinfo").read_text().splitlines()
                if "model name" in line
            ),
            "unknown",
        ),
        "python": ".".join(map(str, sys.version_info[:3])),
        # What else the machine was doing as the run began (1, 5 and 15 minutes).
        "load_average": [round(load, 2) for load in os.getloadavg()],
    }
