"""The XSpace protobuf, the profiler's own trace format, as message classes built here.

A jax profiler capture is a serialized ``tensorflow.profiler.XSpace`` (tsl/profiler/protobuf/xplane.proto, in
openxla/xla). Its schema is small and has been stable for years, so it is written out below, field for field, and the
classes are made by the protobuf runtime the project already has (through OpenTelemetry's OTLP exporter): no
generated module whose protobuf version must match, no jaxlib to read a trace. The descriptor lives in a pool of its
own, so a process that has also loaded TensorFlow's or XProf's copy of the same messages sees no clash.

An XSpace holds planes (``/host:CPU``, ``/device:TPU:0``...); a plane holds lines (a host thread, a device's "XLA
Ops"...) and two tables: event metadata (an event's name, and stats that every event of that name shares, such as
``hlo_category``) and stat metadata (a stat's name). An event is a start (``offset_ps`` from its line's
``timestamp_ns``), a duration and stats; a stat is a metadata id and one value.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

_F = descriptor_pb2.FieldDescriptorProto
_INT64, _UINT64, _DOUBLE, _STRING, _BYTES, _MESSAGE = (
    _F.TYPE_INT64,
    _F.TYPE_UINT64,
    _F.TYPE_DOUBLE,
    _F.TYPE_STRING,
    _F.TYPE_BYTES,
    _F.TYPE_MESSAGE,
)
PACKAGE = "tensorflow.profiler"

# message -> [(field, number, type, repeated, message type, oneof)], as in xplane.proto.
_SCHEMA: dict[str, list[tuple[str, int, int, bool, str, str]]] = {
    "XSpace": [
        ("planes", 1, _MESSAGE, True, "XPlane", ""),
        ("errors", 2, _STRING, True, "", ""),
        ("warnings", 3, _STRING, True, "", ""),
        ("hostnames", 4, _STRING, True, "", ""),
    ],
    "XPlane": [
        ("id", 1, _INT64, False, "", ""),
        ("name", 2, _STRING, False, "", ""),
        ("lines", 3, _MESSAGE, True, "XLine", ""),
        ("event_metadata", 4, _MESSAGE, True, "XPlane.EventMetadataEntry", ""),
        ("stat_metadata", 5, _MESSAGE, True, "XPlane.StatMetadataEntry", ""),
        ("stats", 6, _MESSAGE, True, "XStat", ""),
    ],
    "XLine": [
        ("id", 1, _INT64, False, "", ""),
        ("display_id", 10, _INT64, False, "", ""),
        ("name", 2, _STRING, False, "", ""),
        ("display_name", 11, _STRING, False, "", ""),
        ("timestamp_ns", 3, _INT64, False, "", ""),
        ("duration_ps", 9, _INT64, False, "", ""),
        ("events", 4, _MESSAGE, True, "XEvent", ""),
    ],
    "XEvent": [
        ("metadata_id", 1, _INT64, False, "", ""),
        ("offset_ps", 2, _INT64, False, "", "data"),
        ("num_occurrences", 5, _INT64, False, "", "data"),
        ("duration_ps", 3, _INT64, False, "", ""),
        ("stats", 4, _MESSAGE, True, "XStat", ""),
    ],
    "XStat": [
        ("metadata_id", 1, _INT64, False, "", ""),
        ("double_value", 2, _DOUBLE, False, "", "value"),
        ("uint64_value", 3, _UINT64, False, "", "value"),
        ("int64_value", 4, _INT64, False, "", "value"),
        ("str_value", 5, _STRING, False, "", "value"),
        ("bytes_value", 6, _BYTES, False, "", "value"),
        ("ref_value", 7, _UINT64, False, "", "value"),  # a string kept as the name of the stat metadata it names
    ],
    "XEventMetadata": [
        ("id", 1, _INT64, False, "", ""),
        ("name", 2, _STRING, False, "", ""),
        ("display_name", 4, _STRING, False, "", ""),
        ("metadata", 3, _BYTES, False, "", ""),
        ("stats", 5, _MESSAGE, True, "XStat", ""),
        ("child_id", 6, _INT64, True, "", ""),
    ],
    "XStatMetadata": [
        ("id", 1, _INT64, False, "", ""),
        ("name", 2, _STRING, False, "", ""),
        ("description", 3, _STRING, False, "", ""),
    ],
}
# XPlane's two maps, as protobuf spells a map: a nested entry message of key and value.
_MAPS = {"EventMetadataEntry": "XEventMetadata", "StatMetadataEntry": "XStatMetadata"}


def _add_field(message: descriptor_pb2.DescriptorProto, name: str, number: int, kind: int, repeated: bool,
               type_name: str = "", oneof: int | None = None) -> None:  # fmt: skip
    field = message.field.add(name=name, number=number, type=kind)
    field.label = _F.LABEL_REPEATED if repeated else _F.LABEL_OPTIONAL
    if type_name:
        field.type_name = f".{PACKAGE}.{type_name}"
    if oneof is not None:
        field.oneof_index = oneof


def _file() -> descriptor_pb2.FileDescriptorProto:
    file = descriptor_pb2.FileDescriptorProto(name="tpuscope/xplane.proto", package=PACKAGE, syntax="proto3")
    for name, fields in _SCHEMA.items():
        message = file.message_type.add(name=name)
        oneofs: list[str] = []
        for field, number, kind, repeated, type_name, oneof in fields:
            if oneof and oneof not in oneofs:
                oneofs.append(oneof)
                message.oneof_decl.add(name=oneof)
            _add_field(message, field, number, kind, repeated, type_name, oneofs.index(oneof) if oneof else None)
        if name == "XPlane":
            for entry, value in _MAPS.items():
                nested = message.nested_type.add(name=entry)
                nested.options.map_entry = True
                _add_field(nested, "key", 1, _INT64, False)
                _add_field(nested, "value", 2, _MESSAGE, False, value)
    return file


_pool = descriptor_pool.DescriptorPool()
_pool.Add(_file())


def _message(name: str) -> Any:
    return message_factory.GetMessageClass(_pool.FindMessageTypeByName(f"{PACKAGE}.{name}"))


XSpace = _message("XSpace")
XPlane = _message("XPlane")
XLine = _message("XLine")
XEvent = _message("XEvent")
XStat = _message("XStat")
XEventMetadata = _message("XEventMetadata")
XStatMetadata = _message("XStatMetadata")


def planes(data: bytes) -> Iterator[Any]:
    """Each XPlane of a serialized XSpace, decoded one at a time: a plane decoded is about six times its bytes, so a
    reader that is done with one before the next holds one plane's worth, not the whole trace's. Raises ValueError
    on bytes that are no XSpace."""
    view, at = memoryview(data), 0
    while at < len(view):
        tag, at = _varint(view, at)
        field, kind = tag >> 3, tag & 7
        if kind == 0:  # varint
            _, at = _varint(view, at)
        elif kind == 1:  # 64-bit
            at += 8
        elif kind == 5:  # 32-bit
            at += 4
        elif kind == 2:  # length-delimited: a plane (field 1), or an error, warning or hostname string
            length, at = _varint(view, at)
            if at + length > len(view):
                raise ValueError("a truncated XSpace")
            if field == XSPACE_PLANES:
                yield XPlane.FromString(view[at : at + length])
            at += length
        else:
            raise ValueError(f"not an XSpace: wire type {kind} at byte {at}")
        if field == 0:
            raise ValueError(f"not an XSpace: field 0 at byte {at}")
    if at != len(view):
        raise ValueError("a truncated XSpace")


XSPACE_PLANES = 1  # XSpace.planes' field number


def _varint(view: memoryview, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if at >= len(view) or shift > 63:
            raise ValueError("a truncated or malformed XSpace")
        byte = view[at]
        at += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, at
