"""``/metrics`` written by us: the Prometheus text format 0.0.4 and OpenMetrics 1.0, fast.

The writer reads only what prometheus_client's own writers read, ``registry.collect()``
(its collector protocol), and writes what they write, sample for sample
(tests/test_exposition.py compares the two). It is faster because it keeps what
does not change from one scrape to the next: prometheus_client's writers check and
escape every label name and value character by character at every scrape (9 ms
per 1,000 series in OpenMetrics, too slow for a TPU host's tens of thousands),
while here each series' ``name{labels}`` is rendered once and kept (the cache is
rebuilt when it grows past what a scrape uses), and a sample costs a dict look-up
and a number's formatting.

Two paths, one per kind of family: our own metrics' families
(:class:`~tpuscope.exporter.fast.SeriesFamily`) give each series' label values and
numbers, written from one prefix per sample rendered once per series, without
sample objects; any other family (the sample store's, prometheus_client's process
and platform collectors) is written sample by sample.

Where the bytes differ from prometheus_client's: labels are in the order the
family gives them, not sorted; ``host_labels`` are added to every series; and a
number is Python's shortest form (``1234567.0``, where prometheus_client writes
Go's ``1.234567e+06``): the same samples to any parser.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from prometheus_client.metrics_core import Metric as Family
from prometheus_client.registry import Collector
from prometheus_client.samples import Exemplar, Sample

from tpuscope.exporter.fast import LabelValues, SeriesFamily

OPENMETRICS = "application/openmetrics-text; version=1.0.0; charset=utf-8"
TEXT = "text/plain; version=0.0.4; charset=utf-8"

# A family type in the 0.0.4 format, which knows fewer, and the suffix its name there takes.
_TEXT_TYPES = {
    "counter": ("counter", "_total"),
    "info": ("gauge", "_info"),
    "stateset": ("gauge", ""),
    "gaugehistogram": ("histogram", ""),
    "unknown": ("untyped", ""),
}
# Samples the 0.0.4 format has no place for in their family: each suffix becomes a gauge family of its own.
_TEXT_GAUGE_SUFFIXES = ("_created", "_gcount", "_gsum")  # in the order they are written


def escape_value(value: str) -> str:
    if "\\" in value or '"' in value or "\n" in value:
        return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return value


def escape_help(text: str, openmetrics: bool) -> str:
    """HELP text: OpenMetrics escapes double quotes too, the 0.0.4 format does not."""
    escaped = text.replace("\\", "\\\\").replace("\n", "\\n")
    return escaped.replace('"', '\\"') if openmetrics else escaped


# Below this a whole number is written with all its digits ("12.0"); from it on, as Python's repr ("1e+15").
_EXACT = 10**15


def number(value: float) -> str:
    if type(value) is int:  # bucket counts
        return f"{value}.0" if abs(value) < _EXACT else repr(float(value))
    if value == math.inf:
        return "+Inf"
    if value == -math.inf:
        return "-Inf"
    if value != value:
        return "NaN"
    if value.is_integer() and abs(value) < _EXACT:
        return f"{int(value)}.0"
    return repr(float(value))


def render_labels(labels: Iterable[tuple[str, str]]) -> str:
    """``a="x",b="y"``: the inside of a series' braces."""
    return ",".join(f'{k}="{escape_value(v)}"' for k, v in labels)


def braces(*parts: str) -> str:
    """``{a="x",b="y"}`` from the rendered parts that are not empty; nothing when all are."""
    inner = ",".join(part for part in parts if part)
    return f"{{{inner}}}" if inner else ""


def le_label(le: str | None) -> str:
    """A bucket's rendered ``le`` label; nothing for a sample that has none."""
    return "" if le is None else f'le="{le}"'


def exemplar_text(exemplar: Exemplar) -> str:
    """`` # {labels} value timestamp``, appended to a sample's line (OpenMetrics only)."""
    text = f" # {{{render_labels(exemplar.labels.items())}}} {number(exemplar.value)}"
    if exemplar.timestamp is not None:
        text += f" {exemplar.timestamp}"
    return text


def header(family: Family, openmetrics: bool) -> str:
    """A family's HELP, TYPE and (OpenMetrics only) UNIT lines."""
    if openmetrics:
        text = f"# HELP {family.name} {escape_help(family.documentation, True)}\n# TYPE {family.name} {family.type}\n"
        return text + f"# UNIT {family.name} {family.unit}\n" if family.unit else text
    kind, suffix = _TEXT_TYPES.get(family.type, (family.type, ""))
    return gauge_header(family.name + suffix, family.documentation, kind)


def gauge_header(name: str, documentation: str, kind: str = "gauge") -> str:
    return f"# HELP {name} {escape_help(documentation, False)}\n# TYPE {name} {kind}\n"


class Writer:
    """Renders a registry (any collector); keeps each series' rendered name and labels between scrapes.

    ``host_labels`` (slice and worker) are added to every series, the sidecar's own
    process_* and python_* included: in a multi-host job each sidecar is one worker.
    Not safe to share between threads: one render at a time.
    """

    def __init__(self, registry: Collector, host_labels: Mapping[str, str] | None = None) -> None:
        self._registry = registry
        self._host = render_labels((host_labels or {}).items())
        # Our families: family name -> label values -> each sample's line up to its value ("name{labels} ").
        self._prefixes: dict[str, dict[LabelValues, tuple[str, ...]]] = {}
        # Any other family's samples: (sample name, labels) -> the line up to its value.
        self._keys: dict[tuple[str, tuple[tuple[str, str], ...]], str] = {}

    def render(self, openmetrics: bool) -> bytes:
        lines: list[str] = []
        used = 0  # cache entries this scrape used: series of ours, samples of other families
        for family in self._registry.collect():
            lines.append(header(family, openmetrics))
            if isinstance(family, SeriesFamily):
                used += self._write_rows(family, openmetrics, lines)
            else:
                used += self._write_samples(family, openmetrics, lines)
        if openmetrics:
            lines.append("# EOF\n")
        self._forget_unused(used)
        return "".join(lines).encode()

    def _forget_unused(self, used: int) -> None:
        cached = len(self._keys) + sum(len(prefixes) for prefixes in self._prefixes.values())
        if cached > 2 * used + 1000:  # series gone for good (a workload expired): start afresh
            self._keys.clear()
            self._prefixes.clear()

    # --- our families: rows of numbers ---------------------------------------------------------------
    def _write_rows(self, family: SeriesFamily, openmetrics: bool, lines: list[str]) -> int:
        known = self._prefixes.setdefault(family.name, {})
        for values, numbers, exemplars in family.rows:
            prefixes = known.get(values) or self._render_prefixes(family, values, known)
            if exemplars and openmetrics:
                lines += [
                    f"{prefix}{number(value)}{exemplar_text(exemplars[i]) if i in exemplars else ''}\n"
                    for i, (prefix, value) in enumerate(zip(prefixes, numbers, strict=True))
                ]
            else:
                # A histogram's counts, most of a scrape's numbers, are written without number()'s call: a third
                # of a scrape's time otherwise.
                lines += [
                    f"{prefix}{value}.0\n" if type(value) is int and value < _EXACT else f"{prefix}{number(value)}\n"
                    for prefix, value in zip(prefixes, numbers, strict=True)
                ]
        return len(family.rows)

    def _render_prefixes(
        self, family: SeriesFamily, values: LabelValues, known: dict[LabelValues, tuple[str, ...]]
    ) -> tuple[str, ...]:
        """Each of the series' sample lines up to the value, in the family's shape; kept in ``known``."""
        own = render_labels(zip(family.labelnames, values, strict=True))
        prefixes = tuple(
            f"{family.name}{suffix}{braces(own, self._host, le_label(le))} " for suffix, le in family.shape
        )
        known[values] = prefixes
        return prefixes

    # --- any other family: its samples -------------------------------------------------------------
    def _write_samples(self, family: Family, openmetrics: bool, lines: list[str]) -> int:
        # The 0.0.4 format puts _created (and a gauge histogram's _gsum, _gcount) in gauge families of their own,
        # after the family, as prometheus_client's writer does.
        apart = {} if openmetrics else {family.name + suffix: suffix for suffix in _TEXT_GAUGE_SUFFIXES}
        gauges: dict[str, list[str]] = {}
        samples = family.samples
        for sample in samples:
            line = self._sample_line(sample, openmetrics)
            if (suffix := apart.get(sample.name)) is not None:
                gauges.setdefault(suffix, []).append(line)
            else:
                lines.append(line)
        for suffix in _TEXT_GAUGE_SUFFIXES:
            if suffix in gauges:
                lines.append(gauge_header(family.name + suffix, family.documentation))
                lines += gauges[suffix]
        return len(samples)

    def _sample_line(self, sample: Sample, openmetrics: bool) -> str:
        line = f"{self._key(sample)}{number(sample.value)}"
        if sample.timestamp is not None:  # seconds in OpenMetrics, milliseconds in the 0.0.4 format
            line += f" {sample.timestamp}" if openmetrics else f" {int(float(sample.timestamp) * 1000)}"
        if openmetrics and sample.exemplar is not None:
            line += exemplar_text(sample.exemplar)
        return line + "\n"

    def _key(self, sample: Sample) -> str:
        key = (sample.name, tuple(sample.labels.items()))
        try:
            return self._keys[key]
        except KeyError:
            rendered = self._keys[key] = f"{sample.name}{braces(render_labels(key[1]), self._host)} "
            return rendered
