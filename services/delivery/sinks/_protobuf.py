"""The Kafka sink's `format: protobuf`: Debezium's change event as a Protobuf message in
Confluent's wire format (magic byte 0, the schema's 4-byte id, the message indexes — `[0]`,
the file's first message, as the single byte 0 — then the message), its schema a proto3
file per table registered with `schemaType: PROTOBUF` under `{topic}-value` and
`{topic}-key`. The messages are built at run time from the same description
(`descriptor_pb2`, `message_factory`).

The file: `Envelope` first (before, after: `Value`; source: `Source`; op; ts_ms, ts_us,
ts_ns; transaction: `Block`), then `Value`, one field per column. Column types come from
their Avro type (`_avro`, from the source type):

| source | Protobuf |
|---|---|
| boolean | `bool` |
| smallint, integer, year ...; bigint, int unsigned | `int32`; `int64` |
| numeric, decimal, bigint unsigned | `string`, exact text |
| real, float; double | `float`; `double` |
| timestamp with time zone, MySQL timestamp | `google.protobuf.Timestamp` |
| timestamp without time zone, datetime | `int64`, microseconds since the epoch |
| date; time | `int32` days since the epoch; `int64` microseconds |
| bytea, blobs, binary | `bytes` |
| uuid, json, jsonb, text and the rest | `string` |
| arrays of T | `TArray { repeated TItem items = 1; }`, `TItem { optional T value = 1; }` |

(An array item without a value is NULL.)

Key columns are plain fields; the others are `optional` (explicit presence: unset is NULL)
or messages (unset is NULL). Field numbers are stable: the first schema of a table numbers
its columns 1, 2, ... in the source's column order (PostgreSQL's attnum order, MySQL's
ordinal position); a column added later takes the number after the highest the subject's
latest version uses (read from the registry, so a restart numbers alike); a dropped
column's field stays (never set again), so no number is ever used for another column. An
unchanged TOAST value is Debezium's placeholder in a string or bytes field, as in Avro.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, timestamp_pb2
from google.protobuf.message import DecodeError, Message

from tailrace.envelopes import debezium_connector, debezium_source_fields
from tailrace.events import ChangeEvent
from tailrace_services.delivery.sinks._avro import ColumnTable, plain_decimal
from tailrace_services.delivery.sinks._registry_encoder import RegistryEncoder

CONTENT_TYPE = "application/vnd.confluent.protobuf"
TIMESTAMP = "google.protobuf.Timestamp"
_TIMESTAMP_FILE = "google/protobuf/timestamp.proto"
_FDP = descriptor_pb2.FieldDescriptorProto
_SCALARS = {"double", "float", "int64", "uint64", "int32", "bool", "string", "bytes"}
_TIMESTAMP_PROTO = descriptor_pb2.FileDescriptorProto.FromString(
    timestamp_pb2.DESCRIPTOR.serialized_pb)
_HELPER_PREFIX = {TIMESTAMP: "Timestamp"}  # element type -> its item/array messages' prefix


def message_indexes(indexes: list[int]) -> bytes:
    """Confluent's message-index array: its length and each index as zigzag varints; the
    first message (`[0]`) as the single byte 0."""
    if indexes == [0]:
        return b"\x00"
    return b"".join(_varint(_zigzag(n)) for n in [len(indexes), *indexes])


def _zigzag(n: int) -> int:
    return (n << 1) ^ (n >> 63)


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        out.append(low | (0x80 if n else 0))
        if not n:
            return bytes(out)


def proto_type(avro: dict[str, Any]) -> str:
    """The Protobuf type of a column of Avro type `avro` (this module's table)."""
    kind, logical = avro["type"], avro.get("logicalType")
    if kind == "array":
        return f"{_prefix(proto_type(avro['items'][1]))}Array"
    if logical == "decimal":
        return "string"
    if logical == "timestamp-micros":
        return TIMESTAMP
    return {"boolean": "bool", "int": "int32", "long": "int64", "float": "float",
            "double": "double", "bytes": "bytes"}.get(kind, "string")


def _prefix(element: str) -> str:
    return _HELPER_PREFIX.get(element) or element[0].upper() + element[1:]


def _element(array_type: str) -> str:
    """`StringArray` -> string, `TimestampArray` -> google.protobuf.Timestamp, ..."""
    prefix = array_type.removesuffix("Array")
    back = {v: k for k, v in _HELPER_PREFIX.items()}
    if prefix in back:
        return back[prefix]
    lowered = prefix[0].lower() + prefix[1:]
    return lowered if lowered in _SCALARS else prefix


def proto_finish(avro: dict[str, Any]) -> Callable[[Any], Any] | None:
    """An Avro datum of `avro` -> what `_set` puts in its field (None: the same)."""
    if avro["type"] == "array":
        item = proto_finish(avro["items"][1])
        return None if item is None else lambda v: [None if i is None else item(i) for i in v]
    return plain_decimal if avro.get("logicalType") == "decimal" else None


class Field(NamedTuple):
    number: int
    type: str  # a scalar, google.protobuf.Timestamp, or a message of the file
    optional: bool  # `optional` (scalars only; a message field has presence anyway)
    repeated: bool = False  # an array message's items


@dataclass
class _File:
    """A proto3 file's messages, rendered as text (registered) and as a descriptor (used)."""

    package: str
    messages: dict[str, dict[str, Field]]  # in order; fields by name

    def text(self) -> str:
        lines = ['syntax = "proto3";', f"package {self.package};"]
        if self._uses_timestamp():
            lines.append(f'import "{_TIMESTAMP_FILE}";')
        for name, fields in self.messages.items():
            lines.append(f"\nmessage {name} {{")
            for field_name, f in sorted(fields.items(), key=lambda kv: kv[1].number):
                label = "repeated " if f.repeated else "optional " if f.optional else ""
                lines.append(f"  {label}{f.type} {field_name} = {f.number};")
            lines.append("}")
        return "\n".join(lines) + "\n"

    def _uses_timestamp(self) -> bool:
        return any(f.type == TIMESTAMP for fs in self.messages.values() for f in fs.values())

    def classes(self, name: str) -> dict[str, type[Message]]:
        proto = descriptor_pb2.FileDescriptorProto(name=f"{name}.proto", package=self.package,
                                                   syntax="proto3")
        if self._uses_timestamp():
            proto.dependency.append(_TIMESTAMP_FILE)
        for message_name, fields in self.messages.items():
            message = proto.message_type.add(name=message_name)
            for field_name, f in sorted(fields.items(), key=lambda kv: kv[1].number):
                field = message.field.add(name=field_name, number=f.number)
                field.label = _FDP.LABEL_REPEATED if f.repeated else _FDP.LABEL_OPTIONAL
                if f.type in _SCALARS:
                    field.type = getattr(_FDP, f"TYPE_{f.type.upper()}")
                else:
                    field.type = _FDP.TYPE_MESSAGE
                    field.type_name = f".{f.type}" if f.type == TIMESTAMP \
                        else f".{self.package}.{f.type}"
                if f.optional:
                    field.proto3_optional = True
                    field.oneof_index = len(message.oneof_decl)
                    message.oneof_decl.add(name=f"_{field_name}")
        classes = message_factory.GetMessages([_TIMESTAMP_PROTO, proto],
                                              descriptor_pool.DescriptorPool())
        return {m: classes[f"{self.package}.{m}"] for m in self.messages}


def _helpers(types: Iterable[str]) -> dict[str, dict[str, Field]]:
    """The item and array messages the array types among `types` need."""
    out: dict[str, dict[str, Field]] = {}
    for t in types:
        while t.endswith("Array"):
            element = _element(t)
            item = f"{_prefix(element)}Item"
            out[item] = {"value": Field(1, element, element in _SCALARS)}
            out[t] = {"items": Field(1, item, False, repeated=True)}
            t = element
    return out


def _source_fields(connector: str) -> dict[str, Field]:
    types = {"string": "string", "int64": "int64", "int32": "int32"}
    return {name: Field(i, types[t], optional)
            for i, (name, t, optional) in enumerate(debezium_source_fields(connector), 1)}


_ENVELOPE = {"before": Field(1, "Value", False), "after": Field(2, "Value", False),
             "source": Field(3, "Source", False), "op": Field(4, "string", False),
             "ts_ms": Field(5, "int64", True), "ts_us": Field(6, "int64", True),
             "ts_ns": Field(7, "int64", True), "transaction": Field(8, "Block", False)}
_BLOCK = {"id": Field(1, "string", False), "total_order": Field(2, "int64", False),
          "data_collection_order": Field(3, "int64", False)}


def numbered(columns: list[tuple[str, str, bool]], history: dict[str, Field] | None
             ) -> dict[str, Field]:
    """The `Value` message's fields: `columns` as (field name, type, key); a name in
    `history` (the latest registered `Value`) keeps its number, a new one takes the next
    after the highest there, and a field there no longer a column stays, optional."""
    kept = history or {}
    next_number = max((f.number for f in kept.values()), default=0) + 1
    fields: dict[str, Field] = {}
    for name, type_, key in columns:
        if name in kept:
            number = kept[name].number
        else:
            number, next_number = next_number, next_number + 1
        fields[name] = Field(number, type_, not key and type_ in _SCALARS)
    for name, f in kept.items():
        if name not in fields:
            fields[name] = Field(f.number, f.type, f.type in _SCALARS and not f.repeated,
                                 f.repeated)
    return fields


def _json_name(field_name: str) -> str:
    """protobuf's JSON name of a field (its `ToJsonName`): `foo_bar` -> `fooBar`."""
    out, upper = [], False
    for ch in field_name:
        if ch == "_":
            upper = True
        else:
            out.append(ch.upper() if upper else ch)
            upper = False
    return "".join(out)


def _check_json_names(fields: dict[str, Field], table: str) -> None:
    """proto3 refuses two fields of one message with the same JSON name (`fooBar` and
    `foo_bar`); say which columns, and the ways out, before protobuf's own TypeError."""
    seen: dict[str, str] = {}
    for name in fields:
        other = seen.setdefault(_json_name(name), name)
        if other != name:
            raise ValueError(
                f"columns {other!r} and {name!r} of {table} have the same protobuf JSON name "
                f"{_json_name(name)!r}, which proto3 refuses in one message: rename one of "
                "them, or give this sink format: avro or json_schema")


class _ProtoTable(ColumnTable):
    """One table shape's .proto files (value and key) and their message classes;
    `history`: the `Value` message's fields."""

    def __init__(self, event: ChangeEvent, columns: list[tuple[str, str]],
                 history: dict[str, Field] | None) -> None:
        super().__init__(event, columns, proto_finish)
        package = self.namespace
        types = {self.names[n]: proto_type(self.types[n]) for n, _ in columns}
        self.history = value = numbered(
            [(self.names[n], types[self.names[n]], n in self.keys) for n, _ in columns], history)
        _check_json_names(value, f"{event.schema or event.database}.{event.table}")
        value_file = _File(package, {
            "Envelope": _ENVELOPE, "Value": value,
            "Source": _source_fields(debezium_connector(event)), "Block": _BLOCK,
            **_helpers(f.type for f in value.values())})
        keys = {self.names[n]: Field(value[self.names[n]].number, types[self.names[n]], False)
                for n, _ in columns if n in self.keys}
        key_file = _File(package, {"Key": keys or {"table": Field(1, "string", False)},
                                   **_helpers(f.type for f in keys.values())})
        self.value_schema, self.key_schema = value_file.text(), key_file.text()
        self._envelope = value_file.classes("value")["Envelope"]
        self._key = key_file.classes("key")["Key"]

    def encode_value(self, datum: dict[str, Any]) -> bytes:
        return message_indexes([0]) + _filled(self._envelope(), datum).SerializeToString(
            deterministic=True)

    def encode_key(self, datum: Any) -> bytes:
        doc = datum if isinstance(datum, dict) else {"table": datum}  # keyless: its name
        return message_indexes([0]) + _filled(self._key(), doc).SerializeToString(
            deterministic=True)


def _filled(message: Message, datum: dict[str, Any]) -> Message:
    for field in message.DESCRIPTOR.fields:
        value = datum.get(field.name)
        if value is not None:
            _set(message, field.name, field, value)
    return message


def _set(message: Message, name: str, field: Any, value: Any) -> None:
    kind = field.message_type
    if kind is None:
        try:
            setattr(message, name, value)
        except (TypeError, ValueError) as e:
            raise ValueError(f"field {name}: {value!r} does not fit {field.type}: {e}") from None
    elif kind.full_name == TIMESTAMP:
        getattr(message, name).FromMicroseconds(value)
    elif isinstance(value, dict):
        _filled(getattr(message, name), value)
    else:  # an array: its items, each set or not (NULL)
        array = getattr(message, name)
        array.SetInParent()
        item_field = kind.fields_by_name["items"]
        for element in value:
            item = array.items.add()
            if element is not None:
                _set(item, "value", item_field.message_type.fields_by_name["value"], element)


class ProtobufEncoder(RegistryEncoder):
    """`Encoder`'s part for `format: protobuf`."""

    content_type = CONTENT_TYPE
    schema_type = "PROTOBUF"
    table = _ProtoTable
    keeps_history = True
    history_format = "serialized"  # the registry's latest version as a descriptor

    def history_of(self, schema: str) -> dict[str, Field] | None:
        try:
            proto = descriptor_pb2.FileDescriptorProto.FromString(
                base64.b64decode(schema, validate=True))
        except (ValueError, DecodeError):
            return None  # not served as a descriptor: nothing kept
        return value_fields(proto)


def value_fields(proto: descriptor_pb2.FileDescriptorProto) -> dict[str, Field] | None:
    """The `Value` message's fields in a file (None without one)."""
    value = next((m for m in proto.message_type if m.name == "Value"), None)
    if value is None:
        return None
    names = {v: k.removeprefix("TYPE_").lower() for k, v in _FDP.Type.items()}
    fields = {}
    for f in value.field:
        if f.type == _FDP.TYPE_MESSAGE:
            type_ = f.type_name.lstrip(".").removeprefix(f"{proto.package}.")
        else:
            type_ = names[f.type]
        fields[f.name] = Field(f.number, type_, f.proto3_optional,
                               f.label == _FDP.LABEL_REPEATED)
    return fields
