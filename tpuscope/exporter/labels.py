"""Bounded label values: a job can name as many workloads, devices or programs as it likes, /metrics cannot grow.

Every label a job sets (a :data:`tpuscope.events.LabelValue` field of an event)
keeps at most ``max_values`` distinct values. An event bringing one more is
not dropped: its value is replaced by :data:`OVERFLOW`, so its steps, seconds
and bytes still add up, and the overflow is counted. ``_overflow`` is a value
no job can send (a LabelValue starts with a letter or digit), so it never
mixes with a real one.

A value is held for the workloads that used it; when the last of them expires
(:meth:`LabelLimiter.release`) the value is freed and a new one may take its
place.
"""

from __future__ import annotations

import typing
from collections.abc import Callable, Iterable

import msgspec

from tpuscope import catalog, events

OVERFLOW = "_overflow"


def _label_fields(cls: type[events.AnyEvent]) -> tuple[str, ...]:
    """The fields of an event type that become labels: those typed LabelValue, workload first."""
    hints = typing.get_type_hints(cls, include_extras=True)
    return tuple(name for name in cls.__struct_fields__ if hints[name] == events.LabelValue)


# Event type -> its label fields other than workload (which every event has). Read from the
# schema, so a LabelValue field added to events.py is limited without anyone remembering to.
OTHER_LABELS: dict[type[events.AnyEvent], tuple[str, ...]] = {
    cls: _label_fields(cls)[1:] for cls in typing.get_args(events.AnyEvent)
}
# Every label jobs set, as the catalogue names them (a field's name is its label's name).
LIMITED: tuple[catalog.Label, ...] = (
    catalog.Label.WORKLOAD,
    *dict.fromkeys(catalog.Label(name) for names in OTHER_LABELS.values() for name in names),
)


class LabelLimiter:
    """At most ``max_values`` distinct values per label; further values map to :data:`OVERFLOW`.

    Only the ingest thread calls it. ``on_overflow(label)`` is called for each value
    replaced by OVERFLOW, ``on_held(label, count)`` when a label's count of held values changes.
    """

    def __init__(
        self,
        max_values: int,
        labels: Iterable[str] = LIMITED,
        *,
        on_overflow: Callable[[str], None] = lambda label: None,
        on_held: Callable[[str, int], None] = lambda label, count: None,
    ) -> None:
        if max_values < 1:
            raise ValueError("max_values must be at least 1")
        self.max_values = max_values
        # label -> value -> the workloads that used it (a workload value holds only itself).
        self._held: dict[str, dict[str, set[str]]] = {label: {} for label in labels}
        self._on_overflow = on_overflow
        self._on_held = on_held

    def value(self, label: str, value: str, workload: str) -> str:
        """The value to file ``value`` under: itself while held or while there is room, else OVERFLOW."""
        held = self._held[label]
        users = held.get(value)
        if users is None:
            if value == OVERFLOW:  # the sidecar's own events about an overflowed workload
                return value
            if len(held) >= self.max_values:
                self._on_overflow(label)
                return OVERFLOW
            users = held[value] = set()
            self._on_held(label, len(held))
        users.add(workload)
        return value

    def limit(self, event: events.AnyEvent) -> events.AnyEvent:
        """The event with each label value it may not keep replaced by OVERFLOW (the same event if none)."""
        workload = self.value(catalog.Label.WORKLOAD, event.workload, event.workload)
        changes = {} if workload == event.workload else {"workload": workload}
        for name in OTHER_LABELS[type(event)]:
            value = getattr(event, name)
            if (kept := self.value(name, value, workload)) != value:
                changes[name] = kept
        return msgspec.structs.replace(event, **changes) if changes else event

    def release(self, workload: str) -> list[tuple[str, str]]:
        """Forget an expired workload; the ``(label, value)`` pairs freed because only it used them."""
        freed = []
        for label, held in self._held.items():
            for value, users in list(held.items()):
                users.discard(workload)
                if not users:
                    del held[value]
                    freed.append((label, value))
        for label in dict.fromkeys(label for label, _ in freed):
            self._on_held(label, len(self._held[label]))
        return freed

    def held(self, label: str) -> set[str]:
        """The values held for ``label`` now (for tests and logs)."""
        return set(self._held[label])
