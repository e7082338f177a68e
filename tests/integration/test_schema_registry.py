"""The control service's Confluent-compatible schema registry, driven by Confluent's own
client (`confluent_kafka.schema_registry`) against a real `tailrace-control` process."""

from __future__ import annotations

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
    registry.register_schema("compat-value", avro(retyped))
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
        "proto-value", Schema('syntax = "proto3"; message M {}', "PROTOBUF"))) == 42201
    assert "bad-value" not in registry.get_subjects()


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
