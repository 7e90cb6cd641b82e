"""XProf as the oracle: its own converters (the ``xprof`` package's C++ library) run on XSpace captures.

``xprof_split`` writes the captures as ``<host>.xplane.pb`` files (XProf names a host after its file) and asks XProf's
``xspace_to_tool_data`` for three of its tools:

- ``input_pipeline_analyzer``: the step-time graph, one row per step. TPU columns (``tcComputeTimeMs``,
  ``tcIdleTimeMs``, ``tcInfeedTimeMs``...; the step time only in the row's tooltip, "Step time = X ms"); GPU columns
  (``deviceComputeTimeMs``, ``deviceCollectivesTimeMs``, ``otherTimeMs``, ``stepTimeMs``...). This is the breakdown
  overview_page shows too (op_stats_to_input_pipeline_analysis.cc).
- ``op_profile`` (TPU): time per HLO category, summed over every core and step, from the ops' ``hlo_category``; its
  ``IDLE`` node is the cores' time in steps that no op covers (without steps: from a core's first op to its last).
  On GPU it needs the HLO protos, which a CUPTI capture does not carry, so it holds only ``IDLE``.
- ``kernel_stats`` (GPU): each kernel's total time over all GPUs and steps: the one place XProf counts an NCCL
  kernel's time in full, before its step breakdown gives compute the time both cover.

Every value is returned under XProf's own field name; the tests say which of our parts each one is. XProf sums a
capture's devices together (op_profile over all cores; the step graph over the devices that ran a step):
``one_device`` cuts a capture down to one device plane, beside its host's planes, for XProf's figures of that device.
"""

from __future__ import annotations

import json
import re
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

# HLO categories (tsl/profiler/convert/xla_op_utils.h, and XLA's opcode names) whose time is communication.
XPROF_COLLECTIVE_CATEGORIES = frozenset(
    {
        "all-reduce", "all-reduce-start", "all-reduce-done", "all-reduce fusion", "all-reduce-scatter fusion",
        "all-gather", "all-gather-start", "all-gather-done", "all-gather fusion", "all-to-all", "reduce-scatter",
        "collective-permute", "collective-permute-start", "collective-permute-done", "send", "send-done", "recv",
        "recv-done",
    }
)  # fmt: skip
IDLE_CATEGORY = "IDLE"
_STEP_TIME = re.compile(r"Step time = ([0-9.]+) ms")


def xprof_split(hosts: Mapping[str, bytes], verbose: bool = True) -> dict[str, Any]:
    """XProf's figures for one capture (``hosts``: hostname -> serialized XSpace): ``hardware``, ``steps`` (a dict of
    the step graph's columns per step, with ``stepTimeMs`` on TPU too), ``categories_ms`` (TPU) and ``kernels_ms``."""
    with tempfile.TemporaryDirectory(prefix="xprof-") as folder:
        paths = [Path(folder) / f"{host}.xplane.pb" for host in hosts]
        for path, data in zip(paths, hosts.values(), strict=True):
            path.write_bytes(data)
        pipeline = _tool(paths, "input_pipeline_analyzer")
        hardware, steps = _step_graph(pipeline)
        split = {
            "hardware": hardware,
            "steps": steps,
            "categories_ms": _categories_ms(_tool(paths, "op_profile")) if hardware == "TPU" else {},
            "kernels_ms": _kernels_ms(_tool(paths, "kernel_stats")) if hardware == "GPU" else {},
        }
    if verbose:
        print(f"XProf on {sorted(hosts)}: {json.dumps(split, indent=1, sort_keys=True)}")
    return split


def one_device(data: bytes, plane_name: str) -> bytes:
    """A serialized XSpace holding of ``data``'s device planes only ``plane_name``, and all its other planes (the
    host's, whose annotations and launches XProf groups the device's steps by, and the programs' HLO)."""
    from tpuscope.exporter.profiles import xplane

    space = xplane.XSpace.FromString(data)
    kept = [plane for plane in space.planes if plane.name == plane_name or not plane.name.startswith("/device:")]
    assert any(plane.name == plane_name for plane in kept), f"no plane {plane_name}"
    one = xplane.XSpace(hostnames=space.hostnames, errors=space.errors, warnings=space.warnings)
    one.planes.extend(kept)
    data = one.SerializeToString()
    assert isinstance(data, bytes)
    return data


def _tool(paths: list[Path], tool: str) -> Any:
    # imported here: loading XProf's library costs a test file that does not use it
    from xprof.convert import raw_to_tool_data  # type: ignore[import-untyped]

    data, _ = raw_to_tool_data.xspace_to_tool_data(paths, tool, {"use_saved_result": False})
    if not data:
        raise AssertionError(f"XProf's {tool} gave nothing for {[path.name for path in paths]}")
    return json.loads(data)


def _step_graph(pipeline: list[dict[str, Any]]) -> tuple[str, list[dict[str, Any]]]:
    """The table whose columns start with the step number: one dict of its numeric columns per step."""
    table = next(table for table in pipeline if table.get("cols") and table["cols"][0]["id"] == "stepnum")
    ids = [column["id"] for column in table["cols"]]
    steps = []
    for row in table["rows"]:
        values = dict(zip(ids, (cell.get("v") for cell in row["c"]), strict=True))
        step: dict[str, Any] = {key: value for key, value in values.items() if isinstance(value, float)}
        step["stepnum"] = int(values["stepnum"])
        if "stepTimeMs" not in step:  # TPU: only the tooltip says it
            step["stepTimeMs"] = float(_STEP_TIME.search(values["tooltip"]).group(1))  # type: ignore[union-attr]
        steps.append(step)
    return str(table["p"]["hardware_type"]), steps


def _categories_ms(profile: dict[str, Any]) -> dict[str, float]:
    """Time per HLO category, from the ops of the by-program tree: its first nodes that name an HLO category. Not
    its leaves: where the capture carries its programs' HLO, a fusion's node holds the instructions fused into it
    (with no time of their own), and ops of one name grouped together ("fusion.1 and its duplicate(s)") hold each."""
    totals: dict[str, float] = {}

    def walk(node: dict[str, Any]) -> None:
        if "xla" in node:
            category = node["xla"]["category"]
            totals[category] = totals.get(category, 0.0) + node["metrics"].get("rawTime", 0) / 1e9
            return
        for child in node.get("children", []):
            walk(child)

    walk(profile["byProgram"])
    return totals


def _kernels_ms(kernel_stats: dict[str, Any]) -> dict[str, float]:
    ids = [column["id"] for column in kernel_stats["cols"]]
    totals: dict[str, float] = {}
    for row in kernel_stats["rows"]:
        values = dict(zip(ids, (cell.get("v") for cell in row["c"]), strict=True))
        name = values["kernel_name"]
        totals[name] = totals.get(name, 0.0) + values["total_duration_us"] / 1000
    return totals
