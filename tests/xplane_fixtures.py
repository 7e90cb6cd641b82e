"""XSpace captures with the schema of real TPU (libtpu) and GPU (CUPTI) traces, each with its known split per step.

Built with :mod:`tpuscope.testing.xplane_builder` the way XProf's own tests build theirs
(xprof/convert/xplane_to_step_events_test.cc, xplane_to_op_metrics_db_test.cc), and shaped as a raw capture is before
XProf's preprocessing: no ``group_id`` anywhere. XProf groups a raw capture itself (tsl's group_events.cc) and skips
that grouping, derived lines included, as soon as any plane has a ``group_id`` stat, so a fixture that carried one
would not be read the way a real capture is.

- TPU: a ``/device:TPU:N`` plane per core, with the lines "Steps" (one event per step: XProf groups every other line's
  events by the step event that encloses them), "XLA Modules" (the program run) and "XLA Ops" (one HLO op at a time;
  its ``hlo_category``, ``program_id`` and ``flops`` are stats of the event METADATA, shared by every run of the op).
  An async collective is two ops on that line, ``all-reduce-start.N`` and ``all-reduce-done.N``: what runs between
  them is the compute it overlaps, and the done's own length is the wait that compute did not hide.
- GPU: a ``/device:GPU:N`` plane per GPU whose "Stream #N(...)" lines hold kernels with CUPTI's ``correlation_id``;
  the host thread's driver API call (``cuLaunchKernel``) has the same ``correlation_id``, and nests in the job's
  ``train`` annotation. That is the chain XProf groups a GPU step by: root annotation -> launch -> kernel.
- host: ``/host:CPU``, a line per thread; ``jax.profiler.StepTraceAnnotation("train", step_num=n)`` is a TraceMe whose
  encoded arguments become the event's stats ``step_num`` and ``_r`` (is_root) = 1.

Timestamps are, as in a saved capture, nanoseconds from the start of the profiling session (the profiler normalizes
them; absolute epoch nanoseconds would overflow in picoseconds). Every op runs on whole microseconds.

Ground truth is written out below as literal numbers (microseconds), worked out by hand from the op tables, so that a
test compares two independent things: per step (and per device where devices differ) ``compute`` (union of
non-collective ops), ``exposed`` (collective time no compute covers), ``overlapped`` (collective time compute
covers; an async pair's collective time is from its start op's start to its done op's end) and ``idle`` (no op).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tpuscope.testing.xplane_builder import Ref, Uint, XSpaceBuilder

US = 1_000_000  # picoseconds in a microsecond
SESSION_START_NS = 2_000_000  # where the lines start, from the start of the session
HOST_THREAD_ID = 4242
STEPS = 5  # XProf drops the first and last GPU step of a capture of more than 5 (sampling), so 5 keeps all of them
FIRST_STEP_NUM = 100  # the job's own step numbers, as StepTraceAnnotation gives them


@dataclass(frozen=True)
class Split:
    """One step's split, microseconds."""

    step: int
    compute: int
    exposed: int
    overlapped: int
    idle: int


@dataclass(frozen=True)
class Op:
    """An op (TPU) or kernel (GPU) in a step: name, HLO category, start and end in microseconds from the step start."""

    name: str
    category: str
    begin: int
    end: int


@dataclass(frozen=True)
class Fixture:
    """A capture: one serialized XSpace per host, and its ground truth per host."""

    hosts: dict[str, bytes]
    truth: dict[str, list[Split]]
    step_starts_us: list[int]  # device step starts, from SESSION_START_NS


def _step_starts(periods: Sequence[int]) -> list[int]:
    starts, at = [], 1000  # the first step begins 1 ms into the lines
    for period in periods:
        starts.append(at)
        at += period
    return starts


def _host_plane(space: XSpaceBuilder, step_starts: Sequence[int], lead_us: int, length_us: int,
                launches: Sequence[Sequence[tuple[int, int]]] = (), runtime_thread: bool = False) -> None:  # fmt: skip
    """The host thread: each step's ``train`` annotation, which with async dispatch ends before the step runs on the
    device, and the driver calls made inside it (``launches``: per step, (microseconds into the annotation,
    correlation id)), or, with ``runtime_thread``, made on a thread of the runtime's at the same times (as PjRt
    launches a device's work from a thread of its own). Events go in time order, parents before children, as the
    profiler saves them."""
    host = space.plane("/host:CPU", 0)
    thread = host.line(HOST_THREAD_ID, "python3", SESSION_START_NS)
    launcher = host.line(HOST_THREAD_ID + 1, "pjrt-worker", SESSION_START_NS) if runtime_thread else thread
    for index, start in enumerate(step_starts):
        begin = start - lead_us
        thread.event("train", begin * US, length_us * US, {"step_num": FIRST_STEP_NUM + index, "_r": 1})
        for offset, correlation in sorted(launches[index]) if launches else ():
            launcher.event("cuLaunchKernel", (begin + offset) * US, 8 * US, {"correlation_id": Uint(correlation)})


def _tpu_core(space: XSpaceBuilder, ordinal: int, step_starts: Sequence[int], periods: Sequence[int],
              ops_of_step: Sequence[Sequence[Op]]) -> None:  # fmt: skip
    """One TensorCore: its Steps, XLA Modules and XLA Ops lines, as libtpu writes them."""
    plane = space.plane(f"/device:TPU:{ordinal}", ordinal + 1)
    plane.stats(
        {"device_type_string": "TPU v5 lite", "peak_teraflops_per_second": 197.0,
         "peak_hbm_bw_gigabytes_per_second": 819.0}
    )  # fmt: skip
    steps = plane.line(1, "Steps", SESSION_START_NS)
    modules = plane.line(2, "XLA Modules", SESSION_START_NS)
    ops = plane.line(3, "XLA Ops", SESSION_START_NS)
    for index, (start, period, step_ops) in enumerate(zip(step_starts, periods, ops_of_step, strict=True)):
        steps.event(str(FIRST_STEP_NUM + index), start * US, period * US)
        first, last = step_ops[0].begin, step_ops[-1].end
        modules.event("jit_train_step(7)", (start + first) * US, (last - first) * US,
                      {"run_id": 1000 + index, "program_id": 7})  # fmt: skip
        for symbol_id, op in enumerate(step_ops, start=1):
            # XProf keys an op by (program_id, symbol_id) and drops an op without both
            plane.event_metadata(
                op.name, {"hlo_category": op.category, "program_id": 7, "symbol_id": symbol_id,
                          "hlo_module": Ref("jit_train_step"),
                          "flops": (op.end - op.begin) * 10**9 if "convolution" in op.category else 0}
            )  # fmt: skip
            ops.event(op.name, (start + op.begin) * US, (op.end - op.begin) * US)


# --- TPU, data parallel, async all-reduce -----------------------------------------------------------------------
#
# Per core and step (two cores, the same ops), in microseconds from the step start; step k lasts 10000 + 200 k:
#   [0, 400)        idle: the core waits for the host to dispatch the step
#   [400, 3400)     fusion.1              convolution fusion   (forward)
#   [3400, 3500)    all-reduce-start.1    all-reduce-start     (gradients of the last layers start to travel)
#   [3500, 5500)    fusion.2              convolution fusion   (backward of the first layers, under the all-reduce)
#   [5500, 7500)    fusion.3              loop fusion
#   [7500, 8500)    all-reduce-done.1     all-reduce-done      (waits: the all-reduce outlasted the compute)
#   [8500, 9200)    fusion.4              loop fusion          (optimizer update)
#   [9200, end)     idle, 800 + 200 k
# compute = 3000 + 2000 + 2000 + 700 = 7700; the all-reduce's time is [3400, 8500) = 5100, of which compute covers
# [3500, 7500) = 4000 (overlapped) and 1100 is its own ops (exposed); idle = 400 + 800 + 200 k.
_ASYNC_OPS = [
    Op("fusion.1", "convolution fusion", 400, 3400),
    Op("all-reduce-start.1", "all-reduce-start", 3400, 3500),
    Op("fusion.2", "convolution fusion", 3500, 5500),
    Op("fusion.3", "loop fusion", 5500, 7500),
    Op("all-reduce-done.1", "all-reduce-done", 7500, 8500),
    Op("fusion.4", "loop fusion", 8500, 9200),
]
TPU_ASYNC_ALL_REDUCE_TRUTH = [Split(10000 + 200 * k, 7700, 1100, 4000, 1200 + 200 * k) for k in range(STEPS)]


def _tpu_host(hostname: str, periods: Sequence[int], ops: Sequence[Op]) -> tuple[bytes, list[int]]:
    """One TPU host's capture: the job's annotations, 300 us ahead of the device's steps, and two cores that run
    ``ops`` each step; its bytes and the steps' starts."""
    starts = _step_starts(periods)
    space = XSpaceBuilder(hostname)
    _host_plane(space, starts, lead_us=300, length_us=200)
    for ordinal in range(2):
        _tpu_core(space, ordinal, starts, periods, [ops] * STEPS)
    return space.serialize(), starts


def tpu_async_all_reduce() -> Fixture:
    data, starts = _tpu_host("tpu-host-0", [10000 + 200 * k for k in range(STEPS)], _ASYNC_OPS)
    return Fixture({"tpu-host-0": data}, {"tpu-host-0": TPU_ASYNC_ALL_REDUCE_TRUTH}, starts)


# --- TPU, a reduce-scatter fused into a fusion ------------------------------------------------------------------
#
# XLA on TPU fuses a reduce-scatter (and the reduction feeding it) into one fusion whose kind makes XProf's
# hlo_category "all-reduce-scatter fusion" (tsl::profiler::kHloAllReduceScatterFusion); its name is just "fusion.7".
# Per core and step (two cores), step k lasts 8000 + 100 k:
#   [0, 300)        idle
#   [300, 4300)     fusion.1   convolution fusion
#   [4300, 5800)    fusion.7   all-reduce-scatter fusion   (the collective: nothing runs beside it, so exposed)
#   [5800, 7200)    fusion.3   loop fusion
#   [7200, end)     idle, 800 + 100 k
# compute = 4000 + 1400 = 5400; exposed = 1500; overlapped = 0; idle = 1100 + 100 k.
_FUSED_OPS = [
    Op("fusion.1", "convolution fusion", 300, 4300),
    Op("fusion.7", "all-reduce-scatter fusion", 4300, 5800),
    Op("fusion.3", "loop fusion", 5800, 7200),
]
TPU_FUSED_REDUCE_SCATTER_TRUTH = [Split(8000 + 100 * k, 5400, 1500, 0, 1100 + 100 * k) for k in range(STEPS)]


def tpu_fused_reduce_scatter() -> Fixture:
    data, starts = _tpu_host("tpu-host-0", [8000 + 100 * k for k in range(STEPS)], _FUSED_OPS)
    return Fixture({"tpu-host-0": data}, {"tpu-host-0": TPU_FUSED_REDUCE_SCATTER_TRUTH}, starts)


# --- two TPU hosts, one a straggler -----------------------------------------------------------------------------
#
# Two hosts of two cores each, one synchronous all-reduce per step, steps of 10000 on both (the all-reduce keeps
# them in lock step). tpu-host-1 is slow: its forward takes 7500 instead of 6000, so tpu-host-0's all-reduce waits
# 1500 for it at the rendezvous. Per core and step:
#   tpu-host-0: [0, 500) idle; [500, 6500) fusion.1 conv; [6500, 8500) all-reduce.1 (500 transfer + 1500 wait);
#               [8500, 9300) fusion.2 loop; [9300, 10000) idle.
#               compute 6800, exposed 2000, overlapped 0, idle 1200
#   tpu-host-1: [0, 500) idle; [500, 8000) fusion.1 conv; [8000, 8500) all-reduce.1; [8500, 9300) fusion.2 loop;
#               [9300, 10000) idle.
#               compute 8300, exposed 500, overlapped 0, idle 1200
_PROMPT_OPS = [
    Op("fusion.1", "convolution fusion", 500, 6500),
    Op("all-reduce.1", "all-reduce", 6500, 8500),
    Op("fusion.2", "loop fusion", 8500, 9300),
]
_STRAGGLER_OPS = [
    Op("fusion.1", "convolution fusion", 500, 8000),
    Op("all-reduce.1", "all-reduce", 8000, 8500),
    Op("fusion.2", "loop fusion", 8500, 9300),
]
MULTI_HOST_TRUTH = {
    "tpu-host-0": [Split(10000, 6800, 2000, 0, 1200)] * STEPS,
    "tpu-host-1": [Split(10000, 8300, 500, 0, 1200)] * STEPS,
}


def multi_host() -> Fixture:
    hosts = {}
    for hostname, ops in (("tpu-host-0", _PROMPT_OPS), ("tpu-host-1", _STRAGGLER_OPS)):
        hosts[hostname], starts = _tpu_host(hostname, [10000] * STEPS, ops)
    return Fixture(hosts, MULTI_HOST_TRUTH, starts)


# --- GPU, NCCL all-reduce on its own stream ---------------------------------------------------------------------
#
# Two GPUs with the same kernels at the same times. Per GPU and step (step k lasts 12000 + 250 k), from the step's
# first kernel; the step ends where the next step's first kernel starts, so XProf's step (first kernel to last
# kernel of the step) and the window between step starts are the same span:
#   compute stream "Stream #7(Compute)":
#     [0, 3000)      sm90_xmma_gemm_bf16bf16_bf16f32 (forward)
#     [3000, 3500)   loop_multiply_fusion
#     [3500, 6500)   sm90_xmma_gemm_bf16bf16_bf16f32 (backward)
#     [6500, 7000)   input_reduce_fusion
#     [8500, 9500)   loop_add_fusion (optimizer)
#     [11000 + 250 k, 12000 + 250 k)  loop_convert_fusion (after the host read back the loss)
#   collective stream "Stream #13(NCCL)":
#     [4000, 8500)   ncclDevKernel_AllReduce_Sum_bf16_RING_LL
# compute = 7000 + 1000 + 1000 = 9000; NCCL [4000, 8500) = 4500: [4000, 7000) under compute = 3000 overlapped,
# [7000, 8500) = 1500 exposed; idle [9500, 11000 + 250 k) = 1500 + 250 k.
_GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel"
_NCCL = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
GPU_COMPUTE_STREAM, GPU_NCCL_STREAM = 7, 13
GPU_NCCL_STREAMS_TRUTH = [Split(12000 + 250 * k, 9000, 1500, 3000, 1500 + 250 * k) for k in range(STEPS)]


def _gpu_kernels(step: int, gap: int = 0) -> list[tuple[int, Op]]:
    """The step's kernels, each with its stream, in launch order; ``gap``: the last one ends that much before the
    next step's first (the GPU idles between the steps)."""
    late = 250 * step - gap
    return [
        (GPU_COMPUTE_STREAM, Op(_GEMM, "", 0, 3000)),
        (GPU_COMPUTE_STREAM, Op("loop_multiply_fusion", "", 3000, 3500)),
        (GPU_COMPUTE_STREAM, Op(_GEMM, "", 3500, 6500)),
        (GPU_NCCL_STREAM, Op(_NCCL, "", 4000, 8500)),
        (GPU_COMPUTE_STREAM, Op("input_reduce_fusion", "", 6500, 7000)),
        (GPU_COMPUTE_STREAM, Op("loop_add_fusion", "", 8500, 9500)),
        (GPU_COMPUTE_STREAM, Op("loop_convert_fusion", "", 11000 + late, 12000 + late)),
    ]


def _correlation_id(gpu: int, step: int, kernel: int) -> int:
    return 1 + kernel + 100 * step + 10_000 * gpu


def gpu_nccl_streams(gap_us: int = 0, runtime_thread: bool = False) -> Fixture:
    """``gap_us``: the last kernel of each step ends that long before the next step's first (XProf's step, first
    kernel to last, is that much shorter than the window between step starts; the idle per step is the same).
    ``runtime_thread``: the kernels are launched from a runtime thread, not inside the annotations."""
    periods = [12000 + 250 * k for k in range(STEPS)]
    starts = _step_starts(periods)
    space = XSpaceBuilder("gpu-host-0")
    # each kernel's launch: 50 us into its step's annotation, 100 us apart, GPU 1's 10 us after GPU 0's
    launches = [
        [(50 + 100 * index + 10 * gpu, _correlation_id(gpu, step, index))
         for gpu in range(2) for index in range(len(_gpu_kernels(step, gap_us)))]
        for step in range(STEPS)
    ]  # fmt: skip
    _host_plane(space, starts, lead_us=2000, length_us=1000, launches=launches, runtime_thread=runtime_thread)
    for gpu in range(2):
        plane = space.plane(f"/device:GPU:{gpu}", gpu + 1)
        streams = {
            stream: plane.line(stream, f"Stream #{stream}({label})", SESSION_START_NS)
            for stream, label in ((GPU_COMPUTE_STREAM, "Compute"), (GPU_NCCL_STREAM, "NCCL"))
        }
        for step, start in enumerate(starts):
            for index, (stream, kernel) in enumerate(_gpu_kernels(step, gap_us)):
                streams[stream].event(
                    kernel.name, (start + kernel.begin) * US, (kernel.end - kernel.begin) * US,
                    {"correlation_id": Uint(_correlation_id(gpu, step, index)), "context_id": Uint(1),
                     "device_id": Uint(gpu), "hlo_module": Ref("jit_train_step"), "program_id": 7,
                     "kernel_details": "regs:128 static_shared:0 dynamic_shared:98304 grid:132,1,1 block:384,1,1"},
                )  # fmt: skip
    return Fixture({"gpu-host-0": space.serialize()}, {"gpu-host-0": GPU_NCCL_STREAMS_TRUTH}, starts)
