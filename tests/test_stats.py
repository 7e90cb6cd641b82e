"""``tpuscope.stats.percentile`` is the nearest-rank percentile its docstring says."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tpuscope.stats import percentile

HUNDRED = [float(v) for v in range(1, 101)]


@pytest.mark.parametrize(
    ("q", "expected"), [(0.99, 99.0), (0.95, 95.0), (0.5, 50.0), (0.07, 7.0), (0.01, 1.0), (0.0, 1.0), (1.0, 100.0)]
)
def test_the_ranks_of_one_to_a_hundred_are_the_values_themselves(q: float, expected: float) -> None:
    shuffled = random.Random(7).sample(HUNDRED, len(HUNDRED))
    assert percentile(shuffled, q) == expected


def test_no_values_is_zero_and_one_value_is_itself() -> None:
    assert percentile([], 0.5) == 0.0
    assert percentile([3.5], 0.01) == percentile([3.5], 0.99) == 3.5


@given(st.lists(st.floats(allow_nan=False, allow_infinity=False), min_size=1), st.floats(min_value=0, max_value=1))
def test_it_is_the_smallest_value_with_at_least_q_of_the_values_at_or_below_it(values: list[float], q: float) -> None:
    p = percentile(values, q)
    n = len(values)
    at_or_below = sum(v <= p for v in values)
    assert p in values
    assert at_or_below >= q * n - 1e-9
    below = sum(v < p for v in values)  # any smaller value holds fewer than q of them
    assert below < max(q * n - 1e-9, 1)
