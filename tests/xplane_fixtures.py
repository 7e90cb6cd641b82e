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
  the host thread's driver API call has the same ``correlation_id``, and nests in the job's ``train`` annotation.
  That is the chain XProf groups a GPU step by: root annotation -> launch -> kernel. ``gpu_nccl_streams`` names its
  launches ``cuLaunchKernel`` (CUPTI's name only where it has no kernel symbol); ``gpu_raw_capture`` names them after
  their kernels, as real captures do, and says where each part of its shape comes from.
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

from tpuscope.testing.xplane_builder import Ref, StatValue, Uint, XSpaceBuilder

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


# --- GPU, a raw capture as XLA's profiler writes it ---------------------------------------------------------------
#
# One GPU, kernels on one compute stream, an input copy on a copy stream; per step (step k lasts 9000 + 100 k), from
# the step's first kernel:
#   "Stream #7(Compute)":
#     [0, 2500 + 100 k)  void cutlass::Kernel2<..._128x128_...>(...) (a library GEMM: a demangled C++ name)
#     [3000, 3400)     loop_add_fusion                               (an XLA fusion: one word)
#     [4000, 6000)     void cutlass::Kernel2<..._64x64_...>(...)
#     [6000, 6500)     input_reduce_fusion
#     [8000 + 100 k, 8500 + 100 k)  loop_convert_fusion               (after the host read back the loss)
#   "Stream #8(MemcpyH2D)":
#     [100, 400)       MemcpyH2D                                     (the next batch: the host's input, not compute)
# compute = 2500 + 100 k + 400 + 2000 + 500 + 500 = 5900 + 100 k; no collective; idle = 3100 (the last kernel ends 500
# before the next step's first: XProf's step, first kernel to last, is 500 shorter than ours, and its idle too). The
# first kernel's length changes from step to step: a reader that missed its launch would start each step at the
# second kernel, and count the next step's first kernel in it.
_CUTLASS_GEMMS = [
    f"void cutlass::Kernel2<{kernel}>({kernel}::Params)"
    for kernel in (
        "cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4",
        "cutlass_80_tensorop_s1688gemm_64x64_32x6_tn_align4",
    )
]
RAW_COMPUTE_STREAM, RAW_COPY_STREAM = 7, 8
RAW_TAIL_US = 500  # from a step's last kernel to the next step's first
RAW_THREAD_ID = 2718281  # the job's main thread: its line's id on /host:CPU and on /host:CUPTI alike
PROFILE_START_EPOCH_NS = 1_741_722_099_081_044_120  # where an unmerged capture's lines start: wall-clock time
GPU_RAW_TRUTH = [Split(9000 + 100 * k, 5900 + 100 * k, 0, 0, 3100) for k in range(STEPS)]


@dataclass(frozen=True)
class Kernel:
    """A GPU's kernel or copy in a step: its name (the kernel's symbol), the HLO op that launched it, its stream, and
    its start and end in microseconds from the step's first kernel."""

    name: str
    hlo_op: str
    stream: int
    begin: int
    end: int


def _raw_kernels(step: int) -> list[Kernel]:
    """A step's device work in launch order: the input copy, then the kernels."""
    return [
        Kernel("MemcpyH2D", "", RAW_COPY_STREAM, 100, 400),
        Kernel(_CUTLASS_GEMMS[0], "cublas-gemm.1", RAW_COMPUTE_STREAM, 0, 2500 + 100 * step),
        Kernel("loop_add_fusion", "loop_add_fusion", RAW_COMPUTE_STREAM, 3000, 3400),
        Kernel(_CUTLASS_GEMMS[1], "cublas-gemm.2", RAW_COMPUTE_STREAM, 4000, 6000),
        Kernel("input_reduce_fusion", "input_reduce_fusion", RAW_COMPUTE_STREAM, 6000, 6500),
        Kernel(
            "loop_convert_fusion",
            "loop_convert_fusion",
            RAW_COMPUTE_STREAM,
            8000 + 100 * step,
            9000 + 100 * step - RAW_TAIL_US,
        ),
    ]


def gpu_raw_capture(unmerged: bool = False) -> Fixture:
    """A JAX GPU capture shaped as XLA's profiler writes it, not as XProf shows it: no ``group_id``, no "Steps",
    "XLA Ops" or "Launch Stats" line (XProf derives those when it reads a capture), kernels only on their CUPTI
    stream lines; ``unmerged``: as the GPU tracer hands its planes to the profiler session, before the session's
    post-processing.

    Where each shape comes from (openxla/xla, each file at the commit it was read at):

    - ``xla/backends/profiler/gpu/cupti_tracer.cc`` @80c095fc2f5ba8b1e8c8b7df79c0be532416dd69: a kernel launch's
      driver-API event is named after the kernel's symbol, demangled (``void cutlass::Kernel2<...>(...)``);
      ``cuLaunchKernel`` only where CUPTI gives no symbol. A copy's call is named ``MemcpyH2D``, an allocation's
      after its function (``cuMemAlloc_v2``).
    - ``xla/backends/profiler/gpu/cupti_collector.cc`` @0c24afffd24b459ab172a163943aa5e6d1c1e480: the driver calls
      go on the ``/host:CUPTI`` plane, a line per host thread whose id is the thread's (``Host Threads/<tid>``),
      each with ``device_id`` (uint64), ``correlation_id`` (uint64) and ``context_id`` (``"$$<context>"``); a GPU's
      plane is ``/device:GPU:<ordinal>`` with the ordinal for its id, a line per stream (``Stream #<id>(<kinds>)``),
      its kernels with the same ``correlation_id`` and ``context_id``, ``kernel_details``, the occupancy, and the
      launch's annotation stack as stats (``hlo_op``, ``hlo_module``, ``program_id``).
    - ``xla/tsl/profiler/convert/post_process_single_host_xplane.cc`` @80c095fc2f5ba8b1e8c8b7df79c0be532416dd69:
      before a capture is saved, ``/host:CUPTI`` is merged into ``/host:CPU``, each CUPTI line into the line of the
      same id (the thread's TraceMe line, whose name it keeps), the lines' timestamps are made relative to the
      session's start, and a "Task Environment" plane gets the session's start and stop. A saved capture has no
      ``/host:CUPTI``; the unmerged shape is what a reader of the tracer's own planes sees.
    - ``xla/tsl/profiler/utils/xplane_schema.cc`` @02e89dc4d52744db60acd1fa82ef4417f539b6d8: the stats' names.
    - jax's ``StepTraceAnnotation("train", step_num=n)`` is a TraceMe ``train#_r=1,step_num=n#``, whose arguments
      become int64 stats (``host_tracer_utils.cc`` @827aca0eb2748018b7e803606250f9ea56939ab0).

    Checked against a real capture, ../shared/reference/traces/gpu_v100_bert_tf.xplane.pb (TensorFlow's, V100):
    its launches carry ``correlation_id`` on ``/host:CPU``, on the lines of the threads that launched them, named
    after their kernels (``void Eigen::internal::EigenMetaKernel<...>``), and its kernels carry the same ids on
    ``Stream #N(Compute)`` lines. (That capture was also grouped by XProf before it was saved, so its own steps are
    on a "Steps" line: this fixture is the raw shape it was made from.)"""
    # the first step's annotation begins 2500 us ahead of its first kernel: the lines start 3000 us earlier
    starts = [start + 3000 for start in _step_starts([9000 + 100 * k for k in range(STEPS)])]
    origin = PROFILE_START_EPOCH_NS if unmerged else SESSION_START_NS
    space = XSpaceBuilder("gpu-host-0")
    cupti = space.plane("/host:CUPTI", 0) if unmerged else None
    gpu = space.plane("/device:GPU:0", 0)
    host = space.plane("/host:CPU", 0)
    thread = host.line(RAW_THREAD_ID, f"main/{RAW_THREAD_ID}", origin)
    driver = cupti.line(RAW_THREAD_ID, f"Host Threads/{RAW_THREAD_ID}", origin) if cupti else thread
    if not unmerged:
        space.plane("Task Environment", 0).stats(
            {
                "profile_start_time": Uint(PROFILE_START_EPOCH_NS),
                "profile_stop_time": Uint(PROFILE_START_EPOCH_NS + 10**9),
            }
        )
    gpu.stats({"device_vendor": "Nvidia", "gpu_device_name": "NVIDIA A100-SXM4-40GB", "compute_cap_major": 8,
               "compute_cap_minor": 0, "core_count": 108, "clock_rate": 1410000,
               "memory_bandwidth": Uint(1555 * 10**9), "memory_size": Uint(40 * 2**30)})  # fmt: skip
    streams = {
        RAW_COMPUTE_STREAM: gpu.line(RAW_COMPUTE_STREAM, f"Stream #{RAW_COMPUTE_STREAM}(Compute)", origin),
        RAW_COPY_STREAM: gpu.line(RAW_COPY_STREAM, f"Stream #{RAW_COPY_STREAM}(MemcpyH2D)", origin),
    }
    call: dict[str, StatValue] = {
        "device_id": Uint(0),
        "context_id": "$$1",
    }  # a driver call's stats, but for its correlation id
    # the runtime's allocation before the first step: a driver call whose correlation id no kernel has
    driver.event("cuMemAlloc_v2", 200 * US, 15 * US, {**call, "correlation_id": Uint(1)})
    for step, start in enumerate(starts):
        # the step's annotation, 2500 us ahead of its kernels (asynchronous dispatch), and the jitted call inside it
        begin = start - 2500
        thread.event("train", begin * US, 1000 * US, {"_r": 1, "step_num": FIRST_STEP_NUM + step})
        thread.event("PjitFunction(train_step)", (begin + 20) * US, 900 * US)
        for index, kernel in enumerate(_raw_kernels(step)):
            correlation_id = Uint(100 + 10 * step + index)
            driver.event(
                kernel.name, (begin + 50 + 100 * index) * US, 6 * US, {**call, "correlation_id": correlation_id}
            )
            details: dict[str, StatValue] = (
                {"kernel_details": Ref("regs:128 static_shared:0 dynamic_shared:49152 grid:108,1,1 block:256,1,1 "
                                       "occ_pct:50"),
                 "theoretical_occupancy_pct": 50.0, "hlo_op": Ref(kernel.hlo_op), "hlo_module": Ref("jit_train_step"),
                 "program_id": 7}
                if kernel.hlo_op
                else {"memcpy_details": Ref("kind_src:pageable kind_dst:device size:4194304 dest:0 async:1")}
            )  # fmt: skip
            streams[kernel.stream].event(
                kernel.name,
                (start + kernel.begin) * US,
                (kernel.end - kernel.begin) * US,
                {"correlation_id": correlation_id, "context_id": "$$1", **details},
            )
    return Fixture({"gpu-host-0": space.serialize()}, {"gpu-host-0": GPU_RAW_TRUTH}, starts)
