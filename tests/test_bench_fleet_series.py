"""The synthetic fleet ``bench rule-cost`` and ``bench fleet-scale`` share: its live ``/metrics`` and its history.

The feed serves each target's series at the time of asking from a forked process, and counts the scrapes; the
backfill writes the history's parts with promtool into one TSDB, which a real Prometheus then answers from.
"""

from __future__ import annotations

import functools
import urllib.request
from pathlib import Path

import pytest
from conftest import require

from tpuscope.bench import fleet_series
from tpuscope.testing.prometheus import PrometheusServer
from tpuscope.testing.waiting import wait_for


def test_the_feed_serves_each_target_at_the_time_of_asking_and_counts_the_scrapes() -> None:
    feed = fleet_series.Feed(lambda target, t: f'm{{target="{target}"}} {t:.0f}\n')
    try:
        before = feed.scrapes
        with urllib.request.urlopen(f"http://{feed.address}/metrics?target=3/node", timeout=10) as answer:
            assert answer.read().decode().startswith('m{target="3/node"} ')
        with urllib.request.urlopen(f"http://{feed.address}/metrics", timeout=10) as answer:
            assert answer.read().decode().startswith('m{target=""} ')
        # Counted once its answer is written, in the feed's process: the client may read the answer first.
        wait_for(lambda: feed.scrapes >= before + 2, 10, "both scrapes counted")
        assert feed.scrapes == before + 2
        assert feed.scraped_at(before) <= feed.scraped_at(before + 1)
        with pytest.raises(ValueError, match="not among the latest"):
            feed.scraped_at(before + 2)
    finally:
        feed.close()


def test_the_backfill_writes_every_part_into_one_tsdb_prometheus_reads(short_tmp: Path) -> None:
    require("promtool")
    end = 1_700_000_000.0
    counter = fleet_series.Series("c_total", '{host="a"}', since=3600, every=60, slope=2.0, origin=end - 7200)
    gauge = fleet_series.Series("g", '{host="b"}', since=600, every=60, level=5.0)
    parts = [functools.partial(fleet_series.write_series, [s], end) for s in (counter, gauge)]
    written = fleet_series.backfill(parts, short_tmp / "history", writers=2)
    assert (written.series, written.samples, written.parts) == (2, 61 + 11, 2)
    assert not list((short_tmp / "history").glob("part-*")), "a part's text or blocks left beside the TSDB"
    flags = fleet_series.prometheus_on(written.path, short_tmp / "prometheus")
    with PrometheusServer(short_tmp / "prometheus", [], flags=flags) as prometheus:
        (answer,) = prometheus.api.query("c_total", end)
        assert float(answer["value"][1]) == counter.value(end) == 14_400.0
        (answer,) = prometheus.api.query("g", end - 300)
        assert float(answer["value"][1]) == 5.0
