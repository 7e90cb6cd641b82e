"""Read a sidecar's /metrics: what ``tpuscope workload`` prints at the end, and what tests assert on."""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample


class Scrape:
    """One parsed exposition; look series up by full sample name and a subset of labels."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.samples: list[Sample] = [s for family in text_string_to_metric_families(text) for s in family.samples]

    @classmethod
    def fetch(cls, url: str, timeout: float = 5.0) -> Scrape:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return cls(response.read().decode())

    def find(self, name: str, **labels: str) -> Iterator[Sample]:
        for sample in self.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                yield sample

    def value(self, name: str, **labels: str) -> float | None:
        """The sum over every series of ``name`` that has these labels; None when there is none.

        As client_python's ``get_sample_value``: an absent series is not a zero, so a caller decides what absence
        means (a counter not yet born, a reading not yet taken) and an assert cannot mistake one for the other."""
        matching = [sample.value for sample in self.find(name, **labels)]
        return sum(matching) if matching else None

    def present(self, name: str, **labels: str) -> float:
        """``value`` of a series that must exist (one the sidecar creates at start, a count the caller does
        arithmetic on): its absence is a bug to report, not a zero to compute with."""
        value = self.value(name, **labels)
        if value is None:
            served = sorted({sample.name for sample in self.samples if sample.name.startswith(name)})
            raise LookupError(f"no series {name}{labels or ''} in the scrape (series of that prefix: {served})")
        return value

    def has(self, name: str, **labels: str) -> bool:
        return any(self.find(name, **labels))
