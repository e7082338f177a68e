"""The registry's compatibility rules for JSON Schema and Protobuf schemas (pure logic;
Protobuf schemas are parsed by grpcio-tools' protoc)."""

from __future__ import annotations

import base64
import json

import pytest

from tailrace_services.control import json_compat, proto_compat
from tailrace_services.control.compat_levels import InvalidSchema

NULLABLE_TEXT = {"oneOf": [{"type": "null"}, {"type": "string"}]}


def obj(properties: dict[str, object], required: tuple[str, ...] = ("id",), closed: bool = True,
        **more: object) -> json_compat.Doc:
    return json_compat.parse(json.dumps({
        "type": "object", "properties": properties, "required": list(required),
        **({"additionalProperties": False} if closed else {}), **more}))


ID = {"id": {"type": "integer"}}


def backward(new: json_compat.Doc, old: json_compat.Doc) -> list[str]:
    return json_compat.problems("BACKWARD", new, [old])


def test_json_added_optional_properties_and_wider_types_are_compatible() -> None:
    v1 = obj(ID)
    assert backward(obj({**ID, "note": NULLABLE_TEXT}), v1) == []
    assert backward(obj({"id": {"type": "number"}}), v1) == [], "integer read as number"
    assert backward(obj({"id": {"type": ["integer", "null"]}}), v1) == []
    assert backward(obj(ID, closed=False), v1) == [], "opened"
    assert backward(obj(ID, title="a new title"), v1) == [], "annotations are not compared"


@pytest.mark.parametrize(("new", "old", "found"), [
    (obj({"id": {"type": "string"}}), obj(ID), "id: ['integer'] written, ['string'] read"),
    (obj({**ID, "n": {"type": "integer"}}, ("id", "n")), obj(ID), "n: added as required"),
    (obj({**ID, "n": NULLABLE_TEXT}, closed=False), obj(ID, closed=False),
     "n: added to an open object"),
    (obj(ID), obj({**ID, "n": NULLABLE_TEXT}), "n: removed"),
    (obj({**ID, "n": NULLABLE_TEXT}, ("id", "n")), obj({**ID, "n": NULLABLE_TEXT}),
     "n: required now"),
    (obj({**ID, "n": {"type": "string"}}), obj({**ID, "n": NULLABLE_TEXT}),
     "n: ['null'] written, ['string'] read"),
    (obj({"id": {"type": "integer", "maximum": 9}}), obj(ID), "maximum is 9"),
    (obj(ID), obj(ID, closed=False), "other properties old data may hold"),
    (obj({"d": {"type": "string", "connect.parameters": {"scale": 4}}}, ()),
     obj({"d": {"type": "string", "connect.parameters": {"scale": 2}}}, ()),
     "connect.parameters"),
    (obj({**ID, "ab": {"type": "string"}}),
     obj(ID, patternProperties={"^a": {"type": "integer"}}),
     "ab: added to an open object"),  # closed, but its patterns allowed {"ab": 5}
    (obj({"l": {"type": "array", "items": {"type": "integer"}}}, ()),
     obj({"l": {"type": "array", "items": [{"type": "integer"}]}}, ()),
     "items is a list (tuple items) before"),
])
def test_json_changes_that_old_data_may_not_pass_are_refused(
        new: json_compat.Doc, old: json_compat.Doc, found: str) -> None:
    problems = backward(new, old)
    assert any(found in p for p in problems), problems


def test_json_refs_are_followed_and_the_levels_look_both_ways() -> None:
    def enveloped(value: dict[str, object]) -> json_compat.Doc:
        return json_compat.parse(json.dumps({
            "type": "object", "definitions": {"Value": value},
            "properties": {"after": {"oneOf": [{"type": "null"},
                                               {"$ref": "#/definitions/Value"}]}}}))
    v1 = enveloped({"type": "object", "properties": ID, "additionalProperties": False})
    v2 = enveloped({"type": "object", "properties": {"id": {"type": "string"}},
                    "additionalProperties": False})
    [problem] = backward(v2, v1)
    assert "after.id: ['integer'] written, ['string'] read" in problem
    grown = enveloped({"type": "object", "properties": {**ID, "n": NULLABLE_TEXT},
                       "additionalProperties": False})
    assert json_compat.problems("BACKWARD", grown, [v1]) == []
    assert json_compat.problems("FORWARD", grown, [v1]) != [], "v1 (closed) refuses n"
    assert json_compat.problems("NONE", v2, [v1]) == []


def doc(schema: dict[str, object]) -> json_compat.Doc:
    return json_compat.parse(json.dumps(schema))


def with_b(b: dict[str, object], **top: object) -> json_compat.Doc:
    return doc({**top, "$defs": {"B": b}})


B_TEXT = {"type": "object", "properties": {"a": {"type": "string"}}}
B_NUMBER_REQUIRED = {"type": "object", "properties": {"a": {"type": "integer"}},
                     "required": ["a"]}


@pytest.mark.parametrize("key", ["allOf", "not", "if", "items", "prefixItems",
                                 "dependentSchemas"])
def test_json_a_definition_changed_behind_an_unchanged_ref_is_a_change(key: str) -> None:
    ref: object = {"$ref": "#/$defs/B"}
    value = {"allOf": [ref], "not": ref, "if": ref, "items": [ref], "prefixItems": [ref],
             "dependentSchemas": {"a": ref}}[key]
    old, new = with_b(B_TEXT, **{key: value}), with_b(B_NUMBER_REQUIRED, **{key: value})
    [problem] = backward(new, old)
    assert f"{key} is unchanged, but a definition its $ref points at is not" in problem
    assert backward(with_b(B_TEXT, **{key: value}), old) == []


def test_json_a_recursive_definition_behind_a_ref_is_compared_too() -> None:
    def listed(kind: str) -> json_compat.Doc:
        return doc({"not": {"$ref": "#/$defs/N"}, "$defs": {"N": {
            "type": "object", "properties": {"v": {"type": kind},
                                             "next": {"$ref": "#/$defs/N"}}}}})
    assert backward(listed("string"), listed("string")) == []
    assert any("not is unchanged, but a definition" in p
               for p in backward(listed("integer"), listed("string")))


def test_json_the_words_beside_a_union_hold_in_each_branch() -> None:
    def beside(a: str, required: tuple[str, ...] = ()) -> json_compat.Doc:
        return doc({"type": "object", "properties": {"a": {"type": a}},
                    "required": list(required),
                    "anyOf": [{"properties": {"b": {"type": "string"}}, "required": ["b"]}]})
    assert backward(beside("string"), beside("string")) == []
    assert any("a: required now, not before" in p
               for p in backward(beside("string", ("a",)), beside("string"))), \
        "the reader's own required list was lost to the branch's"
    assert any("a: ['string'] written, ['integer'] read" in p
               for p in backward(beside("integer"), beside("string"))), \
        "the reader's own properties were lost to the branch's"


def test_json_the_words_beside_a_ref_apply_too() -> None:
    old = with_b(B_TEXT, **{"$ref": "#/$defs/B"})
    assert any("a: required now, not before" in p for p in backward(
        with_b(B_TEXT, **{"$ref": "#/$defs/B", "required": ["a"]}), old))
    assert any("a: ['string'] written, ['integer'] read" in p for p in backward(
        with_b(B_TEXT, **{"$ref": "#/$defs/B", "properties": {"a": {"type": "integer"}}}),
        old)), "a key in both: the reader must read with each"
    bounded = {**B_TEXT, "properties": {"a": {"type": "string", "maxLength": 9}}}
    both = with_b(bounded, **{"$ref": "#/$defs/B", "properties": {"a": {"maxLength": 5}}})
    assert backward(with_b(bounded, **{"$ref": "#/$defs/B"}), both) == [], \
        "one part of the writer read alone"
    assert backward(both, both) == []
    [problem] = backward(doc({"type": "object", "properties": {
        "a": {"type": "string", "maxLength": 5}}}), both)
    assert "parts that could not be merged" in problem, "not a guess: refused, and why"


@pytest.mark.parametrize(("text", "why"), [
    ("[1]", "not a JSON Schema"),
    ('{"type": "thing"}', "type 'thing'"),
    ('{"$ref": "other.json#/x"}', "references to other documents"),
    ('{"$ref": "#/definitions/Missing"}', "points at nothing"),
    ('{"properties": {"a": {"required": "a"}}}', "required at a"),
    ('{"type": {"a": 1}}', "type {'a': 1}"),
    ('{"type": [["string"]]}', r"type \['string'\]"),
    ('{"items": [5]}', "not a JSON Schema at \\[0\\]"),
    ('{"additionalProperties": [true]}', "not a JSON Schema at <additionalProperties>"),
    ('{"$ref": "#/required", "required": ["a"]}', "not a JSON Schema at #/required"),
    ('{"anyOf": [{"$ref": "#"}, {"type": "string"}]}', "part of itself"),
    ('{"items": ' * 2000 + "{}" + "}" * 2000, "nested too deeply"),
])
def test_what_is_not_a_json_schema_is_refused(text: str, why: str) -> None:
    with pytest.raises(InvalidSchema, match=why):
        json_compat.parse(text)


def proto(body: str, package: str = "shop") -> object:
    return proto_compat.parse(f'syntax = "proto3";\npackage {package};\n{body}')


V1 = "message Envelope { Value after = 1; }\nmessage Value { int64 id = 1; string note = 2; }"


def test_protobuf_fields_added_or_removed_with_their_number_reserved_are_compatible() -> None:
    v1 = proto(V1)
    assert proto_compat.problems("FULL", proto(V1.replace("note = 2;", "note = 2; int32 q = 3;")),
                                 [v1]) == []
    assert proto_compat.problems("BACKWARD", proto(V1.replace("string note = 2;",
                                                              "reserved 2;")), [v1]) == []


@pytest.mark.parametrize(("new", "found"), [
    (V1.replace("string note", "int64 note"), "Value.note = 2: string written, int64 read"),
    (V1.replace("string note = 2;", "int64 qty = 2;"), "the number was note's"),
    (V1.replace("message Envelope { Value after = 1; }\n", "") +
     "\nmessage Envelope { Value after = 1; }", "the file's first message was shop.Envelope"),
    (V1.replace("Value after", "int64 after").replace("message Value", "message Row"),
     "message shop.Value removed"),
    (V1.replace("string note", "repeated string note"), "string written, repeated string read"),
])
def test_protobuf_type_changes_and_reused_numbers_are_refused(new: str, found: str) -> None:
    problems = proto_compat.problems("BACKWARD", proto(new), [proto(V1)])
    assert any(found in p for p in problems), problems


def test_protobuf_a_reserved_number_used_again_is_refused() -> None:
    removed = proto(V1.replace("string note = 2;", "reserved 2;"))
    problems = proto_compat.problems("BACKWARD", proto(V1.replace("string note", "bytes blob")),
                                     [removed])
    assert any("was reserved" in p for p in problems), problems


TWO = "message M { int32 a = 1; int32 b = 2; }"


@pytest.mark.parametrize(("new", "old", "found"), [
    ("message M { oneof x { int32 a = 1; int32 b = 2; } }", TWO,
     "oneof x holds a = 1, b = 2, fields apart in the writer's schema"),
    ("message M { oneof x { int32 a = 1; int32 b = 2; } }",
     "message M { int32 a = 1; oneof x { int32 b = 2; } }",
     "oneof x holds a = 1, apart in the writer's schema, beside fields of a oneof"),
    ("message M { oneof z { int32 a = 1; int32 b = 2; } }",
     "message M { oneof x { int32 a = 1; } oneof y { int32 b = 2; } }",
     "oneof z holds fields of the writer's oneofs ['x', 'y']"),
])
def test_protobuf_fields_data_may_set_together_made_one_oneofs_are_refused(
        new: str, old: str, found: str) -> None:
    problems = proto_compat.problems("BACKWARD", proto(new), [proto(old)])
    assert any(found in p for p in problems), problems


def test_protobuf_one_field_into_a_new_oneof_is_compatible() -> None:
    assert proto_compat.problems("BACKWARD", proto("message M { int32 b = 2; oneof x { "
                                                   "int32 a = 1; } }"), [proto(TWO)]) == []
    assert proto_compat.problems("FULL", proto("message M { optional int32 a = 1; int32 b = 2; "
                                               "}"), [proto(TWO)]) == [], \
        "proto3 optional's own oneof is no oneof"


def proto2(body: str) -> object:
    return proto_compat.parse(f'syntax = "proto2";\npackage shop;\n{body}')


OPTIONAL = "message M { optional int32 a = 1; optional int32 b = 2; }"
REQUIRED = "message M { optional int32 a = 1; required int32 b = 2; }"
WITHOUT = "message M { optional int32 a = 1; }"


@pytest.mark.parametrize(("level", "new", "old", "found"), [
    ("BACKWARD", REQUIRED, WITHOUT, "M.b = 2: added as required"),
    ("BACKWARD", WITHOUT, REQUIRED, "M.b = 2: required in the writer's schema, not in the"),
    ("FORWARD", REQUIRED, WITHOUT, "M.b = 2: required in the writer's schema, not in the"),
    ("BACKWARD", REQUIRED, OPTIONAL, "M.b = 2: required now, not before"),
    ("FULL", OPTIONAL, REQUIRED, "old readers cannot read new data: shop.M.b = 2: required now"),
])
def test_protobuf_proto2_required_fields_added_removed_or_made_are_refused(
        level: str, new: str, old: str, found: str) -> None:
    problems = proto_compat.problems(level, proto2(new), [proto2(old)])
    assert any(found in p for p in problems), problems
    assert proto_compat.problems("BACKWARD", proto2(OPTIONAL), [proto2(REQUIRED)]) == [], \
        "a required field made optional: old data has it"


def test_protobuf_text_and_its_serialized_form_are_one_schema() -> None:
    text = f'syntax = "proto3";\npackage shop;\n{V1}'
    served = proto_compat.serialized(text)
    assert proto_compat.normalized(served) == proto_compat.normalized(text)
    assert proto_compat.normalized(text.replace("\n", "\n\n// c\n")) == \
        proto_compat.normalized(text)
    assert [m.name for m in proto_compat.parse(base64.b64encode(base64.b64decode(served))
                                               .decode()).message_type] == ["Envelope", "Value"]
    with pytest.raises(InvalidSchema, match="not a .proto file: schema.proto:3"):
        proto_compat.parse('syntax = "proto3";\npackage shop;\nmessage M { int64 id = 1 }')
