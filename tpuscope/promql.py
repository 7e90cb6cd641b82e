"""PromQL pieces the dashboards and the alert rules both build on.

The dashboards add Grafana's template variables to their selectors (:mod:`tpuscope.dashboards.queries`); the
rules do not. What a query *means* is written once, here.
"""

from __future__ import annotations

from collections.abc import Callable

from tpuscope import durations
from tpuscope.catalog import HOST_LABELS, HOST_MEMORY_AVAILABLE, HOST_MEMORY_TOTAL, Metric

# prometheus_client's process collector, in every sidecar's /metrics: when the sidecar started.
SIDECAR_START = "process_start_time_seconds"
# Sidecars' series alone (the sidecar puts slice on every series; node_exporter and Prometheus serve the name
# without it): the bare name, read with a range at every point of a board, would read every exporter's.
SIDECAR_START_SERIES = f'{SIDECAR_START}{{{HOST_LABELS[0]}!=""}}'
# A new target's first scrape comes within this of its start: service discovery and one scrape interval,
# Prometheus' lookback (5 minutes) as the bound.
FIRST_SCRAPE_SECONDS = 300.0
# One workload in the rules: its namespace and JobSet where its pods have them (the scrape's target labels), and its
# name. Its alerts keep them, so an Alertmanager routes them by team as it routes kube-prometheus' alerts and two
# teams' workloads of the same name stay apart. Outside Kubernetes the first two are absent.
PLACEMENT = "namespace, jobset"
WORKLOAD = f"{PLACEMENT}, workload"
# The labels that name one worker of a job for its whole life, across the pods it runs in.
WORKER = ", ".join(HOST_LABELS)
# One worker of a workload, as the rules group it: its sidecars come and go with its pods, the worker stays.
RUN = f"{WORKLOAD}, {WORKER}"
# A scrape target, one host's sidecar, with its pod's namespace and JobSet (the target labels): an alert on a host
# names the team whose job runs there.
TARGET = f"{PLACEMENT}, job, instance"


def series(metric: Metric, *matchers: str, suffix: str = "") -> str:
    """``name{matchers}``: a catalogue metric (a histogram's ``_bucket``/``_sum``/``_count`` by ``suffix``)."""
    name = metric.series(suffix) if suffix else metric.name
    return f"{name}{{{', '.join(matchers)}}}" if matchers else name


def memory_available_ratio(by: str, selector: Callable[[Metric], str] = series) -> str:
    """Each host's memory available (the kernel's MemAvailable) as a share of its total, per ``by`` (a target's
    labels): the alert's, the per-slice record's and Job debug's. ``selector`` writes a metric's selector (the
    dashboards add their variables)."""
    available, total = selector(HOST_MEMORY_AVAILABLE), selector(HOST_MEMORY_TOTAL)
    return f"max by ({by}) ({available}) / max by ({by}) ({total})"


def grown(selector: str, window: str, seconds: str = "", targets: str = "") -> str:
    """How much the counters ``selector`` picks grew in ``window``, per series, a series' first event and a
    sidecar gone since included.

    ``increase()`` alone misses rare events: a labelled counter comes into being at its first event, already at 1,
    and ``increase()`` never counts a series' first sample (the first failure would read 0); over a window of a few
    samples (a report's step) its extrapolation to the edges misreads a count. So, the first that holds, per series:

    1. it existed ``window`` ago and its sidecar has not restarted since: what it gained since, up to its last
       sample (a gone sidecar's too), exactly;
    2. it did not exist ``window`` ago, and its sidecar started inside the window (or too shortly before to be
       scraped when it began), or its target was scraped then without it: all of it;
    3. otherwise ``increase()`` over the window, rounded (its extrapolation adds a fraction): a series whose
       sidecar restarted in place inside the window (``increase()`` counts a reset's new value, where the most in
       the window less the count before would hide the new life's counts behind the old's), or whose target was
       not scraped ``window`` ago (down), so that a gap in the data never makes an old series count as new.

    Three reads of the window per series. ``seconds``: the window in seconds where ``window`` is a variable
    (Grafana's ``$__range_s``); by default parsed from it. ``targets``: matchers on the scrape targets' labels
    (``instance``) narrowing 1 and 2 to the targets ``selector`` can pick; without, each reads every sidecar's
    start and every target's ``up``.
    """
    # How far back a sidecar's start makes its series new: the window, and the time a new target may wait
    # for its first scrape. A sidecar restarted in place inside the window itself reset its counters there.
    if seconds:
        within, since = seconds, f"({seconds} + {FIRST_SCRAPE_SECONDS:g})"
    else:
        within, since = f"{durations.parse(window):g}", f"{durations.parse(window) + FIRST_SCRAPE_SECONDS:g}"
    started = f'{SIDECAR_START}{{{HOST_LABELS[0]}!="", {targets}}}' if targets else SIDECAR_START_SERIES
    up = f"up{{{targets}}}" if targets else "up"
    last = f"max_over_time({selector}[{window}])"
    before = f"{selector} offset {window}"
    by_target = "on (job, instance)"  # the labels of a scrape target, on every series it serves
    start = f"max_over_time({started}[{window}])"
    return (
        f"(({last} - {before}) >= 0 unless {by_target} {start} > time() - {within}"
        f" or {last} unless {before} and {by_target} ({start} > time() - {since} or {up} offset {window} == 1)"
        f" or round(increase({selector}[{window}])))"
    )


def each_worker_once(grew: str, by: str = "workload") -> str:
    """Rare events that every worker of a job reports (a restart, a failure, a recompile), counted once: summed over
    each worker's successive sidecars (a restarted pod's counters start again), then the most any one worker saw.
    One restart of a 4-host job is 1, not 4; three seen by three pod generations are 3. ``grew``: :func:`grown`."""
    return f"max by ({by}) (sum by ({by}, {WORKER}) ({grew}))"


def add(a: str, b: str, on: str = "workload") -> str:
    """``a + b`` per ``on``, either side standing alone where the other has no series (PromQL's ``+`` drops it)."""
    return f"(({a} + on ({on}) {b}) or {a} or {b})"


def le(bound: float) -> str:
    """A bucket bound as the ``le`` label reads (0.5 -> "0.5", 1 -> "1.0"), for matching one bucket."""
    return repr(float(bound))
