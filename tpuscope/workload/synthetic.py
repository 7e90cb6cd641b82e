"""A JAX-free training loop with realistic timings: the light mode of ``tpuscope workload``.

It sleeps through each phase with lognormal jitter, compiles on the first step,
checkpoints every few steps and reports device memory, so every training series
the sidecar exports has data without a model, an accelerator or JAX. Tests and
fleet simulation run it; the real workload (``tpuscope workload`` with JAX) reports the
same events.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from tpuscope.tracing import Monitor

GiB = 1 << 30


@dataclass(frozen=True)
class Profile:
    """Where a synthetic step's time goes. Shares of ``step_seconds``; the rest is ``other``."""

    step_seconds: float = 0.05
    io_share: float = 0.10
    compute_share: float = 0.70
    sync_share: float = 0.15
    jitter: float = 0.10  # sigma of the lognormal noise on every phase
    compile_seconds: float = 0.3  # on the first step: tracing, lowering, backend
    checkpoint_every: int = 50
    checkpoint_seconds: float = 0.1
    checkpoint_bytes: int = 2 * GiB
    devices: int = 8
    device_memory_bytes: int = 16 * GiB
    peak_flops_per_device: float = 197e12  # a v5e chip's bf16 peak
    mfu: float = 0.45  # the model FLOPs a step does, as a share of what the devices could do in its time


def run(
    monitor: Monitor,
    steps: int,
    profile: Profile = Profile(),
    *,
    seed: int = 0,
    progress: Callable[[int], None] | None = None,
    stop: threading.Event | None = None,
) -> None:
    """Run ``steps`` steps (fewer if ``stop`` is set), reporting through ``monitor``; ``progress(n)`` after each."""
    rng = random.Random(seed)

    def sleep_share(share: float) -> None:
        time.sleep(profile.step_seconds * share * rng.lognormvariate(0.0, profile.jitter))

    peak = [0] * profile.devices
    peak_flops = profile.peak_flops_per_device * profile.devices
    monitor.hardware("synthetic", profile.devices, peak_flops)
    for n in range(steps):
        if stop is not None and stop.is_set():
            return
        with monitor.step(n) as step:
            with step.phase("io"):
                sleep_share(profile.io_share)
            with step.phase("compute"):
                if n == 0:
                    compile_programs(monitor, profile.compile_seconds)
                sleep_share(profile.compute_share)
            with step.phase("sync"):
                sleep_share(profile.sync_share)
            sleep_share(max(0.0, 1.0 - profile.io_share - profile.compute_share - profile.sync_share))
            step.flops = profile.mfu * peak_flops * profile.step_seconds
        if n % 10 == 0:
            for device in range(profile.devices):
                used = int(profile.device_memory_bytes * rng.uniform(0.55, 0.65))
                peak[device] = max(peak[device], used)
                monitor.device_memory(
                    str(device),
                    "synthetic",
                    used_bytes=used,
                    limit_bytes=profile.device_memory_bytes,
                    peak_bytes=peak[device],
                )
        if profile.checkpoint_every and (n + 1) % profile.checkpoint_every == 0:
            with monitor.checkpoint("save", step=n) as ckpt:
                time.sleep(profile.checkpoint_seconds * rng.lognormvariate(0.0, profile.jitter))
                ckpt.bytes = profile.checkpoint_bytes
        if progress:
            progress(n)


def compile_programs(monitor: Monitor, seconds: float) -> None:
    """The first step compiles, as a jitted train step would: a cache miss, then three stages."""
    monitor.compile_cache(hit=False)
    for stage, share in (("tracing", 0.2), ("lowering", 0.1), ("backend", 0.7)):
        time.sleep(seconds * share)
        monitor.compile(stage, seconds * share, function="train_step")  # type: ignore[arg-type]
    monitor.program_memory("train_step", spill_bytes=0)
