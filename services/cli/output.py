"""How the CLI prints: aligned tables for people, JSON for scripts.

JSON keeps the proto field names, with numbers as numbers (64-bit ones too), enum values
as the words the tables show (`running`, `required`, `drop_oldest`), bytes as base64,
unset optional fields left out, and every source position with a `native` string in the
source's own notation (a PostgreSQL LSN such as `0/198E748`, or a GTID set) beside its
internal `tx_seq`.
"""

from __future__ import annotations

import base64
import json
import sys
import time
from collections.abc import Sequence
from typing import Any

from google.protobuf.descriptor import EnumDescriptor, FieldDescriptor
from google.protobuf.message import Message

from tailrace.events import native_position
from tailrace.proto.event_pb2 import Position


def to_json(value: Any) -> Any:
    if isinstance(value, Message):
        return message_json(value)
    if isinstance(value, list | tuple):
        return [to_json(v) for v in value]
    if isinstance(value, dict):
        return {k: to_json(v) for k, v in value.items()}
    return value


def message_json(message: Message) -> dict[str, Any]:
    """One protobuf message as JSON for scripts (see the module docstring)."""
    out: dict[str, Any] = {}
    for field in message.DESCRIPTOR.fields:
        if field.has_presence and not message.HasField(field.name):
            continue
        value = getattr(message, field.name)
        entry = field.message_type
        if entry is not None and entry.GetOptions().map_entry:
            out[field.name] = {str(k): _scalar(entry.fields_by_name["value"], v)
                               for k, v in value.items()}
        elif _repeated(field):
            out[field.name] = [_scalar(field, v) for v in value]
        else:
            out[field.name] = _scalar(field, value)
    if isinstance(message, Position):
        out["native"] = native_position(message)
    return out


def _repeated(field: FieldDescriptor) -> bool:
    flag = getattr(field, "is_repeated", None)  # protobuf >= 6; `label` is deprecated there
    return bool(flag) if flag is not None else field.label == FieldDescriptor.LABEL_REPEATED


def enum_word(enum: EnumDescriptor, number: int) -> str:
    """`PIPELINE_RUNNING` -> `running`: an enum value without its type's prefix."""
    value = enum.values_by_number.get(number)
    if value is None:
        return str(number)
    name: str = value.name
    return name.split("_", 1)[-1].lower()


def _scalar(field: FieldDescriptor, value: Any) -> Any:
    if field.message_type is not None:
        return message_json(value)
    if field.enum_type is not None:
        return enum_word(field.enum_type, value)
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    return value


def print_json(value: Any) -> None:
    json.dump(to_json(value), sys.stdout, indent=2, sort_keys=True)
    sys.stdout.write("\n")


def print_table(headers: Sequence[str], rows: Sequence[Sequence[object]], empty: str) -> None:
    if not rows:
        print(empty)
        return
    cells = [[str(c) for c in headers], *[[_cell(c) for c in row] for row in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    for row in cells:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())


def _cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.1f}"
    return str(value).replace("\n", " ")


def when(unix_ms: int) -> str:
    if not unix_ms:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(unix_ms / 1000))


def short(text: str, width: int = 60) -> str:
    return text if len(text) <= width else text[:width - 1] + "…"
