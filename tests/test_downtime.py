"""The JAX bench crashes, stays down a measured gap, and resumes: the gap is downtime, and goodput is productive
time over the whole wall span, as the sidecar, Prometheus and ``tpuscope report`` each tell it, each within half
a point of what this test works out by hand from the job's own recording (docs/goodput.md).

Twice: with one sidecar throughout, and with the sidecar gone during the gap and a new one (another target, as a
new pod is) serving the resumed run, when only Prometheus can know the time nobody booked.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import require

from tpuscope import alerts, catalog, events
from tpuscope.conventions import DOWN_SINCE, GOODPUT_RATE, UNBOOKED_RATE, WALL_RATE
from tpuscope.fleetsim.rules import scaled_rules_file
from tpuscope.generator_config import GeneratorConfig
from tpuscope.scrape import Scrape
from tpuscope.testing import bench as testing_bench
from tpuscope.testing.prometheus import PrometheusServer, free_port, target_of
from tpuscope.testing.waiting import wait_for
from tpuscope.tracing import read_records
from tpuscope.workload.sidecar import SidecarProcess

pytestmark = pytest.mark.long

GAP = 6.0  # seconds between the crash and the rerun
POINT = 0.005  # half a percentage point of goodput


@dataclass
class ByHand:
    """What the recording says, worked out without the ledger: the wall span from the first start to the last
    stop, the gap from the failure to the next start, and the productive time: each durable step's compute
    (its duration less its input wait and its compiles), durable meaning covered by a save or by the clean stop."""

    wall: float
    gap: float
    productive: float

    @property
    def goodput(self) -> float:
        return self.productive / self.wall

    @classmethod
    def of(cls, records: list[tuple[float, events.AnyEvent]]) -> ByHand:
        starts = [t for t, e in records if isinstance(e, events.Lifecycle) and e.state == "start"]
        (failed,) = [t for t, e in records if isinstance(e, events.Lifecycle) and e.state == "failure"]
        (stopped,) = [t for t, e in records if isinstance(e, events.Lifecycle) and e.state == "stop"]
        first_run = [e for t, e in records if t <= failed]
        saved = max(e.step for e in first_run if isinstance(e, events.Checkpoint) and e.operation == "save" and e.ok)
        durable = [e for e in first_run if isinstance(e, events.Step) and e.step <= saved]
        durable += [e for t, e in records if t > failed and isinstance(e, events.Step)]
        productive = sum(s.duration_s - s.io_s - (s.compile_s or 0) for s in durable)
        return cls(wall=stopped - starts[0], gap=starts[1] - failed, productive=productive)


def bench(socket: Path, directory: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    return testing_bench.run(
        *flags,
        env={"XDG_CACHE_HOME": str(directory.parent / "cache")},
        workload="down",
        steps=40,
        checkpoint_every=10,
        socket=socket,
        run_dir=directory / "run",
        record=directory / "events.jsonl",
        profile_period="off",
        compile_cache=directory.parent / "xla-cache",
    )


def crash_wait_resume(first: SidecarProcess, directory: Path, between: object = None) -> None:
    """The bench crashes at step 25 (after its save of step 19), the test waits GAP seconds (calling ``between``
    first), and the same command runs again: it resumes from that checkpoint and finishes."""
    crashed = bench(first.socket, directory, "--inject=crash=25")
    assert crashed.returncode == 3, crashed.stdout[-2000:] + crashed.stderr[-3000:]
    down = time.monotonic()
    if callable(between):
        between()
    time.sleep(max(0.0, GAP - (time.monotonic() - down)))  # the downtime under test: a duration, not a condition


def report(prometheus: str, directory: Path, since: float) -> dict[str, float]:
    """``tpuscope report --prometheus``'s wall time by category at the window's end."""
    out = directory / "report"
    result = subprocess.run(
        [sys.executable, "-m", "tpuscope", "report", f"--prometheus={prometheus}", "--workload=down",
         f"--since={since:.0f}s", f"--out={out}"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    data = json.loads((out / "report.json").read_text())
    return {s["name"]: s["values"][-1] for s in data["goodput"] if s["values"]}


@pytest.fixture
def rules(tmp_path: Path) -> Iterator[Path]:
    """The generated rules, as they are: their 5-minute rates hold the whole run."""
    require("prometheus")
    path = tmp_path / "rules.yml"
    path.write_text(alerts.rules_file(GeneratorConfig()))
    yield path


@pytest.fixture
def fast_rules(tmp_path: Path) -> Iterator[Path]:
    """The generated rules with time compressed 30 times, as fleet-sim runs them: a worker unserved for 10 s (5
    minutes) is down, one unserved for 2 minutes (an hour) forgotten."""
    require("prometheus")
    path = tmp_path / "rules.yml"
    path.write_text(scaled_rules_file(GeneratorConfig(), 30))
    yield path


def test_a_crash_a_gap_and_a_resume_are_booked_by_the_sidecar_prometheus_and_the_report(
    tmp_path: Path, rules: Path
) -> None:
    directory = tmp_path / "one"
    started = time.time()
    with (
        SidecarProcess(tmp_path / "s.sock", "127.0.0.1:0") as sidecar,
        PrometheusServer(tmp_path / "prom", [target_of(sidecar.url)], rule_files=[rules]) as prom,
    ):
        # Scraped from before the start: a counter's first sample is where rate() begins counting.
        wait_for(lambda: prom.scalar("up") == 1, 20, "scrape of the sidecar")
        crash_wait_resume(sidecar, directory)
        resumed = bench(sidecar.socket, directory)
        assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-3000:]
        hand = ByHand.of(read_records(directory / "events.jsonl"))
        assert hand.gap >= GAP  # the wait, and the crashed process's exit and the rerun's start-up

        # The sidecar: downtime is the gap, and its wall time the span (the categories add up to it).
        scrape = Scrape.fetch(sidecar.url)
        booked = {s.labels["category"]: s.value for s in scrape.find(catalog.GOODPUT.name, workload="down")}
        wall = scrape.present(catalog.GOODPUT_WALL.name, workload="down")
        assert booked["downtime"] == pytest.approx(hand.gap, abs=0.1)
        assert wall == pytest.approx(hand.wall, abs=0.2)
        assert sum(booked.values()) == pytest.approx(wall, abs=0.05)
        assert booked["productive"] / wall == pytest.approx(hand.goodput, abs=POINT)

        # Prometheus, through the recording rules: the 5-minute rates of the categories and of the wall time
        # hold the whole run (shorter than 5 minutes), so their ratios are its shares.
        prom.catch_up(rules=True)  # a scrape and an evaluation after the last events

        def share(category: str) -> float | None:
            return prom.scalar(
                f'sum({GOODPUT_RATE}{{workload="down", category="{category}"}}) / sum({WALL_RATE}{{workload="down"}})'
            )

        wait_for(lambda: share("productive") is not None, 15, "recorded productive share")
        assert share("productive") == pytest.approx(hand.goodput, abs=POINT)
        assert share("downtime") == pytest.approx(hand.gap / hand.wall, abs=POINT)

        # tpuscope report, from the same Prometheus.
        seconds = report(prom.url, directory, time.time() - started + 5)
        total = sum(seconds.values())
        print(
            f"by hand: {hand}, goodput {hand.goodput:.2%}; the sidecar: {booked}, wall {wall:.3f} s; the rules: "
            f"productive {share('productive'):.2%}, downtime {share('downtime'):.2%}; the report: {seconds}"
        )
        assert seconds["downtime"] == pytest.approx(hand.gap, abs=0.2)
        assert seconds["productive"] / total == pytest.approx(hand.goodput, abs=POINT)


def test_with_the_sidecar_gone_in_the_gap_prometheus_books_the_time_nobody_did(
    tmp_path: Path, fast_rules: Path
) -> None:
    """The pod went with its sidecar: a preemption deletes both. The crashed run's sidecar stops a moment after the
    crash, a new one (another target, as a new pod's is) serves the resumed run, and the gap between is booked by
    no sidecar. Prometheus' rules see it as it happens (the worker is down since its last step, and its unbooked
    rate rises), and the report books it as downtime: goodput is still productive over the whole span."""
    directory = tmp_path / "two"
    ports = [free_port(), free_port()]
    started = time.time()
    first = SidecarProcess(tmp_path / "s.sock", f"127.0.0.1:{ports[0]}")
    targets = [f"127.0.0.1:{port}" for port in ports]
    # Discovered, as a pod's target is: the first goes with its pod, not merely down (a target listed but unscraped
    # is a NetworkPolicy, not a pod gone).
    with PrometheusServer(tmp_path / "prom", targets, rule_files=[fast_rules], discovered=True) as prom:
        wait_for(lambda: prom.scalar("max(up)") == 1, 20, "a target up")
        seen: dict[str, float | None] = {}

        def sidecar_goes() -> None:
            prom.catch_up()  # scraped a last time, the job gone
            first.stop()
            prom.discover(targets[1:])
            wait_for(
                lambda: (prom.scalar(f'sum({UNBOOKED_RATE}{{workload="down"}})') or 0) > 0,
                10,
                "unbooked time of the gone workload in Prometheus",
            )
            wait_for(
                lambda: prom.scalar(f'min({DOWN_SINCE}{{workload="down"}})') is not None,
                30,
                "down-since of the gone workload in Prometheus",
            )
            seen["down since"] = prom.scalar(f'min({DOWN_SINCE}{{workload="down"}})')

        crash_wait_resume(first, directory, between=sidecar_goes)
        with SidecarProcess(tmp_path / "s.sock", f"127.0.0.1:{ports[1]}") as second:
            resumed = bench(second.socket, directory)
            assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-3000:]
            prom.catch_up()  # a scrape after the last events
            hand = ByHand.of(read_records(directory / "events.jsonl"))
            records = read_records(directory / "events.jsonl")
            crashed_at = max(t for t, e in records if isinstance(e, events.Lifecycle) and e.state == "failure")
            assert seen["down since"] == pytest.approx(crashed_at, abs=1.5), "down since its last step"
            seconds = report(prom.url, directory, time.time() - started + 5)
    total = sum(seconds.values())
    print(
        f"by hand: {hand}, goodput {hand.goodput:.2%};"
        f" the report: {seconds}, goodput {seconds['productive'] / total:.2%}"
    )
    # The sidecar books a gap's downtime each second: up to a second of it goes with a sidecar that stops.
    assert total == pytest.approx(hand.wall, abs=1.0)
    assert seconds["downtime"] == pytest.approx(hand.gap, abs=1.0)
    assert seconds["productive"] / total == pytest.approx(hand.goodput, abs=POINT)
