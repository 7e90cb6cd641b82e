"""Where good turns bad: the objectives and thresholds, defined once.

The dashboards colour their panels by these values; the alert rules fire on
them. A threshold typed into a panel and again into a rule would drift apart the
first time someone tuned one of them.
"""

from __future__ import annotations

from dataclasses import dataclass

from tpuscope import catalog


@dataclass(frozen=True)
class Thresholds:
    # --- objectives (SLOs) ---
    goodput_objective: float = 0.90
    """Share of wall time that is productive training (the rest is badput: compile, io wait, checkpoints, lost)."""
    inference_latency_seconds: float = 0.5
    """A request is good when it is answered within this (a bucket bound of the request histogram)."""
    inference_latency_objective: float = 0.99
    """Share of requests that must be good."""

    # --- a workload's health ---
    stall_seconds: float = 300.0
    """No step for this long: the workload is stalled."""
    checkpoint_age_seconds: float = 3600.0
    """No successful checkpoint for this long: the work since then is at risk."""
    checkpoint_share: float = 0.05
    """Checkpointing taking more than this share of wall time."""
    io_share: float = 0.20
    """Input wait above this share of step time: the job is input-bound."""
    sync_share: float = 0.30
    """Collective sync above this share of step time: the job is sync-bound (or waits on a straggler)."""
    straggler_factor: float = 1.2
    """A worker whose compute time per step is this many times its workload's median is a straggler."""
    compile_cache_hit_ratio: float = 0.5
    """Below this share of cache hits, the persistent compilation cache is not doing its job."""

    # --- the accelerators and the host ---
    duty_cycle_low: float = 0.5
    """Chips busy less than this share of the time are paid for and idle."""
    mfu_low: float = 0.3
    """Model FLOPs utilization below this is worth a look (the best large jobs reach 0.4 to 0.6)."""
    hbm_used_ratio: float = 0.90
    """Device memory above this share of its limit: the next larger batch or program will not fit."""
    host_cpu_ratio: float = 0.90
    """Host CPU busier than this cannot feed the chips."""


DEFAULT = Thresholds()

if DEFAULT.inference_latency_seconds not in catalog.REQUEST_BUCKETS:  # the SLI counts a bucket: it must be one
    raise ValueError(f"inference_latency_seconds must be one of {catalog.REQUEST_BUCKETS}")
