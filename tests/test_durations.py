"""One reading of a length of time for flags, rule windows, scrape intervals and readers' figures."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tpuscope import durations


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90", 90),
        ("2.5", 2.5),
        ("90s", 90),
        ("15m", 900),
        ("1h30m", 5400),
        ("1.5h", 5400),
        ("1500ms", 1.5),
        ("1d", 86400),
        ("1w", 604800),
        (" 5M ", 300),
        ("0", 0),
    ],
)
def test_parse_takes_bare_seconds_and_durations(text: str, seconds: float) -> None:
    assert durations.parse(text) == seconds


@pytest.mark.parametrize("text", ["", "soon", "5 m", "m5", "1h-5m", "-"])
def test_parse_says_what_it_expected(text: str) -> None:
    with pytest.raises(ValueError, match="expected seconds or a duration such as 90s"):
        durations.parse(text)


def test_prometheus_syntax_is_strict() -> None:
    assert durations.prometheus_ms("1h30m") == 5_400_000
    for text in ("90", "1.5h", "5M"):  # Prometheus would refuse each
        with pytest.raises(ValueError, match="not a Prometheus duration"):
            durations.prometheus_ms(text)


@given(st.integers(min_value=1, max_value=10**12))
def test_prometheus_form_reads_back_to_the_same_milliseconds(ms: int) -> None:
    written = durations.prometheus(ms)
    assert durations.prometheus_ms(written) == ms
    assert durations.parse(written) == pytest.approx(ms / 1000)


@pytest.mark.parametrize(
    ("seconds", "said"),
    [(0.038, "38 ms"), (4.2, "4.2 s"), (1020, "17 min"), (12600, "3.5 h"), (math.nan, "never"), (math.inf, "never")],
)
def test_human(seconds: float, said: str) -> None:
    assert durations.human(seconds) == said


def test_seconds_are_written_to_the_millisecond() -> None:
    assert durations.prometheus_seconds(600) == "10m"
    assert durations.prometheus_seconds(90.0) == "90s"
    assert durations.prometheus_seconds(1.5) == "1500ms"
