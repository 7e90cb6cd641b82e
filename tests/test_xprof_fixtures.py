"""XProf reads each fixture of tests/xplane_fixtures.py as its ground truth says (within 5 %).

This proves the fixtures realistic enough for XProf's own analysis: it finds the steps (grouping them from the raw
capture itself, as from a real one), times them, and splits them. Which XProf figure is which of our parts:

- TPU, input pipeline's step graph: ``tcIdleTimeMs`` = idle; ``tcComputeTimeMs`` = compute + exposed collective
  (XProf's TensorCore compute is every op, collectives too). XProf has no overlapped figure on TPU: the time between
  an all-reduce-start and its done is not an op. op_profile's categories split the op time: the collective
  categories = exposed collective, the rest = compute, ``IDLE`` = idle (summed over cores and steps).
- GPU, step graph: ``deviceComputeTimeMs`` = compute (union of compute kernels over the GPUs),
  ``deviceCollectivesTimeMs`` = exposed collective (NCCL time no compute covers: compute has priority),
  ``otherTimeMs`` ("All others") = idle; overlapped = the NCCL kernels' whole time (kernel_stats) minus the exposed.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import xplane_fixtures as fixtures
from xprof_reference import IDLE_CATEGORY, XPROF_COLLECTIVE_CATEGORIES, xprof_split

TOLERANCE = 0.05
TPU_CORES = GPUS = 2


def _close(actual: float, expected: float, step: float) -> bool:
    """Within 5 % of the expected value; for an expected zero, within 5 % of the step."""
    return abs(actual - expected) <= TOLERANCE * (expected or step)


def _assert_close(what: str, actual: float, expected: float, step: float) -> None:
    assert _close(actual, expected, step), f"{what}: XProf {actual:.3f} ms, ground truth {expected:.3f} ms"


def _ms(us: int) -> float:
    return us / 1000


def _mean(values: Iterable[float]) -> float:
    listed = list(values)
    return sum(listed) / len(listed)


def _assert_tpu_steps(split: dict[str, object], truth: list[fixtures.Split]) -> None:
    steps = split["steps"]
    assert isinstance(steps, list)
    assert split["hardware"] == "TPU"
    assert len(steps) == len(truth)
    for step, expected in zip(steps, truth, strict=True):
        name = f"step {step['stepnum']}"
        period = _ms(expected.step)
        _assert_close(f"{name} step time", step["stepTimeMs"], period, period)
        _assert_close(f"{name} TensorCore compute", step["tcComputeTimeMs"], _ms(expected.compute + expected.exposed),
                      period)  # fmt: skip
        _assert_close(f"{name} TensorCore idle", step["tcIdleTimeMs"], _ms(expected.idle), period)


def _assert_tpu_categories(split: dict[str, object], truth: list[fixtures.Split], cores: int) -> None:
    """op_profile's totals over cores and steps, per core and step, against the ground truth's mean."""
    categories = split["categories_ms"]
    assert isinstance(categories, dict)
    core_steps = cores * len(truth)
    collective = sum(ms for category, ms in categories.items() if category in XPROF_COLLECTIVE_CATEGORIES)
    idle = categories.get(IDLE_CATEGORY, 0.0)
    compute = sum(categories.values()) - collective - idle
    period = _ms(round(_mean(split.step for split in truth)))
    _assert_close("op_profile compute", compute / core_steps, _ms(round(_mean(s.compute for s in truth))), period)
    _assert_close("op_profile collectives", collective / core_steps, _ms(round(_mean(s.exposed for s in truth))),
                  period)  # fmt: skip
    _assert_close("op_profile idle", idle / core_steps, _ms(round(_mean(s.idle for s in truth))), period)


def test_tpu_async_all_reduce_reads_as_its_ground_truth() -> None:
    fixture = fixtures.tpu_async_all_reduce()
    split = xprof_split(fixture.hosts)
    truth = fixture.truth["tpu-host-0"]
    _assert_tpu_steps(split, truth)
    _assert_tpu_categories(split, truth, TPU_CORES)
    # the async pair is two ops of their own categories; the compute between them is not collective time to XProf
    categories = split["categories_ms"]
    assert isinstance(categories, dict)
    assert {"all-reduce-start", "all-reduce-done"} <= set(categories)


def test_tpu_fused_reduce_scatter_counts_as_collective_by_its_category() -> None:
    fixture = fixtures.tpu_fused_reduce_scatter()
    split = xprof_split(fixture.hosts)
    truth = fixture.truth["tpu-host-0"]
    _assert_tpu_steps(split, truth)
    _assert_tpu_categories(split, truth, TPU_CORES)
    categories = split["categories_ms"]
    assert isinstance(categories, dict)
    _assert_close("all-reduce-scatter fusion", categories["all-reduce-scatter fusion"],
                  _ms(TPU_CORES * sum(s.exposed for s in truth)), _ms(truth[0].step))  # fmt: skip


def test_multi_host_straggler_shows_as_its_peers_all_reduce() -> None:
    fixture = fixtures.multi_host()
    both = xprof_split(fixture.hosts)
    # together: XProf lines the hosts' steps up; its TensorCore compute is the minimum over the four cores
    _assert_tpu_steps(both, fixture.truth["tpu-host-0"])
    _assert_tpu_categories(both, [*fixture.truth["tpu-host-0"], *fixture.truth["tpu-host-1"]], TPU_CORES)
    # each host alone: the prompt host's all-reduce holds the wait for the straggler
    for host, truth in fixture.truth.items():
        alone = xprof_split({host: fixture.hosts[host]})
        _assert_tpu_steps(alone, truth)
        _assert_tpu_categories(alone, truth, TPU_CORES)


def _gpu_steps(fixture: Any) -> tuple[dict[str, Any], list[dict[str, Any]], list[Any]]:
    """XProf's split of a GPU fixture's host, its step rows (one per step of the fixture's truth), and the truth."""
    split = xprof_split(fixture.hosts)
    truth = fixture.truth["gpu-host-0"]
    steps = split["steps"]
    assert isinstance(steps, list)
    assert split["hardware"] == "GPU"
    assert len(steps) == len(truth)
    return split, steps, truth


def test_gpu_nccl_streams_reads_as_its_ground_truth() -> None:
    split, steps, truth = _gpu_steps(fixtures.gpu_nccl_streams())
    for step, expected in zip(steps, truth, strict=True):
        name = f"step {step['stepnum']}"
        period = _ms(expected.step)
        _assert_close(f"{name} step time", step["stepTimeMs"], period, period)
        _assert_close(f"{name} device compute", step["deviceComputeTimeMs"], _ms(expected.compute), period)
        _assert_close(f"{name} device collectives", step["deviceCollectivesTimeMs"], _ms(expected.exposed), period)
        _assert_close(f"{name} all others", step["otherTimeMs"], _ms(expected.idle), period)
    kernels = split["kernels_ms"]
    assert isinstance(kernels, dict)
    nccl = sum(ms for kernel, ms in kernels.items() if kernel.lower().startswith("nccl")) / (GPUS * len(truth))
    exposed = _mean(step["deviceCollectivesTimeMs"] for step in steps)
    _assert_close("NCCL time under compute", nccl - exposed, _ms(truth[0].overlapped), _ms(truth[0].step))


def test_gpu_raw_capture_is_grouped_by_xprof_as_a_saved_capture_is() -> None:
    """The raw shape (launches named after their kernels, on the launching thread's /host:CPU line; no group_id, no
    derived lines): XProf groups it itself, each step from its first kernel to its last (so the tail after the last
    kernel is neither in its step time nor in its "All others")."""
    _, steps, truth = _gpu_steps(fixtures.gpu_raw_capture())
    tail = fixtures.RAW_TAIL_US
    for step, expected in zip(steps, truth, strict=True):
        name = f"step {step['stepnum']}"
        period = _ms(expected.step - tail)
        _assert_close(f"{name} step time", step["stepTimeMs"], period, period)
        _assert_close(f"{name} device compute", step["deviceComputeTimeMs"], _ms(expected.compute), period)
        _assert_close(f"{name} device collectives", step["deviceCollectivesTimeMs"], _ms(expected.exposed), period)
        _assert_close(f"{name} all others", step["otherTimeMs"], _ms(expected.idle - tail), period)
