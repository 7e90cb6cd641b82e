"""``tpuscope bench soak --minutes 2`` holds: Prometheus ends up with every count the jobs reported.

The soak runs the real JAX workload and two synthetic jobs against one sidecar, scraped
every second by a real Prometheus, for two minutes; the jobs record every event they
send. What is asserted is what a soak is for: each counter Prometheus holds equals the
jobs' recordings, every recorded event was accepted and none was dropped, and the
sidecar's resident memory stopped growing after the warm-up. A lost event, a miscount
or a leak fails the test.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tpuscope.bench import soak
from tpuscope.testing.bench import report as bench_report

pytestmark = pytest.mark.long


@pytest.mark.timeout(600)
def test_a_two_minute_soak_loses_nothing_and_does_not_leak(short_tmp: Path) -> None:
    # Two minutes, a run's length past the deadline at most, then Prometheus' last scrapes.
    figures = bench_report("soak", "--minutes", "2", directory=short_tmp, timeout=540)
    assert figures["failed"] == []

    # Every counter, per workload and label, as the jobs reported it and as Prometheus holds it.
    counters = figures["counters"]
    assert counters and all(row["equal"] for row in counters), [row for row in counters if not row["equal"]]
    assert figures["accepted"] == figures["events_recorded"] == figures["events_sent"] > 0
    assert figures["dropped_by_jobs"] == figures["dropped_by_sidecar"] == figures["invalid"] == 0

    jobs = {job["workload"]: job for job in figures["jobs"]}
    assert any(job["kind"] == "jax" and job["steps_reported"] > 0 for job in jobs.values()), jobs.keys()
    assert sum(job["steps_reported"] for job in jobs.values()) >= 5_000
    # Every kind of event a training job reports, a JAX restart (a checkpoint restore and cache hits) included.
    kinds = {kind for job in jobs.values() for kind, count in job["event_kinds"].items() if count}
    assert set(soak.TRAINING_EVENTS) <= kinds
    checkpoints = {(row["workload"], row["label"]) for row in counters if row["counter"] == "checkpoints"}
    assert {("soak-jax", "save"), ("soak-jax", "restore")} <= checkpoints
    cache = {row["label"] for row in counters if row["counter"] == "cache look-ups" and row["reported"]}
    assert cache == {"hit", "miss"}
    assert jobs["soak-jax"]["restarts"] >= 1
    for job in jobs.values():
        assert job["starts"] == job["stops"] == len(job["runs"])
        assert all(run["returncode"] == 0 for run in job["runs"])

    rss = figures["rss"]
    assert rss["samples"] >= 100  # one a second for two minutes
    assert rss["growth_mb"] <= rss["bound_mb"] == soak.RSS_GROWTH_BOUND_MB
    assert figures["scrapes_failed"] == 0 and figures["sidecar_restarts"] == 0
