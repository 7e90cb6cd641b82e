"""What the workload runs on, and its peak FLOP/s: the denominator of MFU.

Accelerators: the vendors' dense bf16 peak per chip. The CPU has no such
number, so it is measured: ``tpuscope bench --calibrate`` times large float32
matmuls on every local device at once and stores the result, keyed by the
device kind and count, for later runs.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from tpuscope.accelerators import accelerator_name

# Dense bf16 TFLOP/s per chip, from the vendors' data sheets.
PEAK_TFLOPS = {"v4": 275.0, "v5e": 197.0, "v5p": 459.0, "v6e": 918.0, "h100": 989.0}


def accelerator_of(device: Any) -> str:
    """``TPU v5 lite`` -> ``v5e``; a CPU device -> ``cpu``; anything unknown -> its platform."""
    return accelerator_name(str(getattr(device, "device_kind", ""))) or str(device.platform)


def calibration_file() -> Path:
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache")
    return Path(cache) / "tpuscope" / "peak_flops.json"


def peak_flops_per_second(devices: list[Any], calibrate: bool = False) -> tuple[float, str]:
    """Total peak FLOP/s of ``devices`` and where the number comes from."""
    accelerator = accelerator_of(devices[0])
    if accelerator in PEAK_TFLOPS:
        return PEAK_TFLOPS[accelerator] * 1e12 * len(devices), f"{accelerator} data sheet"
    key = f"{devices[0].device_kind}x{len(devices)}"
    path = calibration_file()
    stored: dict[str, float] = json.loads(path.read_text()) if path.exists() else {}
    if calibrate or key not in stored:
        stored[key] = measure_matmul_flops(devices)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(stored, indent=2) + "\n")
        return stored[key], f"measured now (matmul), stored in {path}"
    return stored[key], f"measured earlier, from {path}"


def measure_matmul_flops(devices: list[Any], size: int = 1024, seconds: float = 1.0) -> float:
    """The best FLOP/s of repeated square float32 matmuls, one per device, run together."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    mesh = Mesh(np.array(devices), ("d",))
    sharding = NamedSharding(mesh, PartitionSpec("d"))  # type: ignore[no-untyped-call]
    x = jax.device_put(jnp.ones((len(devices), size, size), jnp.float32), sharding)
    matmul = jax.jit(lambda a: jnp.einsum("dij,djk->dik", a, a) * (1.0 / size))
    jax.block_until_ready(matmul(x))  # type: ignore[no-untyped-call]  # compile outside the timing
    flops_per_call = 2.0 * size**3 * len(devices)
    best = 0.0
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        start = time.perf_counter()
        jax.block_until_ready(matmul(x))  # type: ignore[no-untyped-call]
        best = max(best, flops_per_call / (time.perf_counter() - start))
    return best
