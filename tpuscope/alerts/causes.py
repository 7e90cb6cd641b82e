"""One cause, one notification: the cause each alert stands for, and the inhibitions that keep the alerts a cause
also fires quiet while the alert that names it fires.

An incident fires several rules at once: a straggler slows every step (StepTimeRegression), makes its peers wait
at each collective (SyncBound, CollectiveLatencySpike) and lowers the workload's MFU; an outage burns the goodput
budget. The on-call wants the cause, once: Alertmanager's inhibit rules (``alertmanager_file``) silence the
symptoms of the same workload while the alert that names their cause fires, and docs/alerts.md lists both.
"""

from __future__ import annotations

from dataclasses import dataclass

from tpuscope.conventions import AlertName
from tpuscope.reasons import COMPILE_ERROR

# What each alert stands for: the one cause an on-call reads it as (docs/alerts.md).
CAUSES: dict[AlertName, str] = {
    AlertName.WORKLOAD_STALLED: "the job hangs: its processes are connected and nothing progresses",
    AlertName.WORKLOAD_HUNG: "the job hangs: every worker has stayed at one place past its limit, and the worker "
    "elsewhere than its peers is likely the one they wait for",
    AlertName.STEP_TIME_REGRESSION: "the job's steps got slower than its own recent past, for a reason no more "
    "specific alert names",
    AlertName.INPUT_BOUND: "the input pipeline cannot keep up with the chips",
    AlertName.SYNC_BOUND: "the job waits on collectives more than it computes, with no straggler named",
    AlertName.STRAGGLER: "one worker is slower than its peers, who wait for it",
    AlertName.LOW_DUTY_CYCLE: "a job's chips sit idle on some of its hosts",
    AlertName.LOW_MFU: "the job uses a small share of its chips' peak",
    AlertName.WORKLOAD_FAILED: "the job failed, for a reason of its own (not the platform's)",
    AlertName.WORKLOAD_DOWN: "the job is down and has not come back: the time is lost while it stays down",
    AlertName.WORKLOAD_CRASH_LOOPING: "the job fails again each time it restarts",
    AlertName.COLLECTIVE_LATENCY_SPIKE: "the job's collectives got slower than their own past: the interconnect or "
    "the sharding",
    AlertName.COMPILE_TIME_HIGH: "the job spends its time compiling",
    AlertName.RECOMPILING: "the job recompiles in its steady state: a shape, a dtype or a static argument changes",
    AlertName.COMPILE_CACHE_HIT_RATIO_LOW: "the persistent compilation cache misses: restarts compile from scratch",
    AlertName.COMPILE_FAILING: "a program fails to trace, lower or compile",
    AlertName.MEMORY_SPILL: "a program does not fit in device memory and spills to the host",
    AlertName.DEVICE_MEMORY_NEAR_LIMIT: "a job's devices are nearly out of memory on some of its hosts",
    AlertName.CHECKPOINT_FAILING: "checkpoint saves fail",
    AlertName.CHECKPOINT_STALE: "no checkpoint saved for too long: a failure now loses that much work",
    AlertName.CHECKPOINT_MISSING: "the job steps without ever having saved a checkpoint",
    AlertName.CHECKPOINT_TIME_HIGH: "checkpointing takes too large a share of the job's time",
    AlertName.GOODPUT_BUDGET_BURN: "the job loses productive time faster than its SLO allows, for a cause no "
    "page names",
    AlertName.INFERENCE_LATENCY_BUDGET_BURN: "a service answers too slowly, too often, for its SLO",
    AlertName.COLLECTOR_DOWN: "a sidecar cannot read one of its sources",
    AlertName.EXPORTER_DOWN: "Prometheus cannot scrape a job's sidecars: its workloads are unmonitored",
    AlertName.EXPORTER_ABSENT: "pods run sidecars that no scrape configuration finds",
    AlertName.INGEST_LOSING_EVENTS: "a sidecar drops the events its jobs send",
    AlertName.HOST_CPU_SATURATED: "a job's hosts' CPUs are too busy to feed their chips",
    AlertName.HOST_MEMORY_PRESSURE: "a job's host runs out of memory: the OOM killer is near",
    AlertName.DEVICE_THROTTLED: "a GPU's driver holds its clocks down",
    AlertName.MODEL_STALE: "a service serves a model older than it should",
    AlertName.LOSS_NON_FINITE: "the run diverged: its loss or gradient is NaN or infinite",
    AlertName.NON_FINITE_FIRST_WORKER: "one worker's chips corrupted its values before its peers': suspect "
    "its hardware",
    AlertName.LOSS_SPIKE: "the loss jumped and has not come down: the run diverged without a NaN",
    AlertName.NODE_SUSPECT: "a node's hardware keeps breaking the jobs that land on it, whichever job",
}

# A stalled workload has no step time to speak of: these say nothing new while it is stalled.
STALL_SAYS_IT = (
    AlertName.STEP_TIME_REGRESSION,
    AlertName.INPUT_BOUND,
    AlertName.SYNC_BOUND,
    AlertName.STRAGGLER,
    AlertName.LOW_MFU,
    AlertName.CHECKPOINT_STALE,
    AlertName.COLLECTIVE_LATENCY_SPIKE,
)
# The labels two alerts must share for one to be the other's cause: the same workload of the same JobSet (a workload
# name is unique in neither a namespace nor a team: two JobSets of one namespace often run the same model's name).
SAME_WORKLOAD = ("namespace", "jobset", "workload")


@dataclass(frozen=True)
class Inhibition:
    """While ``source`` fires for a workload, ``targets`` of the same workload notify nobody: ``why``. ``only``:
    a further matcher on the targets (one reason of an alert fired per reason)."""

    source: tuple[AlertName, ...]
    targets: tuple[AlertName, ...]
    why: str
    only: str = ""


INHIBITIONS: tuple[Inhibition, ...] = (
    Inhibition(
        (AlertName.WORKLOAD_HUNG,),
        (AlertName.WORKLOAD_STALLED, *STALL_SAYS_IT),
        "a hung workload stalls, and has no step time to speak of: the hang's page names where it is stuck",
    ),
    Inhibition((AlertName.WORKLOAD_STALLED,), STALL_SAYS_IT, "a stalled workload has no step time to speak of"),
    Inhibition(
        (AlertName.STRAGGLER,),
        (
            AlertName.SYNC_BOUND,
            AlertName.COLLECTIVE_LATENCY_SPIKE,
            AlertName.STEP_TIME_REGRESSION,
            AlertName.LOW_MFU,
        ),
        "every worker waits for the straggler at each collective: the workload's steps, collectives and MFU "
        "suffer for one cause, the straggler's host",
    ),
    Inhibition(
        (AlertName.WORKLOAD_CRASH_LOOPING,),
        (AlertName.WORKLOAD_FAILED, AlertName.WORKLOAD_DOWN),
        "a crash loop is failures, and downtime between them: paged once",
    ),
    Inhibition(
        (AlertName.INPUT_BOUND,),
        (AlertName.LOW_MFU, AlertName.LOW_DUTY_CYCLE),
        "chips that wait for their input sit idle and reach little of their peak: the input pipeline is the cause",
    ),
    Inhibition(
        (AlertName.COMPILE_TIME_HIGH, AlertName.RECOMPILING),
        (AlertName.LOW_MFU, AlertName.LOW_DUTY_CYCLE),
        "a job that compiles does not step: its chips idle meanwhile, its MFU falls",
    ),
    Inhibition(
        (AlertName.COMPILE_FAILING,),
        (AlertName.WORKLOAD_FAILED,),
        "a program that fails to compile ends the job with a compile error: one ticket, the one that names the "
        "program and the stage",
        only=f'reason="{COMPILE_ERROR}"',
    ),
    Inhibition(
        (
            AlertName.WORKLOAD_DOWN,
            AlertName.WORKLOAD_HUNG,
            AlertName.WORKLOAD_STALLED,
            AlertName.WORKLOAD_CRASH_LOOPING,
        ),
        (AlertName.GOODPUT_BUDGET_BURN,),
        "an outage, a hang or a crash loop burns the goodput budget: the page that names it says it",
    ),
    Inhibition(
        (AlertName.LOSS_NON_FINITE,),
        (AlertName.LOSS_SPIKE,),
        "a loss gone non-finite is worse than a spike: the page says it (the worker that went first stays a "
        "ticket of its own)",
    ),
)


def inhibited_by(name: AlertName) -> tuple[AlertName, ...]:
    """The alerts whose firing keeps ``name`` quiet for the same workload."""
    return tuple(source for rule in INHIBITIONS if name in rule.targets for source in rule.source)
