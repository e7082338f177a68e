"""The schema types the registry keeps (Confluent's `schemaType`): how each is parsed,
normalized for its stable id, checked for compatibility, and served in another format."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tailrace_services.control import avro_compat, json_compat, proto_compat


@dataclass(frozen=True)
class SchemaType:
    name: str
    parse: Callable[[str], Any]  # raises compat_levels.InvalidSchema
    normalized: Callable[[str], str]  # one text per schema: what its id keys on
    problems: Callable[[str, Any, list[Any]], list[str]]  # (level, new, existing oldest first)
    formats: dict[str, Callable[[str], str]]  # Confluent's `format` query: text -> served


TYPES = {
    "AVRO": SchemaType("AVRO", avro_compat.parse, avro_compat.normalized, avro_compat.problems,
                       {}),
    "JSON": SchemaType("JSON", json_compat.parse, json_compat.normalized, json_compat.problems,
                       {}),
    "PROTOBUF": SchemaType("PROTOBUF", proto_compat.parse, proto_compat.normalized,
                           proto_compat.problems, {"serialized": proto_compat.serialized}),
}
