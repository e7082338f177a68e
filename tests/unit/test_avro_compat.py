"""Avro schema resolution as the registry's compatibility levels use it (pure logic)."""

from __future__ import annotations

import json

import pytest

from tailrace_services.control.avro_compat import InvalidSchema, normalized, parse, problems


def record(*fields: dict[str, object]) -> object:
    return parse(json.dumps({"type": "record", "name": "V", "namespace": "n",
                             "fields": list(fields)}))


def dec(scale: int) -> dict[str, object]:
    return {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": scale}


ID = {"name": "id", "type": "int"}


def test_backward_reads_old_data_with_the_new_schema() -> None:
    old = record(ID)
    assert problems("BACKWARD", record(ID, {"name": "a", "type": ["null", "string"],
                                           "default": None}), [old]) == []
    assert problems("BACKWARD", record({"name": "id", "type": "long"}), [old]) == [], \
        "int promotes to long"
    assert problems("BACKWARD", record(), [old]) == [], "a removed field is skipped"
    [found] = problems("BACKWARD", record(ID, {"name": "a", "type": "string"}), [old])
    assert "a: added without a default" in found
    [found] = problems("BACKWARD", record({"name": "id", "type": "string"}), [old])
    assert "id: int written, string read" in found


def test_forward_full_and_transitive_look_the_other_way_and_further_back() -> None:
    v1, v2 = record(ID), record(ID, {"name": "a", "type": "string", "default": ""})
    assert problems("FORWARD", record(), [v1]) != [], "old readers need id"
    assert problems("FORWARD", v2, [v1]) == []
    assert problems("FULL", record({"name": "id", "type": "long"}), [v1]) != [], \
        "long does not narrow to int"
    v3 = record({"name": "a", "type": "string", "default": ""})  # id dropped
    assert problems("FORWARD", v3, [v1, v2]) != []
    assert problems("NONE", v3, [v1, v2]) == []
    dropped_then_back = record(ID, {"name": "a", "type": "int", "default": 0})
    assert problems("BACKWARD", dropped_then_back, [v2, v3]) != []
    assert problems("BACKWARD_TRANSITIVE", record(ID), [v1, v2]) == []
    assert problems("BACKWARD_TRANSITIVE", record(ID), [record({"name": "id",
                                                                "type": "string"}), v1]) != []
    assert problems("BACKWARD", record(ID), [record({"name": "id", "type": "string"}), v1]) == []


def test_unions_enums_and_decimals() -> None:
    nullable = record({"name": "id", "type": ["null", "int"], "default": None})
    assert problems("BACKWARD", nullable, [record(ID)]) == [], "int read into [null, int]"
    assert problems("BACKWARD", record(ID), [nullable]) != [], "null has nowhere to go"
    colours = {"type": "enum", "name": "C", "symbols": ["RED", "GREEN"]}
    more = {**colours, "symbols": ["RED", "GREEN", "BLUE"]}
    assert problems("BACKWARD", record({"name": "c", "type": more}),
                    [record({"name": "c", "type": colours})]) == []
    assert problems("BACKWARD", record({"name": "c", "type": colours}),
                    [record({"name": "c", "type": more})]) != []
    [found] = problems("BACKWARD", record({"name": "t", "type": dec(4)}),
                       [record({"name": "t", "type": dec(2)})])
    assert "decimal(10,2) written" in found


def test_stable_text_and_bad_schemas() -> None:
    assert normalized('{"type": "int"}') == normalized('{ "type":"int" }')
    for bad in ('{"type": "record", "name": "X"}', '{"name": "x"}', "not json",
                '{"type": "record", "name": "X", "fields": [{"name": "a"}]}',
                '{"type": "nosuchtype"}'):
        with pytest.raises(InvalidSchema):
            parse(bad)


@pytest.mark.parametrize(("text", "why"), [
    ("5", "at the top: 5, not a name"),
    ("null", "at the top: null, not a name"),
    ("true", "at the top: true, not a name"),
    ('["null", 5]', "at the top: 5, not a name"),
    ('{"type": "array"}', 'the array at the top has no "items"'),
    ('{"type": "map"}', 'the map at the top has no "values"'),
    ('{"type": "record", "name": "X", "fields": [{"name": "a", "type": {"type": "array"}}]}',
     'the array at a has no "items"'),
    ('{"type": "record", "name": "X", "fields": [{"name": "m", "type": {"type": "map"}}]}',
     'the map at m has no "values"'),
    ('{"type": "array", "items": ' * 2000 + '"int"' + "}" * 2000, "nested too deeply"),
])
def test_what_is_not_an_avro_schema_is_refused_not_a_crash(text: str, why: str) -> None:
    with pytest.raises(InvalidSchema, match=why):
        parse(text)
