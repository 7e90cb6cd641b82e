"""promtool cases for the training-health alerts (issue 56): a loss gone non-finite pages, the worker whose value
before the reduction went first alone gets a ticket, a spike that does not come down gets one. tests/test_alerts.py
adds them to the cases.
"""

from __future__ import annotations

from alert_cases import Case, W, place, s, sidecar
from alert_cases_incidents import Reading

from tpuscope import catalog as c
from tpuscope.conventions import GOODPUT_RATE, AlertName

MINUTES = 60


def nonfinite(value: str, counts: str, worker: int = 0) -> dict[str, str]:
    """Worker ``worker``'s counter of non-finite ``value`` readings, and its sidecar (the count of rare events
    reads its start)."""
    return {
        **sidecar(MINUTES, instance=f"h{worker}:9478", worker=str(worker)),
        s(c.TRAINING_NONFINITE, value=value, **place(worker)): counts,
    }


def diverging(onsets: tuple[int, ...], local_reporters: int | None = None) -> dict[str, str]:
    """Workers reporting their local values, each from minute 10 on non-finite from step ``onsets[i]``: the
    all-reduce has spread it, every worker counts non-finite local values a minute."""
    series: dict[str, str] = {}
    for worker, onset in enumerate(onsets):
        series |= nonfinite("local", "0x10 60+60x20", worker)
        series[s(c.TRAINING_NONFINITE_ONSET, value="local", **place(worker))] = f"_x10 {onset}x20"
    for worker in range(len(onsets) if local_reporters is None else local_reporters):
        series[s(c.TRAINING_VALUE, value="local", **place(worker))] = "1x30"
    return series


NON_FINITE_SAYS = (
    "Workload w reported {} non-finite losses or gradient norms in the last 5m: every step from here on is lost. "
    "Stop it, and restore the last checkpoint before the first non-finite step."
)
FIRST_SAYS = (
    "Worker 2 of slice 0 (h2:9478) of workload w went non-finite first, at step 500, its value before the "
    "reduction, while its peers' were finite: suspect silent data corruption on its chips."
)


def deviation(values: str) -> dict[str, str]:
    return {s(c.LOSS_DEVIATION, **W): values}


CASES = [
    # The loss goes NaN at minute 11 and stays: a page at the next evaluation, once for the workload.
    Case(
        AlertName.LOSS_NON_FINITE, "critical", "11m", nonfinite("loss", "0x10 60+60x20"), W, NON_FINITE_SAYS.format(60)
    ),
    # The gradient norm alone says it too, and both count as one cause: one page.
    Case(
        AlertName.LOSS_NON_FINITE,
        "critical",
        "11m",
        {
            **nonfinite("loss", "0x10 60+60x20"),
            s(c.TRAINING_NONFINITE, value="grad_norm", **place(0)): "0x10 60+60x20",
        },
        W,
        NON_FINITE_SAYS.format(120),
    ),
    # A series born at its first NaN counts in full (no zero before it was scraped).
    Case(AlertName.LOSS_NON_FINITE, "critical", "11m", nonfinite("loss", "_x11 5+60x20"), W, NON_FINITE_SAYS.format(5)),
    Case(AlertName.LOSS_NON_FINITE, None, "20m", nonfinite("loss", "0x30")),  # finite throughout
    Case(AlertName.LOSS_NON_FINITE, None, "20m", nonfinite("loss", "0x10 60x20")),  # a minute of NaN, restored since
    Case(AlertName.LOSS_NON_FINITE, None, "12m", diverging((500, 501, 501, 501))),  # local values alone do not page
    # Worker 2's local value went at step 500, its peers' a step later: named, after the minute its peers get.
    Case(
        AlertName.NON_FINITE_FIRST_WORKER,
        "warning",
        "12m",
        diverging((501, 501, 500, 501)),
        {**W, **place(2)},
        FIRST_SAYS,
    ),
    Case(AlertName.NON_FINITE_FIRST_WORKER, None, "10m", diverging((501, 501, 500, 501))),  # its minute not yet over
    Case(AlertName.NON_FINITE_FIRST_WORKER, None, "12m", diverging((500, 500, 500, 500))),  # all at once: the code
    Case(AlertName.NON_FINITE_FIRST_WORKER, None, "12m", diverging((501, 500, 500, 501))),  # a tie names nobody
    Case(
        AlertName.NON_FINITE_FIRST_WORKER, None, "12m", diverging((500, 501), local_reporters=1)
    ),  # no peer to compare
    Case(AlertName.NON_FINITE_FIRST_WORKER, None, "40m", diverging((501, 501, 500, 501))),  # restored: it stopped
    # A spike from minute 20 that never comes down: a ticket once it has held for the whole 30 minutes.
    Case(
        AlertName.LOSS_SPIKE,
        "warning",
        "50m",
        deviation(f"1x19 50x{MINUTES - 20}"),
        W,
        "Workload w's loss has stayed at least 50 robust standard deviations above its recent baseline for 30 min.",
    ),
    Case(AlertName.LOSS_SPIKE, None, "49m", deviation(f"1x19 50x{MINUTES - 20}")),  # 29 minutes of it
    Case(AlertName.LOSS_SPIKE, None, "50m", deviation(f"1x19 50x10 1x{MINUTES - 30}")),  # it came down
    Case(AlertName.LOSS_SPIKE, None, "50m", deviation(f"_x30 50x{MINUTES - 30}")),  # served 20 minutes: too young
]


def rolled_back_at_minute_10() -> dict[str, str]:
    """A worker productive a second a second, whose restore at minute 10 threw away 24 s it had booked productive."""
    return {
        s(c.GOODPUT, category="productive", **W): "0+60x20",
        s(c.GOODPUT, category="lost", **W): "0x20",
        s(c.GOODPUT_ROLLED_BACK, **W): "0x9 24x11",
    }


# The goodput categories the rules book (promql_expr_test): the rolled-back seconds move from productive to lost, at
# the rate of their 5-minute window (24 s over 300 s: 0.08 a second; a counter from 0 is not extrapolated below 0).
READINGS = [
    Reading(
        "a rollback's productive seconds are carved out of productive",
        f'round({GOODPUT_RATE}{{category="productive"}}, 0.01)',
        "12m",
        rolled_back_at_minute_10(),
        0.92,
        {**W, "category": "productive"},
    ),
    Reading(
        "and booked as lost",
        f'round({GOODPUT_RATE}{{category="lost"}}, 0.01)',
        "12m",
        rolled_back_at_minute_10(),
        0.08,
        {**W, "category": "lost"},
    ),
    Reading(
        "a workload without a rollback keeps its productive time",
        f'round({GOODPUT_RATE}{{category="productive"}}, 0.01)',
        "12m",
        {s(c.GOODPUT, category="productive", **W): "0+60x20"},
        1.0,
        {**W, "category": "productive"},
    ),
]
