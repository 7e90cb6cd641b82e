"""The runner every collector shares: deadline, health metrics, backoff and one log line per change of state."""

from __future__ import annotations

import logging
import threading
from typing import Any, ClassVar

import pytest
from prometheus_client import CollectorRegistry

from tpuscope import catalog
from tpuscope.exporter.collectors import COLLECTORS
from tpuscope.exporter.collectors.base import UNAVAILABLE, Collector, CollectorError, Settings
from tpuscope.exporter.collectors.runner import CollectorRunner
from tpuscope.exporter.config import _parse_collectors, _parse_intervals
from tpuscope.exporter.metrics import register
from tpuscope.exporter.samples import Sample, SampleStore


class Scripted(Collector):
    """Does what the test tells it: each collect() pops the next outcome."""

    name = "scripted"
    outcomes: ClassVar[list[Any]] = []
    constructed: ClassVar[int] = 0

    def __init__(self, settings: Settings) -> None:
        type(self).constructed += 1

    def collect(self, timeout: float) -> list[Sample]:
        outcome = self.outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        if isinstance(outcome, threading.Event):
            outcome.wait(10)  # hang until released
            return []
        if isinstance(outcome, list):
            return outcome
        return [Sample(catalog.HOST_MEMORY_TOTAL, (), float(outcome))]


@pytest.fixture
def runner() -> CollectorRunner:
    Scripted.outcomes = []
    Scripted.constructed = 0
    registry = CollectorRegistry()
    store = SampleStore()
    registry.register(store)
    metrics = register(registry)
    runner = CollectorRunner(Scripted, Settings(), interval=1.0, deadline=0.2, store=store, metrics=metrics)
    runner.registry = registry  # type: ignore[attr-defined]
    return runner


def value(runner: CollectorRunner, metric: catalog.Metric, **labels: str) -> float | None:
    return runner.registry.get_sample_value(metric.name, {"collector": "scripted", **labels})  # type: ignore[attr-defined, no-any-return]


def test_failures_are_counted_logged_once_and_clear_the_series(
    runner: CollectorRunner, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "tpuscope.collectors")
    down = CollectorError(UNAVAILABLE, "connection refused")
    Scripted.outcomes = [7, down, down, down, 8]
    runner.collect_once()
    assert value(runner, catalog.COLLECTOR_UP) == 1
    assert runner.registry.get_sample_value(catalog.HOST_MEMORY_TOTAL.name) == 7  # type: ignore[attr-defined]
    for _ in range(3):
        runner.collect_once()
    assert value(runner, catalog.COLLECTOR_UP) == 0
    assert value(runner, catalog.COLLECTOR_ERRORS, reason="unavailable") == 3
    assert value(runner, catalog.COLLECTOR_ERRORS, reason="deadline") == 0  # every reason exists from the start
    assert runner.registry.get_sample_value(catalog.HOST_MEMORY_TOTAL.name) is None  # type: ignore[attr-defined]
    assert runner.failures == 3
    runner.collect_once()
    assert value(runner, catalog.COLLECTOR_UP) == 1 and runner.failures == 0
    assert value(runner, catalog.COLLECTOR_DURATION) is not None
    messages = [r.getMessage() for r in caplog.records]
    assert messages == [
        "collector scripted: up (1 series)",
        "collector scripted: down (unavailable): connection refused; retrying with backoff",
        "collector scripted: up after 3 failed collections (1 series)",
    ]
    assert Scripted.constructed == 1


def test_a_hung_collection_is_not_piled_on(runner: CollectorRunner) -> None:
    hang = threading.Event()
    Scripted.outcomes = [hang, 5]
    runner.collect_once()  # passes the deadline
    runner.collect_once()  # the first still hangs: no second call is started
    assert value(runner, catalog.COLLECTOR_ERRORS, reason="deadline") == 2
    assert Scripted.outcomes == [5]
    hang.set()
    runner._hung.result(timeout=5)  # type: ignore[union-attr]
    runner.collect_once()
    assert value(runner, catalog.COLLECTOR_UP) == 1


def test_an_unexpected_exception_is_an_error_not_a_crash(runner: CollectorRunner) -> None:
    Scripted.outcomes = [KeyError("surprise"), [Sample(catalog.HOST_MEMORY_TOTAL, ("extra-label",), 1.0)], 3]
    runner.collect_once()
    runner.collect_once()  # a sample that does not fit its metric: a bug of ours, reported, not served
    assert value(runner, catalog.COLLECTOR_ERRORS, reason="error") == 2
    assert runner.registry.get_sample_value(catalog.HOST_MEMORY_TOTAL.name) is None  # type: ignore[attr-defined]
    runner.collect_once()
    assert runner.registry.get_sample_value(catalog.HOST_MEMORY_TOTAL.name) == 3  # type: ignore[attr-defined]


def test_collector_options() -> None:
    assert _parse_collectors("auto") is None
    assert _parse_collectors("none") == ()
    assert _parse_collectors("host, libtpu") == ("host", "libtpu")
    with pytest.raises(ValueError, match="unknown collector"):
        _parse_collectors("host,dcgm")
    assert _parse_intervals("2,host=15") == {name: 15.0 if name == "host" else 2.0 for name in COLLECTORS}
    with pytest.raises(ValueError, match="unknown collector"):
        _parse_intervals("gpu=1")
