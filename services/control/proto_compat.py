"""Protobuf schemas (`schemaType: PROTOBUF`): parsed by protoc (grpcio-tools' own, in a
child process), kept as given, served as text or, with Confluent's `format=serialized`, as
the base64 of their `FileDescriptorProto` (what Confluent's Python deserializer reads). A
schema may also be registered in that serialized form, as Confluent's Python
`ProtobufSerializer` does. Imports: Google's well-known types only (no references).

`reads(reader, writer)`, a conservative check of wire compatibility:
- a message of the writer (by full name, nested ones too) must be in the reader;
- the file's first message must stay first (message index `[0]` in the data names it);
- a field number in both must keep its type (scalar type, or message/enum full name) and
  its repeated-ness, and its name (a number used for another name is a reused number);
- a field of the reader must not use a number the writer reserved (a reused number);
- proto2 `required`: a field added as required, made required, or a required one removed
  is refused (Confluent's REQUIRED_FIELD_ADDED / _REMOVED);
- oneofs: fields the writer kept apart (top-level ones, or ones of different oneofs) must
  not be one oneof's in the reader, since old data may set more than one of them
  (Confluent's MULTIPLE_FIELDS_MOVED_TO_ONEOF, FIELD_MOVED_TO_EXISTING_ONEOF); one field
  moved into a new oneof is compatible.
Not checked: enum values, field defaults or options, and Confluent's wire-compatible type
changes (int32 to int64, string to bytes, ...), which are refused.
"""

from __future__ import annotations

import base64
import binascii
import functools
import importlib.util
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from google.protobuf import descriptor_pb2
from google.protobuf.message import DecodeError

from tailrace_services.control import compat_levels
from tailrace_services.control.compat_levels import InvalidSchema

_FDP = descriptor_pb2.FieldDescriptorProto
_MESSAGE_KINDS = (_FDP.TYPE_MESSAGE, _FDP.TYPE_ENUM, _FDP.TYPE_GROUP)
_PROTOC_TIMEOUT_S = 30.0


def parse(text: str) -> descriptor_pb2.FileDescriptorProto:
    """The schema's file descriptor; raises `InvalidSchema` with protoc's message."""
    return descriptor_pb2.FileDescriptorProto.FromString(_descriptor(text))


@functools.lru_cache(maxsize=512)
def _descriptor(text: str) -> bytes:
    serialized = _from_base64(text)
    if serialized is not None:
        return serialized
    with tempfile.TemporaryDirectory(prefix="tailrace-proto-") as tmp:
        source, out = Path(tmp) / "schema.proto", Path(tmp) / "schema.pb"
        source.write_text(text)
        well_known = _well_known()
        try:
            done = subprocess.run(
                [sys.executable, "-m", "grpc_tools.protoc", f"-I{tmp}", f"-I{well_known}",
                 f"--descriptor_set_out={out}", "schema.proto"],
                capture_output=True, text=True, timeout=_PROTOC_TIMEOUT_S, check=False)
        except subprocess.TimeoutExpired:
            raise InvalidSchema(f"protoc did not parse it within {_PROTOC_TIMEOUT_S:.0f} s"
                                ) from None
        if done.returncode != 0:
            reason = " ".join(done.stderr.replace(f"{tmp}/", "").split())
            raise InvalidSchema(f"not a .proto file: {reason[:500]}")
        files = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file
    proto = files[-1]
    if proto.syntax not in ("proto3", "proto2", ""):
        raise InvalidSchema(f"syntax {proto.syntax} is not served: use proto3")
    proto.name = "schema.proto"
    return proto.SerializeToString(deterministic=True)


def _well_known() -> Path:
    """grpcio-tools' copy of Google's well-known .proto files."""
    spec = importlib.util.find_spec("grpc_tools")
    if spec is None or spec.origin is None:
        raise InvalidSchema("protobuf schemas need grpcio-tools installed (pip install "
                            "grpcio-tools) in the control service's environment")
    return Path(spec.origin).parent / "_proto"


def _from_base64(text: str) -> bytes | None:
    """A base64 FileDescriptorProto (Confluent's serialized form), or None for .proto text."""
    try:
        raw = base64.b64decode(text.strip(), validate=True)
        proto = descriptor_pb2.FileDescriptorProto.FromString(raw)
    except (binascii.Error, ValueError, DecodeError):
        return None
    if not proto.message_type and not proto.enum_type:
        return None
    proto.name = "schema.proto"
    return proto.SerializeToString(deterministic=True)


def normalized(text: str) -> str:
    """One text per schema whatever its spacing, comments or form (text or serialized):
    the base64 of its descriptor."""
    return base64.b64encode(_descriptor(text)).decode()


def serialized(text: str) -> str:
    """Confluent's `format=serialized`: the base64 of the file's descriptor."""
    return normalized(text)


def problems(level: str, new: Any, existing: list[Any]) -> list[str]:
    return compat_levels.problems(level, new, existing, reads)


def reads(reader: descriptor_pb2.FileDescriptorProto,
          writer: descriptor_pb2.FileDescriptorProto, at: str) -> list[str]:
    """What keeps `reader` from reading messages written with `writer` (this module's
    rules)."""
    found: list[str] = []
    r_messages, w_messages = _messages(reader), _messages(writer)
    if writer.message_type and (not reader.message_type or
                                _first(reader) != _first(writer)):
        found.append(f"the file's first message was {_first(writer)}, now "
                     f"{_first(reader) or 'none'} (data names it by index 0)")
    for name, w in w_messages.items():
        r = r_messages.get(name)
        if r is None:
            found.append(f"message {name} removed")
            continue
        found += _fields(name, r, w)
    return found


def _first(proto: descriptor_pb2.FileDescriptorProto) -> str:
    return f"{proto.package}.{proto.message_type[0].name}".lstrip(".") \
        if proto.message_type else ""


def _messages(proto: descriptor_pb2.FileDescriptorProto
              ) -> dict[str, descriptor_pb2.DescriptorProto]:
    out: dict[str, descriptor_pb2.DescriptorProto] = {}

    def add(prefix: str, messages: Any) -> None:
        for message in messages:
            name = f"{prefix}.{message.name}".lstrip(".")
            out[name] = message
            add(name, message.nested_type)

    add(proto.package, proto.message_type)
    return out


def _fields(name: str, r: descriptor_pb2.DescriptorProto, w: descriptor_pb2.DescriptorProto
            ) -> list[str]:
    found: list[str] = []
    written = {f.number: f for f in w.field}
    read = {f.number for f in r.field}
    for field in r.field:
        where = f"{name}.{field.name} = {field.number}"
        if any(lo <= field.number < hi for lo, hi in
               ((rng.start, rng.end) for rng in w.reserved_range)):
            found.append(f"{where}: the number was reserved (a reused number)")
        old = written.get(field.number)
        required = field.label == _FDP.LABEL_REQUIRED
        if old is None:
            if required:
                found.append(f"{where}: added as required (old data lacks it)")
            continue
        if old.name != field.name:
            found.append(f"{where}: the number was {old.name}'s (a reused number)")
        if _kind(old) != _kind(field):
            found.append(f"{where}: {_kind(old)} written, {_kind(field)} read")
        if required and old.label != _FDP.LABEL_REQUIRED:
            found.append(f"{where}: required now, not before (old data may lack it)")
    for old in w.field:
        if old.number not in read and old.label == _FDP.LABEL_REQUIRED:
            found.append(f"{name}.{old.name} = {old.number}: required in the writer's schema, "
                         "not in the reader's (a required field added or removed: readers "
                         "that require it refuse data without it)")
    return found + _oneofs(name, r, w)


def _oneofs(name: str, r: descriptor_pb2.DescriptorProto, w: descriptor_pb2.DescriptorProto
            ) -> list[str]:
    """Fields data written with `w` may set together (top-level ones, or ones of different
    oneofs) that are one oneof's in `r`, which keeps only one of them (Confluent's rules)."""
    found: list[str] = []
    w_oneof, r_oneof = _oneof_of(w), _oneof_of(r)
    written = {f.number for f in w.field}
    existed = set(w_oneof.values())
    for oneof in dict.fromkeys(r_oneof.values()):
        kept = [f for f in r.field if r_oneof.get(f.number) == oneof and f.number in written]
        moved = [f"{f.name} = {f.number}" for f in kept if f.number not in w_oneof]
        apart = {w_oneof.get(f.number, f"{f.number}") for f in kept}
        where = f"{name}: oneof {oneof}"
        if len(moved) > 1:
            found.append(f"{where} holds {', '.join(moved)}, fields apart in the writer's "
                         "schema (data may set more than one of them)")
        elif moved and (oneof in existed or len(apart) > 1):
            found.append(f"{where} holds {moved[0]}, apart in the writer's schema, beside "
                         "fields of a oneof the writer had (data may set both)")
        elif len(apart) > 1:
            found.append(f"{where} holds fields of the writer's oneofs {sorted(apart)} (data "
                         "may set one of each)")
    return found


def _oneof_of(message: descriptor_pb2.DescriptorProto) -> dict[int, str]:
    """Field number -> its oneof's name, for fields in a oneof (not proto3 `optional`'s own)."""
    return {f.number: message.oneof_decl[f.oneof_index].name for f in message.field
            if f.HasField("oneof_index") and not f.proto3_optional}


def _kind(field: descriptor_pb2.FieldDescriptorProto) -> str:
    repeated = "repeated " if field.label == _FDP.LABEL_REPEATED else ""
    if field.type in _MESSAGE_KINDS:
        return repeated + field.type_name.lstrip(".")
    return repeated + _FDP.Type.Name(field.type).removeprefix("TYPE_").lower()
