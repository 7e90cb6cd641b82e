"""One recording through the sidecar's arithmetic and the report's gives the same device figures.

The sidecar folds the job's events into gauges (tpuscope.exporter.aggregator), the report reads the job's own
recording (tpuscope.report.from_recording), the workload prints its summary (tpuscope.workload.summary): all three
must say the same collective overlap, device imbalance and MFU for the same steps.
"""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest
from prometheus_client import CollectorRegistry

from tpuscope import catalog, events
from tpuscope.exporter.aggregator import Aggregator
from tpuscope.exporter.metrics import register
from tpuscope.exporter.samples import SampleStore
from tpuscope.report import from_recording
from tpuscope.report.window import Window
from tpuscope.thresholds import Thresholds
from tpuscope.workload.summary import RunSummary

START = 1_795_000_000.0
PEAK = 4e12


def capture(*steps: tuple[float, float, float, float, float]) -> events.DeviceProfile:
    """A capture of the given steps, each (compute, exposed, overlapped, idle, slowest compute) in seconds."""
    measured = tuple(events.ProfiledStep(c + e + i, c, e, o, i, s) for c, e, o, i, s in steps)
    n = len(measured)

    def mean(field: int) -> float:
        return sum(step[field] for step in steps) / n

    return events.DeviceProfile(
        "ok",
        n,
        4,
        step_s=sum(s.step_s for s in measured) / n,
        compute_s=mean(0),
        exposed_collective_s=mean(1),
        overlapped_collective_s=mean(2),
        idle_s=mean(3),
        slowest_compute_s=mean(4),
        per_step=measured,
    )


def recording() -> list[tuple[float, events.AnyEvent]]:
    """Twelve steps of uneven length and FLOPs, three of them carrying captures of uneven steps: a short step
    with no collective, a long one mostly exposed. A mean of ratios and a ratio of sums differ on it."""
    hardware = events.Hardware("llm", accelerator="tpu-v5p", devices=4, peak_flops_per_second=PEAK)
    captures = {
        3: capture((0.05, 0.0, 0.0, 0.01, 0.06), (0.10, 0.08, 0.02, 0.01, 0.11)),
        7: capture((0.08, 0.02, 0.06, 0.0, 0.12), (0.07, 0.01, 0.01, 0.02, 0.07), (0.20, 0.10, 0.0, 0.0, 0.2)),
        10: capture((0.09, 0.03, 0.03, 0.01, 0.10)),
    }
    records: list[tuple[float, events.AnyEvent]] = [(START, hardware)]
    for n in range(12):
        duration = 0.1 + 0.05 * (n % 4)
        flops = 1e11 * (1 + n % 3) if n != 5 else 0.0  # step 5 did not say its FLOPs
        step = events.Step("llm", n, duration, compute_s=duration, flops=flops, profile=captures.get(n))
        records.append((START + 1 + n, step))
    return records


def test_the_sidecar_the_report_and_the_summary_say_the_same_overlap_imbalance_and_mfu(tmp_path: Path) -> None:
    records = recording()
    assert len(records) - 1 <= catalog.MFU_STEPS, "the gauge's steps are all the report's"

    registry = CollectorRegistry()
    aggregator = Aggregator(register(registry), SampleStore())
    for t, event in records:
        aggregator.apply(event, at=t)

    def served(metric: catalog.Metric) -> float | None:
        return registry.get_sample_value(metric.name, {"workload": "llm"})

    path = tmp_path / "events.jsonl"
    path.write_bytes(b"".join(msgspec.json.encode(events.to_record(e, t)) + b"\n" for t, e in records))
    report = from_recording.build(path, None, Window(), Thresholds())
    summary = RunSummary()
    for _, event in records:
        summary.emit(event)

    assert report.profile is not None and report.profile.captures == 3
    overlap, imbalance, mfu = served(catalog.PROFILE_OVERLAP), served(catalog.PROFILE_IMBALANCE), served(catalog.MFU)
    assert overlap is not None and imbalance is not None and mfu is not None
    assert report.profile.overlap == pytest.approx(overlap, rel=1e-12)
    assert report.profile.imbalance == pytest.approx(imbalance, rel=1e-12)
    assert report.totals.mfu == pytest.approx(mfu, rel=1e-12)
    assert summary.mfu() == pytest.approx(mfu, rel=1e-12)
    split = summary.profiled()
    assert split is not None
    assert (split.overlap(), split.imbalance()) == pytest.approx((overlap, imbalance), rel=1e-12)
    assert served(catalog.PROFILE_STEP) == pytest.approx(report.profile.step_seconds, rel=1e-12)

    # The figures are ratios of sums over the steps, typed out here on purpose: not a mean of the captures' ratios.
    steps = [s for _, e in records if isinstance(e, events.Step) and e.profile for s in e.profile.per_step]
    hidden = sum(s.overlapped_collective_s for s in steps)
    assert overlap == pytest.approx(hidden / (hidden + sum(s.exposed_collective_s for s in steps)))
    assert imbalance == pytest.approx(sum(s.slowest_compute_s for s in steps) / sum(s.compute_s for s in steps))
    flops = sum(e.flops for _, e in records if isinstance(e, events.Step))
    seconds = sum(e.duration_s for _, e in records if isinstance(e, events.Step) and e.flops)
    assert mfu == pytest.approx(flops / seconds / PEAK)
    per_capture = [
        p.overlapped_collective_s / (p.overlapped_collective_s + p.exposed_collective_s)
        for _, e in records
        if isinstance(e, events.Step) and (p := e.profile)
    ]
    assert abs(overlap - sum(per_capture) / len(per_capture)) > 0.01, "the recording tells the two means apart"


def test_the_sidecars_mfu_is_over_its_latest_steps_and_the_reports_over_its_window(tmp_path: Path) -> None:
    """Thirty steps, the first ten slow: the gauge has forgotten them, the report of the whole run has not."""
    hardware = events.Hardware("llm", accelerator="tpu-v5p", devices=4, peak_flops_per_second=PEAK)
    steps = [events.Step("llm", n, 0.4 if n < 10 else 0.1, flops=1e11) for n in range(30)]
    registry = CollectorRegistry()
    aggregator = Aggregator(register(registry), SampleStore())
    for n, event in enumerate([hardware, *steps]):
        aggregator.apply(event, at=START + n)
    served = registry.get_sample_value(catalog.MFU.name, {"workload": "llm"})
    assert served == pytest.approx(1e11 / 0.1 / PEAK)

    path = tmp_path / "events.jsonl"
    path.write_bytes(
        b"".join(msgspec.json.encode(events.to_record(e, START + n)) + b"\n" for n, e in enumerate([hardware, *steps]))
    )
    report = from_recording.build(path, None, Window(), Thresholds())
    assert report.totals.mfu == pytest.approx(30 * 1e11 / (10 * 0.4 + 20 * 0.1) / PEAK)
