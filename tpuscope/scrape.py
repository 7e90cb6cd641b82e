"""Read a sidecar's /metrics: what ``tpuscope bench`` prints at the end, and what tests assert on."""

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

    def value(self, name: str, **labels: str) -> float:
        """The sum over every series of ``name`` that has these labels (0 when there is none)."""
        return sum(sample.value for sample in self.find(name, **labels))

    def has(self, name: str, **labels: str) -> bool:
        return any(self.find(name, **labels))
