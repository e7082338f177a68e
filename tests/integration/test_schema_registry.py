"""The control service's Confluent-compatible schema registry, driven by Confluent's own
client (`confluent_kafka.schema_registry`) against a real `tailrace-control` process."""

from __future__ import annotations

import base64
import json

import pytest
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.error import SchemaRegistryError

from tailrace.devservers import free_port
from tests.fix_control import ControlProcess

pytestmark = pytest.mark.integration


def avro(*fields: dict[str, object], name: str = "Value") -> Schema:
    return Schema(json.dumps({"type": "record", "name": name, "namespace": "shop.orders",
                              "fields": list(fields)}), "AVRO")


ID = {"name": "id", "type": "long"}
TOTAL = {"name": "total", "type": ["null", {"type": "bytes", "logicalType": "decimal",
                                            "precision": 12, "scale": 2}], "default": None}


@pytest.fixture(scope="module")
def control(tmp_path_factory):
    directory = tmp_path_factory.mktemp("registry")
    with ControlProcess(directory, f"sqlite:///{directory / 'state.db'}",
                        http_port=free_port()) as control:
        yield control


def client(control: ControlProcess, token: str | None) -> SchemaRegistryClient:
    conf = {"url": f"http://127.0.0.1:{control.http_port}"}
    if token is not None:
        conf["basic.auth.user.info"] = f"tailrace:{token}"
    return SchemaRegistryClient(conf)


def error_code(call) -> int:
    with pytest.raises(SchemaRegistryError) as caught:
        call()
    return caught.value.error_code


def test_register_look_up_and_read_back_with_stable_global_ids(control) -> None:
    registry = client(control, control.service_token)
    first = registry.register_schema("ids-value", avro(ID, TOTAL))
    assert registry.register_schema("ids-value", avro(ID, TOTAL)) == first, "the same again"
    assert registry.register_schema("other-value", avro(ID, TOTAL)) == first, "one id globally"
    assert {"ids-value", "other-value"} <= set(registry.get_subjects())
    assert registry.get_versions("ids-value") == [1]
    latest = registry.get_latest_version("ids-value")
    assert (latest.schema_id, latest.version, latest.subject) == (first, 1, "ids-value")
    assert json.loads(registry.get_schema(first).schema_str)["fields"][1] == TOTAL
    found = registry.lookup_schema("ids-value", avro(ID, TOTAL))
    assert (found.schema_id, found.version) == (first, 1)
    control.restart()
    again = client(control, control.service_token)
    assert again.register_schema("ids-value", avro(ID, TOTAL)) == first, "kept across restarts"


def test_backward_compatibility_is_the_default_and_is_checked(control) -> None:
    registry = client(control, control.service_token)
    assert registry.get_compatibility() == "BACKWARD"
    v1 = registry.register_schema("compat-value", avro(ID))
    v2 = registry.register_schema("compat-value", avro(ID, TOTAL))  # added with a default
    assert v2 != v1 and registry.get_versions("compat-value") == [1, 2]
    no_default = {"name": "note", "type": "string"}
    assert error_code(lambda: registry.register_schema("compat-value",
                                                       avro(ID, TOTAL, no_default))) == 409
    retyped = {"name": "id", "type": "string"}
    assert not registry.test_compatibility("compat-value", avro(retyped, TOTAL))
    assert error_code(lambda: registry.register_schema("compat-value", avro(retyped))) == 409
    rescaled = {**TOTAL, "type": ["null", {"type": "bytes", "logicalType": "decimal",
                                           "precision": 12, "scale": 4}]}
    assert error_code(lambda: registry.register_schema("compat-value",
                                                       avro(ID, rescaled))) == 409
    assert registry.get_versions("compat-value") == [1, 2], "nothing registered by a refusal"
    registry.set_compatibility("compat-value", "NONE")
    assert registry.get_compatibility("compat-value") == "NONE"
    assert registry.register_schema("compat-value", avro(retyped)) == max(v1, v2) + 1, \
        "the refused schemas were given no id"
    assert registry.get_versions("compat-value") == [1, 2, 3]


def test_unknown_things_and_bad_input_get_confluents_error_codes(control) -> None:
    registry = client(control, control.service_token)
    registry.register_schema("known-value", avro(ID))
    assert error_code(lambda: registry.get_versions("nobody-value")) == 40401
    assert error_code(lambda: registry.get_version("known-value", 7)) == 40402
    assert error_code(lambda: registry.get_schema(999_999)) == 40403
    assert error_code(lambda: registry.lookup_schema("known-value", avro(ID, TOTAL))) == 40403
    assert error_code(lambda: registry.register_schema(
        "bad-value", Schema('{"type": "record", "name": "X"}', "AVRO"))) == 42201
    assert error_code(lambda: registry.register_schema(
        "proto-value", Schema('syntax = "proto3"; message M { int64 id = 1 }', "PROTOBUF"))) \
        == 42201, "protoc's refusal"
    assert error_code(lambda: registry.register_schema(
        "json-value", Schema('{"type": "object", "properties": {"a": {"$ref": "other.json"}}}',
                             "JSON"))) == 42201, "references are not served"
    assert error_code(lambda: registry.register_schema(
        "x-value", Schema("{}", "XML"))) == 42201
    assert not {"bad-value", "proto-value", "json-value"} & set(registry.get_subjects())


def test_reads_and_changes_need_the_tokens(control) -> None:
    before = client(control, control.admin_token).get_subjects()
    assert error_code(lambda: client(control, None).get_subjects()) == 40101
    assert error_code(lambda: client(control, "not-a-token").register_schema(
        "x-value", avro(ID))) == 40101
    assert error_code(lambda: client(control, None).register_schema("x-value", avro(ID))) \
        == 40101
    assert error_code(lambda: client(control, control.service_token).set_compatibility(
        level="NONE")) == 40301, "the global level is the admin's"
    assert client(control, control.admin_token).get_subjects() == before, "nothing changed"
    assert client(control, control.admin_token).get_compatibility() == "BACKWARD"


def json_schema(properties: dict[str, object], required: list[str], closed: bool = True
                ) -> Schema:
    return Schema(json.dumps({"$schema": "http://json-schema.org/draft-07/schema#",
                              "type": "object", "properties": properties, "required": required,
                              "additionalProperties": not closed}), "JSON")


NULLABLE_TEXT = {"oneOf": [{"type": "null"}, {"type": "string"}]}


def test_json_schemas_are_kept_served_with_their_type_and_checked(control) -> None:
    registry = client(control, control.service_token)
    v1 = json_schema({"id": {"type": "integer"}}, ["id"])
    first = registry.register_schema("js-value", v1)
    assert registry.register_schema("js-copy-value", v1) == first, "one id globally"
    found = client(control, control.service_token).get_schema(first)  # not from the cache
    assert (found.schema_type, json.loads(found.schema_str)) == ("JSON", json.loads(v1.schema_str))
    text = '{"type": "string"}'  # an Avro schema and a JSON Schema: two schemas, two ids
    as_avro = registry.register_schema("twin-avro-value", Schema(text, "AVRO"))
    as_json = registry.register_schema("twin-json-value", Schema(text, "JSON"))
    fresh = client(control, control.service_token)  # not answered from the cache
    assert as_avro != as_json and fresh.get_schema(as_json).schema_type == "JSON"
    assert fresh.get_schema(as_avro).schema_type == "AVRO"
    assert error_code(lambda: registry.register_schema(
        "js-avro-value", Schema(v1.schema_str, "AVRO"))) == 42201, "not an Avro schema"
    v2 = json_schema({"id": {"type": "integer"}, "note": NULLABLE_TEXT}, ["id"])
    assert registry.register_schema("js-value", v2) != first, "an optional property added"
    latest = registry.get_latest_version("js-value")
    assert (latest.version, latest.schema.schema_type) == (2, "JSON")
    refusals = {
        "a type changed": json_schema({"id": {"type": "string"}, "note": NULLABLE_TEXT}, ["id"]),
        "a property added as required": json_schema(
            {"id": {"type": "integer"}, "note": NULLABLE_TEXT, "qty": {"type": "integer"}},
            ["id", "qty"]),
        "a property removed from a closed object": json_schema(
            {"id": {"type": "integer", "title": "not version 1's text"}}, ["id"]),
        "null no longer allowed": json_schema({"id": {"type": "integer"}, "note": {
            "type": "string"}}, ["id"]),
        "a constraint added": json_schema({"id": {"type": "integer", "maximum": 10},
                                           "note": NULLABLE_TEXT}, ["id"]),
    }
    for what, schema in refusals.items():
        assert not registry.test_compatibility("js-value", schema), what
        assert error_code(lambda s=schema: registry.register_schema("js-value", s)) == 409, what
    assert registry.get_versions("js-value") == [1, 2], "nothing registered by a refusal"
    widened = json_schema({"id": {"type": "number"}, "note": NULLABLE_TEXT}, ["id"])
    assert registry.test_compatibility("js-value", widened), "integer read as number"
    open_v1 = json_schema({"id": {"type": "integer"}}, ["id"], closed=False)
    registry.register_schema("js-open-value", open_v1)
    assert not registry.test_compatibility("js-open-value", json_schema(
        {"id": {"type": "integer"}, "note": NULLABLE_TEXT}, ["id"], closed=False)), \
        "a property added to an open object: old data may hold it as anything"
    assert error_code(lambda: registry.register_schema("js-value", Schema(
        'syntax = "proto3"; message M { int64 id = 1; }', "PROTOBUF"))) == 409, \
        "a subject keeps its schema type"


PROTO_V1 = """syntax = "proto3";
package shop.orders;
import "google/protobuf/timestamp.proto";

message Envelope {
  Value after = 1;
}

message Value {
  int64 id = 1;
  optional string note = 2;
  google.protobuf.Timestamp placed = 3;
}
"""


def test_protobuf_schemas_are_kept_served_serialized_and_checked(control) -> None:
    from google.protobuf import descriptor_pb2

    registry = client(control, control.service_token)
    first = registry.register_schema("pb-value", Schema(PROTO_V1, "PROTOBUF"))
    spaced = Schema(PROTO_V1.replace("\n\n", "\n// a comment\n\n"), "PROTOBUF")
    assert registry.register_schema("pb-value", spaced) == first, "comments and spacing aside"
    found = client(control, control.service_token).get_schema(first)  # not from the cache
    assert (found.schema_type, found.schema_str) == ("PROTOBUF", PROTO_V1), "kept as given"
    # a new client: Confluent's caches a schema by id whatever the format asked
    served = client(control, control.service_token).get_schema(first, fmt="serialized").schema_str
    proto = descriptor_pb2.FileDescriptorProto.FromString(base64.b64decode(served))
    assert [m.name for m in proto.message_type] == ["Envelope", "Value"]
    assert list(proto.dependency) == ["google/protobuf/timestamp.proto"]
    assert registry.register_schema("pb-serialized-value", Schema(served, "PROTOBUF")) == first, \
        "the serialized form (Confluent's Python serializer registers it) is the same schema"
    added = PROTO_V1.replace("placed = 3;", "placed = 3;\n  optional int32 qty = 4;")
    assert registry.register_schema("pb-value", Schema(added, "PROTOBUF")) != first
    refusals = {
        "a field's type changed": added.replace("optional int32 qty", "optional string qty"),
        "a number reused for another name": added.replace("qty = 4", "qty = 2").replace(
            "optional string note = 2;", ""),
        "the first message changed": added.replace("message Envelope {\n  Value after = 1;\n}\n",
                                                   "") + "message Envelope {\n  Value after = 1;\n}\n",
        "a message removed": added.replace("Value after = 1;", "int64 after = 1;").replace(
            "message Value", "message Row").replace("google.protobuf.Timestamp placed = 3;", ""),
    }
    for what, text in refusals.items():
        assert text != added, what
        schema = Schema(text, "PROTOBUF")
        assert not registry.test_compatibility("pb-value", schema), what
        assert error_code(lambda s=schema: registry.register_schema("pb-value", s)) == 409, what
    assert registry.get_versions("pb-value") == [1, 2]
    removed = added.replace("optional string note = 2;", "reserved 2;")
    assert registry.test_compatibility("pb-value", Schema(removed, "PROTOBUF")), \
        "a field removed, its number reserved"
    registry.register_schema("pb-value", Schema(removed, "PROTOBUF"))
    reused = Schema(removed.replace("reserved 2;", "optional int64 price = 2;"), "PROTOBUF")
    assert error_code(lambda: registry.register_schema("pb-value", reused)) == 409, \
        "a reserved number used again"
    assert registry.get_versions("pb-value") == [1, 2, 3]
