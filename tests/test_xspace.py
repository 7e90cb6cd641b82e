"""The split of a device trace into compute, exposed and overlapped collective, and idle
(tpuscope.exporter.profiles.xspace, which the sidecar runs on each trace a job hands it).

Three layers: collectives told by name; hand-built XSpaces (a text proto turned into bytes by jax) for the step
windows, the leaf ops and the device planes; and real captures of a data-parallel step on 8 CPU devices, checked
against an independent reading of the same trace. The interval algebra beneath is tested on its own
(tests/test_intervals.py).

Why not XProf's own converter as the independent reading here: on a CPU-only trace its overview page files every
step as host compute (hardware type CPU_ONLY: device compute and collectives 0), and its op stats show only IDLE, so it
has nothing to compare with. On TPU and GPU traces it has: tests/test_xspace_devices.py compares the two there.

The test's own reading differs from the module's where it can: containers and collectives told by the opcodes of the
compiled HLO rather than by nesting and names, and one sweep over op edges counting the ops running at each moment
rather than unions and differences of intervals.
"""

from __future__ import annotations

import bisect
import itertools
import json
import os
import re
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tpuscope.events import STEP_ANNOTATION
from tpuscope.exporter.profiles.xspace import ProfiledSteps, is_collective, split_steps

# --- telling ops apart -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "collective"),
    [
        ("all-reduce", True),
        ("all-reduce.3", True),
        ("all-reduce-start.1", True),
        ("psum.7", True),
        ("psum_invariant.28", True),
        ("all_gather.3", True),
        ("all-gather-done", True),
        ("reduce_scatter.7", True),
        ("ppermute.3", True),
        ("all-to-all", True),
        ("ragged-all-to-all.2", True),
        ("collective-permute", True),
        ("pmax.1", True),
        ("ncclDevKernel_AllReduce_Sum_f32_RING_LL", True),
        ("dot.1", False),
        ("ynn_fusion.2", False),
        ("wrapped_tanh", False),
        ("multiply_add_fusion", False),
        ("reduce.4", False),
        ("while.9", False),
        ("psummary", False),
    ],
)
def test_collectives_are_told_by_name(name: str, collective: bool) -> None:
    assert is_collective(name) is collective


# --- hand-built traces -------------------------------------------------------------------------------------------

# An event of a hand-built trace: (name, start us, end us, stats).
Event = tuple[str, float, float, dict[str, int | str]]


def step(number: int | None, start: float) -> Event:
    """A step annotation lasting 1 us (its length does not matter: windows run start to start)."""
    return (STEP_ANNOTATION, start, start + 1, {} if number is None else {"step_num": number})


def op(name: str, start: float, end: float, device: int = 0) -> Event:
    """An XLA thunk of the CPU backend."""
    return (name, start, end, {"hlo_op": name, "device_ordinal": device, "hlo_module": "jit_step"})


def xspace(planes: dict[str, dict[str, list[Event]]]) -> bytes:
    """Serialized XSpace bytes from {plane: {line: events}}, through the text proto jax can read."""
    from jax.profiler import ProfileData

    text = []
    for p, (plane, lines) in enumerate(planes.items(), 1):
        names = sorted({event[0] for events in lines.values() for event in events})
        stat_names = sorted({stat for events in lines.values() for event in events for stat in event[3]})
        body = []
        for line_id, (line, events) in enumerate(lines.items(), 1):
            rendered = []
            for name, start, end, stats in events:
                values = " ".join(
                    f"stats {{ metadata_id: {stat_names.index(k) + 1} "
                    f"{'int64_value' if isinstance(v, int) else 'str_value'}: {json.dumps(v)} }}"
                    for k, v in stats.items()
                )
                rendered.append(
                    f"events {{ metadata_id: {names.index(name) + 1} offset_ps: {round(start * 1e6)} "
                    f"duration_ps: {round((end - start) * 1e6)} {values} }}"
                )
            body.append(f'lines {{ id: {line_id} name: "{line}" timestamp_ns: 0 {" ".join(rendered)} }}')
        body += [f'event_metadata {{ key: {i} value {{ id: {i} name: "{n}" }} }}' for i, n in enumerate(names, 1)]
        body += [f'stat_metadata {{ key: {i} value {{ id: {i} name: "{n}" }} }}' for i, n in enumerate(stat_names, 1)]
        text.append(f'planes {{ id: {p} name: "{plane}" {" ".join(body)} }}')
    serialized: bytes = ProfileData.text_proto_to_serialized_xspace("\n".join(text))
    return serialized


def host(*lines: list[Event]) -> bytes:
    """A CPU-backend trace: the steps and the thunks on /host:CPU thread lines."""
    return xspace({"/host:CPU": {f"thread{i}": events for i, events in enumerate(lines)}})


def us(seconds: float) -> float:
    return round(seconds * 1e6, 6)


def assert_adds_up(split: ProfiledSteps) -> None:
    assert split.compute_s + split.exposed_collective_s + split.idle_s == pytest.approx(split.step_s, rel=1e-9)
    for device in split.per_device:
        assert device.compute_s + device.exposed_collective_s + device.idle_s == pytest.approx(device.step_s, rel=1e-9)


def test_one_device_split_by_hand() -> None:
    # One window, [100, 200): step 2 only closes it.
    trace = host(
        [step(1, 100), step(2, 200)],
        [
            op("dot", 110, 140),  # compute 30
            op("all-reduce", 130, 160),  # 10 under the dot, 20 exposed
            op("fusion", 170, 180),  # compute 10; idle: 100 - 40 - 20 = 40
        ],
    )
    split = split_steps(trace)
    assert split is not None
    assert (split.steps, split.devices) == (1, 1)
    assert [us(x) for x in (split.step_s, split.compute_s, split.exposed_collective_s)] == [100, 40, 20]
    assert [us(split.overlapped_collective_s), us(split.idle_s), us(split.slowest_compute_s)] == [10, 40, 40]
    assert_adds_up(split)


def test_ops_straddling_a_window_edge_are_clipped() -> None:
    trace = host(
        [step(1, 100), step(2, 200), step(3, 300)],
        [op("dot", 80, 120), op("psum.1", 190, 230), op("fusion", 290, 320)],
    )
    split = split_steps(trace)
    assert split is not None and split.steps == 2
    # Window [100, 200): dot 20 + psum 10; window [200, 300): psum 30 + fusion 10. Means per step:
    assert [us(split.compute_s), us(split.exposed_collective_s), us(split.idle_s)] == [15, 20, 65]
    assert us(split.slowest_compute_s) == 15
    assert_adds_up(split)


def test_every_window_is_measured_unless_skip_first_leaves_some_out() -> None:
    # The job annotates only steps whose windows its session saw whole: by default none is left out.
    trace = host([step(0, 0), step(1, 100), step(2, 200)], [op("dot", 50, 60), op("dot", 150, 180)])
    split = split_steps(trace)
    assert split is not None and split.steps == 2
    assert us(split.compute_s) == 20
    left = split_steps(trace, skip_first=1)
    assert left is not None and left.steps == 1 and us(left.compute_s) == 30


def test_too_few_steps_or_no_op_give_none() -> None:
    ops = [op("dot", 10, 20)]
    assert split_steps(host([step(0, 0)], ops)) is None  # one annotation closes no window
    assert split_steps(host([step(0, 0), step(1, 100)], ops)) is not None
    assert split_steps(host([step(0, 0), step(1, 100)], ops), skip_first=1) is None  # its only window left out
    assert split_steps(host([step(0, 0), step(1, 100), step(2, 200)])) is None  # no device op at all
    assert split_steps(host(ops)) is None  # no step


def test_an_annotation_without_step_num_is_not_a_step() -> None:
    trace = host([step(None, 150), step(1, 100), step(2, 200)], [op("dot", 100, 150)])
    split = split_steps(trace)
    assert split is not None and split.steps == 1
    assert us(split.step_s) == 100 and us(split.compute_s) == 50


def test_steps_are_windowed_in_time_order_and_a_repeated_number_counts_once() -> None:
    # Listed out of order, one step annotated twice (from two threads): the windows follow the timeline.
    trace = host([step(2, 200), step(1, 100)], [step(1, 130)], [op("dot", 150, 170)])
    split = split_steps(trace)
    assert split is not None and split.steps == 1
    assert us(split.step_s) == 100 and us(split.compute_s) == 20


def test_a_control_flow_op_counts_only_the_ops_it_encloses() -> None:
    # A while thunk runs its body inline on its thread: its own span would count the loop's gaps as compute.
    trace = host(
        [step(1, 100), step(2, 200)],
        [op("while.9", 110, 190), op("ynn_fusion", 120, 130), op("wrapped_add", 140, 150), op("psum.2", 160, 170)],
    )
    split = split_steps(trace)
    assert split is not None
    assert [us(split.compute_s), us(split.exposed_collective_s), us(split.idle_s)] == [20, 10, 70]


def test_an_op_enclosing_only_another_devices_op_still_counts() -> None:
    trace = host([step(1, 100), step(2, 200)], [op("dot", 110, 190, device=0), op("dot", 120, 130, device=1)])
    split = split_steps(trace)
    assert split is not None and split.devices == 2
    assert [us(d.compute_s) for d in split.per_device] == [80, 10]


def test_a_devices_ops_are_gathered_over_threads() -> None:
    # A program's thunks hop threads after a rendezvous; per device, ops on two lines overlap in time.
    trace = host(
        [step(1, 100), step(2, 200)],
        [op("dot", 110, 150, device=3)],
        [op("fusion", 130, 160, device=3), op("all-reduce", 150, 180, device=3)],
    )
    split = split_steps(trace)
    assert split is not None and split.devices == 1
    assert [us(split.compute_s), us(split.exposed_collective_s), us(split.overlapped_collective_s)] == [50, 20, 10]


def test_per_device_and_slowest_compute() -> None:
    trace = host(
        [step(1, 100), step(2, 200), step(3, 300)],
        # Device 0 computes 60 then 20; device 1 computes 30 then 40, and waits at the all-reduce for the rest.
        [op("dot", 100, 160, 0), op("all-reduce", 160, 170, 0), op("dot", 200, 220, 0), op("all-reduce", 220, 260, 0)],
        [op("dot", 100, 130, 1), op("all-reduce", 130, 170, 1), op("dot", 200, 240, 1), op("all-reduce", 240, 260, 1)],
    )
    split = split_steps(trace)
    assert split is not None and (split.steps, split.devices) == (2, 2)
    assert [(d.device, us(d.compute_s), us(d.exposed_collective_s)) for d in split.per_device] == [
        (0, 40, 25),
        (1, 35, 30),
    ]
    assert us(split.compute_s) == 37.5
    assert us(split.slowest_compute_s) == 50  # max(60, 30) and max(20, 40), averaged
    assert_adds_up(split)


def test_device_planes_take_their_ops_lines_and_leave_the_host_thunks_out() -> None:
    steps = [step(1, 100), step(2, 200)]
    trace = xspace(
        {
            "/host:CPU": {"python": steps, "thunks": [op("dot", 100, 200, device=0)]},  # would double count
            "/device:TPU:0": {
                "XLA Modules": [("jit_step", 100, 190, {})],
                "XLA Ops": [("fusion.1", 110, 130, {}), ("all-reduce.2", 120, 150, {})],
            },
            "/device:GPU:1": {  # a raw GPU capture: kernels on streams, NCCL ones collective
                "Stream #13(Compute)": [("gemm_kernel", 110, 140, {})],
                "Stream #20(Nccl)": [("ncclDevKernel_AllReduce_Sum_f32", 130, 170, {})],
                "Launch Stats": [("cuLaunchKernel", 100, 200, {})],
            },
        }
    )
    split = split_steps(trace)
    assert split is not None and split.devices == 2
    assert [(d.device, us(d.compute_s), us(d.exposed_collective_s), us(d.overlapped_collective_s)) for d in
            split.per_device] == [(0, 20, 20, 10), (1, 30, 30, 10)]  # fmt: skip


# --- real captures: a data-parallel step on 8 CPU devices --------------------------------------------------------

# Captures two programs, 4 annotated steps each, with the public profiler API and the Python tracer off (as the
# Monitor's capture runs). Each step blocks until done, as a loop that reads its loss every step does: with only 4
# steps, a loop that dispatches ahead has not reached the steady state that step-start windows measure.
# "straggler" is the same step with device 5 doing STRAGGLE extra matmuls first (a loop whose trip count depends on
# the device index), so its peers wait for it at the all-reduce.
CAPTURE = r"""
import glob, os, sys
import jax, jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from tpuscope.events import STEP_ANNOTATION

out, slow_device, straggle = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
mesh = Mesh(jax.devices(), ("d",))
width, rows = 256, 64

def loss(params, x):
    return jnp.mean((jnp.tanh(x @ params[0]) @ params[1]) ** 2)

def make_step(slow_device, extra):
    def local_step(params, x):
        grads = jax.grad(loss)(params, x)
        trips = jnp.where(jax.lax.axis_index("d") == slow_device, extra, 0)
        busy = jax.lax.fori_loop(0, trips, lambda i, a: jnp.tanh(a @ params[0]), x)
        grads = jax.lax.pmean([g + 0 * jnp.mean(busy) for g in grads], "d")
        return [p - 0.01 * g for p, g in zip(params, grads)]
    return jax.jit(jax.shard_map(local_step, mesh=mesh, in_specs=(P(), P("d")), out_specs=P()))

params = jax.device_put([jnp.full((width, width), 0.01)] * 2, NamedSharding(mesh, P()))
x = jax.device_put(jnp.ones((8 * rows, width)), NamedSharding(mesh, P("d")))
options = jax.profiler.ProfileOptions()
options.python_tracer_level = 0
for name, extra in (("balanced", 0), ("straggler", straggle)):
    step = make_step(slow_device, extra)
    params = jax.block_until_ready(step(params, x))  # compiled and warm before the capture
    hlo = step.lower(params, x).compile().as_text()
    jax.profiler.start_trace(os.path.join(out, name), profiler_options=options)
    for n in range(4):
        with jax.profiler.StepTraceAnnotation(STEP_ANNOTATION, step_num=n):
            params = jax.block_until_ready(step(params, x))
    jax.profiler.stop_trace()
    [path] = glob.glob(os.path.join(out, name, "plugins", "profile", "*", "*.xplane.pb"))
    os.replace(path, os.path.join(out, name + ".xplane.pb"))
    with open(os.path.join(out, name + ".hlo"), "w") as f:
        f.write(hlo)

# The bench's own fused step (tpuscope workload --fused: default model, 8 devices), captured the same way.
import numpy as np
from tpuscope.workload.model import DataParallelTrainer
trainer = DataParallelTrainer()
state = trainer.init_state()
batch = trainer.put_batch(np.arange(trainer.global_batch * 64).reshape(trainer.global_batch, 64) % 256)
state, _ = trainer.fused_step(state, batch)
hlo = trainer._fused_step.lower(state, batch).compile().as_text()
jax.profiler.start_trace(os.path.join(out, "bench"), profiler_options=options)
for n in range(4):
    with jax.profiler.StepTraceAnnotation(STEP_ANNOTATION, step_num=n):
        state, _ = trainer.fused_step(state, batch)
jax.profiler.stop_trace()
[path] = glob.glob(os.path.join(out, "bench", "plugins", "profile", "*", "*.xplane.pb"))
os.replace(path, os.path.join(out, "bench.xplane.pb"))
with open(os.path.join(out, "bench.hlo"), "w") as f:
    f.write(hlo)
"""
STRAGGLER = 5
STRAGGLE = 30  # extra 64x256x256 matmuls on the straggler: a few ms, several times a peer's compute


@dataclass(frozen=True)
class Capture:
    xspace: bytes
    opcodes: dict[str, str]  # HLO instruction name -> opcode, from the compiled program


@pytest.fixture(scope="module")
def captures(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Capture]:
    out = tmp_path_factory.mktemp("xspace")
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=8", "JAX_PLATFORMS": "cpu"}
    run = subprocess.run(
        [sys.executable, "-c", CAPTURE, str(out), str(STRAGGLER), str(STRAGGLE)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    return {
        name: Capture((out / f"{name}.xplane.pb").read_bytes(), hlo_opcodes((out / f"{name}.hlo").read_text()))
        for name in ("balanced", "straggler", "bench")
    }


# "%name = type opcode(" (or "ROOT %name = ..."): the first lowercase word followed by "(" after the "=".
HLO_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*.*?\s([a-z][\w\-]*)\(", re.MULTILINE)
CONTROL_FLOW = {"while", "conditional", "call"}
COLLECTIVES = {"all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute", "collective-broadcast"}


def hlo_opcodes(hlo: str) -> dict[str, str]:
    return {name: opcode for name, opcode in HLO_INSTRUCTION.findall(hlo)}


@dataclass
class Reading:
    """The independent reading of one trace: per device, the summed ns of each part over the measured windows."""

    windows: list[tuple[float, float]]
    parts: dict[int, dict[str, float]]

    def mean(self, part: str) -> float:
        """Seconds per step and device."""
        return statistics.mean(p[part] for p in self.parts.values()) / len(self.windows) * 1e-9


def independent_reading(capture: Capture, skip_first: int = 0) -> Reading:
    """Sweep each device's op edges in time order, counting the compute and collective ops running between them;
    each stretch between two edges goes to its window as compute (any compute running), exposed collective (only
    collectives), idle (nothing), and to overlapped collective when both run."""
    from jax.profiler import ProfileData

    starts: list[float] = []
    edges: dict[int, list[tuple[float, int, bool]]] = defaultdict(list)  # device -> (time, +1/-1, collective)
    for plane in ProfileData.from_serialized_xspace(capture.xspace).planes:
        for line in plane.lines:
            for event in line.events:
                stats = dict(event.stats)
                if event.name == STEP_ANNOTATION and "step_num" in stats:
                    starts.append(event.start_ns)
                elif "hlo_op" in stats:
                    opcode = capture.opcodes[str(stats["hlo_op"])]
                    if opcode not in CONTROL_FLOW:
                        kind = opcode.removesuffix("-start").removesuffix("-done") in COLLECTIVES
                        device = int(stats["device_ordinal"])
                        edges[device] += [(event.start_ns, 1, kind), (event.end_ns, -1, kind)]
    starts.sort()
    windows = list(itertools.pairwise(starts))[skip_first:]
    window_starts = [low for low, _ in windows]
    parts: dict[int, dict[str, float]] = {}
    for device, device_edges in edges.items():
        sums = dict.fromkeys(("compute", "exposed", "overlapped", "idle"), 0.0)
        points = sorted(device_edges + [(t, 0, False) for window in windows for t in window])
        running = {True: 0, False: 0}
        for (at, change, kind), (until, _, _) in zip(points, [*points[1:], points[-1]], strict=True):
            running[kind] += change
            w = bisect.bisect_right(window_starts, at) - 1
            if until > at and w >= 0 and at < windows[w][1]:
                if running[False]:
                    sums["compute"] += until - at
                    sums["overlapped"] += (until - at) if running[True] else 0.0
                else:
                    sums["exposed" if running[True] else "idle"] += until - at
        parts[device] = sums
    return Reading(windows, parts)


def agrees(expected: float, step_s: float) -> Any:
    """Within 20 %, or 1 % of the step for figures near 0 (overlap is about 0 on the CPU)."""
    return pytest.approx(expected, rel=0.2, abs=0.01 * step_s)


@pytest.mark.parametrize("name", ["balanced", "bench"])  # bench: tpuscope workload --fused's own step
def test_a_real_capture_splits_and_agrees_with_an_independent_reading(captures: dict[str, Capture], name: str) -> None:
    capture = captures[name]
    import jax.profiler  # noqa: F401  (a job has jax loaded: time the parse, not the import)

    began = time.perf_counter()
    split = split_steps(capture.xspace)
    parse_s = time.perf_counter() - began
    assert split is not None
    print(
        f"{len(capture.xspace)} bytes parsed in {parse_s * 1e3:.1f} ms: step {split.step_s * 1e3:.3f} ms = compute "
        f"{split.compute_s * 1e3:.3f} + exposed collective {split.exposed_collective_s * 1e3:.3f} + idle "
        f"{split.idle_s * 1e3:.3f} (overlapped {split.overlapped_collective_s * 1e3:.3f}, slowest compute "
        f"{split.slowest_compute_s * 1e3:.3f})"
    )
    assert (split.steps, split.devices) == (3, 8)  # 4 annotated steps, each window measured
    assert split.exposed_collective_s > 0
    assert split.compute_s > 0
    parts = split.compute_s + split.exposed_collective_s + split.idle_s
    assert parts == pytest.approx(split.step_s, rel=0.05)
    assert split.slowest_compute_s >= split.compute_s

    reading = independent_reading(capture)
    assert len(reading.windows) == split.steps and len(reading.parts) == split.devices
    assert statistics.mean(high - low for low, high in reading.windows) * 1e-9 == pytest.approx(split.step_s, rel=0.2)
    for figure, part in [
        (split.compute_s, "compute"),
        (split.exposed_collective_s, "exposed"),
        (split.overlapped_collective_s, "overlapped"),
        (split.idle_s, "idle"),
    ]:
        assert figure == agrees(reading.mean(part), split.step_s), part
    independent_parts = reading.mean("compute") + reading.mean("exposed") + reading.mean("idle")
    assert split.step_s == pytest.approx(independent_parts, rel=0.05)


def test_a_straggler_device_computes_more_and_waits_less(captures: dict[str, Capture]) -> None:
    split = split_steps(captures["straggler"].xspace)
    assert split is not None and split.devices == 8
    by_device: dict[int, Any] = {d.device: d for d in split.per_device}
    slow = by_device.pop(STRAGGLER)
    print(
        "compute / exposed collective per device (ms):",
        {d.device: (round(d.compute_s * 1e3, 3), round(d.exposed_collective_s * 1e3, 3)) for d in split.per_device},
    )
    # Against the peers' median, not each peer: 8 devices share 2 cores here, and an op's wall time includes the
    # time its thread was descheduled, so now and then one peer's compute reads several times the others'.
    assert slow.compute_s > 2 * statistics.median(d.compute_s for d in by_device.values())
    assert slow.exposed_collective_s < statistics.median(d.exposed_collective_s for d in by_device.values())
    assert split.slowest_compute_s >= slow.compute_s * (1 - 1e-9)  # per step the most, so at least the straggler's

    reading = independent_reading(captures["straggler"])
    for device in split.per_device:
        per_step_s = {part: ns / len(reading.windows) * 1e-9 for part, ns in reading.parts[device.device].items()}
        assert device.compute_s == agrees(per_step_s["compute"], split.step_s)
        assert device.exposed_collective_s == agrees(per_step_s["exposed"], split.step_s)


def test_the_parse_loads_neither_jax_nor_the_rest_of_the_sidecar(tmp_path: Path) -> None:
    """The parse child needs protobuf only (a sidecar without jax parses too), and loads of the sidecar nothing
    but its own package: whatever more it imported would cost memory its limit is for."""
    blocker = tmp_path / "jax.py"
    blocker.write_text("raise ImportError('no jax here')\n")
    code = (
        "import json, sys; import tpuscope.exporter.profiles.xspace as x; assert x.split_steps(b'') is None; "
        "print(json.dumps([m for m in sys.modules if m.startswith('tpuscope.exporter')]))"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.getcwd()])}
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert run.returncode == 0, run.stderr
    loaded = set(json.loads(run.stdout))
    package = {"tpuscope.exporter", "tpuscope.exporter.profiles"}
    parse = {f"tpuscope.exporter.profiles.{name}" for name in ("xspace", "xplane", "intervals")}
    assert loaded == package | parse, sorted(loaded - package - parse)


def test_the_sidecars_parser_prints_the_profile_and_refuses_links(captures: dict[str, Capture], tmp_path: Path) -> None:
    """``python -m tpuscope.exporter.profiles.xspace TRACE``, as the sidecar runs it: the capture's DeviceProfile as
    JSON; a trace that is no trace fails (the sidecar answers error); a link is not followed (a spool writer could
    point it at any file the sidecar may read)."""
    import msgspec

    from tpuscope import events

    trace = tmp_path / "t.xspace"
    trace.write_bytes(captures["balanced"].xspace)
    parse = [sys.executable, "-m", "tpuscope.exporter.profiles.xspace"]
    run = subprocess.run([*parse, str(trace)], capture_output=True, timeout=120)
    assert run.returncode == 0, run.stderr
    profile = msgspec.json.decode(run.stdout, type=events.DeviceProfile)
    split = split_steps(captures["balanced"].xspace)
    assert split is not None and profile.result == "ok"
    assert (profile.steps, profile.devices, profile.step_s) == (split.steps, split.devices, split.step_s)
    garbage = tmp_path / "g.xspace"
    garbage.write_bytes(b"no trace at all")
    assert subprocess.run([*parse, str(garbage)], capture_output=True, timeout=120).returncode != 0
    link = tmp_path / "l.xspace"
    link.symlink_to(trace)
    refused = subprocess.run([*parse, str(link)], capture_output=True, text=True, timeout=120)
    assert refused.returncode != 0 and "Too many levels of symbolic links" in refused.stderr, refused.stderr
