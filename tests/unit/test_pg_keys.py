"""Event keys under each replica identity, and the TOAST fill under FULL (pure logic)."""

from __future__ import annotations

import json

import pytest

from tailrace.envelopes import Encoder, debezium_key
from tailrace.events import UNCHANGED_TOAST, ChangeEvent, Op, bus_key, key_bytes
from tailrace.events._wire import value_bytes
from tailrace_services.capture_postgres.events import (
    EventFactory,
    encoded_row,
    fill_unchanged_toast,
)
from tailrace_services.capture_postgres.position import Timelines
from tailrace_services.capture_postgres.reader import Delete, Insert, Relation, RelationColumn, Update
from tailrace_services.capture_postgres.schema import choose_key
from tailrace_services.delivery.sinks.postgres import keyless_changes

INT4, TEXT = 23, 25
BIG = "x" * 9000


def relation(identity: str, flags: tuple[bool, ...] = (True, False, False),
             names: tuple[str, ...] = ("id", "note", "big")) -> Relation:
    """`t (id int, note text, big text)` as a Relation message under `identity`."""
    types = (INT4, TEXT, TEXT, INT4)
    return Relation(7, "public", "t", identity, tuple(
        RelationColumn(n, types[i], -1, flag) for i, (n, flag) in enumerate(zip(names, flags,
                                                                                strict=True))))


def encoded(values: list[object] | None) -> list[bytes] | None:
    """Python values as the decoder gives a tuple: serialized `Value`s."""
    return None if values is None else [value_bytes(v) for v in values]


def insert_msg(rel: Relation, new: list[object]) -> Insert:
    return Insert(rel, encoded(new))  # type: ignore[arg-type]


def update_msg(rel: Relation, old: list[object] | None, key_only: bool, new: list[object]
           ) -> Update:
    return Update(rel, encoded(old), key_only, encoded(new))  # type: ignore[arg-type]


def delete_msg(rel: Relation, old: list[object], key_only: bool) -> Delete:
    return Delete(rel, encoded(old), key_only)  # type: ignore[arg-type]


ALL = (True, True, True)
NONE = (False, False, False)


@pytest.mark.parametrize(("identity", "flags", "primary_key", "expected"), [
    ("d", (True, False, False), None, ["id"]),          # DEFAULT: pgoutput's flags = the PK
    ("d", NONE, None, []),                              # DEFAULT without a PK: no key
    ("i", (False, True, False), ["id"], ["note"]),      # USING INDEX: the index, not the PK
    ("f", ALL, ["id"], ["id"]),                         # FULL: every column flagged, PK wins
    ("f", ALL, [], []),                                 # FULL without a PK: no key
    ("f", ALL, None, []),                               # FULL, table gone from the catalog
    ("f", ALL, ["gone"], []),                           # PK names a column the stream lacks
    ("n", NONE, ["id"], ["id"]),                        # NOTHING: the catalog's PK
    ("n", NONE, [], []),
])
def test_key_under_each_replica_identity(identity: str, flags: tuple[bool, ...],
                                         primary_key: list[str] | None,
                                         expected: list[str]) -> None:
    assert choose_key(relation(identity, flags), primary_key) == expected


def test_key_columns_follow_the_table_order_whatever_the_identity() -> None:
    rel = relation("f", (True, True, True, True), ("a", "b", "c", "d"))
    assert choose_key(rel, ["c", "a"]) == ["a", "c"]  # as DEFAULT's flags would list them
    assert choose_key(relation("d", (True, False, True, False), ("a", "b", "c", "d")),
                      None) == ["a", "c"]


def test_unchanged_toast_is_filled_from_the_old_row_where_it_was_sent() -> None:
    new = encoded([1, "y", UNCHANGED_TOAST, UNCHANGED_TOAST])
    old = encoded([1, "x", BIG, UNCHANGED_TOAST])
    assert new is not None and old is not None
    assert fill_unchanged_toast(new, old) == encoded([1, "y", BIG, UNCHANGED_TOAST])
    plain = encoded([1, "y", None, "z"])
    assert plain is not None
    assert fill_unchanged_toast(plain, old) is plain  # nothing to fill: no copy


def factory(primary_key: list[str]) -> EventFactory:
    return EventFactory("src", "acme", "shop", Timelines(1),
                        lambda rel: choose_key(rel, primary_key))


def values(row: object) -> dict[str, object]:
    out: dict[str, object] = {}
    for c in row.columns:  # type: ignore[attr-defined]
        kind = c.value.WhichOneof("kind")
        out[c.name] = {"unchanged_toast": "TOAST", "null": None}.get(
            kind, getattr(c.value, kind))
    return out


def test_full_update_keeps_the_whole_before_image_keys_by_the_pk_and_fills_toast() -> None:
    rel = relation("f", ALL)
    event = factory(["id"]).from_change(
        update_msg(rel, [5, "old", BIG], False, [5, "new", UNCHANGED_TOAST]), 100, ("fp", 1)).event()
    assert list(event.key_columns) == ["id"]
    assert values(event.before) == {"id": 5, "note": "old", "big": BIG}
    assert values(event.after) == {"id": 5, "note": "new", "big": BIG}
    delete = factory(["id"]).from_change(delete_msg(rel, [5, None, BIG], False), 101, ("fp", 1)).event()
    assert list(delete.key_columns) == ["id"]
    assert values(delete.before) == {"id": 5, "note": None, "big": BIG}


def test_default_update_without_old_row_keeps_the_toast_marker() -> None:
    rel = relation("d")
    event = factory([]).from_change(update_msg(rel, None, False, [5, "new", UNCHANGED_TOAST]), 100,
                                    ("fp", 1)).event()
    assert values(event.before) == {"id": 5}
    assert values(event.after) == {"id": 5, "note": "new", "big": "TOAST"}


def stamped(event: ChangeEvent) -> ChangeEvent:
    return factory(["id"]).stamp(event, xid=9, tx_seq=1, end_lsn=200, commit_ts_us=10**15,
                                 index=0, size=1)


def test_every_version_of_a_full_row_has_one_key() -> None:
    rel, f = relation("f", ALL), factory(["id"])
    versions = [f.from_change(insert_msg(rel, [5, "v0", BIG]), 1, ("fp", 1)).event()]
    versions += [f.from_change(update_msg(rel, [5, f"v{i}", BIG], False, [5, f"v{i + 1}", BIG]),
                               2 + i, ("fp", 1)).event() for i in range(3)]
    versions.append(f.from_change(delete_msg(rel, [5, "v3", BIG], False), 9, ("fp", 1)).event())
    assert {key_bytes(e) for e in versions} == {b'{"pk":{"id":5},"table":"shop.public.t"}'}
    assert len({bus_key(e) for e in versions}) == 1
    assert len({Encoder("debezium").key(stamped(e)) for e in versions}) == 1


def test_debezium_key_and_value_schema_under_full() -> None:
    rel = relation("f", ALL)
    event = stamped(factory(["id"]).from_change(
        update_msg(rel, [5, None, BIG], False, [5, None, UNCHANGED_TOAST]), 100, ("fp", 1)).event())
    key = debezium_key(event)
    assert key == {"schema": {"type": "struct", "optional": False,
                              "name": "src.shop.public.t.Key",
                              "fields": [{"type": "int32", "optional": False, "field": "id"}]},
                   "payload": {"id": 5}}
    assert json.loads(Encoder("debezium").key(event)) == key
    assert Encoder("native").key(event) == key_bytes(event)
    value = json.loads(Encoder("debezium").encode(event))
    fields = {f["field"]: f for f in value["schema"]["fields"][0]["fields"]}
    assert not fields["id"]["optional"] and fields["note"]["optional"]  # NULL note is valid
    assert value["payload"]["after"] == {"id": 5, "note": None, "big": BIG}


def test_a_table_without_a_key_is_keyed_by_its_name_and_refused_by_the_postgres_sink() -> None:
    rel = relation("f", ALL)
    f = factory([])
    insert = f.from_change(insert_msg(rel, [5, "a", "b"]), 1, ("fp", 1)).event()
    update = f.from_change(update_msg(rel, [5, "a", "b"], False, [5, "c", "b"]), 2, ("fp", 1)).event()
    delete = f.from_change(delete_msg(rel, [6, "a", "b"], False), 3, ("fp", 1)).event()
    assert not insert.key_columns and not update.key_columns
    assert values(update.before) == {"id": 5, "note": "a", "big": "b"}  # still whole
    assert key_bytes(insert) == key_bytes(delete) == b'{"pk":{},"table":"shop.public.t"}'
    assert debezium_key(stamped(insert))["payload"] == {}
    failures = keyless_changes([insert, update, delete])
    assert [i for i, _ in failures] == [1, 2]
    assert failures[0][1].startswith("update of a row of shop.public.t without key columns")
    assert "add a primary key to public.t, or ALTER TABLE public.t REPLICA IDENTITY USING " \
           "INDEX" in failures[0][1]
    assert insert.op == Op.OP_INSERT


def _field_by_field(f: EventFactory, msg: Insert | Update | Delete, lsn: int) -> ChangeEvent:
    """What `from_change` built before it parsed a template: `change`, then each row."""
    rel = msg.relation
    keys = choose_key(rel, ["id"])
    op = {Insert: Op.OP_INSERT, Update: Op.OP_UPDATE, Delete: Op.OP_DELETE}[type(msg)]
    event = f.change(rel, op, None, None, lsn, ("fp", 1), keys)
    old = getattr(msg, "old", None)
    if isinstance(msg, Update | Delete):
        if old is not None:
            event.before.MergeFromString(
                encoded_row(rel, old, set(keys) if msg.old_is_key_only else None))
        elif isinstance(msg, Update):
            event.before.MergeFromString(encoded_row(rel, msg.new, set(keys)))
    if isinstance(msg, Insert | Update):
        new = msg.new
        if isinstance(msg, Update) and old is not None and not msg.old_is_key_only:
            new = fill_unchanged_toast(new, old)
        event.after.MergeFromString(encoded_row(rel, new))
    return event


@pytest.mark.parametrize("identity", ["d", "f"])
def test_an_event_parsed_from_its_template_equals_one_built_field_by_field(identity: str
                                                                          ) -> None:
    rel = relation(identity, ALL if identity == "f" else (True, False, False))
    f = factory(["id"])
    for lsn in (0, 100, 2**40):
        for msg in (insert_msg(rel, [5, "a", BIG]), insert_msg(rel, [5, None, ""]),
                    update_msg(rel, None, False, [5, "n", UNCHANGED_TOAST]),
                    update_msg(rel, [4, None, None], True, [5, "n", "b"]),
                    update_msg(rel, [5, "o", BIG], False, [5, "n", UNCHANGED_TOAST]),
                    delete_msg(rel, [5, None, None], True), delete_msg(rel, [5, "o", BIG], False)):
            built = f.from_change(msg, lsn, ("fp", 1)).event()
            expected = _field_by_field(f, msg, lsn)
            assert built == expected, msg
            assert built.SerializeToString() == expected.SerializeToString(), msg
            assert [built.HasField(n) for n in ("before", "after", "position")] == \
                [expected.HasField(n) for n in ("before", "after", "position")], msg
