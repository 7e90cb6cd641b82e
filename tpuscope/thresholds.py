"""Where good turns bad: the objectives and thresholds, defined once.

The dashboards colour their panels by these values; the alert rules fire on
them. A threshold typed into a panel and again into a rule would drift apart the
first time someone tuned one of them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from tpuscope import catalog


@dataclass(frozen=True)
class Thresholds:
    # --- objectives (SLOs) ---
    goodput_objective: float = 0.90
    """Share of wall time that is productive training (the rest is badput: compile, io wait, checkpoints, lost,
    downtime; docs/goodput.md)."""
    inference_latency_seconds: float = 0.5
    """A request is good when it is answered within this (a bucket bound of the request histogram)."""
    inference_latency_objective: float = 0.99
    """Share of requests that must be good."""

    # --- a workload's health ---
    stall_seconds: float = 600.0
    """No progress (a step, a checkpoint save or restore ending, a compile stage ending) for this long, counted
    from the start; the alert then waits half as long again, so a save or compile that began at a step may
    last 1.5 times this."""
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
    straggler_share: float = 0.05
    """A workload whose workers wait for the slowest, beyond what they wait for each other, more than this share
    of their steps has a straggler: the worker that waits least (docs/alerts.md, TpuscopeStraggler)."""
    straggler_chronic: float = 0.6
    """A worker that has been its workload's straggler for more than this share of the last hour is chronic: it
    opens a ticket. One slow capture holds the profile gauges for 3 capture periods, half an hour at the default
    period, and so can never reach it; a host-timed blip holds the 5-minute rates for 5 minutes."""
    profile_min_steps: float = 4
    """Measured steps a worker's device-profile gauges must be a mean of (tpuscope_profile_measured_steps) before
    the rules judge the worker by them, rather than by its host-timed phases: one step's exposed collective time
    can differ from the next's by half. A capture measures 5 steps (at least 4), so one capture suffices; an older
    job's captures of 2 steps wait for a second. A sidecar too old to serve the count is judged as before."""
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
    host_memory_available_ratio: float = 0.05
    """Host memory available (the kernel's MemAvailable) below this share of the total, while a workload runs on
    the host: the kernel's OOM killer is near, and it picks the largest process, likely the training job."""
    swap_in_bytes_per_second: float = 1048576.0
    """The host swapping in faster than this (1 MiB/s: 256 pages a second) while its job's processes fault pages in
    from disk faster than :attr:`major_faults_per_second`: the job's memory does not fit, it thrashes."""
    major_faults_per_second: float = 100.0
    """A job's major page faults per second (pages read from disk: swap, or a mapped file) above which, with the
    host swapping in, the job thrashes. Alone it may be a memory-mapped dataset being read: not an alert."""
    throttle_clock_ratio: float = 0.9
    """A GPU whose SM clock is below this share of its maximum while the driver names a power, thermal or hardware
    reason for holding it down is throttled."""

    # --- for the alerts alone ---
    step_regression_factor: float = 1.3
    """Mean step time this many times its own baseline (the 6 hours before the last 30 minutes)."""
    compile_seconds_per_hour: float = 600.0
    """Backend compile time per hour above this is a job that keeps compiling."""
    steady_state_compiles: float = 3
    """Compiles in 30 minutes of a workload that was already stepping an hour earlier: recompiles."""
    hang_seconds: float = 60.0
    """The least time a worker must stay at one place in a step (a phase, or between two) before it may be
    stuck: a step's limit is this, or hang_step_factor times the longest of its recent steps, whichever is
    longer. Compiles, checkpoints and the time between steps are judged against stall_seconds instead. A workload
    hangs (a page) when every worker is stuck."""
    hang_step_factor: float = 5.0
    """How many times its longest recent step a worker may stay at one place in a step before it is stuck."""
    downtime_seconds: float = 900.0
    """A workload down this long (a process failed or vanished, and none has started since) pages: the time a
    scheduler may take to put a preempted job back."""
    crash_loop_failures: float = 3
    """The job's own failures in an hour that make a crash loop (a page), however it restarts; the platform's
    (preemption, maintenance, and the peers that vanished with a preempted worker) not counted. A single failure
    makes a ticket."""
    ingest_loss_ratio: float = 0.01
    """Share of a sidecar's events dropped or invalid above which its step metrics undercount."""
    exporter_down_share: float = 0.1
    """Share of a job's sidecars Prometheus cannot scrape above which their hosts count as unmonitored."""
    inference_min_requests: float = 100
    """Requests a serving workload must have answered in a burn-rate window before its latency SLO is judged
    over it: a few slow requests of a nearly idle service are not an outage."""
    collective_spike_factor: float = 2.0
    """A workload's collective time, its median over the last 30 minutes, this many times its median of the 6
    hours before: the interconnect (ICI, DCN) or a peer got slower."""
    collective_spike_min_share: float = 0.1
    """The share of its step a workload must now spend in exposed collectives (its device profiles) before a
    jump of its collective time counts: twice nothing is still nothing."""
    loss_spike_seconds: float = 1800.0
    """A loss spike (the loss far above its recent baseline, tpuscope_training_loss_deviation) that has not come
    down for this long makes a ticket: long enough that a spike training recovers from on its own (tens to
    hundreds of steps) does not."""
    model_age_seconds: float = 7 * 86400.0
    """A serving workload still serving a model loaded this long ago: the pipeline that publishes new models, or
    the roll-out that loads them, has stopped."""

    def __post_init__(self) -> None:
        for name in ("goodput_objective", "inference_latency_objective"):
            if not 0 < getattr(self, name) < 1:
                raise ValueError(f"{name} must be between 0 and 1 (an objective of 1 leaves no error budget)")
        for name in ("host_memory_available_ratio", "collective_spike_min_share"):
            if not 0 < getattr(self, name) < 1:
                raise ValueError(f"{name} must be between 0 and 1 (a share)")
        if not 0 < self.throttle_clock_ratio <= 1:
            raise ValueError("throttle_clock_ratio must be above 0 and at most 1 (a share of the maximum clock)")
        if self.collective_spike_factor <= 1:
            raise ValueError("collective_spike_factor must be above 1 (a multiple of the baseline)")
        if self.hang_step_factor <= 1:
            raise ValueError("hang_step_factor must be above 1 (a multiple of the longest step)")
        if not 0 < self.hang_seconds < self.stall_seconds:
            raise ValueError("hang_seconds must be above 0 and below stall_seconds (the long scale)")
        if self.profile_min_steps < 1:
            raise ValueError("profile_min_steps must be 1 or more (a mean of no step is no measure)")
        for name in ("swap_in_bytes_per_second", "major_faults_per_second", "model_age_seconds", "loss_spike_seconds"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be above 0")
        if self.inference_latency_seconds not in catalog.REQUEST_BUCKETS:  # the SLI counts a bucket: it must be one
            raise ValueError(f"inference_latency_seconds must be one of {catalog.REQUEST_BUCKETS}")

    @classmethod
    def override(cls, values: Mapping[str, Any]) -> Thresholds:
        """The defaults with ``values`` (from a YAML file) in their place; an unknown name is an error."""
        known = {f.name for f in fields(cls)}
        if unknown := set(values) - known:
            raise ValueError(f"unknown thresholds: {', '.join(sorted(unknown))} (known: {', '.join(sorted(known))})")
        try:
            numbers = {name: float(value) for name, value in values.items()}
        except (TypeError, ValueError) as e:
            raise ValueError(f"thresholds must be numbers: {e}") from None
        return cls(**numbers)  # each value's own check says what is wrong with it
