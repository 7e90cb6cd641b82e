"""``/metrics`` written by us: the Prometheus text format 0.0.4 and OpenMetrics 1.0, fast.

prometheus_client's writers check and escape every label name and value
character by character at every scrape: 9 ms per 1,000 series in OpenMetrics,
too slow for a TPU host's tens of thousands. A sidecar's series are the same from
one scrape to the next, so here each series' ``name{labels}`` is rendered once
and kept (the cache is rebuilt when it grows past what a scrape uses), and a
sample costs a dict look-up and a number's formatting.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric as Family
from prometheus_client.samples import Sample

OPENMETRICS = "application/openmetrics-text; version=1.0.0; charset=utf-8"
TEXT = "text/plain; version=0.0.4; charset=utf-8"

# What each family type is called in the 0.0.4 format, which knows fewer.
_TEXT_TYPES = {"counter": "counter", "gauge": "gauge", "histogram": "histogram", "summary": "summary"}


def escape_value(value: str) -> str:
    if "\\" in value or '"' in value or "\n" in value:
        return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return value


def escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def number(value: float) -> str:
    if type(value) is int:  # bucket counts
        return f"{value}.0" if abs(value) < 10**15 else repr(float(value))
    if value == math.inf:
        return "+Inf"
    if value == -math.inf:
        return "-Inf"
    if value != value:
        return "NaN"
    if value.is_integer() and abs(value) < 1e15:
        return f"{int(value)}.0"
    return repr(float(value))


def render_labels(labels: Mapping[str, str]) -> str:
    """``a="x",b="y"``: the inside of a series' braces."""
    return ",".join(f'{k}="{escape_value(v)}"' for k, v in labels.items())


class Writer:
    """Renders a registry; keeps each series' rendered name and labels between scrapes.

    ``host_labels`` (slice and worker) are added to every series, the sidecar's own
    process_* and python_* included: in a multi-host job each sidecar is one worker.
    """

    def __init__(self, registry: CollectorRegistry, host_labels: Mapping[str, str] | None = None) -> None:
        self._registry = registry
        self._series: dict[tuple[str, tuple[tuple[str, str], ...]], str] = {}
        self._host = render_labels(host_labels or {})

    def _collectors(self) -> list[Any]:
        # What CollectorRegistry.collect() iterates, taken the way it takes it (prometheus_client has no
        # public accessor); the fast histograms then write their own lines.
        with self._registry._lock:
            return list(self._registry._collector_to_names)

    def _key(self, sample: Sample) -> str:
        labels = tuple(sample.labels.items())
        key = (sample.name, labels)
        try:
            return self._series[key]
        except KeyError:
            inner = ",".join(filter(None, (render_labels(sample.labels), self._host)))
            rendered = self._series[key] = f"{sample.name}{{{inner}}}" if inner else sample.name
            return rendered

    def render(self, openmetrics: bool) -> bytes:
        lines: list[str] = []
        used = 0
        for collector in self._collectors():
            if write := getattr(collector, "write_exposition", None):  # fast.Histogram: writes its own lines
                write(openmetrics, lines, self._host)
                continue
            for family in collector.collect():
                used += len(family.samples)
                if openmetrics:
                    self._openmetrics_family(family, lines)
                else:
                    self._text_family(family, lines)
        if openmetrics:
            lines.append("# EOF\n")
        if len(self._series) > 2 * used + 1000:  # series gone for good (a workload expired): start afresh
            self._series.clear()
        return "".join(lines).encode()

    def _openmetrics_family(self, family: Family, lines: list[str]) -> None:
        name = family.name
        lines.append(f"# HELP {name} {escape_help(family.documentation)}\n# TYPE {name} {family.type}\n")
        if family.unit:
            lines.append(f"# UNIT {name} {family.unit}\n")
        for sample in family.samples:
            line = f"{self._key(sample)} {number(sample.value)}"
            if sample.timestamp is not None:
                line += f" {sample.timestamp}"
            if sample.exemplar is not None:
                line += exemplar_text(sample.exemplar)
            lines.append(line + "\n")

    def _text_family(self, family: Family, lines: list[str]) -> None:
        name = family.name
        kind = _TEXT_TYPES.get(family.type, "untyped")
        if family.type == "counter":
            name += "_total"
        elif family.type == "info":
            name += "_info"
            kind = "gauge"
        lines.append(f"# HELP {name} {escape_help(family.documentation)}\n# TYPE {name} {kind}\n")
        for sample in _without_created(family.samples):
            lines.append(f"{self._key(sample)} {number(sample.value)}\n")


def _without_created(samples: Iterable[Sample]) -> Iterable[Sample]:
    # The 0.0.4 format has no created timestamps; prometheus_client's writer drops them too.
    return (s for s in samples if not s.name.endswith("_created"))


def exemplar_text(exemplar: Any) -> str:
    """` # {labels} value timestamp`, appended to a sample's line (OpenMetrics only)."""
    labels = render_labels(exemplar.labels)
    text = f" # {{{labels}}} {number(exemplar.value)}"
    if exemplar.timestamp is not None:
        text += f" {exemplar.timestamp}"
    return text
