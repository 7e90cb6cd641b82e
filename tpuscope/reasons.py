"""Why a job failed, why a compile failed, why a function was traced again: the closed sets of reasons.

The job classifies its own failures (:mod:`tpuscope.tracing.failures`), the sidecar counts them under these
values (``workload_failures_total{reason}``, ``compile_failures_total{reason}``, ``recompiles_total{cause}``),
and docs/alerts.md and the on-call board say what to do for each. A few values each, never free text: a label
with an exception's message would be a new series per failure.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Reason:
    """One value of a reason label: what it means, and what the person on call does about it."""

    value: str
    meaning: str
    runbook: str


# The failure a program that fails to compile ends its job with (TpuscopeCompileFailing names the program).
COMPILE_ERROR = "compile_error"
FAILURE_REASONS: tuple[Reason, ...] = (
    Reason(
        "out_of_memory",
        "An allocation was refused: XLA's RESOURCE_EXHAUSTED on the device (HBM) or the host, or Python's MemoryError.",
        "Read the job's log for the allocation's size and the program that asked. A new model size, batch or "
        "sequence length, or a change of sharding, no longer fits: reduce the per-device batch, shard more, "
        "rematerialise activations, or offload. tpuscope_device_memory_peak_bytes shows how close the job ran.",
    ),
    Reason(
        COMPILE_ERROR,
        "A program failed to trace, lower or compile (compile_failures_total says which stage and why).",
        "A code or dependency change: a tracing error (a Python branch on a traced value), an op the backend does "
        "not implement, or a compiler bug. It fails again on restart: roll back the change or pin JAX and libtpu.",
    ),
    Reason(
        "runtime_init",
        "The accelerator runtime or driver did not start: no backend or device found, a driver or libtpu "
        "version mismatch, the chips held by another process.",
        "A host problem, not the model's: check the node (driver and libtpu versions against jaxlib's, another "
        "process holding /dev/accel* or the GPUs, the device plugin). Cordon the node if it repeats there.",
    ),
    Reason(
        "checkpoint_restore",
        "Restoring a checkpoint failed: corrupt or missing bytes, a checkpoint of another model, storage unreachable.",
        "The job cannot resume: check the latest checkpoint's files and the bucket's reachability; restore the one "
        "before it (delete or move the bad step's directory) and restart. Check the saves: tpuscope_checkpoint_"
        'duration_seconds_count{result="error"}.',
    ),
    Reason(
        "preemption",
        "The platform stopped the process: the VM's metadata server said the VM was preempted when the job "
        "vanished (the sidecar asks it), the job reached JAX's preemption sync point, or the job opted in to "
        "tpuscope's SIGTERM handler and got a SIGTERM (a preemption, an eviction, a drained node).",
        "Expected on spot capacity: the scheduler restarts the job from its last checkpoint, and the downtime and "
        "lost work count against goodput. Frequent preemptions call for more frequent saves.",
    ),
    Reason(
        "maintenance",
        "The process was stopped for a host maintenance event (TERMINATE_ON_HOST_MAINTENANCE), as the VM's "
        "metadata server said when the job vanished or got its SIGTERM.",
        "Planned by the cloud: the job restarts on its own once the host is back. Schedule long runs around "
        "announced maintenance windows, or start the maintenance yourself between runs.",
    ),
    Reason(
        "data_error",
        "The input pipeline raised: a corrupt or missing record, a file it could not read, a bad transform.",
        "Find the file or shard in the job's log; restarting reads the same data and fails the same way: skip or "
        "repair the shard, or make the pipeline skip bad records and count them.",
    ),
    Reason(
        "hang",
        "The process hung and ended itself (the job's `exit_on_hang`): the sidecar judged that it had stayed at "
        "one place far longer than that place ever takes, and logged its stacks first.",
        'Read the sidecars\' hang verdicts (`tpuscope hangs` on their logs, docs/failures.md, "A hung job"): the '
        "worker named elsewhere than its peers, its phase and its stacks. A restart may clear a transient hang "
        "(a peer's network, a storage stall); one that recurs at the same place is a bug in the job or its data.",
    ),
    Reason(
        "other",
        "An exception none of the above: a bug in the training code, an assertion, a NaN check.",
        "Read the job's log for the traceback.",
    ),
    Reason(
        "vanished",
        "The process's connection closed without a stop or failure, and no metadata server said the platform "
        "ended it: killed by a signal (SIGKILL from the kernel's OOM killer or a scheduler past its grace period; "
        "a SIGTERM where nothing tells a preemption from a deletion, as on Kubernetes without a metadata server), "
        "or a crash in native code. Set by the sidecar, not the job.",
        "Check the node's kernel log and the pod's last state (OOMKilled: host memory, see TpuscopeHostMemory"
        "Pressure) and the process's exit code; a native crash leaves a core or a stack on stderr.",
    ),
)
FAILURE_VALUES: tuple[str, ...] = tuple(reason.value for reason in FAILURE_REASONS)
# What a job older than these reasons sends (its sidecar newer): documented, so the alerts' links to it work.
LEGACY_FAILURE_REASONS: tuple[Reason, ...] = (
    Reason(
        "exception",
        "Any exception, from a job whose tpuscope predates the failure reasons.",
        "Read the job's log for the traceback; a newer tpuscope in the job's image names the reason.",
    ),
)
# The platform's doing, not the job's: no ticket each time (TpuscopeWorkloadDown pages if the job does not come
# back, and the downtime counts against goodput).
PLATFORM_REASONS = ("preemption", "maintenance")
# The failures that may be the host's: the runtime or driver would not start, or the process died in native code
# without a word (a crash in the runtime; the OOM killer and a scheduler's SIGKILL read the same). The bad-host ledger
# (tpuscope.alerts.nodes) counts them only where the node's process failed first, alone.
HOST_FAILURE_REASONS = ("runtime_init", "vanished")
OTHER = "other"
VANISHED = "vanished"
HANG = "hang"

COMPILE_FAILURE_REASONS: tuple[Reason, ...] = (
    Reason("out_of_memory", "The compiler ran out of device or host memory.", "See out_of_memory above."),
    Reason(
        "unsupported",
        "An op, dtype or custom call the backend does not implement.",
        "The program needs another backend or a newer JAX or libtpu.",
    ),
    Reason(
        "invalid_program",
        "Tracing failed (a Python branch or conversion on a traced value), or XLA rejected the program.",
        "A bug in the traced code: the job's log names the line.",
    ),
    Reason("internal", "XLA failed inside itself.", "A compiler bug: pin the last working JAX and libtpu, report it."),
    Reason("other", "Any other compile failure.", "Read the job's log."),
)
COMPILE_FAILURE_VALUES: tuple[str, ...] = tuple(reason.value for reason in COMPILE_FAILURE_REASONS)

# A recompile counted without JAX's explanation of it (tracing/jax_compiles.py): the cause is not known.
UNEXPLAINED = "unexplained"
RECOMPILE_CAUSES: tuple[Reason, ...] = (
    Reason(
        "input_types",
        "An argument's shape, dtype, sharding or weak type differs from every earlier call's.",
        "Pad to fixed shapes or bucket them; keep dtypes fixed (a Python scalar is weakly typed).",
    ),
    Reason(
        "input_structure",
        "The arguments form another pytree (a dict with other keys, a list of another length).",
        "Pass the same structure every step.",
    ),
    Reason(
        "redefined_function",
        "A new function object, defined on the same line as one traced before: jit of a lambda or closure made "
        "inside the loop.",
        "Define and jit the function once, outside the loop.",
    ),
    Reason(
        "tracing_context",
        "A JAX config value or context manager differs from earlier calls'.",
        "Set the config once, before the first step.",
    ),
    Reason("other", "JAX gave no explanation tpuscope recognises.", "Set jax_explain_cache_misses and read the log."),
    Reason(
        UNEXPLAINED,
        "A function was traced again and JAX's explanation was not there to read: the job's log levels hide JAX's "
        "warnings (the jax logger at ERROR, logging.disable), or explanations are off (the job turned them off, a "
        "Monitor did not ask for them, or the process spent its budget of explanations: EXPLAIN_BUDGET in "
        "tpuscope/tracing/jax_compiles.py).",
        "Counted from JAX's compile events, without a cause. To learn it, run with JAX_EXPLAIN_CACHE_MISSES=1 and "
        "JAX's loggers at WARNING, and read the TRACING CACHE MISS warnings in the job's log; then see the causes "
        "above. Many in the steady state cost compile time like any other cause.",
    ),
)
RECOMPILE_VALUES: tuple[str, ...] = tuple(cause.value for cause in RECOMPILE_CAUSES)
