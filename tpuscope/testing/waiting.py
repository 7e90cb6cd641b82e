"""Waiting for a condition, for the tests and tpuscope's own benchmarks: poll until it holds, fail loudly if not.

One implementation, so that every wait fails the same way: an AssertionError naming what was awaited and the last
value the condition gave, raised by the wait itself. A wait that returns quietly on timeout leaves the next assert
to fail for a reason nobody can read, or to pass on a state the test never reached."""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable
from typing import TypeVar

from tpuscope import catalog
from tpuscope.scrape import Scrape

T = TypeVar("T")

POLL_SECONDS = 0.05
SHOWN_CHARS = 4000  # of a diagnostic (a log, a scrape) in a failure's message: its tail, where the news is


class WaitTimedOut(AssertionError, TimeoutError):
    """A wait that ran out: a failed assert to a test, a timeout to a benchmark that reports a run that never
    came up (the fleet simulator catches TimeoutError)."""


def wait_for(
    predicate: Callable[[], T],
    timeout: float,
    what: str,
    *,
    detail: Callable[[], object] | None = None,
    ignoring: tuple[type[Exception], ...] = (),
    interval: float = POLL_SECONDS,
) -> T:
    """Call ``predicate`` until it returns a true value, and return that value.

    After ``timeout`` seconds, raise WaitTimedOut (an AssertionError) naming ``what``, the predicate's last value
    and ``detail()`` (a log, say: read only on failure). ``ignoring`` lists errors that mean "not yet" (a scrape
    refused under load), which are then the last value rather than the end of the wait."""
    deadline = time.monotonic() + timeout
    while True:
        last: object
        try:
            value = predicate()
        except ignoring as error:
            last = error
        else:
            if value:
                return value
            last = value
        if time.monotonic() >= deadline:
            shown = f"\n{str(detail())[-SHOWN_CHARS:]}" if detail is not None else ""
            raise WaitTimedOut(f"no {what} within {timeout:g} s (last: {_short(last)}){shown}")
        time.sleep(interval)


def scrape_until(url: str, ready: Callable[[Scrape], object], timeout: float = 20.0, what: str = "") -> Scrape:
    """Scrape ``url`` until ``ready`` holds of the scrape; that scrape (for the asserts that follow).

    On timeout the failure shows the last scrape and, unless ``what`` says otherwise, the source of ``ready``."""
    latest: list[Scrape] = []

    def attempt() -> Scrape | None:
        latest[:] = [Scrape.fetch(url)]
        return latest[0] if ready(latest[0]) else None

    def last_scrape() -> str:
        return f"the last scrape:\n{latest[0].text}" if latest else "no scrape answered"

    found = wait_for(attempt, timeout, what or f"scrape where {_source(ready)}", detail=last_scrape)
    assert found is not None  # wait_for returns only a true value
    return found


def sidecar_rounds(url: str, witness: str, count: int, timeout: float = 20.0) -> Scrape:
    """Wait until ``count`` of the sidecar's once-a-second rounds (the expiry check, then the wall-time booking)
    have begun and ended after this call; the scrape that shows the last.

    ``witness``: a workload with a process connected that sends nothing more. Its wall time grows at each round
    and only then, so it counts the rounds where nothing else shows them (a series that must not change). The
    first growth seen may be a round a scrape caught half done, so it waits for one more than ``count``."""
    scrape = Scrape.fetch(url)
    for seen in range(1, count + 2):
        scrape = _next_round(url, witness, scrape, timeout, f"round {seen} of {count + 1}")
    return scrape


def last_scrape_before_exit(
    url: str,
    exited: Callable[[], bool],
    ours: Callable[[Scrape], bool],
    timeout: float,
    *,
    detail: Callable[[], object] | None = None,
) -> Scrape:
    """Scrape ``url`` as Prometheus goes on scraping (every 0.1 s) until the server behind it has gone; the last
    scrape it served. A lingering sidecar exits after a scrape begun once its job had left: one begun earlier may
    already show the job's last booking, yet is not the final state.

    Gone: ``exited()``, a refused connection, or a page that is not ``ours``. Once closed, its port is anyone's:
    in the moments before its process ends, another server may answer there."""
    served: list[Scrape] = []  # the latest

    def gone() -> bool:
        if exited():
            return True
        try:
            scrape = Scrape.fetch(url)
        except OSError:  # it stopped listening between two scrapes
            return True
        if not ours(scrape):
            return True
        served[:] = [scrape]
        return False

    wait_for(gone, timeout, f"the exit of the server at {url}", detail=detail, interval=0.1)
    assert served, f"no scrape was served at {url} before it went"
    return served[-1]


def _next_round(url: str, witness: str, last: Scrape, timeout: float, which: str) -> Scrape:
    wall = catalog.GOODPUT_WALL.name
    booked = last.value(wall, workload=witness) or 0.0
    what = f"{which} ({witness}'s wall time booked again)"
    return scrape_until(url, lambda s: (s.value(wall, workload=witness) or 0.0) > booked, timeout, what)


def _source(function: Callable[..., object]) -> str:
    """What a predicate tests, as written (a lambda's line): the best name a wait can give it."""
    try:
        return " ".join(inspect.getsource(function).split())
    except (OSError, TypeError):
        return getattr(function, "__qualname__", repr(function))


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS // 2] + " ... " + text[-SHOWN_CHARS // 2 :]
