"""The catalogue follows Prometheus conventions, is the only place names are typed, and its docs are current."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tpuscope import catalog, generate

ROOT = Path(__file__).resolve().parents[1]
UNITS = {"seconds", "bytes", "ratio", "celsius", "watts", "hertz"}


@pytest.mark.parametrize("metric", catalog.CATALOG, ids=lambda m: m.name)
def test_names_follow_prometheus_conventions(metric: catalog.Metric) -> None:
    assert re.fullmatch(r"tpuscope_[a-z][a-z0-9_]*[a-z0-9]", metric.name)
    assert metric.help.endswith(".") and len(metric.help) > 15
    words = metric.name.removesuffix("_total").split("_")
    if metric.kind is catalog.Kind.COUNTER:
        assert metric.name.endswith("_total")
    else:
        assert not metric.name.endswith("_total")
    if metric.unit:
        assert metric.unit in UNITS
        assert words[-1] == metric.unit, "the unit is the name's last word (before _total)"
    else:
        assert not UNITS & set(words[-1:]), "a name ending in a unit declares that unit"
    for bad in ("milliseconds", "microseconds", "percent", "kilobytes", "megabytes", "mib", "gib"):
        assert bad not in words, "base units only"
    assert not {"job", "instance"} & set(metric.labels), "job and instance belong to Prometheus"
    assert len(set(metric.labels)) == len(metric.labels)
    if metric.kind is catalog.Kind.HISTOGRAM and metric.sampled:
        assert not metric.buckets, "a sampled histogram keeps its source's bounds"
    elif metric.kind is catalog.Kind.HISTOGRAM:
        assert list(metric.buckets) == sorted(set(metric.buckets)) and metric.buckets
    else:
        assert not metric.buckets


def test_names_are_unique() -> None:
    names = [m.name for m in catalog.CATALOG]
    assert len(names) == len(set(names))


def test_no_metric_name_is_typed_outside_the_catalogue() -> None:
    """One source of truth: code refers to catalogue objects, never to a name as a string."""
    # Grafana's own JSON keys that happen to equal a metric's stem ("steps" of a panel's thresholds).
    grafana_keys = {"steps"}
    stems = {m.base_name.removeprefix(catalog.PREFIX) for m in catalog.CATALOG} - grafana_keys
    offenders = []
    for path in [*ROOT.glob("tpuscope/**/*.py"), *ROOT.glob("tests/**/*.py")]:
        if path.name == "catalog.py":
            continue
        for quoted in re.findall(r"[\"']([a-z_]+)[\"']", path.read_text()):
            if quoted.removeprefix(catalog.PREFIX).removesuffix("_total") in stems:
                offenders.append(f"{path.relative_to(ROOT)}: {quoted}")
    assert not offenders


def test_generated_files_are_current() -> None:
    """docs/metrics.md (and every other generated file) matches what the code generates now."""
    assert generate.stale(ROOT) == [], "run `tpuscope generate` and commit the result"


def test_docs_list_every_metric() -> None:
    text = generate.metrics_markdown()
    for metric in catalog.CATALOG:
        assert f"`{metric.name}`" in text


def test_the_collectors_table_holds_the_catalogues_collector_names() -> None:
    """The `collector` label's closed set is the catalogue's; the sidecar's table of collectors must match it."""
    from tpuscope.exporter.collectors import COLLECTORS

    assert tuple(COLLECTORS) == catalog.COLLECTOR_NAMES == catalog.COLLECTOR_UP.values(catalog.Label.COLLECTOR)


def test_every_closed_label_value_is_a_label_of_its_metric_and_named_in_its_help() -> None:
    """Closed label values live on their metric in the catalogue: the help a user reads lists each of them (a value
    added to the set and not to the help fails here), and docs/metrics.md is written from the set."""
    closed = [m for m in catalog.CATALOG if m.closed]
    assert len(closed) >= 8  # the health counters, the profile results: the sets this test exists for
    for metric in closed:
        for label, values in metric.closed:
            assert label in metric.labels, (metric.name, label)
            assert values and len(set(values)) == len(values), (metric.name, label)
            if label is not catalog.Label.COLLECTOR:  # the collectors are listed once, in docs/metrics.md
                missing = [v for v in values if v not in metric.help]
                assert not missing, f"{metric.name}: its help does not name {missing}"
