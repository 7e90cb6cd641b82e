"""`tpuscope bench perf` runs from the command line at a tiny size and writes well-formed results.

Nothing here is timed: the figures of a tiny run mean nothing. docs/performance.md quotes a full run.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
from conftest import PROFILE_PROMPTLY, require

from tpuscope.testing import bench as testing_bench

EXPECTED = (
    "emit one step event, p50",
    "peer: prometheus_client Histogram.observe, p99",
    "peer: one OpenTelemetry span per step, p99",
    "instrumentation per step [spans unsampled]",
    "instrumentation share of a step [spans sampled]",
    "A/B on - off [spans sampled]",
    "ingest on one core, step events",
    "events lost",
    "sidecar RSS, idle",
    "sidecar CPU, idle",
    "sidecar RSS, 1,000 steps/s",
    "sidecar RSS after the floods",
    "sidecar CPU, 1,000 steps/s",
    "scrape p99 at",
    "peer: node_exporter scrape p99",
    "step annotation, no profiler session",
    "step annotation, during a capture",
    "device-profile capture: the job's start and stop, mean",
    "the sidecar's parse of a capture, mean",
    "capture cost share of wall time, default period",
    "steps overlapping the trace's stop / the others, p50",
    "peer: the least such a step costs in Python",
    "instrumented step / the least such a step costs in Python",
    "A/B loss reported - not",
    "s.loss per step, a number",
    "s.loss per step, a ready JAX array",
)
# Per-step and per-series targets are ratios to a peer measured in the same run, the absolute figures beside.
RATIOS = {
    "steps during and after a capture / the others, p50": "<= 1.05",
    "instrumented step / one OpenTelemetry span": "<= 0.5",
    "instrumented step / a bare send of its event": "<= 2",
    "scrape per series / node_exporter's": "<= 0.1",
    "JAX step, loss reported / not, p50": "<= 1.02",
}


def test_the_benchmark_runs_tiny_and_writes_every_figure_with_its_target(short_tmp: Path) -> None:
    require("prometheus-node-exporter")
    out_json = short_tmp / "perf.json"
    # The figures of the parse need one to finish within the run, on a loaded machine too.
    out = testing_bench.run("perf", "--tiny", json=out_json, env=PROFILE_PROMPTLY)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    result = json.loads(out_json.read_text())
    assert result["machine"]["cpus"] >= 1 and result["machine"]["memory_gib"] > 0
    figures = result["figures"]
    names = [f["name"] for f in figures]
    for expected in EXPECTED:
        assert any(expected in name for name in names), f"no figure {expected!r} in {names}"
    for figure in figures:
        assert set(figure) == {"name", "value", "unit", "target", "note", "met", "ours", "peer", "absolute_unit"}
        assert isinstance(figure["value"], (int, float)) and math.isfinite(figure["value"]), figure
        if figure["absolute_unit"]:  # a ratio: both absolute figures, printed beside it
            assert figure["unit"] == "x" and figure["ours"] > 0 and figure["peer"] > 0, figure
            assert figure["value"] == pytest.approx(figure["ours"] / figure["peer"]), figure
        else:
            assert figure["ours"] is None and figure["peer"] is None, figure
        assert figure["unit"], figure
        if figure["target"]:
            op, bound = figure["target"].split()
            assert op in ("<=", ">=") and float(bound) >= 0
            assert isinstance(figure["met"], bool), figure
            assert f"target {figure['target']}" in out.stdout, "every target is printed with its figure"
        else:
            assert figure["met"] is None
    # The targets the issue sets, each judged somewhere in the run.
    targets = {f["target"] for f in figures}
    assert {"<= 0.5", "<= 2", "<= 0.1", ">= 100000", "<= 0", "<= 80", "<= 1", "<= 1.05", "<= 1.02"} <= targets
    by_name = {f["name"].strip(): f for f in figures}
    for name, target in RATIOS.items():
        assert by_name[name]["target"] == target, by_name[name]
    headline = out.stdout.split("Ratios to the peers measured in this run")[1]
    for name in RATIOS:
        assert re.search(rf"{re.escape(name)} +[\d.]+ x .* [\d.]+ [mu]s / [\d.]+ [mu]s", headline), headline
    # The captures on the JAX workload were real: the sidecar parsed at least one, and said what that cost.
    capture = by_name["device-profile capture: the job's start and stop, mean"]
    assert capture["value"] > 0 and re.match(r"[1-9]\d* ok, ", capture["note"]), capture
    assert by_name["the sidecar's parse of a capture, mean"]["value"] > 0
    assert by_name["capture cost share of wall time, default period"]["target"] == "<= 0.5"
    # The JSON is printed too.
    assert '"figures": [' in out.stdout
