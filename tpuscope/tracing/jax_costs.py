"""The two halves of MFU, read from JAX: the FLOPs of a compiled step, and the peak FLOP/s of its devices.

Model FLOPs utilization is the FLOP/s a step achieves over its devices' best. Neither half is computed by hand:

- FLOPs: XLA's cost analysis of the compiled program (``compiled.cost_analysis()["flops"]``). A program over
  several devices (sharded ``jax.jit``, ``shard_map``) is one SPMD module each device runs on its shard, so
  XLA's figure is one device's share, times the devices for the step's.
- Peak: for accelerators, the vendors' dense bf16 peak per chip. The CPU has no such number, so it is
  measured (float32 matmuls on every device at once), stored for later runs, and said to be an estimate.

Both count this process's devices only: the Hardware event, and so the sidecar's MFU, are per process (one
sidecar per worker), and summing the workers' FLOPs gives the job's.

It lives in the in-job library for ``Monitor.flops_of`` and ``tpuscope bench``. jax is imported inside the
functions that need it, so importing this module costs nothing in a job that never asks.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tpuscope.accelerators import accelerator_name

if TYPE_CHECKING:
    import jax

# Dense bf16 TFLOP/s per chip, from the vendors' data sheets.
PEAK_TFLOPS = {"v4": 275.0, "v5e": 197.0, "v5p": 459.0, "v6e": 918.0, "h100": 989.0}


# --- the FLOPs of a step -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StepCost:
    """What one call of a compiled step does: its model FLOPs on ``devices`` (this process's), all together."""

    flops: float
    devices: tuple[Any, ...]


def step_cost(step: Callable[..., Any], *args: Any, **kwargs: Any) -> StepCost:
    """The FLOPs of one call of the jitted ``step`` with these arguments, and its devices. It compiles now unless
    JAX's caches hold the program; either way the step's first call finds it compiled."""
    lower: Callable[..., Any] | None = getattr(step, "lower", None)
    if lower is None:
        raise TypeError(f"{step!r} has no .lower(): pass the jax.jit-ed step, not the Python function")
    compiled = lower(*args, **kwargs).compile()
    devices = program_devices(compiled)
    return StepCost(program_flops(compiled) * len(devices), devices)


def program_flops(compiled: jax.stages.Compiled) -> float:
    """The ``flops`` of a compiled program's cost analysis (per device for SPMD programs); 0 when unreported."""
    cost: Any = compiled.cost_analysis()
    if isinstance(cost, list):  # older jax returned one dict per program
        cost = cost[0] if cost else {}
    return float((cost or {}).get("flops", 0.0))


def program_devices(compiled: jax.stages.Compiled) -> tuple[Any, ...]:
    """This process's devices in the program's shardings (with none, it runs on the default device)."""
    import jax

    shardings = jax.tree.leaves((compiled.input_shardings, compiled.output_shardings))
    devices = {device for sharding in shardings for device in getattr(sharding, "addressable_devices", ())}
    return tuple(sorted(devices, key=lambda d: d.id)) or tuple(jax.local_devices()[:1])


# --- the peak of the devices -------------------------------------------------------------------------------------


def accelerator_of(device: Any) -> str:
    """``TPU v5 lite`` -> ``v5e``; a CPU device -> ``cpu``; anything unknown -> its platform."""
    return accelerator_name(str(getattr(device, "device_kind", ""))) or str(device.platform)


def calibration_file() -> Path:
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache")
    # Not peak_flops.json, where older tpuscope keeps a bare number per device: each version reads its own file.
    return Path(cache) / "tpuscope" / "cpu_peak_flops.json"


# A CPU's stored peak is measured again once it is this old: the same device kind may be another host by now.
CALIBRATION_MAX_AGE_S = 7 * 86400.0
# Rounds of matmuls a calibration takes the best of, with a pause between: one round on a loaded host reads the
# load, not the peak, and a peak read low reads MFU high.
CALIBRATION_ROUNDS = 3


def peak_flops_per_second(devices: Sequence[Any], calibrate: bool = False) -> tuple[float, str]:
    """Total peak FLOP/s of ``devices`` and where the number comes from. The sidecar caps MFU at 1 besides: a
    CPU peak read low under load must not show more than 100 %."""
    accelerator = accelerator_of(devices[0])
    if accelerator in PEAK_TFLOPS:
        return PEAK_TFLOPS[accelerator] * 1e12 * len(devices), f"{accelerator} data sheet"
    key = f"{devices[0].device_kind}x{len(devices)}"
    path = calibration_file()
    stored = _read_calibrations(path)
    entry = stored.get(key)
    now = time.time()
    if calibrate or entry is None or now - entry["measured_at"] > CALIBRATION_MAX_AGE_S:
        flops = measure_matmul_flops(devices)
        stored[key] = {"flops_per_second": flops, "measured_at": now}
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(stored, indent=2) + "\n")
        return flops, f"an estimate, measured now (best of {CALIBRATION_ROUNDS} matmul rounds), stored in {path}"
    return entry["flops_per_second"], f"an estimate, measured earlier, from {path}"


def _read_calibrations(path: Path) -> dict[str, dict[str, float]]:
    """The stored peaks; an unreadable file, or an entry not of this form, is measured again."""
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return (
        {
            key: value
            for key, value in raw.items()
            if isinstance(value, dict) and {"flops_per_second", "measured_at"} <= value.keys()
        }
        if isinstance(raw, dict)
        else {}
    )


def measure_matmul_flops(
    devices: Sequence[Any], size: int = 1024, seconds: float = 0.4, rounds: int = CALIBRATION_ROUNDS
) -> float:
    """The best call's FLOP/s of square float32 matmuls, one per device, run together, over ``rounds`` rounds
    of ``seconds`` each with a pause between (another process's burst need not span them all)."""
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
    for round_ in range(rounds):
        if round_:
            time.sleep(0.05)
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            start = time.perf_counter()
            jax.block_until_ready(matmul(x))  # type: ignore[no-untyped-call]
            best = max(best, flops_per_call / (time.perf_counter() - start))
    return best
