"""/metrics' writer against prometheus_client's own writers, on the same registry, sample for sample.

The writer (tpuscope/exporter/exposition.py) reads only ``registry.collect()``, as
``generate_latest`` does, and must say what it says: the same families, HELP, TYPE
and UNIT, and the same samples with the same values, timestamps and exemplars,
in both formats. Its bytes differ only where Prometheus cannot tell (label order,
a number's spelling), so where neither arises the bytes are compared too. Also
here: the Accept and Accept-Encoding negotiation, and that nothing under
tpuscope/exporter reaches into another object's private attributes.
"""

from __future__ import annotations

import ast
import gzip
import math
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client import Counter as ClientCounter
from prometheus_client import Histogram as ClientHistogram
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeHistogramMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    StateSetMetricFamily,
    SummaryMetricFamily,
    UnknownMetricFamily,
)
from prometheus_client.exposition import generate_latest as text_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics.exposition import generate_latest as openmetrics_latest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families as parse_text
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.samples import Exemplar, Timestamp

import tpuscope
from tpuscope import catalog, events
from tpuscope.exporter import fast, samples
from tpuscope.exporter.aggregator import Aggregator
from tpuscope.exporter.daemon import build_registry
from tpuscope.exporter.exposition import OPENMETRICS, TEXT, Writer
from tpuscope.exporter.http import make_app, preferences, wants_gzip, wants_openmetrics
from tpuscope.exporter.metrics import register
from tpuscope.exporter.samples import SampleStore

TRACE = {"trace_id": "0123456789abcdef0123456789abcdef"}
ODD = 'a "quoted" \\ back\nline'  # a label value with every character the formats escape
HOST = {"slice": "s1", "worker": "3"}
# What prometheus_client writes, by format: (its writer, a parser of that format).
FORMATS: dict[str, tuple[Callable[[Any], bytes], Callable[[str], Iterable[Metric]]]] = {
    "text": (text_latest, parse_text),
    "openmetrics": (openmetrics_latest, parse_openmetrics),
}


# --- comparing two expositions -----------------------------------------------------------------------
def described(text: str, parse: Callable[[str], Iterable[Metric]], extra: dict[str, str] | None = None) -> list[Any]:
    """Each family as a parser reads it: its metadata, then each sample in order, labels as a sorted list,
    values by ``repr`` (so that NaN equals NaN). ``extra``: labels to add to every sample."""
    return [
        (
            family.name,
            family.type,
            family.documentation,
            family.unit,
            [
                (s.name, sorted({**s.labels, **(extra or {})}.items()), repr(s.value), s.timestamp, s.exemplar)
                for s in family.samples
            ],
        )
        for family in parse(text)
    ]


def assert_same_as_prometheus_client(registry: Any, fmt: str, host: dict[str, str] | None = None) -> str:
    """Our writer's exposition of ``registry`` says what prometheus_client's does (plus the host labels)."""
    theirs, parse = FORMATS[fmt]
    ours = Writer(registry, host).render(fmt == "openmetrics").decode()
    expected = theirs(registry).decode()
    assert described(ours, parse) == described(expected, parse, host)
    # HELP, TYPE, UNIT and EOF byte for byte: a parser forgives some escaping that Prometheus' may not.
    assert metadata(ours) == metadata(expected)
    return ours


def metadata(exposition: str) -> list[str]:
    return [line for line in exposition.splitlines() if line.startswith("#")]


class Replay:
    """A collector that hands out the same families at every collect(): one registry state for both writers,
    where live collectors (the process's CPU time, the GC's counts) would move between two scrapes."""

    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self.families)


# --- registries -----------------------------------------------------------------------------------
def every_kind_of_ours(registry: CollectorRegistry) -> dict[catalog.Metric, Any]:
    """Our counter, gauge and histogram, labelled and not, with values that test the number formatting."""
    metrics = register(
        registry,
        (catalog.STEPS, catalog.WORKLOADS_EXPIRED, catalog.LAST_STEP, catalog.STEP_DURATION, catalog.COMPILE_DURATION),
    )
    metrics[catalog.STEPS].labels("w").inc(3)
    metrics[catalog.STEPS].labels(ODD).inc(2**63)
    metrics[catalog.STEPS].labels("zero")
    metrics[catalog.WORKLOADS_EXPIRED].inc(0.25)
    for workload, value in [("w", 1.7e9 + 0.123), ("nan", math.nan), ("inf", -math.inf), ("tiny", 1e-300)]:
        metrics[catalog.LAST_STEP].labels(workload).set(value)
    for value in (0.003, 0.2, 0.2, 7.5, 1e9):
        metrics[catalog.STEP_DURATION].labels("w").observe(value)
    metrics[catalog.STEP_DURATION].labels("w").observe(0.07, TRACE)
    metrics[catalog.STEP_DURATION].labels("idle")  # a series with no observation yet
    metrics[catalog.COMPILE_DURATION].labels("w", "backend").observe(12.0)
    return metrics


def sampled(store: SampleStore) -> None:
    """The sample store's families: a gauge and a histogram of device series."""
    gauge = next(m for m in samples.SAMPLED if m.kind is catalog.Kind.GAUGE)
    histogram = next(m for m in samples.SAMPLED if m.kind is catalog.Kind.HISTOGRAM)
    buckets = samples.Histogram(((0.001, 2.0), (0.1, 5.0), (math.inf, 6.0)), 1.25)
    store.replace(
        "test",
        [
            samples.Sample(gauge, ("0",) * len(gauge.labels), 3.5e10),
            samples.Sample(gauge, (ODD,) * len(gauge.labels), 0.0),
            samples.Sample(histogram, ("0",) * len(histogram.labels), buckets),
        ],
    )


class EveryFamilyType:
    """prometheus_client's own family types, as a third-party collector would yield them."""

    def collect(self) -> Iterator[Metric]:
        counter = CounterMetricFamily("ext_requests", 'Help with "quotes", \\ and\na newline.', labels=["code"])
        counter.add_metric(["200"], 7, created=1.7e9)
        counter.add_metric(["500"], 1, created=1.7e9, exemplar=Exemplar(TRACE, 1.0, 1.7e9))
        yield counter
        gauge = GaugeMetricFamily(
            "ext_temperature_celsius", "A gauge with timestamps.", labels=["zone"], unit="celsius"
        )
        gauge.add_metric(["a"], 21.5, timestamp=1.7e9)
        gauge.add_metric(["b"], 22.0, timestamp=Timestamp(1_700_000_000, 500_000_000))
        yield gauge
        yield InfoMetricFamily("ext_build", "Build.", value={"version": "1.2", "commit": "abc"})
        yield StateSetMetricFamily("ext_mode", "Mode.", value={"on": True, "off": False})
        yield GaugeHistogramMetricFamily("ext_queue", "Queue.", buckets=[("1.0", 4), ("+Inf", 5)], gsum_value=3)
        yield SummaryMetricFamily("ext_latency_seconds", "Latency.", count_value=4, sum_value=2.5, unit="seconds")
        yield UnknownMetricFamily("ext_mystery", "Unknown type.", value=1e21)
        histogram = HistogramMetricFamily("ext_size_bytes", "Sizes.", labels=["kind"], unit="bytes")
        histogram.add_metric(["x"], [("10.0", 1, Exemplar(TRACE, 5.0)), ("+Inf", 2)], sum_value=1e6)
        yield histogram


def mixed_registry() -> CollectorRegistry:
    """Every path the writer has: our metrics, the sample store, prometheus_client's metric objects (with
    their _created samples) and its platform collector, and a collector yielding every family type."""
    registry = CollectorRegistry(auto_describe=True)
    every_kind_of_ours(registry)
    store = SampleStore()
    registry.register(store)
    sampled(store)
    requests = ClientCounter("client_requests", "prometheus_client's counter.", ["path"], registry=registry)
    requests.labels("/metrics").inc(2)
    ClientHistogram("client_wait_seconds", "prometheus_client's histogram.", registry=registry).observe(0.3)
    PlatformCollector(registry=registry)
    registry.register(EveryFamilyType())
    return registry


def sidecar_registry() -> Replay:
    """The sidecar's registry as ``tpuscope serve`` builds it, after a few events, frozen at one collect()."""
    registry = build_registry()
    store = SampleStore()
    registry.register(store)
    aggregator = Aggregator(register(registry), store)
    sampled(store)
    aggregator.accept(
        events.Step(workload="w", step=1, duration_s=0.2, compute_s=0.1, io_s=0.05, trace_id=TRACE["trace_id"])
    )
    aggregator.accept(events.Compile(workload="w", stage="backend", duration_s=3.0))
    aggregator.accept(events.Checkpoint(workload=ODD, operation="save", duration_s=1.5, ok=True, bytes=2**40))
    return Replay(list(registry.collect()))


# --- the comparison with prometheus_client -----------------------------------------------------------
@pytest.mark.parametrize("fmt", FORMATS)
def test_every_kind_of_family_is_written_as_prometheus_client_writes_it(fmt: str) -> None:
    ours = assert_same_as_prometheus_client(mixed_registry(), fmt)
    # The comparison saw each path: our histogram's exemplar, the store's, the third party's odd types.
    assert "tpuscope_step_duration_seconds_bucket" in ours and "tpuscope_tpu_" in ours and "ext_mode" in ours
    assert ("# {trace_id=" in ours) == (fmt == "openmetrics")


@pytest.mark.parametrize("fmt", FORMATS)
def test_the_sidecars_registry_is_written_as_prometheus_client_writes_it(fmt: str) -> None:
    assert_same_as_prometheus_client(sidecar_registry(), fmt)


@pytest.mark.parametrize("fmt", FORMATS)
def test_host_labels_are_added_to_every_sample_and_nothing_else_changes(fmt: str) -> None:
    ours = assert_same_as_prometheus_client(sidecar_registry(), fmt, HOST)
    assert 'process_cpu_seconds_total{slice="s1",worker="3"}' in ours  # prometheus_client's collectors too


@pytest.mark.parametrize("fmt", FORMATS)
def test_where_labels_are_sorted_and_numbers_short_the_bytes_are_prometheus_clients(fmt: str) -> None:
    """Counters and gauges with one label, values Go and Python spell alike: the same bytes, metadata and all."""
    registry = CollectorRegistry()
    metrics = register(registry, (catalog.STEPS, catalog.WORKLOADS_EXPIRED, catalog.LAST_STEP, catalog.BUILD_INFO))
    metrics[catalog.STEPS].labels("a").inc(41)
    metrics[catalog.STEPS].labels("b").inc(0.5)
    metrics[catalog.LAST_STEP].labels("a").set(-2.25)
    metrics[catalog.BUILD_INFO].labels(tpuscope.__version__).set(1)
    theirs, _ = FORMATS[fmt]
    assert Writer(registry).render(fmt == "openmetrics") == theirs(registry)


def test_the_cached_series_follow_the_registry_across_scrapes() -> None:
    """Series added, changed and removed between scrapes of one writer, past the point where it drops its cache
    of rendered series: each scrape still says what the registry holds."""
    registry = CollectorRegistry()
    metrics = every_kind_of_ours(registry)
    writer = Writer(registry, HOST)

    def check() -> None:
        for fmt, (theirs, parse) in FORMATS.items():
            ours = writer.render(fmt == "openmetrics").decode()
            assert described(ours, parse) == described(theirs(registry).decode(), parse, HOST)

    check()
    for workload in range(1500):
        metrics[catalog.STEP_DURATION].labels(f"w{workload}").observe(0.1)
        metrics[catalog.STEPS].labels(f"w{workload}").inc()
    check()
    for workload in range(1500):  # as an expiry removes a workload's series
        for metric in (catalog.STEP_DURATION, catalog.STEPS):
            metrics[metric].remove_matching(catalog.Label.WORKLOAD, f"w{workload}")
    metrics[catalog.STEPS].labels("w").inc()
    metrics[catalog.STEPS].labels("w1").inc(9)  # a removed series born again starts afresh
    check()
    check()


def test_our_metrics_read_through_prometheus_clients_registry_api() -> None:
    """get_sample_value reads our families' samples like any collector's; an absent series is None, not 0."""
    registry = CollectorRegistry()
    every_kind_of_ours(registry)
    value = registry.get_sample_value
    assert value(catalog.STEPS.name, {"workload": "w"}) == 3
    assert value(catalog.STEPS.name, {"workload": "absent"}) is None
    assert value(catalog.WORKLOADS_EXPIRED.name) == 0.25
    assert value(catalog.STEP_DURATION.series("bucket"), {"workload": "w", "le": "0.1"}) == 2
    assert value(catalog.STEP_DURATION.series("count"), {"workload": "w"}) == 6
    assert value(catalog.STEP_DURATION.series("count"), {"workload": "idle"}) == 0


def test_our_metrics_refuse_what_prometheus_clients_refuse() -> None:
    registry = CollectorRegistry()
    metrics = every_kind_of_ours(registry)
    with pytest.raises(ValueError):
        metrics[catalog.STEPS].labels("w").inc(-1)  # a counter only goes up
    with pytest.raises(ValueError):
        metrics[catalog.STEPS].labels("w", "extra")
    with pytest.raises(ValueError):
        metrics[catalog.STEPS].inc()  # labelled: labels(...) first
    with pytest.raises(ValueError):
        metrics[catalog.LAST_STEP].labels("w").set("soon")
    with pytest.raises(ValueError):  # the same name twice in one registry
        register(registry, (catalog.STEPS,))


# --- content negotiation ----------------------------------------------------------------------------
PROMETHEUS_2 = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
    "text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)
PROMETHEUS_3 = (
    "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.5,application/openmetrics-text;"
    "version=0.0.1;q=0.4,text/plain;version=1.0.0;escaping=allow-utf-8;q=0.3,text/plain;version=0.0.4;q=0.2,*/*;q=0.1"
)


@pytest.mark.parametrize(
    ("accept", "openmetrics"),
    [
        (PROMETHEUS_2, True),
        (PROMETHEUS_3, True),
        ("application/openmetrics-text; version=1.0.0", True),
        ("application/openmetrics-text;version=0.0.1", True),
        ("Application/OpenMetrics-Text", True),  # media types are case-insensitive
        ('application/openmetrics-text; version="1.0.0"', True),  # a quoted parameter value
        ("text/plain, application/openmetrics-text", True),  # as high, and named: order says nothing
        ("application/*", True),  # only OpenMetrics is an application type
        ("", False),  # no Accept: the text format, as every exporter answers
        ("*/*", False),  # curl, a browser
        ("text/plain;version=0.0.4", False),
        ("application/openmetrics-text;version=2.0.0", False),  # a version we do not write
        ("application/openmetrics-text;version=2.0.0, text/plain;q=0.1", False),
        ("application/openmetrics-text;q=0", False),  # q=0: not acceptable
        ("application/openmetrics-text;version=1.0.0;q=0, */*", False),  # the specific range wins over */*
        ("text/plain;q=0.9, application/openmetrics-text;q=0.8", False),
        ("text/plain;q=0.8, application/openmetrics-text;q=0.9", True),
        ("application/openmetrics-text;q=2", False),  # no qvalue: the element is left out
        ("application/openmetrics-text-like", False),  # a substring is not a media type
        ("application/json", False),  # nothing we write: the text format all the same
    ],
)
def test_accept_chooses_the_format(accept: str, openmetrics: bool) -> None:
    assert wants_openmetrics(accept) is openmetrics


@pytest.mark.parametrize(
    ("accept_encoding", "compressed"),
    [
        ("gzip", True),
        ("gzip, deflate, br", True),
        ("GZIP;q=0.4, deflate", True),
        ("x-gzip", True),
        ("*", True),
        ("*, identity;q=0", True),
        ("identity;q=0, gzip;q=0.1", True),
        ("", False),
        ("identity", False),
        ("deflate, br", False),
        ("gzip;q=0", False),
        ("gzip;q=0.0", False),
        ("*;q=0", False),
        ("*, gzip;q=0", False),  # gzip's own element wins over *
        ("gzip;q=0.5, identity", False),  # the uncompressed body ranked higher
        ("notgzip", False),  # a substring is not a coding
        ("gzip;q=1.5", False),  # no qvalue: left out
    ],
)
def test_accept_encoding_chooses_gzip(accept_encoding: str, compressed: bool) -> None:
    assert wants_gzip(accept_encoding) is compressed


def test_a_list_element_keeps_its_quoted_commas_and_drops_q() -> None:
    [first, second] = preferences('a/b; x="1,2"; Q=0.5 , c/d')
    assert (first.value, dict(first.parameters), first.q) == ("a/b", {"x": "1,2"}, 0.5)
    assert (second.value, dict(second.parameters), second.q) == ("c/d", {}, 1.0)


def test_a_quoted_parameter_keeps_its_escaped_quotes_and_separators() -> None:
    [only] = preferences(r'a/b; x="say \"1;2\", then"; q=0.1')
    assert (only.value, only.parameters["x"], only.q) == ("a/b", r"say \"1;2\", then", 0.1)


def test_a_hostile_header_costs_time_in_proportion_to_its_length() -> None:
    """Unclosed quotes and escapes, 64 KiB of them (what the HTTP server lets through): a parser that backtracks
    took a minute on this, the scrape's thread and the GIL with it; a linear one takes milliseconds."""
    header = "a" + '\\"' * 21_000
    began = time.perf_counter()
    wants_openmetrics(header)
    assert time.perf_counter() - began < 2.0


@pytest.mark.parametrize(
    ("headers", "content_type", "encoding"),
    [
        ({"HTTP_ACCEPT": PROMETHEUS_2, "HTTP_ACCEPT_ENCODING": "gzip"}, OPENMETRICS, "gzip"),
        ({"HTTP_ACCEPT": "*/*"}, TEXT, None),
        ({}, TEXT, None),
    ],
)
def test_metrics_answers_in_the_negotiated_format(
    headers: dict[str, str], content_type: str, encoding: str | None
) -> None:
    registry = mixed_registry()
    answered: dict[str, str] = {}

    def start_response(status: str, response_headers: list[tuple[str, str]]) -> None:
        answered.update(response_headers, status=status)

    body = b"".join(make_app(registry, HOST)({"PATH_INFO": "/metrics", **headers}, start_response))
    assert answered["status"] == "200 OK"
    assert answered["Content-Type"] == content_type
    assert answered.get("Content-Encoding") == encoding
    text = gzip.decompress(body) if encoding else body
    assert text == Writer(registry, HOST).render(content_type == OPENMETRICS)


# --- prometheus_client's private attributes ---------------------------------------------------------
# A namedtuple's own methods start with "_" so as not to clash with field names; they are its public API.
NAMEDTUPLE_API = {"_replace", "_asdict", "_make", "_fields", "_field_defaults"}


def test_nothing_in_the_exporter_reads_another_objects_private_attributes() -> None:
    """``x._name`` only where x is self or cls: an upstream rename of a private field must not break /metrics."""
    exporter = Path(fast.__file__).parent
    reached = []
    for path in sorted(exporter.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (
                isinstance(node, ast.Attribute)
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
                and node.attr not in NAMEDTUPLE_API
                and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
            ):
                reached.append(f"{path.relative_to(exporter)}:{node.lineno}: {ast.unparse(node)}")
    assert reached == []
