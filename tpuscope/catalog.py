"""The metric catalogue: every metric tpuscope exports, defined once.

The exporter registers its metrics from these objects, ``docs/metrics.md`` is
generated from them, and the dashboards and alerts read their names
from here. Code refers to a metric by its constant (``catalog.STEPS``), never by
typing its name as a string.

Conventions (checked by tests/test_catalog.py and ``promtool check metrics``):
base units (seconds, bytes, ratio 0..1), counters end in ``_total``, the unit is
the last word before ``_total``, and no metric carries ``job`` or ``instance``:
those belong to the Prometheus scrape.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Literal, Required, TypedDict, Unpack, overload

# The wire schema's closed sets that are label values here too (the job reports them; the sidecar counts them).
from tpuscope.events import PROFILE_RESULTS, REJECT_REASONS, TRAINING_VALUES

# The bound of the goodput category label's open part: the custom badput names a workload keeps.
from tpuscope.goodput import CUSTOM_BADPUT, MAX_CUSTOM_BADPUT

PREFIX = "tpuscope_"


class Kind(enum.StrEnum):
    COUNTER = "counter"
    GAUGE = "gauge"
    HISTOGRAM = "histogram"


class Label(enum.StrEnum):
    """Every label name a tpuscope series may carry (see docs/metrics.md)."""

    WORKLOAD = "workload"
    PHASE = "phase"
    STAGE = "stage"
    RESULT = "result"
    OPERATION = "operation"
    DEVICE = "device"
    ACCELERATOR = "accelerator"
    SOURCE = "source"
    PROGRAM = "program"
    REASON = "reason"
    CATEGORY = "category"
    VERSION = "version"
    COLLECTOR = "collector"
    CPU = "cpu"
    PID = "pid"
    DIRECTION = "direction"
    BUFFER_SIZE = "buffer_size"
    CLOCK = "clock"
    XID = "xid"
    LABEL = "label"
    SLICE = "slice"
    WORKER = "worker"
    PART = "part"
    CAUSE = "cause"
    CLASSIFIED_BY = "classified_by"
    TPU_TOPOLOGY = "tpu_topology"
    CORE = "core"
    FINGERPRINT = "fingerprint"
    HLO_LOCATION = "hlo_location"
    DEVICE_ID = "device_id"
    STEP = "step"
    FRAMES = "frames"
    VALUE = "value"


# Where in a multi-host job the sidecar runs: every series it serves carries these two
# labels (``tpuscope serve --slice/--worker``, by default from the TPU environment), so
# recording rules can aggregate a workload across its workers and name a straggler.
HOST_LABELS = (Label.SLICE, Label.WORKER)


@dataclass(frozen=True)
class Metric:
    """One metric family as Prometheus exposes it (``name`` is the full name)."""

    name: str
    kind: Kind
    help: str
    labels: tuple[Label, ...] = ()
    unit: str = ""
    buckets: tuple[float, ...] = ()
    group: str = ""
    # Sampled: a collector reads the value from a device or the OS each interval and
    # the sidecar serves its latest snapshot (a histogram's bounds are then the source's own).
    sampled: bool = False
    # The labels whose values are a closed set, and the set: every room reads them from here (the sidecar that
    # counts, the rules and boards that select, the docs), so a value is typed once.
    closed: tuple[tuple[Label, tuple[str, ...]], ...] = ()

    def values(self, label: Label) -> tuple[str, ...]:
        """The closed set of ``label``'s values on this metric."""
        return dict(self.closed)[label]

    @property
    def base_name(self) -> str:
        """The family name without the counter ``_total`` suffix (as OpenMetrics names it)."""
        return self.name.removesuffix("_total") if self.kind is Kind.COUNTER else self.name

    def series(self, suffix: str) -> str:
        """A histogram's ``_bucket`` / ``_sum`` / ``_count`` series name, for queries."""
        assert self.kind is Kind.HISTOGRAM, f"{self.name} is not a histogram"
        return f"{self.name}_{suffix}"


# A metric's kind as a type too, so that the type checker knows what the sidecar's handle for it can do
# (:class:`tpuscope.exporter.metrics.Series`): a counter's series goes up (``inc``), a gauge's is ``set``,
# a histogram's takes an ``observe``. ``_metric`` makes the class its ``kind`` says.
@dataclass(frozen=True)
class CounterMetric(Metric):
    """A metric whose ``kind`` is :attr:`Kind.COUNTER`."""


@dataclass(frozen=True)
class GaugeMetric(Metric):
    """A metric whose ``kind`` is :attr:`Kind.GAUGE`."""


@dataclass(frozen=True)
class HistogramMetric(Metric):
    """A metric whose ``kind`` is :attr:`Kind.HISTOGRAM`."""


_CLASSES: dict[Kind, type[Metric]] = {
    Kind.COUNTER: CounterMetric,
    Kind.GAUGE: GaugeMetric,
    Kind.HISTOGRAM: HistogramMetric,
}


# Bucket layouts, shared by metrics with the same range of values.
STEP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
PHASE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 60.0)
COMPILE_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0)
CHECKPOINT_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0)
REQUEST_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096)


class _Options(TypedDict, total=False):
    """The keywords of ``_metric`` (below), for its overloads: the same for every kind."""

    group: Required[str]
    unit: str
    buckets: tuple[float, ...]
    sampled: bool
    closed: dict[Label, tuple[str, ...]] | None


@overload
def _metric(
    name: str, kind: Literal[Kind.COUNTER], help: str, *labels: Label, **options: Unpack[_Options]
) -> CounterMetric: ...
@overload
def _metric(
    name: str, kind: Literal[Kind.GAUGE], help: str, *labels: Label, **options: Unpack[_Options]
) -> GaugeMetric: ...
@overload
def _metric(
    name: str, kind: Literal[Kind.HISTOGRAM], help: str, *labels: Label, **options: Unpack[_Options]
) -> HistogramMetric: ...
def _metric(
    name: str,
    kind: Kind,
    help: str,
    *labels: Label,
    group: str,
    unit: str = "",
    buckets: tuple[float, ...] = (),
    sampled: bool = False,
    closed: dict[Label, tuple[str, ...]] | None = None,
) -> Metric:
    assert set(closed or ()) <= set(labels), f"{name}: a closed label it does not have"
    return _CLASSES[kind](
        PREFIX + name,
        kind,
        help,
        labels,
        unit=unit,
        buckets=buckets,
        group=group,
        sampled=sampled,
        closed=tuple((closed or {}).items()),
    )


W = Label.WORKLOAD

# --- Training steps -------------------------------------------------------
STEPS_GROUP = "Training steps"
STEP_DURATION = _metric(
    "step_duration_seconds",
    Kind.HISTOGRAM,
    "Wall time of one training step.",
    W,
    unit="seconds",
    buckets=STEP_BUCKETS,
    group=STEPS_GROUP,
)
STEP_PHASE_DURATION = _metric(
    "step_phase_duration_seconds",
    Kind.HISTOGRAM,
    "Time of each phase within a step: compute, sync (collectives), io (input wait and host-to-device), "
    "other (the rest of the step). The phases of a step add up to its duration.",
    W,
    Label.PHASE,
    unit="seconds",
    buckets=PHASE_BUCKETS,
    group=STEPS_GROUP,
)
STEPS = _metric("steps_total", Kind.COUNTER, "Training steps completed.", W, group=STEPS_GROUP)
LAST_STEP = _metric(
    "last_step_timestamp_seconds",
    Kind.GAUGE,
    "Unix time at which the sidecar received the workload's latest step, or its start if it has not "
    "stepped since (stall detection reads tpuscope_last_progress_timestamp_seconds).",
    W,
    unit="seconds",
    group=STEPS_GROUP,
)
LAST_PROGRESS = _metric(
    "last_progress_timestamp_seconds",
    Kind.GAUGE,
    "Unix time at which the sidecar last saw the workload make progress, for stall detection: a step, its "
    "start, the end of a checkpoint save or restore (failed ones too), or the end of a compile stage (which "
    "is when the next stage begins: the lowering's end is the backend compile's start).",
    W,
    unit="seconds",
    group=STEPS_GROUP,
)

# --- Compilation -------------------------------------------------------------
COMPILE_GROUP = "Compilation"
COMPILE_DURATION = _metric(
    "compile_duration_seconds",
    Kind.HISTOGRAM,
    "XLA compilation time by stage: tracing (jaxpr), lowering (to MLIR), backend (XLA compile).",
    W,
    Label.STAGE,
    unit="seconds",
    buckets=COMPILE_BUCKETS,
    group=COMPILE_GROUP,
)
COMPILE_CACHE_REQUESTS = _metric(
    "compile_cache_requests_total",
    Kind.COUNTER,
    "Persistent compilation cache look-ups by result (hit or miss).",
    W,
    Label.RESULT,
    group=COMPILE_GROUP,
)

COMPILE_FAILURES = _metric(
    "compile_failures_total",
    Kind.COUNTER,
    "Compilations that failed, by stage (tracing, lowering, backend) and reason: out_of_memory (the compiler ran "
    "out of device or host memory), unsupported (an op or custom call the backend does not implement), "
    "invalid_program (a tracing error, or a program XLA rejects), internal (a compiler bug), other.",
    W,
    Label.STAGE,
    Label.REASON,
    group=COMPILE_GROUP,
)
RECOMPILES = _metric(
    "recompiles_total",
    Kind.COUNTER,
    "Functions traced again although traced before, by cause, from JAX's explanation of its tracing-cache miss: "
    "input_types (an argument's shape, dtype, sharding or weak type changed), input_structure (another pytree), "
    "redefined_function (a new function object from the same line each time), tracing_context (a config or "
    "context manager changed), other.",
    W,
    Label.CAUSE,
    group=COMPILE_GROUP,
)

# --- Memory ---------------------------------------------------------------
MEMORY_GROUP = "Memory"
_dev = (Label.DEVICE, Label.ACCELERATOR, Label.SOURCE)
DEVICE_MEMORY_USED = _metric(
    "device_memory_used_bytes",
    Kind.GAUGE,
    "Accelerator (HBM) memory in use.",
    *_dev,
    unit="bytes",
    group=MEMORY_GROUP,
    sampled=True,
)
DEVICE_MEMORY_LIMIT = _metric(
    "device_memory_limit_bytes",
    Kind.GAUGE,
    "Accelerator (HBM) memory available to the workload.",
    *_dev,
    unit="bytes",
    group=MEMORY_GROUP,
    sampled=True,
)
DEVICE_MEMORY_PEAK = _metric(
    "device_memory_peak_bytes",
    Kind.GAUGE,
    "Peak accelerator (HBM) memory in use since the process started.",
    *_dev,
    unit="bytes",
    group=MEMORY_GROUP,
    sampled=True,
)
MEMORY_SPILL = _metric(
    "memory_spill_bytes",
    Kind.GAUGE,
    "Bytes XLA placed in host memory for a compiled program (spill from device memory).",
    W,
    Label.PROGRAM,
    unit="bytes",
    group=MEMORY_GROUP,
)

# --- Checkpoints ----------------------------------------------------------
CHECKPOINT_GROUP = "Checkpoints"
CHECKPOINT_DURATION = _metric(
    "checkpoint_duration_seconds",
    Kind.HISTOGRAM,
    "Checkpoint save or restore time, by outcome.",
    W,
    Label.OPERATION,
    Label.RESULT,
    unit="seconds",
    buckets=CHECKPOINT_BUCKETS,
    group=CHECKPOINT_GROUP,
)
CHECKPOINT_BYTES = _metric(
    "checkpoint_bytes_total",
    Kind.COUNTER,
    "Bytes written (save) or read (restore) by checkpoints.",
    W,
    Label.OPERATION,
    unit="bytes",
    group=CHECKPOINT_GROUP,
)
CHECKPOINT_LAST_SUCCESS = _metric(
    "checkpoint_last_success_timestamp_seconds",
    Kind.GAUGE,
    "Unix time of the latest successful checkpoint save: its age is the work at risk.",
    W,
    unit="seconds",
    group=CHECKPOINT_GROUP,
)

# --- Device profiles --------------------------------------------------------------
# From the device traces the job samples (tpuscope.tracing.profile_sampler): where a fused step's time goes on
# the devices, which host-side timers cannot see (collectives overlap compute inside one program).
PROFILE_GROUP = "Device profiles (sampled from device traces)"
# The parts a profiled step's window splits into: they add up to tpuscope_profile_step_seconds.
PROFILE_PARTS = ("compute", "exposed_collective", "idle")
# Why a straggler is late, as the rules tell it (the label cause of the straggler's recorded series,
# tpuscope.alerts.stragglers): its device compute, its input phase, its device idle the input does not explain
# (dispatch, callbacks, a busy CPU), or none of those by half its lag.
STRAGGLER_CAUSES = ("compute", "input", "host", "unknown")
# The profile gauges are a mean over the measured steps of this many of the workload's latest captures that
# measured something, those still fresh (conventions.PROFILE_FRESH_PERIODS): a capture measures a few steps
# (5, at least 4), and one step's exposed collective time can differ from the next by half.
PROFILE_MEAN_CAPTURES = 3
_OVER_STEPS = f"over the steps of the last {PROFILE_MEAN_CAPTURES} fresh device-profile captures"
# How the parser told a device op's kind: by its HLO category (as XProf does), or by its name alone (a trace
# without categories: the CPU backend, an older runtime).
PROFILE_OP_CLASSIFIERS = ("category", "name")
PROFILE_STEP = _metric(
    "profile_step_seconds",
    Kind.GAUGE,
    f"A step's time on the devices, the mean {_OVER_STEPS} and this host's devices.",
    W,
    unit="seconds",
    group=PROFILE_GROUP,
)
PROFILE_TIME = _metric(
    "profile_time_seconds",
    Kind.GAUGE,
    f"Where a profiled step's time went on this host's devices, the mean per step and device {_OVER_STEPS}: "
    "compute (the union of non-collective ops), exposed_collective (collective ops no compute covers: waiting "
    "for the other devices and hosts), idle (no op at all: waiting for the host, the input, the next dispatch, "
    "and on a host with more devices than free cores, one device's ops waiting for the CPU threads the others "
    "hold). The parts add up to tpuscope_profile_step_seconds.",
    W,
    Label.PART,
    unit="seconds",
    group=PROFILE_GROUP,
)
PROFILE_TIME_STDDEV = _metric(
    "profile_time_stddev_seconds",
    Kind.GAUGE,
    f"The spread of each part of tpuscope_profile_time_seconds from step to step: its standard deviation "
    f"{_OVER_STEPS} (0 from one step, or from captures of a job too old to send its steps one by one).",
    W,
    Label.PART,
    unit="seconds",
    group=PROFILE_GROUP,
)
PROFILE_STEPS = _metric(
    "profile_measured_steps",
    Kind.GAUGE,
    "How many measured steps the device-profile gauges are a mean of: the rules judge a worker's profile only "
    "from a few steps on.",
    W,
    group=PROFILE_GROUP,
)
PROFILE_OVERLAP = _metric(
    "profile_collective_overlap_ratio",
    Kind.GAUGE,
    f"Share of the collective ops' time that compute covered, {_OVER_STEPS} (1: every collective hidden behind "
    "compute).",
    W,
    unit="ratio",
    group=PROFILE_GROUP,
)
PROFILE_IMBALANCE = _metric(
    "profile_device_imbalance_ratio",
    Kind.GAUGE,
    f"The compute of this host's busiest device over its devices' mean, {_OVER_STEPS} (1: balanced).",
    W,
    unit="ratio",
    group=PROFILE_GROUP,
)
PROFILE_OPS = _metric(
    "profile_device_ops_total",
    Kind.COUNTER,
    "Device ops in the captured traces, by how the parser told their kind (compute or collective): category "
    "(their HLO category, as XProf does) or name (no category in the trace: the CPU backend, an older runtime; "
    "a guess from the op's name).",
    W,
    Label.CLASSIFIED_BY,
    group=PROFILE_GROUP,
)
PROFILE_CAPTURES = _metric(
    "profile_captures_total",
    Kind.COUNTER,
    "Device-profile captures the job attempted, by result: ok, busy (skipped: a profiler of the user's ran, or "
    "JAX's PGLE was on), error (failed, unparsable, or discarded: the job left its step loop mid-capture).",
    W,
    Label.RESULT,
    group=PROFILE_GROUP,
    closed={Label.RESULT: PROFILE_RESULTS},
)
PROFILE_CAPTURE_SECONDS = _metric(
    "profile_capture_seconds_total",
    Kind.COUNTER,
    "What the captures cost the job: starting and stopping the trace, on its profiler's thread (the sidecar "
    "parses the trace: tpuscope_profile_parse_seconds_total).",
    W,
    unit="seconds",
    group=PROFILE_GROUP,
)
PROFILE_CAPTURE_BYTES = _metric(
    "profile_capture_bytes_total",
    Kind.COUNTER,
    "Bytes of the serialized device traces captured (handed to the sidecar to parse, then deleted).",
    W,
    unit="bytes",
    group=PROFILE_GROUP,
)
PROFILE_LAST_CAPTURE = _metric(
    "profile_last_capture_timestamp_seconds",
    Kind.GAUGE,
    "Unix time at which the sidecar received the latest device-profile capture that measured something.",
    W,
    unit="seconds",
    group=PROFILE_GROUP,
)
PROFILE_PERIOD = _metric(
    "profile_period_seconds",
    Kind.GAUGE,
    "Wall seconds the job aims at between two device-profile captures, as its latest attempt said (a whole "
    "number of steps near the configured period, widened where a capture cost too much). The rules count a "
    "capture fresh for 3 of them; from a job too old to say it, for 30 min.",
    W,
    unit="seconds",
    group=PROFILE_GROUP,
)

# --- Utilization and goodput ---------------------------------------------------
UTILIZATION_GROUP = "Utilization and goodput"
MODEL_FLOPS = _metric(
    "model_flops_total",
    Kind.COUNTER,
    "Model FLOPs done by the workload's steps on all its devices (from XLA's cost analysis).",
    W,
    group=UTILIZATION_GROUP,
)
PEAK_FLOPS = _metric(
    "peak_flops_per_second",
    Kind.GAUGE,
    "Peak dense FLOP/s of all the workload's devices together (bf16 from a table per accelerator; "
    "measured for the CPU). rate(model_flops_total) over this is MFU.",
    W,
    Label.ACCELERATOR,
    group=UTILIZATION_GROUP,
)
WORKLOAD_DEVICES = _metric(
    "workload_devices",
    Kind.GAUGE,
    "Accelerator devices the workload's process drives, as it reported them: the chips a step occupies "
    "(with a price per chip-hour, the cost of a step).",
    W,
    Label.ACCELERATOR,
    group=UTILIZATION_GROUP,
)
# The MFU gauge is a ratio of sums over this many of the workload's latest steps that reported FLOPs.
MFU_STEPS = 20
MFU = _metric(
    "model_flops_utilization_ratio",
    Kind.GAUGE,
    f"Model FLOPs over the devices' peak FLOP/s times the seconds taken, over the last {MFU_STEPS} steps that "
    "reported FLOPs (at most 1).",
    W,
    unit="ratio",
    group=UTILIZATION_GROUP,
)
GOODPUT = _metric(
    "goodput_seconds_total",
    Kind.COUNTER,
    "Wall time by category (docs/goodput.md): productive (step compute that reached a checkpoint or a clean "
    "end), compile, io_wait, checkpoint (what held the loop), init (start to first step), lost (step compute "
    "of a process that failed, vanished or restored before a checkpoint covered it), downtime (a failed "
    "process's gap until the workload's next start, as it grows), other (the rest of a process's time, booked "
    "when it ends); and the custom badput a job names (Monitor.badput: eval, ...), booked as it happens: up to "
    f"{MAX_CUSTOM_BADPUT} names per workload, later ones as {CUSTOM_BADPUT}.",
    W,
    Label.CATEGORY,
    unit="seconds",
    group=UTILIZATION_GROUP,
)
GOODPUT_WALL = _metric(
    "goodput_wall_seconds_total",
    Kind.COUNTER,
    "Wall time of the workload as it grows: each process from its start to its end, and each gap from a "
    "failure to the next start. The goodput categories add up to it once settled; it is the denominator of "
    "goodput and of its SLO.",
    W,
    unit="seconds",
    group=UTILIZATION_GROUP,
)

# --- Training health -------------------------------------------------------------
# What the job's own numbers say (Monitor's ``s.loss(...)``, tpuscope.tracing.training_values): a loss that went
# non-finite, a worker whose value before the reduction went first, a loss far above its recent values.
TRAINING_GROUP = "Training health"
# The loss's baseline: the median and MAD of the latest this many finite losses that were not spikes. 100 steps:
# enough that one noisy batch moves neither (the MAD of 100 draws is within about 10 % of the truth), few enough to
# follow a loss that falls as the job learns (a few minutes of steps).
LOSS_BASELINE_STEPS = 100
# Losses a baseline needs before a deviation is served: fewer give a MAD that one batch can halve.
LOSS_BASELINE_MIN_STEPS = 20
# A loss this many robust standard deviations (1.4826 MADs) above the median is a spike: kept out of the baseline,
# so a loss that stays up reads as a spike until it comes down (TpuscopeLossSpike reads the same bound).
LOSS_SPIKE_DEVIATION = 6.0
TRAINING_VALUE = _metric(
    "training_value",
    Kind.GAUGE,
    "The latest step's value the job reported, by value: its loss, its gradient norm (grad_norm), and its own "
    "value before the reduction (local). NaN and infinities as reported.",
    W,
    Label.VALUE,
    group=TRAINING_GROUP,
    closed={Label.VALUE: TRAINING_VALUES},
)
TRAINING_NONFINITE = _metric(
    "training_nonfinite_values_total",
    Kind.COUNTER,
    "Steps whose value read NaN or infinite, by value: loss, grad_norm, local (created at 0 with the value's "
    "first reading).",
    W,
    Label.VALUE,
    group=TRAINING_GROUP,
    closed={Label.VALUE: TRAINING_VALUES},
)
TRAINING_NONFINITE_ONSET = _metric(
    "training_nonfinite_onset_step",
    Kind.GAUGE,
    "The step at which the value (loss, grad_norm, local) last went non-finite after a finite reading (or at its "
    "first reading): compared across workers, the first to go.",
    W,
    Label.VALUE,
    group=TRAINING_GROUP,
    closed={Label.VALUE: TRAINING_VALUES},
)
LOSS_DEVIATION = _metric(
    "training_loss_deviation",
    Kind.GAUGE,
    f"The latest finite loss against its baseline, the median and MAD of the latest {LOSS_BASELINE_STEPS} finite "
    f"losses that were not spikes: (loss - median) / (1.4826 MAD). Above {LOSS_SPIKE_DEVIATION:g} it is a spike. "
    f"Served once {LOSS_BASELINE_MIN_STEPS} losses were read.",
    W,
    group=TRAINING_GROUP,
)
TRAINING_VALUES_UNREAD = _metric(
    "training_values_unread_total",
    Kind.COUNTER,
    "Steps whose values the job dropped unread: never computed while it waited for them, or still computing "
    "when it closed.",
    W,
    group=TRAINING_GROUP,
)
GOODPUT_ROLLED_BACK = _metric(
    "goodput_rolled_back_seconds_total",
    Kind.COUNTER,
    "Productive seconds thrown away: the steps past a checkpoint the job restored after it had reached further "
    "(a rollback after divergence), booked productive before. The rules move them from productive to lost.",
    W,
    unit="seconds",
    group=TRAINING_GROUP,
)
GOODPUT_ROLLED_BACK_STEPS = _metric(
    "goodput_rolled_back_steps_total",
    Kind.COUNTER,
    "Steps thrown away by restores to a step below the highest the workload had reached: that highest step less "
    "the checkpoint's.",
    W,
    group=TRAINING_GROUP,
)

# --- Workload lifecycle ---------------------------------------------------------
LIFECYCLE_GROUP = "Workload lifecycle"
WORKLOAD_RESTARTS = _metric(
    "workload_restarts_total",
    Kind.COUNTER,
    "Workload restarts, by reason (preemption, crash, ...).",
    W,
    Label.REASON,
    group=LIFECYCLE_GROUP,
)
# Where each process of a workload is (tpuscope.positions), read by the sidecar from the record the Monitor keeps.
WHERE = ("outside", "step", "io", "compute", "sync", "other", "compile", "checkpoint_save", "checkpoint_restore")
POSITION_AGE = _metric(
    "workload_position_seconds",
    Kind.GAUGE,
    "How long the workload's process on this host has been where it is (phase): in a phase of a step (io, "
    "compute, sync, other), in a step between phases (step), between steps or in code the job did not mark "
    "(outside), compiling (compile), or in a checkpoint's save or restore (checkpoint_save, checkpoint_restore). "
    "The longest where two processes are "
    "at one place. Read from the record the Monitor keeps in shared memory, so it goes on while the job hangs.",
    W,
    Label.PHASE,
    unit="seconds",
    group=LIFECYCLE_GROUP,
    closed={Label.PHASE: WHERE},
)
POSITION_LIMIT = _metric(
    "workload_position_limit_seconds",
    Kind.GAUGE,
    "How long the process may stay where it is (phase, as tpuscope_workload_position_seconds names it) before it is "
    "stuck: in a step (io, compute, sync, other, or step between phases), hang_seconds or hang_step_factor times "
    "its longest recent step, whichever is longer (before its first step has ended, the long scale); compiling "
    "(compile), in a checkpoint (checkpoint_save, checkpoint_restore) or between steps (outside), the long scale "
    "(the sidecar's core_state_after: stall_seconds). A process that has not begun stepping is not judged.",
    W,
    Label.PHASE,
    unit="seconds",
    group=LIFECYCLE_GROUP,
    closed={Label.PHASE: WHERE},
)
STUCK = _metric(
    "workload_stuck",
    Kind.GAUGE,
    "1 while every process of the workload on this host has stayed where it is past its limit, and its stacks "
    "are logged (or known to be unknowable); else 0. A workload whose every worker is stuck hangs "
    "(TpuscopeWorkloadHung).",
    W,
    group=LIFECYCLE_GROUP,
)
STUCK_POSITION = _metric(
    "workload_stuck_info",
    Kind.GAUGE,
    "1 for each stuck process of the workload on this host, labelled with where it is stuck: the step (its "
    "number; empty before the first), the phase (as tpuscope_workload_position_seconds names it: io, compute, "
    "sync, other, step, outside, compile, checkpoint_save, checkpoint_restore), and its top Python frames (the "
    "innermost frame of the thread that runs the steps, then the job's own frames under it, 'function (file:line)' "
    "innermost first, cut to 200 characters; 'unknown' where the process could not answer). Served only while "
    "stuck: a few series in a hang, none otherwise. The whole stacks are in the sidecar's log.",
    W,
    Label.STEP,
    Label.PHASE,
    Label.FRAMES,
    group=LIFECYCLE_GROUP,
    closed={Label.PHASE: WHERE},
)
WORKLOAD_PROCESSES = _metric(
    "workload_processes",
    Kind.GAUGE,
    "The workload's processes connected to the sidecar now. The series goes when the last one leaves: a "
    "workload that stopped reporting steps while it is still here is stalled, not finished.",
    W,
    group=LIFECYCLE_GROUP,
)
WORKLOAD_FAILURES = _metric(
    "workload_failures_total",
    Kind.COUNTER,
    "Processes of the workload that failed, by reason as the job classified its failure: out_of_memory, "
    "compile_error, runtime_init, checkpoint_restore, preemption, maintenance, data_error, other; vanished when "
    "the process ended without a word and no metadata server said the platform ended it (a signal: the kernel's "
    "OOM killer, a scheduler's SIGTERM or SIGKILL; a crash in native code). "
    "docs/alerts.md says what to do for each.",
    W,
    Label.REASON,
    group=LIFECYCLE_GROUP,
)
WORKLOAD_START_TIME = _metric(
    "workload_start_time_seconds",
    Kind.GAUGE,
    "Unix time of the workload's first start this sidecar saw. A restarted sidecar sees a later one: the "
    "recording rules keep the earliest, the start of the wall time goodput is measured against.",
    W,
    unit="seconds",
    group=LIFECYCLE_GROUP,
)
WORKLOAD_END_TIME = _metric(
    "workload_end_time_seconds",
    Kind.GAUGE,
    "Unix time at which the workload ended cleanly: its last process stopped and none is down. The end of "
    "the wall time goodput is measured against; absent while it runs or is down, gone at its next start.",
    W,
    unit="seconds",
    group=LIFECYCLE_GROUP,
)
WORKLOAD_DOWN_SINCE = _metric(
    "workload_down_since_timestamp_seconds",
    Kind.GAUGE,
    "Unix time at which a process of the workload failed or vanished, while the workload has not started "
    "again: the ongoing downtime is time() minus this. Absent while the workload is up or ended cleanly.",
    W,
    unit="seconds",
    group=LIFECYCLE_GROUP,
)

# --- Serving ------------------------------------------------------------------
SERVING_GROUP = "Serving"
INFERENCE_REQUEST_DURATION = _metric(
    "inference_request_duration_seconds",
    Kind.HISTOGRAM,
    "Latency of one inference request.",
    W,
    unit="seconds",
    buckets=REQUEST_BUCKETS,
    group=SERVING_GROUP,
)
INFERENCE_QUEUE_DEPTH = _metric(
    "inference_queue_depth", Kind.GAUGE, "Requests waiting for a batch slot.", W, group=SERVING_GROUP
)
MODEL_LOADED = _metric(
    "model_load_timestamp_seconds",
    Kind.GAUGE,
    "Unix time at which the serving workload loaded the model it serves, by its version (the latest load only; "
    "the version label holds at most --max-label-values values): time() minus this is the model's age.",
    W,
    Label.VERSION,
    unit="seconds",
    group=SERVING_GROUP,
)
INFERENCE_BATCH_SIZE = _metric(
    "inference_batch_size",
    Kind.HISTOGRAM,
    "Requests per executed batch.",
    W,
    buckets=BATCH_BUCKETS,
    group=SERVING_GROUP,
)

# --- Accelerators, sampled by the libtpu and nvml collectors ---------------------------
ACCELERATOR_GROUP = "Accelerators (sampled by the libtpu, gke-device-plugin and nvml collectors)"
DUTY_CYCLE = _metric(
    "device_duty_cycle_ratio",
    Kind.GAUGE,
    "Share of the last sample period the device was executing: TensorCore duty cycle on TPUs "
    "(libtpu, or GKE's TPU device plugin), GPU utilization on GPUs (nvml).",
    *_dev,
    unit="ratio",
    group=ACCELERATOR_GROUP,
    sampled=True,
)
MEMORY_BANDWIDTH_UTILIZATION = _metric(
    "device_memory_bandwidth_utilization_ratio",
    Kind.GAUGE,
    "Share of the device memory bandwidth in use: HBM bandwidth utilization on TPUs, "
    "memory utilization (time memory was read or written) on GPUs.",
    *_dev,
    unit="ratio",
    group=ACCELERATOR_GROUP,
    sampled=True,
)
TENSORCORE_UTILIZATION = _metric(
    "tpu_tensorcore_utilization_ratio",
    Kind.GAUGE,
    "Share of the TensorCore's capacity in use (its matrix and vector units), as GKE's TPU device plugin "
    "reports it: unlike the duty cycle, which counts time busy at any rate, low while busy with small work.",
    *_dev,
    unit="ratio",
    group=ACCELERATOR_GROUP,
    sampled=True,
)
TENSORCORE_IDLE = _metric(
    "tpu_tensorcore_idle_duration_seconds",
    Kind.GAUGE,
    "How long the TensorCore has been idle, as the TPU runtime reports it (grows while a job is stuck).",
    *_dev,
    unit="seconds",
    group=ACCELERATOR_GROUP,
    sampled=True,
)
HLO_QUEUE_SIZE = _metric(
    "tpu_hlo_queue_size",
    Kind.GAUGE,
    "Programs (HLO executions) queued on the device, waiting to run.",
    *_dev,
    group=ACCELERATOR_GROUP,
    sampled=True,
)
HLO_EXECUTION_DURATION = _metric(
    "tpu_hlo_execution_duration_seconds",
    Kind.HISTOGRAM,
    "Device execution time of programs (HLO), as the TPU runtime's cumulative distribution, with its own bucket "
    "bounds.",
    *_dev,
    unit="seconds",
    group=ACCELERATOR_GROUP,
    sampled=True,
)
MEGASCALE_LATENCY = _metric(
    "tpu_megascale_latency_seconds",
    Kind.HISTOGRAM,
    "Multislice (megascale) latencies by operation: dcn_transfer, dcn_inbound_transfer, host_to_device, "
    "device_to_host, collective_end_to_end, host_compute, tcp_min_rtt; the runtime's cumulative distribution "
    "with its own bucket bounds.",
    Label.OPERATION,
    Label.BUFFER_SIZE,
    unit="seconds",
    group=ACCELERATOR_GROUP,
    sampled=True,
)
TPU_CHIP_INFO = _metric(
    "tpu_chip_info",
    Kind.GAUGE,
    "1 for each TPU chip of the host: device is its index on the host (0 to 7), which every TPU series's device "
    "label is, from every source; device_id is the id the TPU runtime and JAX (jax.Device.id) give it, on a "
    "multi-host slice its id in the whole slice (404 on a v5p host of an 8x8x16).",
    Label.DEVICE,
    Label.DEVICE_ID,
    Label.ACCELERATOR,
    Label.SOURCE,
    group=ACCELERATOR_GROUP,
    sampled=True,
)
RUNTIME_ERROR_REASONS = ("megascale_hang", "slice_error")
TPU_RUNTIME_ERROR = _metric(
    "tpu_runtime_error_detected",
    Kind.GAUGE,
    "1 while the TPU runtime's own detector reports this error on the host, else 0 (absent where the runtime does "
    "not offer it): megascale_hang (libtpu's megascale.error.detected.gauge with error_type HANG_DETECTED: a "
    "multislice collective that stopped making progress) or slice_error (slice.error.detected.gauge: the slice "
    "failed). They are what GKE's TPU device plugin turns into the node conditions MegascaleHangDetected and "
    "SliceErrorDetected.",
    Label.REASON,
    group=ACCELERATOR_GROUP,
    sampled=True,
    closed={Label.REASON: RUNTIME_ERROR_REASONS},
)
CORE_STATE = _metric(
    "tpu_core_state_info",
    Kind.GAUGE,
    "1 for each TPU core (core: tc0, tc1 for its chip's TensorCores, sc0... for its SparseCores; device: the "
    "chip), labelled with the program it runs (fingerprint: the start of the runtime's program fingerprint, in "
    "hex) and where in it (hlo_location: the HLO its sequencer is at), as the runtime's GetTpuRuntimeStatus says. "
    "Asked only while a workload on the host has made no progress for stall_seconds: what a hung job's cores are "
    "doing. A worker whose cores sit elsewhere than its peers' is likely the one the others wait for. Values are "
    "cut to 64 characters; 'none' where the runtime names no program or location.",
    Label.DEVICE,
    Label.CORE,
    Label.FINGERPRINT,
    Label.HLO_LOCATION,
    group=ACCELERATOR_GROUP,
    sampled=True,
)
CORE_LOCATION_AGE = _metric(
    "tpu_core_location_seconds",
    Kind.GAUGE,
    "How long the TPU core has been at the program and HLO location tpuscope_tpu_core_state_info gives it, as far "
    "as the sidecar has seen: counted from the first time it asked the runtime during this stall, so a lower "
    "bound.",
    Label.DEVICE,
    Label.CORE,
    unit="seconds",
    group=ACCELERATOR_GROUP,
    sampled=True,
)
POWER = _metric(
    "device_power_watts",
    Kind.GAUGE,
    "Power draw of the device (nvml).",
    *_dev,
    unit="watts",
    group=ACCELERATOR_GROUP,
    sampled=True,
)
TEMPERATURE = _metric(
    "device_temperature_celsius",
    Kind.GAUGE,
    "Temperature of the device die (nvml).",
    *_dev,
    unit="celsius",
    group=ACCELERATOR_GROUP,
    sampled=True,
)
CLOCK = _metric(
    "device_clock_hertz",
    Kind.GAUGE,
    "Current clock frequency of the device, by clock domain: sm (compute) or memory (nvml).",
    *_dev,
    Label.CLOCK,
    unit="hertz",
    group=ACCELERATOR_GROUP,
    sampled=True,
)
CLOCK_MAX = _metric(
    "device_clock_max_hertz",
    Kind.GAUGE,
    "Highest clock frequency the device supports, by clock domain: sm or memory (nvml); a current clock below it "
    "while the device is busy is a throttled device.",
    *_dev,
    Label.CLOCK,
    unit="hertz",
    group=ACCELERATOR_GROUP,
    sampled=True,
)
THROTTLED = _metric(
    "device_throttled",
    Kind.GAUGE,
    "1 while the driver holds the device's clocks down for this reason, else 0 (nvml clocks-event reasons): "
    "power_cap (the software power cap: a busy GPU at its power limit), power_brake (a hardware power brake: the "
    "rack or the power supply asks the board to slow), thermal (software or hardware thermal slowdown), hardware "
    "(hardware slowdown: the power supply or an overheating board). TPU runtimes report no equivalent.",
    *_dev,
    Label.REASON,
    group=ACCELERATOR_GROUP,
    sampled=True,
)
XID_ERRORS = _metric(
    "gpu_xid_errors_total",
    Kind.COUNTER,
    "Critical XID errors the NVIDIA driver reported for the device since the sidecar started, by XID code.",
    *_dev,
    Label.XID,
    group=ACCELERATOR_GROUP,
    sampled=True,
)

# --- The host and the job's processes, sampled by the host collector -----------------------
HOST_GROUP = "Host and job processes (sampled by the host collector)"
HOST_CPU_UTILIZATION = _metric(
    "host_cpu_utilization_ratio",
    Kind.GAUGE,
    "Share of the last sample period each logical CPU was busy (not idle and not waiting for IO).",
    Label.CPU,
    unit="ratio",
    group=HOST_GROUP,
    sampled=True,
)
HOST_CPU_IOWAIT = _metric(
    "host_cpu_iowait_ratio",
    Kind.GAUGE,
    "Share of the last sample period the CPUs, all together, sat idle waiting for IO (slow input or checkpoints).",
    unit="ratio",
    group=HOST_GROUP,
    sampled=True,
)
HOST_MEMORY_AVAILABLE = _metric(
    "host_memory_available_bytes",
    Kind.GAUGE,
    "Host memory available to new allocations without swapping (the kernel's MemAvailable).",
    unit="bytes",
    group=HOST_GROUP,
    sampled=True,
)
HOST_MEMORY_TOTAL = _metric(
    "host_memory_total_bytes", Kind.GAUGE, "Host memory in total.", unit="bytes", group=HOST_GROUP, sampled=True
)
HOST_DISK_IO = _metric(
    "host_disk_io_bytes_total",
    Kind.COUNTER,
    "Bytes read and written by all the host's disks, by direction (read, write); rate() gives the throughput.",
    Label.DIRECTION,
    unit="bytes",
    group=HOST_GROUP,
    sampled=True,
)
HOST_NETWORK = _metric(
    "host_network_bytes_total",
    Kind.COUNTER,
    "Bytes received and transmitted on the host's interfaces except loopback, by direction (receive, transmit).",
    Label.DIRECTION,
    unit="bytes",
    group=HOST_GROUP,
    sampled=True,
)
HOST_SWAP_IO = _metric(
    "host_swap_io_bytes_total",
    Kind.COUNTER,
    "Bytes the host swapped in from disk and out to it, by direction (in, out): swapping in while a job runs "
    "is memory thrash.",
    Label.DIRECTION,
    unit="bytes",
    group=HOST_GROUP,
    sampled=True,
)
JOB_CPU = _metric(
    "job_cpu_seconds_total",
    Kind.COUNTER,
    "CPU time (user and system) used by each of the job's processes.",
    W,
    Label.PID,
    unit="seconds",
    group=HOST_GROUP,
    sampled=True,
)
JOB_RESIDENT_MEMORY = _metric(
    "job_resident_memory_bytes",
    Kind.GAUGE,
    "Resident host memory of each of the job's processes.",
    W,
    Label.PID,
    unit="bytes",
    group=HOST_GROUP,
    sampled=True,
)
JOB_MAJOR_PAGE_FAULTS = _metric(
    "job_major_page_faults_total",
    Kind.COUNTER,
    "Page faults of each of the job's processes that had to read from disk (swap or a mapped file): the job "
    "thrashing when its memory does not fit.",
    W,
    Label.PID,
    group=HOST_GROUP,
    sampled=True,
)
JOB_THREADS = _metric(
    "job_threads", Kind.GAUGE, "Threads in each of the job's processes.", W, Label.PID, group=HOST_GROUP, sampled=True
)

# --- The sidecar's own health -----------------------------------------------------
HEALTH_GROUP = "Exporter health"
# The results of an event at the sidecar's socket.
ACCEPTED, INVALID, DROPPED = "accepted", "invalid", "dropped"
OK = "ok"  # a push that went through
# Why a job's connection could not be taken or read.
ACCEPT, REFUSED, RECEIVE = "accept", "refused", "receive"
# The sidecar's collectors (tpuscope/exporter/collectors, one file each): the values of --collectors and of the
# `collector` label. libtpu and the device plugin are also the `source` of the device series they read.
LIBTPU, GKE_DEVICE_PLUGIN, NVML, HOST = "libtpu", "gke-device-plugin", "nvml", "host"
COLLECTOR_NAMES = (LIBTPU, GKE_DEVICE_PLUGIN, NVML, HOST)
# Why a collection failed (a collector's CollectorError), each a value of collector_errors_total's reason.
UNAVAILABLE = "unavailable"  # the source is not there: connection refused, driver not loaded, port closed
DEADLINE = "deadline"  # the source did not answer in time
UNKNOWN_METRICS = "unknown_metrics"  # the source answers, but with none of the metrics we know
INVALID_RESPONSE = "invalid_response"  # the source answered something we cannot read
NOT_SUPPORTED = "not_supported"  # nothing to collect here (no library, no device)
PROCESS_GONE = "process_gone"  # a process we were told to watch does not exist
ERROR = "error"  # anything else (a bug of ours, or an error we did not foresee)
INGEST_EVENTS = _metric(
    "ingest_events_total",
    Kind.COUNTER,
    "Events by result: accepted; invalid (rejected by the sidecar); dropped (could not be sent, "
    "as reported by the job in its next event).",
    Label.RESULT,
    group=HEALTH_GROUP,
    closed={Label.RESULT: (ACCEPTED, INVALID, DROPPED)},
)
INGEST_INVALID_EVENTS = _metric(
    "ingest_invalid_events_total",
    Kind.COUNTER,
    "Events the sidecar rejected, by reason: malformed, truncated, oversized, unknown_version, invalid_field.",
    Label.REASON,
    group=HEALTH_GROUP,
    closed={Label.REASON: REJECT_REASONS},
)
INGEST_CONNECTION_ERRORS = _metric(
    "ingest_connection_errors_total",
    Kind.COUNTER,
    "Job connections the sidecar could not take or read, by reason: accept (accept() failed, as when the "
    "sidecar is out of file descriptors), refused (past its connection limit), receive (a read failed).",
    Label.REASON,
    group=HEALTH_GROUP,
    closed={Label.REASON: (ACCEPT, REFUSED, RECEIVE)},
)
COLLECTOR_UP = _metric(
    "collector_up",
    Kind.GAUGE,
    "1 when the collector's latest collection succeeded in full, 0 when it failed or passed its deadline "
    "(collector_errors_total says why).",
    Label.COLLECTOR,
    group=HEALTH_GROUP,
    closed={Label.COLLECTOR: COLLECTOR_NAMES},
)
COLLECTOR_DURATION = _metric(
    "collector_duration_seconds",
    Kind.GAUGE,
    "How long the collector's latest collection took.",
    Label.COLLECTOR,
    unit="seconds",
    group=HEALTH_GROUP,
    closed={Label.COLLECTOR: COLLECTOR_NAMES},
)
COLLECTOR_ERRORS = _metric(
    "collector_errors_total",
    Kind.COUNTER,
    "Failed collections by reason: unavailable, deadline, unknown_metrics, invalid_response, not_supported, "
    "process_gone, error.",
    Label.COLLECTOR,
    Label.REASON,
    group=HEALTH_GROUP,
    closed={
        Label.COLLECTOR: COLLECTOR_NAMES,
        Label.REASON: (UNAVAILABLE, DEADLINE, UNKNOWN_METRICS, INVALID_RESPONSE, NOT_SUPPORTED, PROCESS_GONE, ERROR),
    },
)
COLLECTOR_UNKNOWN_METRICS = _metric(
    "collector_unknown_metrics",
    Kind.GAUGE,
    "Metrics the collector's source says it offers that tpuscope does not read (libtpu: what ListSupportedMetrics "
    "lists beyond the catalogue's): a newer runtime's additions, noticed rather than silently missing. The sidecar "
    "logs their names.",
    Label.COLLECTOR,
    group=HEALTH_GROUP,
    sampled=True,
    closed={Label.COLLECTOR: COLLECTOR_NAMES},
)
LABEL_VALUES = _metric(
    "ingest_label_values",
    Kind.GAUGE,
    "Distinct values the sidecar holds for each label jobs set (workload, device, accelerator, program, "
    "reason); at most --max-label-values each.",
    Label.LABEL,
    group=HEALTH_GROUP,
)
LABEL_OVERFLOW = _metric(
    "ingest_label_overflow_total",
    Kind.COUNTER,
    "Events whose label value was new while the label already held --max-label-values values: they are "
    "kept under the value _overflow instead, so the series count stays bounded.",
    Label.LABEL,
    group=HEALTH_GROUP,
)
WORKLOADS_EXPIRED = _metric(
    "workloads_expired_total",
    Kind.COUNTER,
    "Workloads whose series were removed because no process of theirs was connected and none had sent an "
    "event for --workload-expiry.",
    group=HEALTH_GROUP,
)
OTLP_PUSHES = _metric(
    "otlp_pushes_total",
    Kind.COUNTER,
    "Pushes of these metrics to an OpenTelemetry collector (--otlp-metrics on), by result: ok, error.",
    Label.RESULT,
    group=HEALTH_GROUP,
    closed={Label.RESULT: (OK, ERROR)},
)
# What became of a device trace a job handed to the sidecar's profile service (tpuscope.exporter.profiles).
PROFILE_PARSE_RESULTS = ("ok", "empty", "dropped", "too_large", "error")
PROFILE_PARSES = _metric(
    "profile_parses_total",
    Kind.COUNTER,
    "Device traces the sidecar parsed for its jobs' profile captures, by result: ok; empty (no traced step or "
    "device op in it); dropped (its job handed a newer one, or stopped waiting, before it was parsed); too_large "
    "(over the size cap: deleted unread); error (the parse failed or ran out of time).",
    Label.RESULT,
    group=HEALTH_GROUP,
    closed={Label.RESULT: PROFILE_PARSE_RESULTS},
)
PROFILE_PARSE_SECONDS = _metric(
    "profile_parse_seconds_total",
    Kind.COUNTER,
    "Wall time the sidecar spent parsing device traces, each in a child process at the lowest CPU priority.",
    unit="seconds",
    group=HEALTH_GROUP,
)
BUILD_INFO = _metric(
    "build_info",
    Kind.GAUGE,
    "Always 1; the version label says which tpuscope serves these metrics.",
    Label.VERSION,
    group=HEALTH_GROUP,
)

del _dev

CATALOG: tuple[Metric, ...] = tuple(v for v in list(globals().values()) if isinstance(v, Metric))

# The series one sidecar may serve: a host of 8 accelerators with every collector on and one workload, no more than
# node_exporter serves on a busy host (docs/fleet.md has the counts). Checked by `tpuscope bench fleet-scale` on its
# recorded series set and by tests/test_fleet_scale.py on the workload's default run.
HOST_SERIES_BUDGET = 1_500
