"""Job debug: where one workload's time goes, step by step, worker by worker.

For the ML engineer whose job is slow, and the SRE paged for it: step time and
its distribution (exemplars link to traces), where a hung worker is stuck, the
job's loss and the worker whose values went non-finite first, the phase
breakdown, the straggler view, compiles, memory, checkpoints and the host that
feeds the chips.

Two views of where a step's time goes sit side by side, and every title says which it is: the
host-timed phases (every step, timed around the programs the job runs) and the device profile
(a few steps sampled from a device trace every so often). In a job that runs one fused program a
step, the host sees one block of compute (sync reads 0); only the device trace splits it into
compute, collectives no compute hides, and idle time.
"""

from __future__ import annotations

import functools
from typing import Any

from tpuscope import catalog as c
from tpuscope import durations
from tpuscope.conventions import (
    COLLECTIVE_P99,
    GOODPUT_RATE,
    STRAGGLER,
    STRAGGLER_CHIPS,
    WAIT_BEYOND_LEAST,
    WALL_RATE,
    AlertName,
    DashboardUID,
)
from tpuscope.dashboards import panels as p
from tpuscope.dashboards import queries as q
from tpuscope.promql import memory_available_ratio
from tpuscope.thresholds import Thresholds

TITLE = "tpuscope / Job debug"
DESCRIPTION = (
    "One workload's steps, hangs, loss and non-finite values, host-timed phases and sampled device profiles, "
    "stragglers, compiles, memory, checkpoints and host."
)

# The rare-event counters' sidecar starts and scrapes (tpuscope.promql.grown), read on the workload's hosts only
# (the hidden host variable): fleet-wide, each point read every sidecar's start and every target's up (9 M samples,
# 2.3 s a panel over 24 h of 1,000 hosts).
events = functools.partial(q.events, targets=q.WORKLOAD_HOSTS)
once_per_job = functools.partial(q.once_per_job, targets=q.WORKLOAD_HOSTS)

PER_WORKER = f"workload, {q.BY_WORKER}"
WORKER = "{{workload}} " + q.WORKER_LEGEND


def steps(t: Thresholds) -> p.Section:
    quantiles = p.quantile_queries(c.STEP_DURATION, (0.5, 0.95, 0.99))
    phase_seconds = q.share(
        f"sum by (phase) ({q.rate(c.STEP_PHASE_DURATION, suffix='sum')})",
        f"sum ({q.rate(c.STEP_DURATION, suffix='count')})",
        ignoring="phase",
    )

    def phase_share(phase: str) -> str:
        part = f"sum ({q.rate(c.STEP_PHASE_DURATION, q.eq('phase', phase), suffix='sum', window=q.RANGE)})"
        return q.share(part, f"sum ({q.rate(c.STEP_DURATION, suffix='sum', window=q.RANGE)})")

    return p.Section(
        "Steps",
        [
            p.timeseries_panel(
                "Step time p50 / p95 / p99",
                "Wall time of one training step, from the step histogram, for the selected workers. A p99 that "
                "rises while the p50 stays flat is a few slow steps (a straggler, a stall, an input hiccup); both "
                "rising is a regression: compare with the phase breakdown below. The dots are exemplars: each "
                "opens the trace of a kept step (link trace_id to your tracing datasource).",
                "s",
                *quantiles,
            ),
            p.heatmap_panel(
                "Step time distribution",
                "Steps per second in each step-time bucket. One band is a healthy job; a second, higher band is "
                "a recurring slow step (checkpoints, recompiles, a periodic input stall). Exemplars mark kept "
                "steps; open one for its trace.",
                "s",
                p.query(f"sum by (le) ({q.rate(c.STEP_DURATION, suffix='bucket')})", buckets=True, exemplar=True),
            ),
            p.timeseries_panel(
                "Host-timed phases: where a step's time goes",
                "Mean seconds per step in each phase, as the job times them on the host around every step: "
                "compute, sync (collectives), io (waiting for input and copying it to the devices) and other "
                "(what no phase claims: the loop's own Python). The stack is the mean step time. A growing io "
                "band means an input-bound job (more loader workers, prefetch); a growing sync band, a slow "
                "interconnect or a straggler (see Stragglers). A job that runs one fused program a step reports "
                "its collectives inside compute (sync 0): the device profile below splits them.",
                "s",
                p.query(phase_seconds, "{{phase}}"),
                stacked=True,
            ),
            p.stat_panel(
                "Input wait share",
                f"The io phase's share of step time over the range. Above {t.io_share:.0%} the chips wait for "
                "data: add input workers, prefetch more, or move decoding off the training host.",
                "percentunit",
                p.query(phase_share("io"), instant=True),
                limits=p.high_is_bad(t.io_share, t.io_share / 2),
                span=6,
            ),
            p.stat_panel(
                "Host-timed sync share",
                f"The host-timed sync phase's share of step time over the range. Above {t.sync_share:.0%} the "
                "job is bound by collectives: check for a straggler (below), the interconnect, or the sharding. "
                "0 in a fused step: read the device profile's exposed collective share instead.",
                "percentunit",
                p.query(phase_share("sync"), instant=True),
                limits=p.high_is_bad(t.sync_share, t.sync_share / 2),
                span=6,
            ),
            p.stat_panel(
                "Seconds since the last step",
                f"Per workload. Over {t.stall_seconds:g} s the workload is stalled: look at the job's logs, its "
                "input pipeline, and whether a host is down (Exporter health on the on-call dashboard).",
                "s",
                p.query(q.age(c.LAST_STEP), "{{workload}}"),
                limits=p.high_is_bad(t.stall_seconds, t.stall_seconds / 2),
                span=6,
            ),
            p.stat_panel(
                "Steps per second",
                "Steps completed per second, per workload (the fastest worker: in a synchronous job all workers "
                "take the same steps). Zero while the job compiles, checkpoints or is stalled.",
                "short",
                p.query(f"max by (workload) ({q.rate(c.STEPS)})", "{{workload}}"),
                span=6,
            ),
        ],
    )


def hangs(t: Thresholds) -> p.Section:
    """Where each worker is, as its sidecar reads it every second, and where the stuck ones are stuck."""
    at = f"on (job, instance, workload, {c.Label.PHASE})"
    stuck = f"{q.selector(c.STUCK_POSITION)} * {at} group_left () {q.selector(c.POSITION_AGE)}"
    where = f"workload, {q.BY_WORKER}, {c.Label.STEP}, {c.Label.PHASE}, {c.Label.FRAMES}"
    return p.Section(
        "Hangs",
        [
            p.table_panel(
                "Where each worker is stuck",
                "Each stuck process of the workload: its worker, the step and phase where it stopped, its top Python "
                "frames (innermost first; the job's own frames under a library's), and how long it has been there. "
                "A process is stuck once it stays at one place past its limit (beside); its sidecar then logs every "
                f"thread's stacks (`tpuscope hangs` reads them). With every worker stuck, {AlertName.WORKLOAD_HUNG} "
                "pages and names the worker at another step or phase than most of its peers: likely the one they "
                "wait for. Empty while no process is stuck.",
                p.query(f"max by ({where}) ({stuck})", table=True),
                unit="s",
                span=12,
            ),
            p.timeseries_panel(
                "Time at one place against its limit, by worker",
                "How long each worker's process has been where it is (its phase of a step, between steps, "
                "compiling, in a checkpoint), as a share of how long it may stay there: in a step, "
                f"{t.hang_seconds:g} s or {t.hang_step_factor:g}x its longest recent step, whichever is longer; "
                f"elsewhere, {t.stall_seconds:g} s. At 100% the process is stuck. A healthy job's lines stay near "
                "0, each phase a moment long.",
                "percentunit",
                p.query(
                    f"max by (workload, {q.BY_WORKER}, {c.Label.PHASE})"
                    f" ({q.selector(c.POSITION_AGE)} / {q.selector(c.POSITION_LIMIT)})",
                    WORKER + " {{phase}}",
                ),
                limits=p.high_is_bad(1, 0.5),
                span=12,
            ),
        ],
    )


def training_health(t: Thresholds) -> p.Section:
    """What the job's own numbers say (``s.loss(...)``): its loss, a spike, the worker whose values went non-finite
    first, and the steps a restore threw away. The divergence alerts' runbooks send the on-call here."""
    loss = q.eq(c.Label.VALUE, "loss")
    per_value = f"{PER_WORKER}, {c.Label.VALUE}"
    nonfinite = f"sum by ({per_value}) ({events(c.TRAINING_NONFINITE, window=q.RANGE)}) > 0"
    # The latest onset of each value that went non-finite in the range, its sidecar gone since too (a crash often
    # follows a NaN): not one from before the range, which the gauge keeps for the workload's life.
    latest_onset = f"max by ({per_value}) (last_over_time({q.selector(c.TRAINING_NONFINITE_ONSET)}[{q.RANGE}]))"
    onset = f"{latest_onset} and ({nonfinite})"
    rolled_back_steps = once_per_job(c.GOODPUT_ROLLED_BACK_STEPS, window=q.RANGE)
    rolled_back_seconds = f"sum by (workload) ({events(c.GOODPUT_ROLLED_BACK, window=q.RANGE)})"
    spike = c.LOSS_SPIKE_DEVIATION
    return p.Section(
        c.TRAINING_GROUP,
        [
            p.timeseries_panel(
                "Loss, by worker",
                "The loss each worker reported with `s.loss(...)` at its latest step (after the all-reduce every "
                "worker's is the same loss). A NaN shows as a gap in the line, from the first scrape that read it "
                "(an infinite loss runs off the axis); the table below says which worker and value went first, "
                f"and at which step; {AlertName.LOSS_NON_FINITE} pages. Stop the job, or restore the last "
                "checkpoint before the first non-finite step. A loss that climbs and stays up without a NaN: see "
                "its deviation beside.",
                "none",
                p.query(f"max by ({PER_WORKER}) ({q.selector(c.TRAINING_VALUE, loss)})", WORKER),
                min_value=None,
            ),
            p.timeseries_panel(
                "Loss against its recent baseline, by worker",
                "How far the latest finite loss is above its recent baseline, in robust standard deviations: "
                f"(loss - median) / (1.4826 MAD) of its latest {c.LOSS_BASELINE_STEPS} finite losses that were not "
                f"spikes (served once {c.LOSS_BASELINE_MIN_STEPS} were read; a NaN leaves it at the last finite "
                f"one). Above {spike:g} (red) the loss spiked. One that comes down is the noise of training; one "
                f"that stays above for {durations.human(t.loss_spike_seconds)} makes {AlertName.LOSS_SPIKE} a "
                "ticket: the run diverged without a NaN, or settled at a worse loss. Look at the learning-rate "
                "schedule and the data at the step it rose, and restore a checkpoint before it if the run does "
                "not recover.",
                "none",
                p.query(f"max by ({PER_WORKER}) ({q.selector(c.LOSS_DEVIATION)})", WORKER),
                limits=p.high_is_bad(spike, spike / 2),
                min_value=None,
            ),
            p.table_panel(
                "Non-finite values over the range, by worker: how many, and the step each went at",
                "Each worker and value (loss, grad_norm, and local: the worker's own value before the reduction) "
                "that read NaN or infinite in the range: how many steps did, and the step of its latest onset, "
                "lowest first. The first row is the first to go. A local value whose onset is lower than every "
                "peer's, alone, is the worker that fed the all-reduce a bad value: "
                f"{AlertName.NON_FINITE_FIRST_WORKER} names it; suspect its chips (silent data corruption), run the "
                "accelerator's diagnostics on its node and cordon it if they fail. Every worker at the same step: "
                "the code, the data or the learning rate. Restore a checkpoint before the lowest step. Empty while "
                "every value is finite.",
                p.query(nonfinite, table=True),
                p.query(onset, table=True),
                columns=("Non-finite steps", "Onset step"),
                sort_by="Onset step",
                unit="none",  # a step reads whole: 9000 and 9001, not 9 K twice
                span=16,
            ),
            p.stat_panel(
                "Rolled back by restores over the range",
                "What the workload's restores to a step below the highest it had reached threw away over the "
                "range: the steps (that highest step less the checkpoint's, counted once per job) and the "
                "productive seconds its workers had booked for them, which the goodput breakdown moves from "
                "productive to lost. A resume after a failure throws away the steps since its last checkpoint; a "
                "rollback after a divergence, those since the checkpoint before the bad step. Many: save more "
                "often, or find why the run diverges.",
                "short",
                p.query(rolled_back_steps, "steps", instant=True),
                p.query(rolled_back_seconds, "productive seconds", instant=True),
                units={"B": "s"},
                span=8,
                height=8,
            ),
        ],
        numbered_last=True,
    )


# What every device-profile panel must say: where its figures come from and how old they may be.
SAMPLED = (
    "Sampled: from the device traces the job takes of a few steps every 10 minutes by default (the same steps "
    f"on every host), each worker's mean over the steps of its last {c.PROFILE_MEAN_CAPTURES} fresh captures, so a "
    "figure holds until the next capture (Age of the latest device profile says how old it is)."
)


def device_profile(t: Thresholds) -> p.Section:
    parts = f"sum by (workload, part) ({q.selector(c.PROFILE_TIME)})"
    step = f"sum by (workload) ({q.selector(c.PROFILE_STEP)})"

    def over_range(metric: c.Metric, *matchers: str) -> str:
        return f"sum (avg_over_time({q.selector(metric, *matchers)}[{q.RANGE}]))"

    exposed_share = q.share(over_range(c.PROFILE_TIME, q.eq("part", "exposed_collective")), over_range(c.PROFILE_STEP))
    # Each part's step-to-step spread as a share of its mean (the coefficient of variation), per worker: a part
    # of 0 s has no spread to speak of.
    spread = f"{q.selector(c.PROFILE_TIME_STDDEV)} / ({q.selector(c.PROFILE_TIME)} > 0)"
    named = q.eq(c.Label.CLASSIFIED_BY, c.PROFILE_OP_CLASSIFIERS[1])  # told by name only
    by_name = f"sum ({events(c.PROFILE_OPS, named, window=q.RANGE)}) / sum ({events(c.PROFILE_OPS, window=q.RANGE)})"
    capture_cost = f"{once_per_job(c.PROFILE_CAPTURE_SECONDS, window=q.RANGE)} / {q.SECONDS[q.RANGE]}"
    trace_bytes = (
        f"sum ({events(c.PROFILE_CAPTURE_BYTES, window=q.RANGE)})"
        f" / sum ({events(c.PROFILE_CAPTURES, q.eq('result', 'ok'), window=q.RANGE)})"
    )
    return p.Section(
        "Device profile (sampled device traces)",
        [
            p.timeseries_panel(
                "Device profile: where the step's device time went",
                "Each part's share of a profiled step on the devices: compute (the union of the non-collective "
                "ops), exposed collective (collective ops no compute hides: waiting for the other devices and "
                "hosts) and idle (no op at all: waiting for the host, the input, the next dispatch, and where a "
                "host has more devices than free cores, one device's ops waiting for CPU threads the others hold), "
                "stacked to 100%, over the workload's workers. Unlike the host-timed phases above, this splits one "
                f"fused program's time. {SAMPLED} A wide exposed collective band: a straggler (below), the "
                "interconnect or the sharding; a wide idle band: the host, the input or the host's cores do not "
                "keep up.",
                "percentunit",
                p.query(q.share(parts, step, ignoring="part"), "{{part}}"),
                stacked=True,
                max_value=1,
                span=8,
            ),
            p.stat_panel(
                "Device profile: exposed collective share",
                "The share of the profiled step the devices spent in collectives no compute hid, over the range "
                f"(the device-trace counterpart of the host-timed sync share). {SAMPLED} Above "
                f"{t.sync_share:.0%} the job is bound by collectives: a straggler, the interconnect, or the "
                "sharding.",
                "percentunit",
                p.query(exposed_share, instant=True),
                limits=p.high_is_bad(t.sync_share, t.sync_share / 2),
                span=4,
                height=8,
            ),
            p.timeseries_panel(
                "Device profile: compute and exposed collective per step, by worker",
                "Each worker's profiled compute and exposed collective seconds per step (mean over its "
                "devices). Every worker of a synchronous step takes as long as the slowest, so a straggler "
                "shows as the one worker with more compute and less collective wait than its peers, who wait "
                f"for it at each collective. {SAMPLED}",
                "s",
                p.query(q.profiled("compute"), "compute " + WORKER),
                p.query(q.profiled("exposed_collective"), "exposed collective " + WORKER),
                span=12,
            ),
            p.timeseries_panel(
                "Device profile: compute over the workload's median, by worker",
                "Each worker's profiled compute per step divided by its workload's median worker's: the "
                "straggler view that holds in a fused step, where the host-timed compute of every worker "
                f"includes the wait for the slowest. Above {t.straggler_factor:g} the worker is a straggler "
                f"(as {AlertName.STRAGGLER} reads it, with less collective wait than its peers): cordon or replace "
                f"its host. {SAMPLED} Only recent captures of running workers count, so a finished job's last "
                "profile leaves no straggler behind.",
                "none",
                p.query(q.profiled_compute_over_median(), WORKER),
                limits=p.ratio_high_is_bad(t.straggler_factor),
                min_value=None,
                span=8,
            ),
            p.timeseries_panel(
                "Device profile: collective overlap",
                "The share of the collective ops' time that compute covered, averaged over the workload's "
                "workers (1: every collective hidden behind compute). Falling overlap with a rising exposed "
                f"collective share: the collectives no longer fit behind the compute (a larger model, a "
                f"smaller batch per device, another sharding). {SAMPLED}",
                "percentunit",
                p.query(f"avg by (workload) ({q.selector(c.PROFILE_OVERLAP)})", "{{workload}}"),
                max_value=1,
                span=8,
            ),
            p.timeseries_panel(
                "Device profile: device imbalance, by worker",
                "The compute of each worker's busiest local device over its devices' mean (1: balanced). Above "
                f"{t.straggler_factor:g} (the straggler bound, for devices of one host) one chip does more "
                f"work or runs slower than its neighbours: uneven sharding, or a failing chip. {SAMPLED}",
                "none",
                p.query(f"max by ({PER_WORKER}) ({q.selector(c.PROFILE_IMBALANCE)})", WORKER),
                limits=p.ratio_high_is_bad(t.straggler_factor),
                min_value=None,
                span=8,
            ),
            p.timeseries_panel(
                "Device profile: step-to-step spread, by part",
                "Each part's standard deviation from one measured step to the next, over its mean (the "
                "coefficient of variation), averaged over the workload's workers: how far one step may stray from "
                "the figures above, which are means over the steps of each worker's last "
                f"{c.PROFILE_MEAN_CAPTURES} fresh captures. An exposed collective that varies by half from step to "
                "step is common; a spread that grows while the mean holds: a peer or the interconnect at times "
                f"slow. {SAMPLED}",
                "percentunit",
                p.query(f"avg by (workload, part) ({spread})", "{{part}}"),
                min_value=None,
                span=12,
            ),
            p.stat_panel(
                "Device profile: measured steps averaged",
                "How many measured steps the device-profile figures of the workload's thinnest worker are a mean "
                f"of. Under {t.profile_min_steps:g} the alerts do not judge the worker by its profile yet (a "
                f"capture measures a few steps: the first captures after a start). {SAMPLED}",
                "short",
                p.query(f"min by (workload) ({q.selector(c.PROFILE_STEPS)})", "{{workload}}", instant=True),
                limits=p.low_is_bad(t.profile_min_steps),
                span=6,
                height=8,
            ),
            p.stat_panel(
                "Device ops told by name only",
                "The share of the device ops in the sampled device traces over the range whose kind (compute or "
                "collective) the parser could only guess from their name, the trace giving no HLO category (the "
                "CPU backend, an older runtime). Near 0 on a TPU or GPU; high there, the compute and collective "
                "split may be off.",
                "percentunit",
                p.query(by_name, instant=True),
                span=6,
                height=8,
            ),
            p.timeseries_panel(
                "Device profile captures, by result",
                "The sampled device traces the job tried to capture in each interval, each counted once however many "
                "workers take it (every host captures the same steps): ok, busy (a profiler of the user's was "
                "running, so the job left it alone) and error (the capture or its parse failed: the job's log "
                "says why). No ok capture for long: the figures above are old.",
                "short",
                p.query(once_per_job(c.PROFILE_CAPTURES, by="workload, result"), "{{result}}"),
                span=12,
            ),
            p.stat_panel(
                "Device profile capture cost",
                "What the sampled device traces cost over the range, as a share of wall time: the seconds the "
                "costliest worker spent stopping traces and parsing them (off the training thread). The job widens its "
                "sampling period by itself when a capture costs too much.",
                "percentunit",
                p.query(capture_cost, instant=True),
                span=4,
                height=8,
            ),
            p.stat_panel(
                "Age of the latest device profile",
                "Seconds since the oldest of the workers' latest captures that measured something: how old the "
                "sampled device-profile figures may be. A capture comes every 10 minutes by default (longer where the "
                "job widened its period: its period, beside it); a capture counts in the alerts for three of its "
                "job's periods (30 minutes from a job that does not say its period). Much older, the job stopped "
                "profiling: busy or failing captures (see Device profile captures), or profiles turned off.",
                "s",
                p.query(f"time() - min by (workload) ({q.selector(c.PROFILE_LAST_CAPTURE)})", "{{workload}} age"),
                p.query(f"max by (workload) ({q.selector(c.PROFILE_PERIOD)})", "{{workload}} period"),
                span=4,
                height=8,
            ),
            p.stat_panel(
                "Device trace size per capture",
                "Bytes of a sampled device trace, serialized, per capture that measured something, on one host "
                "over the range. The job parses it in memory and writes nothing; the size grows with the steps "
                "captured and the ops per step.",
                "bytes",
                p.query(trace_bytes, instant=True),
                span=4,
                height=8,
            ),
        ],
    )


def stragglers(t: Thresholds) -> p.Section:
    compute = q.mean(c.STEP_PHASE_DURATION, q.eq("phase", "compute"), by=PER_WORKER)
    chosen = 'workload=~"$workload"'
    return p.Section(
        "Stragglers",
        [
            p.timeseries_panel(
                "What stragglers cost: chips kept waiting, and the straggler's cause",
                "The chips the workload's workers keep idle waiting at the collectives beyond what they wait for "
                "each other (each worker's wait per step beyond the least-waiting worker's, times its steps a "
                "second and its chips), and, while one worker holds them back by over "
                f"{t.straggler_share:.0%} of their steps, that worker with its cause: compute (its devices), input "
                "(its input phase), host (its devices idle on their host), unknown. Chronic for over "
                f"{t.straggler_chronic:.0%} of an hour, {AlertName.STRAGGLER} opens a ticket. Booked in goodput as "
                "`straggler` (docs/goodput.md).",
                "none",
                p.query(f"sum by (workload) ({STRAGGLER_CHIPS}{{{chosen}}})", "all workers of {{workload}}"),
                p.query(f"{STRAGGLER}{{{chosen}}}", "straggler: worker {{worker}} ({{instance}}), {{cause}}"),
                span=8,
            ),
            p.timeseries_panel(
                "Wait at the collectives beyond the least-waiting worker, by worker",
                "Each worker's wait at the collectives per step beyond its workload's least-waiting worker's over "
                "the last hour: the straggler waits least (it arrives last), its peers this much longer for it; "
                "a clean job's workers sit around 0, either side. From the host-timed sync phase where the workload "
                "times one, else the sampled device profiles.",
                "s",
                p.query(f"{WAIT_BEYOND_LEAST}{{{chosen}}}", WORKER),
                span=8,
            ),
            p.timeseries_panel(
                "Host-timed compute per step, by worker",
                "Mean host-timed compute phase of each worker. In a synchronous job every worker waits for the "
                "slowest at the next collective, so one line above the others slows them all: that host is the "
                "straggler (thermal throttling, a noisy neighbour, a failing chip). In a fused step every worker's "
                "compute holds the wait for the slowest, so all read alike: see the device profile's per-worker "
                "split.",
                "s",
                p.query(compute, WORKER),
                span=8,
            ),
            p.timeseries_panel(
                "Host-timed compute over the workload's median, by worker",
                f"Each worker's host-timed compute time divided by its workload's median worker. Above "
                f"{t.straggler_factor:g} the worker is a straggler: cordon or replace its host.",
                "none",
                p.query(q.compute_over_median(), WORKER),
                limits=p.ratio_high_is_bad(t.straggler_factor),
                span=8,
            ),
            p.timeseries_panel(
                "Host-timed sync per step, by worker",
                "Mean host-timed sync phase of each worker: the time spent in collectives, most of it waiting for the "
                "others. A straggler shows here inverted: little sync on itself, much on everyone else.",
                "s",
                p.query(q.mean(c.STEP_PHASE_DURATION, q.eq("phase", "sync"), by=PER_WORKER), WORKER),
                span=8,
            ),
        ],
    )


def compiles(t: Thresholds) -> p.Section:
    cache = f"sum ({events(c.COMPILE_CACHE_REQUESTS, window=q.RANGE)})"
    hits = f"sum ({events(c.COMPILE_CACHE_REQUESTS, q.eq('result', 'hit'), window=q.RANGE)})"
    return p.Section(
        "Compilation",
        [
            p.timeseries_panel(
                "Compile time by stage",
                "Seconds spent compiling in each interval, by stage (tracing, lowering to MLIR, XLA backend): "
                "the job's own, the longest any one worker took (every worker compiles the same program and "
                "the others wait for the slowest). Expected at the start and after each restart; in the steady "
                "state it means recompiles: shapes or static arguments that change between steps (pad to fixed "
                "shapes, mark arguments static deliberately).",
                "s",
                p.query(once_per_job(c.COMPILE_DURATION, suffix="sum", by="workload, stage"), "{{stage}}"),
                stacked=True,
                span=8,
            ),
            p.timeseries_panel(
                "Compiles",
                "XLA backend compiles of the job in each interval, each counted once however many workers "
                "compile it (they all compile the same program). A steady trickle after warm-up is a "
                "recompiling job; each compile stalls every worker for its duration.",
                "short",
                p.query(
                    once_per_job(c.COMPILE_DURATION, q.eq("stage", "backend"), suffix="count"),
                    "{{workload}}",
                ),
                span=8,
            ),
            p.stat_panel(
                "Compilation cache hit ratio",
                f"Share of persistent compilation-cache look-ups that hit, over the range. Below "
                f"{t.compile_cache_hit_ratio:.0%} restarts pay full compile time: check that the cache directory "
                "is shared and persistent and that the JAX version and flags did not change.",
                "percentunit",
                p.query(f"{hits} / {cache}", instant=True),
                limits=p.low_is_bad(t.compile_cache_hit_ratio),
                span=8,
                height=8,
            ),
        ],
    )


def memory(t: Thresholds) -> p.Section:
    peak, limit = (
        f"max by ({q.BY_DEVICE}) ({q.selector(m, q.WORKLOAD_HOSTS)})"
        for m in (c.DEVICE_MEMORY_PEAK, c.DEVICE_MEMORY_LIMIT)
    )
    return p.Section(
        "Memory and utilization",
        [
            p.timeseries_panel(
                "Device memory used, by device",
                f"HBM (or GPU memory) in use over its limit, per device of the workload's hosts, as the job "
                f"reports it (source workload) and as the runtime or driver does (libtpu, nvml). Above "
                f"{t.hbm_used_ratio:.0%} the next larger batch or program will not fit: reduce the batch, "
                "rematerialize activations, or shard the optimizer state.",
                "percentunit",
                p.query(q.on_workload_hosts(q.memory_used_ratio(q.WORKLOAD_HOSTS)), q.DEVICE_LEGEND),
                limits=p.high_is_bad(t.hbm_used_ratio, t.hbm_used_ratio - 0.1),
                max_value=1,
                span=8,
            ),
            p.timeseries_panel(
                "Peak device memory over its limit, by device",
                "The high-water mark of device memory the job reports (its allocator's peak), over the limit: "
                "the headroom a step really has is what the peak leaves, not what current use leaves.",
                "percentunit",
                p.query(q.on_workload_hosts(f"{peak} / {limit}"), q.DEVICE_LEGEND),
                limits=p.high_is_bad(t.hbm_used_ratio, t.hbm_used_ratio - 0.1),
                max_value=1,
                span=8,
            ),
            p.timeseries_panel(
                "Memory spilled to host, by program",
                "Bytes XLA placed in host memory for each compiled program (arguments, outputs, temporaries). "
                "Any spill makes a step wait on host transfers: it means the program did not fit in device "
                "memory, or offloading was asked for.",
                "bytes",
                p.query(f"max by (workload, program) ({q.selector(c.MEMORY_SPILL)})", "{{workload}} {{program}}"),
                limits=p.high_is_bad(1),
                span=8,
            ),
            p.timeseries_panel(
                "Model FLOPs utilization",
                f"Achieved model FLOP/s over the chips' peak, averaged over the workload's workers. Below "
                f"{t.mfu_low:.0%} the chips spend their time on something other than the model's math: look at "
                "the phase breakdown, the duty cycle, and the step's compiled program (fusion, padding).",
                "percentunit",
                p.query(f"avg by (workload) ({q.selector(c.MFU)})", "{{workload}}"),
                limits=p.low_is_bad(t.mfu_low),
                max_value=1,
                span=12,
            ),
            p.timeseries_panel(
                "Duty cycle, by device",
                f"Share of time each chip of the workload's hosts was busy (the runtime's or the driver's own "
                f"measure). Below {t.duty_cycle_low:.0%} the chips wait: on input, on the host, or on a "
                "straggler.",
                "percentunit",
                p.query(q.on_workload_hosts(q.selector(c.DUTY_CYCLE, q.WORKLOAD_HOSTS)), q.DEVICE_LEGEND),
                limits=p.low_is_bad(t.duty_cycle_low),
                max_value=1,
                span=12,
            ),
        ],
    )


def checkpoints(t: Thresholds) -> p.Section:
    by = "operation, result"
    checkpoint_time = f"sum ({q.increase(c.GOODPUT, q.eq('category', 'checkpoint'), window=q.RANGE)})"
    wall_time = f"sum ({q.increase(c.GOODPUT, window=q.RANGE)})"
    written = f"sum by (operation) ({events(c.CHECKPOINT_BYTES, window=q.RANGE)})"
    writing = (
        f"sum by (operation) ({events(c.CHECKPOINT_DURATION, q.eq('result', 'ok'), suffix='sum', window=q.RANGE)})"
    )
    return p.Section(
        "Checkpoints",
        [
            p.bar_gauge_panel(
                "Checkpoint time p50 / p95 over the range",
                "How long saves and restores took, by result. Long saves block training (unless asynchronous); "
                "long restores lengthen every recovery.",
                "s",
                *p.quantile_queries(
                    c.CHECKPOINT_DURATION,
                    (0.5, 0.95),
                    by=by,
                    window=q.RANGE,
                    instant=True,
                    rare=True,
                    targets=q.WORKLOAD_HOSTS,
                ),
                span=8,
            ),
            p.timeseries_panel(
                "Checkpoints, by result",
                "Checkpoint saves and restores in each interval, ok and error, each counted once per job however "
                "many hosts take part (every process of a multi-host job saves its part of the same checkpoint, "
                f"as {AlertName.CHECKPOINT_FAILING} counts them). A failed save leaves the work since the last "
                "good one at risk: check the storage (quota, permissions, throttling).",
                "short",
                p.query(
                    once_per_job(c.CHECKPOINT_DURATION, suffix="count", by=f"workload, {by}"),
                    "{{workload}} {{operation}} {{result}}",
                ),
                span=8,
            ),
            p.bar_gauge_panel(
                "Checkpoint speed over the range",
                "Bytes written per second of saving, and read per second of restoring, for the checkpoints that "
                "succeeded. Far below the storage's bandwidth: too many small files, or a throttled bucket.",
                "Bps",
                p.query(f"{written} / {writing}", "{{operation}}", instant=True),
                span=8,
            ),
            p.bar_gauge_panel(
                "Time since the last good checkpoint",
                f"Per workload: everything computed since is lost if the job fails now. Over "
                f"{t.checkpoint_age_seconds:g} s the work at risk is above the bound: are saves failing? "
                "Infinity: the workload steps and never saved.",
                "s",
                p.query(q.checkpoint_age(), "{{workload}}", instant=True),
                limits=p.high_is_bad(t.checkpoint_age_seconds, t.checkpoint_age_seconds / 2),
                span=12,
            ),
            p.stat_panel(
                "Checkpointing share of wall time",
                f"Wall time spent checkpointing over the range. Above {t.checkpoint_share:.0%} checkpoint less "
                "often, save asynchronously, or write less (only what a restart needs).",
                "percentunit",
                p.query(f"{checkpoint_time} / {wall_time}", instant=True),
                limits=p.high_is_bad(t.checkpoint_share, t.checkpoint_share / 2),
                span=12,
            ),
        ],
    )


def goodput(t: Thresholds) -> p.Section:
    by_category = q.recorded_hour(GOODPUT_RATE, by="category")
    return p.Section(
        "Goodput",
        [
            p.timeseries_panel(
                "Wall time by category",
                "Where the wall time of the last hour went: productive training, compile, io_wait, checkpoint, "
                "init (start to first step), lost (work of a process that failed before a checkpoint covered "
                "it), downtime (from a failure to the next start) and other (the rest of a process's time, "
                "booked when it ends). Step time becomes productive only when a checkpoint covers it, so the "
                "productive band grows in steps, one checkpoint at a time (hence the hour); the bands add up to "
                "the wall time once it is settled. The objective is "
                f"{t.goodput_objective:.0%} productive; the largest other band is the first thing to fix. From "
                "the recording rules' 5-minute rates of each workload: the slice and worker variables do not apply.",
                "percentunit",
                p.query(
                    q.share(by_category, q.recorded_hour(WALL_RATE), ignoring="category"),
                    "{{category}}",
                ),
                stacked=True,
                max_value=1,
                span=24,
            ),
        ],
    )


def host(t: Thresholds) -> p.Section:
    errors, legend = q.increase(c.COLLECTOR_ERRORS, q.WORKLOAD_HOSTS), "{{instance}} {{collector}} {{reason}}"
    return p.Section(
        "Host",
        [
            p.timeseries_panel(
                "Host CPU, by host",
                f"CPU busy (all CPUs, and the busiest one) and iowait of the workload's hosts. Busier than "
                f"{t.host_cpu_ratio:.0%} the host cannot feed its chips; one CPU at 100% while the rest idle is a "
                "single-threaded bottleneck (the Python loop, an input thread). High iowait points at the input "
                "files.",
                "percentunit",
                p.query(
                    q.on_workload_hosts(
                        f"avg by (job, instance) ({q.selector(c.HOST_CPU_UTILIZATION, q.WORKLOAD_HOSTS)})"
                    ),
                    "busy {{instance}}",
                ),
                p.query(
                    q.on_workload_hosts(
                        f"max by (job, instance) ({q.selector(c.HOST_CPU_UTILIZATION, q.WORKLOAD_HOSTS)})"
                    ),
                    "busiest CPU {{instance}}",
                ),
                p.query(q.on_workload_hosts(q.selector(c.HOST_CPU_IOWAIT, q.WORKLOAD_HOSTS)), "iowait {{instance}}"),
                limits=p.high_is_bad(t.host_cpu_ratio),
                max_value=1,
                span=8,
            ),
            p.timeseries_panel(
                "The job's CPU, by host",
                "CPU cores the workload's processes use. Near the host's core count, the input pipeline and the "
                "training loop compete for the CPU.",
                "short",
                p.query(f"sum by (workload, instance) ({q.rate(c.JOB_CPU)})", "{{workload}} {{instance}}"),
                span=8,
            ),
            p.timeseries_panel(
                "Host disk and network",
                "Bytes per second read and written on the workload's hosts' disks, and received and transmitted "
                "on their network interfaces: input reads and checkpoint writes show here.",
                "Bps",
                p.query(
                    q.on_workload_hosts(
                        f"sum by (job, instance, direction) ({q.rate(c.HOST_DISK_IO, q.WORKLOAD_HOSTS)})"
                    ),
                    "disk {{direction}} {{instance}}",
                ),
                p.query(
                    q.on_workload_hosts(
                        f"sum by (job, instance, direction) ({q.rate(c.HOST_NETWORK, q.WORKLOAD_HOSTS)})"
                    ),
                    "net {{direction}} {{instance}}",
                ),
                span=8,
            ),
            p.memory_available_panel(
                "Host memory available, by host",
                "Share of each of the workload's hosts' memory still available. Near zero the kernel's OOM killer "
                f"picks a process, likely the training job ({AlertName.HOST_MEMORY_PRESSURE} pages under "
                f"{t.host_memory_available_ratio:.0%}); the on-call board shows each slice's least.",
                p.query(
                    q.on_workload_hosts(
                        memory_available_ratio("job, instance", lambda m: q.selector(m, q.WORKLOAD_HOSTS))
                    ),
                    "{{instance}}",
                ),
                t.host_memory_available_ratio,
            ),
            p.timeseries_panel(
                "Host swap in and out, by host",
                "Bytes per second each of the workload's hosts swaps in from disk and out to it. Swapping in while "
                "the job faults pages back from disk is thrash; swapping out alone is the kernel making room.",
                "Bps",
                p.query(
                    q.on_workload_hosts(
                        f"sum by (job, instance, direction) ({q.rate(c.HOST_SWAP_IO, q.WORKLOAD_HOSTS)})"
                    ),
                    "{{direction}} {{instance}}",
                ),
                limits=p.high_is_bad(t.swap_in_bytes_per_second),
                span=8,
            ),
            p.timeseries_panel(
                "Multislice collective latency p99, by host",
                "The TPU runtime's end-to-end collective latency across slices (megascale's collective_end_to_end, "
                "all buffer sizes), p99 over 5 minutes on each of the workload's hosts, as the recording rule the "
                "alert reads keeps it: in a multislice job, the DCN between the slices. A host far above its peers "
                "has a bad network path. Empty for single-slice jobs and GPUs.",
                "s",
                p.query(
                    q.on_workload_hosts(f"max by (job, instance) ({COLLECTIVE_P99}{{{q.WORKLOAD_HOSTS}}})"),
                    "{{instance}}",
                ),
                span=8,
            ),
            p.timeseries_panel(
                "Collector errors, by host and reason",
                "Failed collections on the workload's hosts, per collector and reason (the on-call board has them by "
                "slice): a host whose runtime or driver stops answering shows here first. The sidecar's log has the "
                "detail.",
                "short",
                p.query(q.on_workload_hosts(f"sum by (job, instance, collector, reason) ({errors})"), legend),
                span=8,
            ),
        ],
    )


def dashboard(t: Thresholds) -> dict[str, Any]:
    sections = [
        steps(t),
        hangs(t),
        training_health(t),
        device_profile(t),
        stragglers(t),
        compiles(t),
        memory(t),
        checkpoints(t),
        goodput(t),
        host(t),
    ]
    return p.build(DashboardUID.JOB, TITLE, DESCRIPTION, sections, p.variables(c.STEPS, one_workload=True))
