"""A sink that keeps every event a Monitor delivers, for the tests that read what it sent."""

from __future__ import annotations

from tpuscope import events


class Recorder:
    def __init__(self) -> None:
        self.events: list[events.AnyEvent] = []

    def emit(self, event: events.AnyEvent) -> None:
        self.events.append(event)

    def close(self) -> None:
        pass
