"""``tpuscope bench flood`` holds: ten times the supported rate, drops counted on both sides, nothing else lost.

The run's figures are printed, not asserted as speed; what is asserted is what the
flood is for: the overload was real (offered >= 10x the supported rate, drops > 0),
every drop was counted by the jobs and by the sidecar alike, the well-behaved job
lost nothing, every scrape was answered, and the sidecar's memory stayed bounded.
"""

from __future__ import annotations

from pathlib import Path

from tpuscope.bench import flood
from tpuscope.testing.bench import report as bench_report


def test_a_flood_at_ten_times_the_supported_rate_loses_nothing_unseen(short_tmp: Path) -> None:
    figures = bench_report("flood", "--seconds", "30", directory=short_tmp, timeout=400)
    assert figures["failed"] == []
    assert figures["offered_events_per_second"] >= 10 * flood.SUPPORTED_EVENTS_PER_SECOND
    assert figures["flood_dropped_by_jobs"] > 0
    assert figures["dropped_by_sidecar"] == figures["flood_dropped_by_jobs"]
    assert figures["accepted_from_flooders"] == figures["flood_sent"]
    assert figures["invalid_by_sidecar"] == 0
    assert figures["good_dropped"] == 0
    assert figures["good_steps_on_sidecar"] == figures["good_steps_run"] > 0
    # A scrape every half second for 30 s: dozens, and not one unanswered.
    assert figures["scrapes_unanswered"] == 0
    assert figures["scrapes_answered"] >= 30
    assert figures["rss_peak_mb"] <= figures["rss_bound_mb"] == flood.RSS_BOUND_MB
    assert figures["scrape_p99_ms"] > 0  # measured, and printed in the table
