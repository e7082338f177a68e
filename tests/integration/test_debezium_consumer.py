"""A consumer written for Debezium's documented message format reads the Kafka sink's
topics unchanged and rebuilds every table exactly, deletes included.

The consumer knows nothing of Tailrace. It follows Debezium's documentation of the
PostgreSQL connector's change events and of its JSON converter:
- one topic per table; the key is a struct of the primary-key columns, with
  `schemas.enable` `{"schema": {"type": "struct", "name": "….Key", "fields": […]},
  "payload": {"id": 5}}`, without it the bare `{"id": 5}`;
- the value is `{"schema", "payload"}` (or the bare payload) with `before`, `after`,
  `source`, `op` (c create, u update, d delete, r snapshot read, t truncate), `ts_ms`;
- a delete is followed by a tombstone: the same key, a null value (`tombstones.on.delete`);
- an update that changes the key is a delete of the old key (and its tombstone) and a
  create of the new one.
A compacted topic keeps the last message of each key, so a consumer of one learns of a
delete from the tombstone alone: `compacted()` reduces a topic that way, and the
consumer rebuilds the same tables from it with deletes applied by tombstones only.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from decimal import Decimal
from typing import Any

import pytest

from tailrace.events import (
    ChangeEvent,
    Column,
    Op,
    Position,
    PostgresPosition,
    Row,
    event_id,
    idempotency_key,
    python_of,
    value_of,
)
from tailrace_services.delivery.sinks.base import BatchCommit
from tailrace_services.delivery.sinks.kafka import KafkaSink, TransactionalKafkaSink
from tests.fix_sinks import DATABASE, SOURCE, TENANT, batches_of, read_kafka, sink_spec, source_events

pytestmark = pytest.mark.integration

TABLES = ("items", "orders")
EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
Rows = dict[str, dict[tuple[Any, ...], dict[str, Any]]]  # table -> key -> row

# What an application reading schema-less messages knows of its tables' columns; with
# schemas, the consumer reads the same from each message's schema instead.
KNOWN_COLUMNS: dict[str, Callable[[Any], Any]] = {
    "changed_at": lambda v: dt.datetime.fromisoformat(v.replace("Z", "+00:00")),
}


# -- the consumer --------------------------------------------------------------------------

class DebeziumReplica:
    """Rebuilds tables from Debezium change events: key -> row per table (topic)."""

    def __init__(self, schemas: bool, deletes_by: str = "op") -> None:
        self.schemas = schemas
        self.deletes_by = deletes_by  # "op": on op d; "tombstone": on the tombstone alone
        self.rows: Rows = defaultdict(dict)

    def apply(self, topic: str, key: bytes, value: bytes | None) -> str:
        """One message; returns what it was: c, u, d, r, t or tombstone."""
        table = topic.rsplit(".", 1)[1]
        row_key = self._key(json.loads(key))
        if value is None:
            self.rows[table].pop(row_key, None)
            return "tombstone"
        schema, payload = self._unwrap(json.loads(value))
        op = payload["op"]
        assert op in ("c", "u", "d", "r", "t"), op
        assert isinstance(payload["ts_ms"], int) and payload["source"]["table"] == table
        if op == "t":
            self.rows[table].clear()
        elif op == "d":
            assert payload["after"] is None
            assert _key_of(self._row(schema, "before", payload["before"]), row_key) == row_key
            if self.deletes_by == "op":
                self.rows[table].pop(row_key, None)
        else:
            row = self._row(schema, "after", payload["after"])
            assert _key_of(row, row_key) == row_key, "the key is the row's primary key"
            self.rows[table][row_key] = row
        return op

    def _unwrap(self, doc: dict[str, Any]) -> tuple[dict[str, Any] | None, dict[str, Any]]:
        if not self.schemas:
            assert "schema" not in doc, "schemas.enable=false: the bare payload"
            return None, doc
        assert set(doc) == {"schema", "payload"}
        return doc["schema"], doc["payload"]

    def _key(self, doc: dict[str, Any]) -> tuple[Any, ...]:
        """The message key as a tuple of (column, value)."""
        schema, payload = self._unwrap(doc) if self.schemas else (None, doc)
        if schema is not None:
            assert schema["type"] == "struct" and schema["name"].endswith(".Key")
            assert [f["field"] for f in schema["fields"]] == list(payload)
            assert not any(f["optional"] for f in schema["fields"])
        return tuple(sorted(payload.items()))

    def _row(self, schema: dict[str, Any] | None, image: str, row: dict[str, Any]
             ) -> dict[str, Any]:
        if schema is None:
            return {k: KNOWN_COLUMNS[k](v) if k in KNOWN_COLUMNS and v is not None else v
                    for k, v in row.items()}
        envelope = {f["field"]: f for f in schema["fields"]}
        fields = {f["field"]: f for f in envelope[image]["fields"]}
        assert set(row) <= set(fields), f"{image} has fields its schema does not declare"
        return {k: _connect_value(fields[k], v) for k, v in row.items()}


def _key_of(row: dict[str, Any], key: tuple[Any, ...]) -> tuple[Any, ...]:
    """The row's values of the key's columns, shaped as the key."""
    return tuple((name, row[name]) for name, _ in key)


def _connect_value(field: dict[str, Any], value: Any) -> Any:
    """A value by its Kafka Connect schema, as Debezium documents the logical types."""
    if value is None:
        assert field["optional"], f"{field['field']} is null but not optional"
        return None
    name = field.get("name")
    if name == "io.debezium.time.ZonedTimestamp":
        return dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    if name == "io.debezium.time.MicroTimestamp":
        return (EPOCH + dt.timedelta(microseconds=value)).replace(tzinfo=None)
    if field["type"] in ("int16", "int32", "int64"):
        assert isinstance(value, int)
    return value


def compacted(messages: Sequence[Any]) -> list[Any]:
    """What log compaction leaves of a topic: the last message of each key, in offset order
    (a tombstone too, until `delete.retention.ms` has passed)."""
    last = {(m.topic(), m.key()): i for i, m in enumerate(messages)}
    return [m for i, m in enumerate(messages) if last[(m.topic(), m.key())] == i]


def rebuild(messages: Sequence[Any], schemas: bool, deletes_by: str = "op"
            ) -> tuple[Rows, list[str]]:
    replica = DebeziumReplica(schemas, deletes_by)
    kinds = [replica.apply(m.topic(), m.key(), m.value()) for m in messages]
    return {t: rows for t, rows in replica.rows.items() if rows}, kinds


# -- the source and what the tables must hold ---------------------------------------------

def _row(key: int, note: str, version: int) -> Row:
    return Row(columns=[
        Column(name="id", type="integer", value=value_of(key)),
        Column(name="note", type="text", value=value_of(note)),
        Column(name="version", type="bigint", value=value_of(version)),
    ])


def _key_row(key: int) -> Row:
    """A before-image as PostgreSQL sends it under REPLICA IDENTITY DEFAULT: the key."""
    return Row(columns=[Column(name="id", type="integer", value=value_of(key))])


def _transaction(last: ChangeEvent, changes: Sequence[tuple[int, str, Row, Row]]
                 ) -> list[ChangeEvent]:
    """One more source transaction after `last`: (op, table, before, after) per change."""
    lsn = last.position.postgres.commit_lsn + 0x100
    events = []
    for index, (op, table, before, after) in enumerate(changes):
        eid = event_id(SOURCE, f"{lsn:X}", index, last.ts_source_micros // 1000)
        events.append(ChangeEvent(
            id=eid, source_id=SOURCE, tenant=TENANT, database=DATABASE, schema="public",
            table=table, op=op, before=before, after=after, key_columns=["id"],
            tx_id=str(lsn), tx_index=index, tx_size=len(changes), tx_end=index == len(changes) - 1,
            position=Position(tx_seq=lsn, event_index=index, postgres=PostgresPosition(
                commit_lsn=lsn, event_lsn=lsn - 0x80 + index, timeline=1)),
            schema_version=f"fp-{table}", ts_source_micros=last.ts_source_micros + 1000,
            ts_captured_micros=last.ts_source_micros + 1005,
            idempotency_key=idempotency_key(TENANT, DATABASE, f"public.{table}", str(lsn), eid)))
    return events


def expected_tables(events: Sequence[ChangeEvent]) -> Rows:
    """The tables after `events` (decimals as the exact strings Debezium sends)."""
    tables: Rows = defaultdict(dict)

    def row(r: Row) -> dict[str, Any]:
        return {c.name: str(v) if isinstance(v := python_of(c.value), Decimal) else v
                for c in r.columns}

    for event in events:
        rows = tables[event.table]
        if event.op == Op.OP_TRUNCATE:
            rows.clear()
            continue
        if event.before.columns:
            rows.pop((("id", row(event.before)["id"]),), None)
        if event.op != Op.OP_DELETE:
            rows[(("id", row(event.after)["id"]),)] = row(event.after)
    return {t: rows for t, rows in tables.items() if rows}


def change_stream() -> list[ChangeEvent]:
    """Snapshot reads, inserts, updates and deletes over two tables, then a key change, an
    update and a delete of the moved row, and a truncate followed by new rows."""
    events = source_events(900, seed=11, tables=TABLES, keys=120)
    for event in events[:60]:
        if event.op == Op.OP_INSERT:
            event.op = Op.OP_SNAPSHOT_READ
    moved, gone = sorted(k for (_, k), in expected_tables(events)["orders"])[:2]
    events += _transaction(events[-1], [
        (Op.OP_UPDATE, "orders", _key_row(moved), _row(10_000 + moved, "moved", 1)),
        (Op.OP_UPDATE, "orders", _key_row(gone), _row(20_000 + gone, "moved", 1))])
    events += _transaction(events[-1], [
        (Op.OP_UPDATE, "orders", _key_row(10_000 + moved), _row(10_000 + moved, "again", 2)),
        (Op.OP_DELETE, "orders", _key_row(20_000 + gone), Row())])
    events += _transaction(events[-1], [
        (Op.OP_TRUNCATE, "items", Row(), Row()),
        (Op.OP_INSERT, "items", Row(), _row(1, "after the truncate", 1)),
        (Op.OP_INSERT, "items", Row(), _row(2, "after the truncate", 1))])
    return events


def tombstones_follow_their_deletes(messages: Sequence[Any], kinds: Sequence[str]) -> int:
    """Every delete is followed, next in its topic, by a tombstone of its key; returns how many."""
    by_topic: dict[str, list[tuple[Any, str]]] = defaultdict(list)
    for msg, kind in zip(messages, kinds, strict=True):
        by_topic[msg.topic()].append((msg, kind))
    count = 0
    for seq in by_topic.values():
        for (msg, kind), (after, after_kind) in zip(seq, [*seq[1:], (None, "")], strict=True):
            assert (kind == "d") == (after_kind == "tombstone"), (kind, after_kind)
            if kind == "d":
                assert after.key() == msg.key()
                count += 1
    return count


# -- the tests -----------------------------------------------------------------------------

def make_sink(brokers: str, prefix: str, **fields: Any) -> KafkaSink:
    spec = sink_spec(id="dbz", type="kafka", brokers=brokers, topic=prefix + ".{table}",
                     envelope="debezium", **fields)
    kind = TransactionalKafkaSink if fields.get("exactly_once") else KafkaSink
    return kind(spec, timeout_s=10)


def write(sink: KafkaSink, batches: Sequence[list[ChangeEvent]], pipeline: str) -> None:
    for batch in batches:
        sink.write(batch, BatchCommit(pipeline=pipeline, source_id=SOURCE, sink_id=sink.id,
                                      position=batch[-1].position))


def test_a_debezium_consumer_rebuilds_the_tables_from_the_exactly_once_topic(noida_kafka: Any
                                                                            ) -> None:
    events = change_stream()
    expected = expected_tables(events)
    batches = batches_of(events, 120)
    prefix, pipeline = f"d{uuid.uuid4().hex[:8]}", f"p{uuid.uuid4().hex[:6]}"
    sink = make_sink(noida_kafka.bootstrap, prefix, exactly_once=True)
    write(sink, batches[: len(batches) // 2], pipeline)
    sink.close()
    # a restart replays every batch: what the transactions hold, tombstones included, is skipped
    restarted = make_sink(noida_kafka.bootstrap, prefix, exactly_once=True)
    write(restarted, batches, pipeline)
    assert restarted.stored_position(0) == events[-1].position
    restarted.close()

    messages = read_kafka(noida_kafka.bootstrap, [f"{prefix}.{t}" for t in TABLES])
    tables, kinds = rebuild(messages, schemas=True)
    by_tombstones, _ = rebuild(messages, schemas=True, deletes_by="tombstone")
    squeezed = compacted(messages)
    from_compacted, _ = rebuild(squeezed, schemas=True, deletes_by="tombstone")
    tombstones = sum(e.op == Op.OP_DELETE for e in events) + 2  # and one per key change
    marks = [(dict(m.headers())["tailrace-event-id"], dict(m.headers())["tailrace-idempotency-key"])
             for m in messages]
    print(f"\ndebezium, exactly-once with a replay: {len(events)} changes -> {len(messages)} "
          f"messages {dict(Counter(kinds))}; compacted: {len(squeezed)}; rows rebuilt: "
          f"{ {t: len(r) for t, r in sorted(tables.items())} }")
    # each change once; a delete also its tombstone; a key change delete, tombstone, create
    assert len(marks) == len(set(marks)) == len(events) + tombstones + 2
    assert tombstones_follow_their_deletes(messages, kinds) == tombstones
    assert set(kinds) == {"c", "u", "d", "r", "t", "tombstone"}
    assert tables == expected
    assert by_tombstones == expected  # every delete is carried by its tombstone too
    assert from_compacted == expected


@pytest.mark.parametrize("tombstones", [True, False])
def test_schema_less_and_tombstone_free_topics_rebuild_the_same_tables(
        kafka_broker: Any, tombstones: bool) -> None:
    events = change_stream()
    prefix = f"d{uuid.uuid4().hex[:8]}"
    for table in TABLES:  # one partition, as Debezium creates its topics by default
        kafka_broker.create_topic(f"{prefix}.{table}", 1)
    sink = make_sink(kafka_broker.bootstrap, prefix, schemas_enable=False,
                     tombstones_on_delete=tombstones)
    write(sink, batches_of(events, 200), "p")
    sink.close()
    messages = read_kafka(kafka_broker.bootstrap, [f"{prefix}.{t}" for t in TABLES],
                          "read_uncommitted")
    assert all("schema" not in json.loads(m.key()) for m in messages)
    tables, kinds = rebuild(messages, schemas=False)
    print(f"\ndebezium, schemas.enable=false, tombstones {tombstones}, at-least-once: "
          f"{len(messages)} messages {dict(Counter(kinds))}")
    assert tables == expected_tables(events)
    if tombstones:
        assert tombstones_follow_their_deletes(messages, kinds) > 0
    else:
        assert all(m.value() is not None for m in messages)
