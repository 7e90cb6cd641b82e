"""Builds XSpace captures in tests the way XProf's own C++ tests do, with a Python twin of tsl's ``XPlaneBuilder``.

XProf's tests (xprof/convert/*_test.cc) make a plane with ``XPlaneBuilder``, its lines with ``GetOrCreateLine``,
event metadata with ``GetOrCreateEventMetadata`` (stats that every event of one name shares, such as ``hlo_category``)
and stat metadata by name with ``GetOrCreateStatMetadata``; a stat is then a metadata id and one value. Fixtures built
the same way have the schema real libtpu and CUPTI captures have, so both XProf's converters and our parser read them.

A value's Python type picks its field: ``int`` is int64, ``float`` double, ``str`` str, and the two kinds a Python value
cannot say on its own are wrapped: :class:`Uint` (uint64, as CUPTI writes ids) and :class:`Ref` (a string kept once, as
the name of a stat metadata, and referred to by id: how the profiler stores repeated strings such as ``hlo_module``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tpuscope.exporter.profiles import xplane


@dataclass(frozen=True)
class Uint:
    """A uint64 stat value."""

    value: int


@dataclass(frozen=True)
class Ref:
    """A string stat value stored by reference to the stat metadata named by it."""

    value: str


StatValue = int | float | str | Uint | Ref
Stats = Mapping[str, StatValue]


class XLineBuilder:
    """One line of a plane (a host thread, a device's "XLA Ops", a GPU stream): events placed from its timestamp."""

    def __init__(self, plane: XPlaneBuilder, line: Any) -> None:
        self._plane = plane
        self._line = line

    def event(self, name: str, offset_ps: int, duration_ps: int, stats: Stats | None = None) -> None:
        """An event of metadata ``name`` (made if new), ``offset_ps`` after the line's ``timestamp_ns``."""
        event = self._line.events.add(
            metadata_id=self._plane.event_metadata(name), offset_ps=offset_ps, duration_ps=duration_ps
        )
        self._plane.add_stats(event.stats, stats or {})


class XPlaneBuilder:
    """A plane and its two metadata tables; ids start at 1, as in tsl's builder (0 means none)."""

    def __init__(self, plane: Any) -> None:
        self._plane = plane
        self._event_ids: dict[str, int] = {}
        self._stat_ids: dict[str, int] = {}

    def stat_metadata(self, name: str) -> int:
        """The id of the stat metadata ``name``, made if new (``GetOrCreateStatMetadata``)."""
        if name not in self._stat_ids:
            self._stat_ids[name] = len(self._stat_ids) + 1
            self._plane.stat_metadata[self._stat_ids[name]].CopyFrom(
                xplane.XStatMetadata(id=self._stat_ids[name], name=name)
            )
        return self._stat_ids[name]

    def event_metadata(self, name: str, stats: Stats | None = None, display_name: str = "") -> int:
        """The id of the event metadata ``name``, made if new, with stats shared by all its events (its HLO category,
        program id...): given again for a name that exists, they are added to it."""
        if name not in self._event_ids:
            self._event_ids[name] = len(self._event_ids) + 1
            self._plane.event_metadata[self._event_ids[name]].CopyFrom(
                xplane.XEventMetadata(id=self._event_ids[name], name=name, display_name=display_name)
            )
        metadata = self._plane.event_metadata[self._event_ids[name]]
        self.add_stats(metadata.stats, stats or {})
        return self._event_ids[name]

    def line(self, line_id: int, name: str, timestamp_ns: int) -> XLineBuilder:
        """A new line; its events' offsets count from ``timestamp_ns``."""
        return XLineBuilder(self, self._plane.lines.add(id=line_id, name=name, timestamp_ns=timestamp_ns))

    def stats(self, stats: Stats) -> None:
        """Stats of the plane itself (a device's type, peak FLOP/s...)."""
        self.add_stats(self._plane.stats, stats)

    def add_stats(self, repeated: Any, stats: Stats) -> None:
        for name, value in stats.items():
            stat = repeated.add(metadata_id=self.stat_metadata(name))
            _set_value(stat, value, self)


def _set_value(stat: Any, value: StatValue, plane: XPlaneBuilder) -> None:
    # bool is an int in Python; the profiler writes booleans as int64 too, so it needs no case of its own.
    if isinstance(value, Uint):
        stat.uint64_value = value.value
    elif isinstance(value, Ref):
        stat.ref_value = plane.stat_metadata(value.value)
    elif isinstance(value, str):
        stat.str_value = value
    elif isinstance(value, float):
        stat.double_value = value
    else:
        stat.int64_value = value


class XSpaceBuilder:
    """An XSpace: the planes of one host's capture, and that host's name."""

    def __init__(self, hostname: str = "") -> None:
        self._space = xplane.XSpace()
        if hostname:
            self._space.hostnames.append(hostname)

    def plane(self, name: str, plane_id: int) -> XPlaneBuilder:
        return XPlaneBuilder(self._space.planes.add(id=plane_id, name=name))

    def serialize(self) -> bytes:
        data: bytes = self._space.SerializeToString()
        return data
