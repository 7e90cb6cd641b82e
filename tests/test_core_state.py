"""What a hung TPU job's cores are doing (issue 39): the runtime's GetTpuRuntimeStatus, asked by the sidecar only
while a workload stalls, served as bounded series, and the worker whose cores sit elsewhere named by the rules.

The fake runtime answers at the proto boundary (tpu-info's own client reads it first); the collector reads it in
process, then four real sidecars, each with its runtime, serve a four-worker job that hangs, through a real
Prometheus on the generated rules (time compressed, as fleet-sim runs them).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import msgspec
import pytest
from conftest import require
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import generate_latest
from rich.console import Console
from tpu_info import metrics as tpu_metrics

from tpuscope import catalog, events, top
from tpuscope.conventions import CORE_ELSEWHERE, AlertName
from tpuscope.exporter.aggregator import Aggregator
from tpuscope.exporter.collectors import core_state, libtpu
from tpuscope.exporter.collectors.base import Settings
from tpuscope.exporter.metrics import register
from tpuscope.exporter.samples import Sample, SampleStore
from tpuscope.fleetsim.rules import scaled_rules_file
from tpuscope.generator_config import GeneratorConfig
from tpuscope.report import prometheus as report_prometheus
from tpuscope.report import render
from tpuscope.report.window import Window
from tpuscope.scrape import Scrape
from tpuscope.testing.fake_tpu import Chip, CoreState, FakeTpuRuntime, FakeTpuServer, QueuedProgram
from tpuscope.testing.prometheus import PrometheusServer, target_of
from tpuscope.testing.waiting import wait_for
from tpuscope.thresholds import Thresholds
from tpuscope.tracing import Monitor
from tpuscope.workload import synthetic
from tpuscope.workload.sidecar import SidecarProcess

STUCK_AT = "all-reduce.42"  # where the fake's cores are unless told otherwise (CoreState's default)
ELSEWHERE = CoreState(hlo_location="fusion.7", pc=512)
PROGRAM = CoreState().fingerprint.hex()[: core_state.FINGERPRINT_DIGITS]


def test_the_fake_runtime_answers_tpu_infos_own_client_with_each_cores_state() -> None:
    queued = [QueuedProgram(run_id=2, launch_id=9, fingerprint=b"\x0a\x0b")]
    odd = CoreState(hlo_location="fusion.7", queued=queued, error_message="sequencer halted")
    runtime = FakeTpuRuntime([Chip(0), Chip(1, state=odd, tensor_cores=2)])
    with FakeTpuServer(runtime) as server:
        plain = tpu_metrics.get_tpuz_info(server.address, include_hlo_info=False)
        detailed = tpu_metrics.get_tpuz_info(server.address, include_hlo_info=True)
    assert runtime.status_requests == [False, True]
    assert [(c.global_core_id, c.chip_id, c.core_on_chip_index) for c in detailed] == [(0, 0, 0), (1, 1, 0), (2, 1, 1)]
    assert {c.core_type for c in detailed} == {"TPU_CORE_TYPE_TENSOR_CORE"}
    # The HLO location is sent only when asked for, as libtpu does (it costs the runtime work).
    assert all(s.hlo_location is None for c in plain for s in c.sequencer_states)
    assert [c.sequencer_states[0].hlo_location for c in detailed] == [STUCK_AT, "fusion.7", "fusion.7"]
    assert all("fusion.7" in (c.sequencer_states[0].hlo_detailed_info or "") for c in detailed[1:])
    assert detailed[0].program_fingerprint == CoreState().fingerprint.hex()
    assert [c.error_message for c in detailed] == [None, "sequencer halted", "sequencer halted"]
    assert [[(q.run_id, q.launch_id, q.program_fingerprint) for q in c.queued_programs] for c in detailed] == [
        [],
        [(2, 9, "0a0b")],
        [(2, 9, "0a0b")],
    ]


class Progress:
    """What the aggregator would say of one connected workload: its last progress, moved by the test."""

    def __init__(self, seconds_ago: float = 0.0) -> None:
        self.last = time.time() - seconds_ago

    def __call__(self) -> dict[str, float]:
        return {"llm": self.last}


def collect(collector: libtpu.LibtpuCollector) -> list[Sample]:
    return collector.collect(2.0)


def cores_served(samples: list[Sample]) -> dict[tuple[str, ...], tuple[str, str]]:
    """(device, core) -> (fingerprint, hlo_location), from the info series."""
    return {s.labels[:2]: (s.labels[2], s.labels[3]) for s in samples if s.metric is catalog.CORE_STATE}


def ages(samples: list[Sample]) -> dict[tuple[str, ...], float]:
    return {s.labels: float(s.value) for s in samples if s.metric is catalog.CORE_LOCATION_AGE}  # type: ignore[arg-type]


@pytest.fixture
def runtime() -> Iterator[tuple[FakeTpuRuntime, FakeTpuServer]]:
    runtime = FakeTpuRuntime([Chip(0), Chip(1, state=ELSEWHERE, tensor_cores=2)])
    with FakeTpuServer(runtime) as server:
        yield runtime, server


def collector_of(server: FakeTpuServer, progress: Callable[[], dict[str, float]]) -> libtpu.LibtpuCollector:
    return libtpu.LibtpuCollector(
        Settings(libtpu_addresses=(server.address,), workload_progress=progress, core_state_after=60)
    )


def test_the_cores_state_is_asked_only_while_a_workload_stalls(
    runtime: tuple[FakeTpuRuntime, FakeTpuServer],
) -> None:
    fake, server = runtime
    progress = Progress(seconds_ago=10)
    collector = collector_of(server, progress)
    try:
        stepping = collect(collector)
        assert fake.status_requests == [] and not cores_served(stepping)
        progress.last = time.time() - 61  # no step, checkpoint or compile stage ending for over a minute
        stalled = collect(collector)
        assert fake.status_requests == [True], "asked once per collection, with the HLO locations"
        assert cores_served(stalled) == {
            ("0", "tc0"): (PROGRAM, STUCK_AT),
            ("1", "tc0"): (PROGRAM, "fusion.7"),
            ("1", "tc1"): (PROGRAM, "fusion.7"),
        }
        assert set(ages(stalled)) == {("0", "tc0"), ("1", "tc0"), ("1", "tc1")}
        assert {s.metric for s in stalled} > {catalog.DUTY_CYCLE, catalog.CORE_STATE}, "the metrics are read too"
        progress.last = time.time()  # it stepped again: the cores' series go, and nothing more is asked
        again = collect(collector)
        assert fake.status_requests == [True] and not cores_served(again) and not ages(again)
    finally:
        collector.close()


def test_a_workload_the_hang_watch_says_is_stuck_is_asked_about_at_once(
    runtime: tuple[FakeTpuRuntime, FakeTpuServer],
) -> None:
    """A stuck workload (exporter/hangs.py) has its cores asked about long before the stall threshold: the HLO
    location joins the hang verdict of TpuscopeWorkloadHung."""
    fake, server = runtime
    stuck: frozenset[str] = frozenset()
    settings = Settings(
        libtpu_addresses=(server.address,),
        workload_progress=Progress(seconds_ago=10),
        core_state_after=60,
        stuck_workloads=lambda: stuck,
    )
    collector = libtpu.LibtpuCollector(settings)
    try:
        assert not cores_served(collect(collector)) and fake.status_requests == []
        stuck = frozenset({"train"})  # 10 s without progress, but every process here is stuck
        assert cores_served(collect(collector)) and fake.status_requests == [True]
    finally:
        collector.close()


def test_no_connected_workload_is_no_stall() -> None:
    with FakeTpuServer(FakeTpuRuntime([Chip(0)])) as server:
        collector = collector_of(server, dict)
        try:
            assert not cores_served(collect(collector))
        finally:
            collector.close()
        assert server.runtime.status_requests == []


def test_the_seconds_at_a_location_grow_and_start_again_when_the_core_moves() -> None:
    clock = core_state.CoreClock()
    here = core_state.CoreAt("0", "tc0", PROGRAM, STUCK_AT)
    assert ages(clock.samples([here], now=100.0)) == {("0", "tc0"): 0.0}
    assert ages(clock.samples([here], now=130.0)) == {("0", "tc0"): 30.0}
    moved = core_state.CoreAt("0", "tc0", PROGRAM, "fusion.7")
    assert ages(clock.samples([moved], now=140.0)) == {("0", "tc0"): 0.0}
    assert ages(clock.samples([moved], now=145.0)) == {("0", "tc0"): 5.0}
    clock.forget()  # the stall ended: the next one counts afresh
    assert ages(clock.samples([moved], now=200.0)) == {("0", "tc0"): 0.0}


def test_seconds_at_a_location_are_counted_across_collections(runtime: tuple[FakeTpuRuntime, FakeTpuServer]) -> None:
    fake, server = runtime
    collector = collector_of(server, Progress(seconds_ago=120))
    try:
        first = ages(collect(collector))
        latest: dict[tuple[str, ...], float] = {}

        def grown() -> bool:
            latest.update(ages(collect(collector)))
            return min(latest.values()) > 0.2

        wait_for(grown, 10, "growth")
        assert all(latest[core] > first[core] for core in first)
        fake.chips[0].state = ELSEWHERE  # chip 0's core moves on: its count starts again, the others' go on
        moved = ages(collect(collector))
        assert moved[("0", "tc0")] < 0.2 < moved[("1", "tc0")]
    finally:
        collector.close()


@pytest.mark.parametrize(
    ("raw", "served"),
    [
        ("%fusion.3 = f32[8]{0} add(a, b)", "fusion.3___f32_8__0__add_a__b_"),
        ("all-reduce.42", "all-reduce.42"),
        ("", core_state.NONE),
        ("%%%", core_state.NONE),
        ("x" * 300, "x" * events.LABEL_VALUE_MAX),
        ("jit(train_step)/while/body/dot_general", "jit_train_step_/while/body/dot_general"),
    ],
)
def test_label_values_keep_to_the_label_alphabet_and_length(raw: str, served: str) -> None:
    value = core_state.label_value(raw)
    assert value == served
    assert msgspec.convert(value, events.LabelValue) == value  # what a job's label values must be, too


def test_a_host_serves_at_most_max_cores_and_long_locations_cut() -> None:
    long_way = CoreState(hlo_location="%" + "fusion." * 40 + "9")
    chips = [Chip(d, state=long_way, tensor_cores=2) for d in range(core_state.MAX_CORES)]  # twice too many
    with FakeTpuServer(FakeTpuRuntime(chips)) as server:
        collector = collector_of(server, Progress(seconds_ago=120))
        try:
            served = cores_served(collect(collector))
        finally:
            collector.close()
    assert len(served) == core_state.MAX_CORES
    assert {len(hlo) for _, hlo in served.values()} == {events.LABEL_VALUE_MAX}
    assert ("0", "tc0") in served and ("0", "tc1") in served, "chips in order, their cores together"


def test_a_runtime_without_the_status_call_costs_the_cores_only_and_is_asked_once() -> None:
    runtime = FakeTpuRuntime([Chip(0)])
    runtime.status_unimplemented = True
    with FakeTpuServer(runtime) as server:
        collector = collector_of(server, Progress(seconds_ago=120))
        try:
            first, second = collect(collector), collect(collector)  # neither raises: the metrics were read
        finally:
            collector.close()
    assert runtime.status_requests == [True]
    assert not cores_served(first) and not cores_served(second)
    assert catalog.DUTY_CYCLE in {s.metric for s in second}


def test_a_cores_error_is_logged_once_never_served(caplog: pytest.LogCaptureFixture) -> None:
    runtime = FakeTpuRuntime([Chip(0, state=CoreState(error_message="HBM ECC error: uncorrectable"))])
    with FakeTpuServer(runtime) as server:
        collector = collector_of(server, Progress(seconds_ago=120))
        try:
            with caplog.at_level("WARNING", logger="tpuscope.collectors"):
                samples = collect(collector) + collect(collector)
        finally:
            collector.close()
    assert [r.getMessage() for r in caplog.records].count(
        "TPU core tc0 of chip 0 reports an error: HBM ECC error: uncorrectable"
    ) == 1
    assert all("ECC" not in value for s in samples for value in s.labels)


def test_the_aggregator_says_each_connected_workloads_last_progress() -> None:
    registry = CollectorRegistry()
    aggregator = Aggregator(register(registry), SampleStore())
    aggregator.process_joined("llm")
    aggregator.apply(events.Lifecycle(workload="llm", state="start"), at=100.0)
    assert aggregator.progress() == {"llm": 100.0}
    aggregator.apply(events.Step(workload="llm", step=1, duration_s=0.5, compute_s=0.5), at=110.0)
    assert aggregator.progress() == {"llm": 110.0}
    aggregator.apply(events.Checkpoint(workload="llm", operation="save", duration_s=30.0, ok=False), at=150.0)
    assert aggregator.progress() == {"llm": 150.0}, "a checkpoint's end is progress, failed or not"
    aggregator.apply(events.Compile(workload="llm", stage="backend", duration_s=9.0), at=170.0)
    assert aggregator.progress() == {"llm": 170.0}
    aggregator.apply(events.Lifecycle(workload="batch", state="start"), at=180.0)  # no process connected
    assert aggregator.progress() == {"llm": 170.0}
    aggregator.process_left("llm")
    assert aggregator.progress() == {}, "a job whose processes are gone does not stall"


def test_top_shows_the_cores_of_a_stalled_workload(runtime: tuple[FakeTpuRuntime, FakeTpuServer]) -> None:
    _, server = runtime
    collector = collector_of(server, Progress(seconds_ago=120))
    try:
        samples = collect(collector)
    finally:
        collector.close()
    store, registry = SampleStore(), CollectorRegistry()
    registry.register(store)
    store.replace(libtpu.LibtpuCollector.name, samples)
    source = top.Source("fake")
    source.latest, source.read_at = Scrape(generate_latest(registry).decode()), time.time()
    console = Console(record=True, width=160, force_terminal=True)
    console.print(top.frame(source, top.Alerts()))
    text = console.export_text()
    assert "Cores of the stalled workload" in text
    rows = [line for line in text.splitlines() if PROGRAM in line]
    assert len(rows) == 3 and sum("fusion.7" in row for row in rows) == 2 and STUCK_AT in rows[0], text
    store.replace(libtpu.LibtpuCollector.name, [s for s in samples if s.metric is catalog.DUTY_CYCLE])
    source.latest = Scrape(generate_latest(registry).decode())
    console = Console(record=True, width=160, force_terminal=True)
    console.print(top.frame(source, top.Alerts()))
    assert "Cores of the stalled workload" not in console.export_text(), "no stall, no table"


# --- a four-worker job that hangs, through real sidecars and a real Prometheus -------------------------------
WORKLOAD = "llm"
WORKERS, ODD = 4, 2  # worker 2's cores sit at a fusion while its peers' wait at the all-reduce it never joined
K = 60  # the rules' time compression: TpuscopeWorkloadStalled's 10 minutes of no progress become 10 s, its for: 5 s
STALL_AFTER = GeneratorConfig().thresholds.stall_seconds / K  # the sidecars ask when the alert's threshold passes
PROFILE = synthetic.Profile(step_seconds=0.01, compile_seconds=0.01, checkpoint_every=0)


def stalled_alert(prom: PrometheusServer) -> dict[str, Any] | None:
    alerts = prom.api.get("alerts")["alerts"]
    return next(
        (
            a
            for a in alerts
            if a["labels"]["alertname"] == AlertName.WORKLOAD_STALLED
            and a["state"] == "firing"
            and a["labels"].get("workload") == WORKLOAD
        ),
        None,
    )


@pytest.mark.long
def test_a_four_worker_hang_fires_stalled_and_names_the_worker_whose_cores_sit_elsewhere(short_tmp: Path) -> None:
    require("prometheus")
    rules = short_tmp / "rules.yml"
    rules.write_text(scaled_rules_file(GeneratorConfig(), K))
    with ExitStack() as stack:
        servers = [
            stack.enter_context(
                FakeTpuServer(FakeTpuRuntime([Chip(d, state=ELSEWHERE if w == ODD else CoreState()) for d in (0, 1)]))
            )
            for w in range(WORKERS)
        ]
        sidecars = [
            stack.enter_context(
                SidecarProcess(
                    short_tmp / f"w{w}.sock",
                    "127.0.0.1:0",
                    "--collectors=libtpu",
                    f"--libtpu-address={server.address}",
                    "--collector-interval=0.5",
                    "--slice=0",
                    f"--worker={w}",
                    f"--core-state-after={STALL_AFTER:g}",
                )
            )
            for w, server in enumerate(servers)
        ]
        prom = stack.enter_context(
            PrometheusServer(short_tmp / "prom", [target_of(s.url) for s in sidecars], rule_files=[rules])
        )
        # Each worker steps, then its collective hangs: no more progress, every process still connected.
        for sidecar in sidecars:
            synthetic.run(stack.enter_context(Monitor(WORKLOAD, socket=sidecar.socket, traces=False)), 5, PROFILE)
        hung = time.time()

        def named() -> bool:
            alert = stalled_alert(prom)
            return alert is not None and f"Worker {ODD} " in alert["annotations"]["description"]

        wait_for(
            named,
            90,
            "stall alert naming the worker",
            detail=lambda: (stalled_alert(prom), prom.query(CORE_ELSEWHERE), sidecars[0].log()),
        )
        description = stalled_alert(prom)["annotations"]["description"]  # type: ignore[index]
        assert f"has had its TPU cores at HLO fusion.7 of program {PROGRAM} for" in description, description
        assert [f"Worker {w} " in description for w in range(WORKERS)] == [w == ODD for w in range(WORKERS)]
        asked = [s.runtime.status_requests for s in servers]
        assert all(asked) and all(all(with_hlo) for with_hlo in asked), asked  # each with the HLO locations

        # tpuscope top on the odd worker's host shows where its cores are.
        source = top.Source(sidecars[ODD].url)
        source.read(5.0)
        console = Console(record=True, width=160, force_terminal=True)
        console.print(top.frame(source, top.Alerts()))
        assert "Cores of the stalled workload" in (screen := console.export_text()) and "fusion.7" in screen, screen

        # tpuscope report names it too, from the same Prometheus.
        made = report_prometheus.build(prom.url, WORKLOAD, Window(since=time.time() - hung + 60), Thresholds())
        odd = [(c.worker, c.hlo_location) for c in made.stalled_cores if c.elsewhere]
        assert odd == [(str(ODD), "fusion.7")], made.stalled_cores
        assert {c.worker for c in made.stalled_cores if not c.elsewhere} == {"0", "1", "3"}
        page = (render.write(made, short_tmp / "report")[0]).read_text()
        assert "Where the TPU cores sat while the workload stalled" in page and "fusion.7" in page
