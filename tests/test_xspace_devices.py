"""The device-trace parser (tpuscope.exporter.profiles.xspace) on the planes of TPU and GPU captures, which this
machine cannot take: built the way XProf's own tests build theirs (tpuscope.testing.xplane_builder), and read by
XProf's own converters beside ours.

Two layers: small hand-built planes, one rule each (categories, async pairs, nesting, where steps come from, how
program runs meet across cores); then the fixtures of tests/xplane_fixtures.py (a TPU data-parallel step with an async
all-reduce, a fusion that holds a reduce-scatter, two hosts with a straggler, a GPU step with NCCL kernels on their own
stream, a GPU capture shaped as XLA's profiler writes it), whose split must match both their worked-out truth and
XProf's reading of them within 5 %. The real captures are read in tests/test_reference_traces.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
import xplane_fixtures as fixtures
from xprof_reference import IDLE_CATEGORY, XPROF_COLLECTIVE_CATEGORIES, xprof_split

from tpuscope.events import STEP_ANNOTATION
from tpuscope.exporter.profiles.xspace import ProfiledSteps, async_half, is_collective_op, split_steps
from tpuscope.testing.xplane_builder import Uint, XPlaneBuilder, XSpaceBuilder

US = 1_000_000  # picoseconds
# A real capture's lines start at epoch nanoseconds: past a float's exact integers once in picoseconds.
EPOCH_NS = 1_764_000_000_000_000_000

# An op on a device line: (name, HLO category or None, start us, end us).
Op = tuple[str, str | None, int, int]


def device(space: XSpaceBuilder, ordinal: int, ops: Sequence[Op], *, kind: str = "TPU", line: str = "XLA Ops",
           steps: Sequence[tuple[int, int, int]] = (), modules: Sequence[tuple[int, int]] = ()) -> None:  # fmt: skip
    """A device plane: its ops on one line (categories in the event metadata, as libtpu writes them), and optionally
    a "Steps" line of (number, start us, end us) and an "XLA Modules" line of (start us, end us)."""
    plane = space.plane(f"/device:{kind}:{ordinal}", ordinal + 1)
    ops_line = plane.line(1, line, EPOCH_NS)
    for name, category, start, end in ops:
        plane.event_metadata(name, {"hlo_category": category} if category is not None else None)
        ops_line.event(name, start * US, (end - start) * US)
    if steps:
        steps_line = plane.line(2, "Steps", EPOCH_NS)
        for number, start, end in steps:
            steps_line.event(str(number), start * US, (end - start) * US)
    if modules:
        modules_line = plane.line(3, "XLA Modules", EPOCH_NS)
        for start, end in modules:
            modules_line.event("jit_step(1)", start * US, (end - start) * US)


def annotations(space: XSpaceBuilder, starts: Sequence[int]) -> XPlaneBuilder:
    """The host plane with the job's step annotations, numbered from 0, at ``starts`` (us)."""
    plane = space.plane("/host:CPU", 100)
    line = plane.line(1, "python", EPOCH_NS)
    for number, start in enumerate(starts):
        line.event(STEP_ANNOTATION, start * US, 1 * US, {"step_num": number})
    return plane


def split(space: XSpaceBuilder) -> ProfiledSteps:
    result = split_steps(space.serialize())
    assert result is not None
    return result


def us(seconds: float) -> float:
    return round(seconds * 1e6, 6)


def parts(result: ProfiledSteps) -> list[float]:
    """Compute, exposed collective, overlapped collective, idle: means per step, us."""
    return [
        us(result.compute_s),
        us(result.exposed_collective_s),
        us(result.overlapped_collective_s),
        us(result.idle_s),
    ]


@pytest.mark.parametrize(
    ("name", "category", "collective"),
    [
        ("fusion.12", "all-reduce-scatter fusion", True),  # the name says nothing: the category does
        ("fusion.3", "all-gather fusion", True),
        ("convolution.4", "convolution", False),
        ("all-reduce.7", "all-reduce", True),
        ("all-reduce-done.1", "async-done", True),  # the category says async: the name says which
        ("copy-start.2", "async-start", False),
        ("copy-done", "copy-done", False),
        ("psum.1", None, True),  # no category: the name
        ("ncclDevKernel_AllReduce_Sum_f32_RING_LL", None, True),
        ("sm90_xmma_gemm_f32f32", None, False),
        ("all-reduce.1", "loop fusion", False),  # a category that says otherwise wins over the name
    ],
)
def test_an_op_is_a_collective_by_its_category_and_by_its_name_only_without_one(
    name: str, category: str | None, collective: bool
) -> None:
    assert is_collective_op(name, category) is collective


def test_the_halves_of_an_async_collective_are_told_by_name() -> None:
    assert async_half("all-reduce-start.3") == ("all-reduce", "start")
    assert async_half("all-reduce-done") == ("all-reduce", "done")
    assert async_half("collective-permute-done.12") == ("collective-permute", "done")
    assert async_half("copy-start.1") is None  # async, but no collective
    assert async_half("all-reduce.3") is None


def test_a_fusion_holding_a_collective_is_collective_time_and_counted_by_category() -> None:
    space = XSpaceBuilder()
    annotations(space, [0, 100])
    device(space, 0, [("fusion.1", "convolution fusion", 10, 50), ("fusion.2", "all-reduce-scatter fusion", 50, 80)])
    result = split(space)
    assert parts(result) == [40, 30, 0, 30]
    assert (result.ops_by_category, result.ops_by_name) == (2, 0)


def test_an_async_collective_in_flight_under_compute_is_overlapped_and_its_done_wait_exposed() -> None:
    # all-reduce-start at 10-12, compute 12-60 while it is in flight, the done waits 60-70 for the rest.
    space = XSpaceBuilder()
    annotations(space, [0, 100])
    device(
        space,
        0,
        [
            ("all-reduce-start.1", "async-start", 10, 12),
            ("fusion.1", "convolution fusion", 12, 60),
            ("all-reduce-done.1", "async-done", 60, 70),
            ("fusion.2", "loop fusion", 70, 90),
        ],
    )
    result = split(space)
    # Compute 48 + 20; exposed: the start's 2 and the done's 10; overlapped: the 48 in flight under compute.
    assert parts(result) == [68, 12, 48, 20]
    assert result.compute_s + result.exposed_collective_s + result.idle_s == pytest.approx(result.step_s)


def test_two_async_collectives_of_one_kind_in_flight_together_are_one_collective_time() -> None:
    space = XSpaceBuilder()
    annotations(space, [0, 100])
    device(
        space,
        0,
        [
            ("all-gather-start.1", "all-gather-start", 0, 1),
            ("all-gather-start.2", "all-gather-start", 1, 2),
            ("fusion.1", "loop fusion", 2, 40),
            ("all-gather-done.1", "all-gather-done", 40, 41),  # closes .1: in flight 0-41
            ("fusion.2", "loop fusion", 41, 80),
            ("all-gather-done.2", "all-gather-done", 80, 81),  # closes .2: in flight 1-81
        ],
    )
    result = split(space)
    assert parts(result) == [77, 4, 77, 19]


def test_an_op_counts_for_its_self_time_in_its_own_category() -> None:
    # A while (XProf: its self time is its own) encloses a fusion and an all-reduce: the loop's own 40 us is compute,
    # the all-reduce inside it collective, as XProf's op profile books them.
    space = XSpaceBuilder()
    annotations(space, [0, 100])
    device(
        space,
        0,
        [
            ("while.1", "control flow", 0, 80),
            ("fusion.1", "loop fusion", 10, 30),
            ("all-reduce.2", "all-reduce", 40, 60),
        ],
    )
    assert parts(split(space)) == [60, 20, 0, 20]


def test_an_op_that_outlasts_ops_it_began_inside_leaves_each_of_them_its_whole_time() -> None:
    # Ops on a line nest or follow; one that overlaps without nesting (here it starts inside a while and its body
    # op and outlasts both) is their neighbour, not their child: the while keeps all of its 100 us.
    space = XSpaceBuilder()
    annotations(space, [0, 200])
    device(
        space,
        0,
        [
            ("while.1", "control flow", 0, 100),
            ("fusion.1", "loop fusion", 10, 50),
            ("all-reduce.2", "all-reduce", 40, 120),
        ],
    )
    assert parts(split(space)) == [100, 20, 60, 80]


def test_a_devices_steps_line_gives_its_windows_and_a_step_begun_before_the_first_annotation_is_left_out() -> None:
    space = XSpaceBuilder()
    annotations(space, [50, 150, 250])  # the job's annotations: the device's steps lag them
    device(
        space,
        0,
        [
            ("fusion.1", "loop fusion", 0, 30),
            ("fusion.1", "loop fusion", 60, 100),
            ("fusion.1", "loop fusion", 160, 220),
        ],
        steps=[(6, 0, 40), (7, 60, 130), (8, 160, 260)],  # step 6 began before the capture's first annotation
    )
    result = split(space)
    assert result.windows_from == "device" and result.steps == 2
    assert [us(s.step_s) for s in result.per_step] == [70, 100]
    assert [us(s.compute_s) for s in result.per_step] == [40, 60]


def test_without_steps_or_annotations_each_program_run_is_a_window() -> None:
    # Batched inference: no step annotation, no Steps line; each run of the program is one.
    space = XSpaceBuilder()
    device(
        space,
        0,
        [("fusion.1", "loop fusion", 10, 60), ("fusion.1", "loop fusion", 110, 150)],
        modules=[(0, 80), (100, 160)],
    )
    result = split(space)
    assert result.windows_from == "module" and result.steps == 2
    assert [us(s.step_s) for s in result.per_step] == [80, 60]
    assert [us(s.idle_s) for s in result.per_step] == [30, 20]


def test_a_raw_gpu_capture_takes_its_kernels_from_its_stream_lines_told_by_name() -> None:
    space = XSpaceBuilder()
    annotations(space, [0, 100])
    plane = space.plane("/device:GPU:0", 1)
    compute, nccl = plane.line(1, "Stream #13(Compute)", EPOCH_NS), plane.line(2, "Stream #20(Nccl)", EPOCH_NS)
    compute.event("sm90_xmma_gemm", 10 * US, 40 * US)
    nccl.event("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 30 * US, 40 * US)
    plane.line(3, "Launch Stats", EPOCH_NS).event("cuLaunchKernel", 0, 100 * US)  # not a stream: not ops
    result = split(space)
    assert parts(result) == [40, 20, 20, 40]
    assert (result.ops_by_category, result.ops_by_name) == (0, 2)


def test_steps_are_per_step_in_time_order_and_the_means_are_theirs() -> None:
    space = XSpaceBuilder()
    annotations(space, [0, 100, 300, 350])
    device(
        space,
        0,
        [
            ("fusion.1", "loop fusion", 0, 10),
            ("all-reduce.1", "all-reduce", 100, 250),
            ("fusion.1", "loop fusion", 300, 340),
        ],
    )
    device(
        space,
        1,
        [
            ("fusion.1", "loop fusion", 0, 30),
            ("all-reduce.1", "all-reduce", 100, 150),
            ("fusion.1", "loop fusion", 300, 320),
        ],
    )
    result = split(space)
    assert [us(s.step_s) for s in result.per_step] == [100, 200, 50]
    assert [us(s.compute_s) for s in result.per_step] == [20, 0, 30]
    assert [us(s.exposed_collective_s) for s in result.per_step] == [0, 100, 0]
    assert [us(s.slowest_compute_s) for s in result.per_step] == [30, 0, 40]
    assert us(result.step_s) == pytest.approx(350 / 3) and us(result.exposed_collective_s) == pytest.approx(100 / 3)


# --- the fixtures: their truth, and XProf's reading of them ------------------------------------------------------

TOLERANCE = 0.05  # the issue's: within 5 % of XProf's figure (of the step, where XProf's is 0)


def within(ours_ms: float, xprofs_ms: float, step_ms: float) -> bool:
    return abs(ours_ms - xprofs_ms) <= TOLERANCE * (xprofs_ms or step_ms)


def ms(seconds: float) -> float:
    return seconds * 1e3


def assert_matches_truth(result: ProfiledSteps, truth: Sequence[fixtures.Split]) -> None:
    """Ours per step against the worked-out truth: exact (the last step of a GPU capture closes no window)."""
    assert result.steps >= 4
    # A GPU's last step closes no window (its window runs to the next step's first kernel): one fewer.
    assert result.steps in (len(truth), len(truth) - 1)
    for step, expected in zip(result.per_step, truth[: result.steps], strict=True):
        assert [round(us(x)) for x in (step.step_s, step.compute_s, step.exposed_collective_s,
                step.overlapped_collective_s, step.idle_s)] == [expected.step, expected.compute, expected.exposed,
                expected.overlapped, expected.idle]  # fmt: skip


def assert_agrees_with_xprof_tpu(result: ProfiledSteps, xprof: dict[str, Any], cores: int) -> list[str]:
    """TPU: per step, XProf's TensorCore compute is every op (ours compute + exposed collective) and its idle ours;
    over the capture, op_profile's collective categories are our exposed collective and the rest our compute."""
    said = []
    steps = xprof["steps"]
    assert len(steps) == result.steps
    for ours, theirs in zip(result.per_step, steps, strict=True):
        step = theirs["stepTimeMs"]
        for what, mine, xprofs in [
            ("step", ms(ours.step_s), step),
            ("busy", ms(ours.compute_s + ours.exposed_collective_s), theirs["tcComputeTimeMs"]),
            ("idle", ms(ours.idle_s), theirs["tcIdleTimeMs"]),
        ]:
            assert within(mine, xprofs, step), (what, mine, xprofs)
    categories = xprof["categories_ms"]
    core_steps = cores * result.steps
    collective = sum(t for category, t in categories.items() if category in XPROF_COLLECTIVE_CATEGORIES) / core_steps
    compute = sum(t for category, t in categories.items() if category != IDLE_CATEGORY) / core_steps - collective
    step = ms(result.step_s)
    assert within(ms(result.exposed_collective_s), collective, step), (ms(result.exposed_collective_s), collective)
    assert within(ms(result.compute_s), compute, step), (ms(result.compute_s), compute)
    said.append(f"compute {ms(result.compute_s):.3f} vs op_profile {compute:.3f} ms, exposed collective "
                f"{ms(result.exposed_collective_s):.3f} vs {collective:.3f} ms")  # fmt: skip
    return said


def assert_agrees_with_xprof_gpu(result: ProfiledSteps, xprof: dict[str, Any], gpus: int) -> list[str]:
    """GPU: per step, XProf's device compute, device collectives and "all others" are our compute, exposed
    collective and idle; the NCCL kernels' whole time (kernel_stats) less the exposed is our overlapped."""
    steps = xprof["steps"]
    for ours, theirs in zip(result.per_step, steps, strict=False):  # ours: the last step closes no window
        step = theirs["stepTimeMs"]
        for what, mine, xprofs in [
            ("step", ms(ours.step_s), step),
            ("compute", ms(ours.compute_s), theirs["deviceComputeTimeMs"]),
            ("exposed collective", ms(ours.exposed_collective_s), theirs["deviceCollectivesTimeMs"]),
            ("idle", ms(ours.idle_s), theirs["otherTimeMs"]),
        ]:
            assert within(mine, xprofs, step), (what, mine, xprofs)
    nccl = sum(t for kernel, t in xprof["kernels_ms"].items() if kernel.lower().startswith("nccl")) / (
        gpus * len(steps)
    )
    overlapped = nccl - sum(s["deviceCollectivesTimeMs"] for s in steps) / len(steps)
    assert within(ms(result.overlapped_collective_s), overlapped, ms(result.step_s))
    return [
        f"overlapped {ms(result.overlapped_collective_s):.3f} vs kernel_stats' NCCL less exposed {overlapped:.3f} ms"
    ]


@pytest.mark.parametrize("name", ["tpu_async_all_reduce", "tpu_fused_reduce_scatter", "multi_host", "gpu_nccl_streams"])
def test_a_fixture_splits_as_its_truth_and_as_xprofs_converters_read_it(name: str) -> None:
    fixture: fixtures.Fixture = getattr(fixtures, name)()
    for host, data in fixture.hosts.items():
        result = split_steps(data)
        assert result is not None
        assert result.windows_from == "device"  # the TPU's Steps line; the GPU's kernels, by the step that launched
        assert_matches_truth(result, fixture.truth[host])
        xprof = xprof_split({host: data}, verbose=False)
        if xprof["hardware"] == "TPU":
            said = assert_agrees_with_xprof_tpu(result, xprof, cores=2)
            assert result.ops_by_category > 0 and result.ops_by_name == 0  # libtpu's ops carry their category
        else:
            said = assert_agrees_with_xprof_gpu(result, xprof, gpus=2)
            assert result.ops_by_category == 0 and result.ops_by_name > 0  # CUPTI's kernels carry no category
        print(f"{name} {host}: {result.steps} steps on {result.devices} devices, step {ms(result.step_s):.3f} ms;",
              "; ".join(said))  # fmt: skip


def test_the_straggler_host_computes_more_and_waits_less_than_its_peer() -> None:
    fixture = fixtures.multi_host()
    prompt, straggler = (split_steps(fixture.hosts[host]) for host in ("tpu-host-0", "tpu-host-1"))
    assert prompt is not None and straggler is not None
    assert straggler.compute_s > 1.2 * prompt.compute_s
    assert straggler.exposed_collective_s < prompt.exposed_collective_s / 3


def test_where_a_gpu_idles_between_steps_ours_counts_the_gap_in_the_step_and_xprof_leaves_it_out() -> None:
    """XProf takes a GPU step from its first kernel to its last; ours runs to the next step's first kernel, so the GPU
    idling between two steps (waiting for the host, the input) is in our step and its idle. The rest agrees."""
    gap_ms = 1.0  # the last kernel then runs [10000, 11000) of a step of 12000 or more: still after the others
    fixture = fixtures.gpu_nccl_streams(gap_us=round(gap_ms * 1000))
    [(host, data)] = fixture.hosts.items()
    result = split_steps(data)
    assert result is not None and result.windows_from == "device"
    assert_matches_truth(result, fixture.truth[host])  # the gap moved within the window: the same split
    xprof = xprof_split({host: data}, verbose=False)
    for ours, theirs in zip(result.per_step, xprof["steps"], strict=False):
        step = theirs["stepTimeMs"]
        assert within(ms(ours.step_s), step + gap_ms, step)
        assert within(ms(ours.idle_s), theirs["otherTimeMs"] + gap_ms, step)
        assert within(ms(ours.compute_s), theirs["deviceComputeTimeMs"], step)
        assert within(ms(ours.exposed_collective_s), theirs["deviceCollectivesTimeMs"], step)


def test_kernels_launched_from_a_runtime_thread_go_to_the_step_begun_last_before_their_launch() -> None:
    fixture = fixtures.gpu_nccl_streams(runtime_thread=True)
    [(host, data)] = fixture.hosts.items()
    result = split_steps(data)
    assert result is not None and result.windows_from == "device"
    assert_matches_truth(result, fixture.truth[host])


def test_a_gpus_copies_are_not_compute_and_every_device_takes_its_windows_from_one_source() -> None:
    space = XSpaceBuilder()
    annotations(space, [0, 100, 200])
    for ordinal in (0, 1):
        plane = space.plane(f"/device:GPU:{ordinal}", ordinal + 1)
        plane.line(1, "Stream #7(MemcpyH2D)", EPOCH_NS).event("MemcpyH2D", 0, 40 * US)
        kernels = plane.line(2, "Stream #8(Compute)", EPOCH_NS)
        for start in (50, 150):
            kernels.event("sm90_xmma_gemm", start * US, 20 * US)
    # Device 0 also has a Steps line; device 1 has none: both are measured on the host's windows, numbered alike.
    steps = space.plane("/device:GPU:0", 1).line(3, "Steps", EPOCH_NS)
    steps.event("0", 0, 100 * US)
    result = split(space)
    assert result.windows_from == "annotation" and (result.steps, result.devices) == (2, 2)
    assert [us(s.compute_s) for s in result.per_step] == [20, 20]  # the copy is the host's input: idle


# --- a raw GPU capture, and program runs across devices ---------------------------------------------------------


@pytest.mark.parametrize("unmerged", [False, True], ids=["saved", "unmerged"])
def test_a_raw_gpu_capture_groups_kernels_by_the_step_that_launched_them(unmerged: bool) -> None:
    """Launches named after their kernels (``void cutlass::Kernel2<...>(...)``), on the launching thread's line of
    ``/host:CPU`` (a saved capture) or of ``/host:CUPTI`` (the tracer's own planes): each kernel is in the step whose
    annotation its launch nests in, whatever its name. XProf groups the saved shape the same way; it does not group
    the unmerged one (to XProf, ``/host:CUPTI`` is no host plane), so that one is ours alone."""
    fixture = fixtures.gpu_raw_capture(unmerged=unmerged)
    [(host, data)] = fixture.hosts.items()
    result = split_steps(data)
    assert result is not None
    assert result.windows_from == "device"  # the kernels by the step that launched them, not the host's windows
    assert_matches_truth(result, fixture.truth[host])
    assert result.ops_by_category == 0 and result.ops_by_name > 0
    if unmerged:
        return
    # XProf's step runs from the step's first kernel to its last: the GPU's idle after the last is not in it
    xprof = xprof_split({host: data}, verbose=False)
    tail_ms = fixtures.RAW_TAIL_US / 1000
    assert len(xprof["steps"]) == len(fixture.truth[host])
    for ours, theirs in zip(result.per_step, xprof["steps"], strict=False):  # ours: the last step closes no window
        step = theirs["stepTimeMs"]
        assert within(ms(ours.step_s), step + tail_ms, step)
        assert within(ms(ours.compute_s), theirs["deviceComputeTimeMs"], step)
        assert within(ms(ours.exposed_collective_s), theirs["deviceCollectivesTimeMs"], step)
        assert within(ms(ours.idle_s), theirs["otherTimeMs"] + tail_ms, step)


PROGRAM_IDS = {"init": 9646411105960254074, "step": 12190760917235803885}  # XLA's fingerprints: all 64 bits


def _cores_running(space: XSpaceBuilder, runs: dict[int, list[tuple[str, int, int, int]]], named: str) -> None:
    """TPU cores, each with its program runs on its "XLA Modules" line, (program, start us, end us, compute us from
    the start), numbered by libtpu's per-core ``run_id``; ``named``: how a run says its program (``"name"``: by its
    name, ``jit_step(12190760917235803885)``, as libtpu names it; ``"metadata"``: a ``program_id`` stat of the run's
    metadata; ``"event"``: one of the run's own, each run named ``jit_f`` whatever its program, as a function traced
    anew for other shapes is; ``"module"``: not at all, the module's name alone)."""
    for ordinal, core_runs in runs.items():
        plane = space.plane(f"/device:TPU:{ordinal}", ordinal + 1)
        ops, modules = plane.line(1, "XLA Ops", EPOCH_NS), plane.line(2, "XLA Modules", EPOCH_NS)
        plane.event_metadata("fusion.1", {"hlo_category": "loop fusion"})
        for program in {run[0] for run in core_runs} if named == "metadata" else ():
            plane.event_metadata(f"jit_{program}", {"program_id": Uint(PROGRAM_IDS[program])})
        for run_id, (program, start, end, compute) in enumerate(core_runs, start=1):
            module = {"name": f"jit_{program}({PROGRAM_IDS[program]})", "event": "jit_f"}.get(named, f"jit_{program}")
            stats = {"run_id": Uint(run_id), **({"program_id": Uint(PROGRAM_IDS[program])} if named == "event" else {})}
            modules.event(module, start * US, (end - start) * US, stats)
            ops.event("fusion.1", start * US, compute * US)


@pytest.mark.parametrize("named", ["name", "metadata", "event", "module"])
def test_program_runs_meet_across_cores_by_program_and_run_not_by_position(named: str) -> None:
    # Core 0 runs a program the other core does not (an initialization) before the three runs of the step both run;
    # libtpu numbers each core's runs (run_id) on its own, so core 0's step runs are its runs 2 to 4, core 1's 1 to 3.
    space = XSpaceBuilder()
    _cores_running(
        space,
        {
            0: [("init", 0, 10, 10), ("step", 20, 60, 30), ("step", 70, 90, 15), ("step", 100, 150, 40)],
            1: [("step", 20, 70, 40), ("step", 70, 100, 10), ("step", 100, 140, 30)],
        },
        named,
    )
    result = split(space)
    assert result.windows_from == "module"
    assert [(d.device, d.steps) for d in result.per_device] == [(0, 4), (1, 3)]  # the init is core 0's alone
    # in time order: the init (core 0 alone), then the step's three runs, each the mean of both cores' k-th run
    assert [us(s.step_s) for s in result.per_step] == [10, 45, 25, 45]
    assert [us(s.compute_s) for s in result.per_step] == [10, 35, 12.5, 35]
    assert [us(s.slowest_compute_s) for s in result.per_step] == [10, 40, 15, 40]
