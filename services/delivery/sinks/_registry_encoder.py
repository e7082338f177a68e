"""What the Kafka sink's registry formats (`avro`, `json_schema`, `protobuf`) share: each
event's keyed messages (Debezium's change event: a delete's tombstone, a key change as
delete + tombstone + create, nothing for DDL), one table shape's schemas registered under
`{topic}-value` and `{topic}-key`, and Confluent's framing. A format supplies its `Table`:
the schema texts of a table shape and how a value or key datum becomes bytes."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Protocol

from tailrace.config import KafkaSinkSpec
from tailrace.envelopes import (
    Record,
    as_op,
    changes_key,
    debezium_op,
    debezium_source,
    debezium_transaction,
)
from tailrace.errors import FatalError
from tailrace.events import ChangeEvent, Column, Op, key_values
from tailrace_services.delivery.sinks._registry import (
    RegistryRefused,
    SchemaRegistryClient,
    header,
)


class Table(Protocol):
    """One table shape in one format."""

    value_schema: str
    key_schema: str
    history: Any  # what the next shape of the table keeps (see `RegistryEncoder.history`)

    def row(self, columns: Sequence[Column]) -> Any:
        """An image's datum (None when the image is empty)."""

    def key_datum(self, columns: Sequence[Column]) -> Any:
        """The key columns' datum."""

    def encode_value(self, datum: dict[str, Any]) -> bytes:
        """The envelope datum as the payload after the wire format's header."""

    def encode_key(self, datum: Any) -> bytes:
        """A key datum (or a keyless table's name) likewise."""


class TableType(Protocol):
    """A format's `Table` class: the schemas of a table shape from its event, its columns
    (name, source type) in order, and the format's history (see `RegistryEncoder.history`)."""

    def __call__(self, event: ChangeEvent, columns: list[tuple[str, str]], history: Any, /
                 ) -> Table: ...


class RegistryEncoder:
    """`Encoder`'s part for a registry format: each event's keyed messages, in order."""

    content_type: ClassVar[str]
    schema_type: ClassVar[str]  # the registry's schemaType: AVRO, JSON, PROTOBUF
    table: ClassVar[TableType]
    keeps_history: ClassVar[bool] = False  # whether `history_of` reads anything
    history_format: ClassVar[str | None] = None  # Confluent's `format` to read history in

    def __init__(self, spec: KafkaSinkSpec, registry: SchemaRegistryClient,
                 topic_of: Callable[[ChangeEvent], str], *, halt: bool = False) -> None:
        """`halt`: a schema the registry refuses stops the pipeline (the source's
        `on_schema_drift: halt`) instead of failing its event alone (to the DLQ)."""
        self._sink_id = spec.id
        self._halt = halt
        self._tombstones = spec.tombstones_on_delete
        self._registry = registry
        self._topic_of = topic_of
        self._tables: dict[tuple[str, ...], Table] = {}  # by table, column shape, history
        self._latest: dict[tuple[str, ...], tuple[tuple[str, str], ...]] = {}
        self._tx: str | None = None
        self._per_table: dict[str, int] = {}
        self._histories: dict[str, Any] = {}  # by topic

    def history(self, topic: str) -> Any:
        """What the last schema registered under `{topic}-value` says the next one keeps
        (`history_of` it), or what this encoder registered there last."""
        if topic not in self._histories:
            latest = self._registry.latest(f"{topic}-value", self.history_format)
            same = latest is not None and latest.get("schemaType", "AVRO") == self.schema_type
            self._histories[topic] = self.history_of(str(latest["schema"])) \
                if latest is not None and same else None
        return self._histories[topic]

    def history_of(self, schema: str) -> Any:
        """The format's history in a registered schema (None: it keeps none)."""
        return None

    def new_batch(self) -> None:
        """`data_collection_order` counts again from here."""
        self._tx, self._per_table, self._latest = None, {}, {}

    def records(self, event: ChangeEvent) -> list[Record]:
        """[] for a DDL event (the registry's new version records the change)."""
        if event.HasField("outbox"):  # an outbox processor's message, as the row says it
            box = event.outbox
            return [Record(box.key, box.payload,
                           headers=tuple((h.name, h.value) for h in box.headers))]
        if event.op == Op.OP_DDL:
            return []
        order = self._collection_order(event)
        topic = self._topic_of(event)
        table = self._table(event, topic)
        if changes_key(event):
            old, new = as_op(event, Op.OP_DELETE), as_op(event, Op.OP_INSERT)
            records = [Record(self._key(old, table, topic), self._value(old, table, topic, order),
                              "delete")]
            if self._tombstones:
                records.append(Record(records[0].key, None, "tombstone"))
            records.append(Record(self._key(new, table, topic),
                                  self._value(new, table, topic, order)))
            return records
        key = self._key(event, table, topic)
        records = [Record(key, self._value(event, table, topic, order))]
        if self._tombstones and event.op == Op.OP_DELETE and event.key_columns:
            records.append(Record(key, None, "tombstone"))
        return records

    def _table(self, event: ChangeEvent, topic: str) -> Table:
        name = (event.source_id, event.database, event.schema, event.table)
        shape = tuple(_shape(event))
        latest = self._latest.get(name)
        if latest is not None and set(shape) <= set(latest):
            shape = latest  # a delete's key-only image, say: the table's full shape
        history = self.history(topic) if self.keeps_history else None
        key = (*name, *map(str, shape), str(history))  # a table's schema depends on both
        table = self._tables.get(key)
        if table is None:
            table = self._tables[key] = self.table(event, list(shape), history)
        self._latest[name] = shape
        return table

    def _value(self, event: ChangeEvent, table: Table, topic: str, order: int) -> bytes:
        schema_id = self._id(f"{topic}-value", table.value_schema)
        self._histories[topic] = table.history
        ts_us = event.ts_captured_micros or event.ts_source_micros
        datum = {
            "before": table.row(event.before.columns), "after": table.row(event.after.columns),
            "source": debezium_source(event), "op": debezium_op(event),
            "ts_ms": ts_us // 1000, "ts_us": ts_us, "ts_ns": ts_us * 1000,
            "transaction": debezium_transaction(event, order),
        }
        return header(schema_id) + table.encode_value(datum)

    def _key(self, event: ChangeEvent, table: Table, topic: str) -> bytes:
        schema_id = self._id(f"{topic}-key", table.key_schema)
        if not event.key_columns:  # keyless: the table's name
            name = ".".join(p for p in (event.database, event.schema, event.table) if p)
            return header(schema_id) + table.encode_key(name)
        return header(schema_id) + table.encode_key(table.key_datum(key_values(event)))

    def _id(self, subject: str, schema: str) -> int:
        try:
            return self._registry.register(subject, schema, self.schema_type)
        except RegistryRefused as e:
            if self._halt:
                raise FatalError(
                    f"kafka sink {self._sink_id}: {e}; spec.source.on_schema_drift is halt, so "
                    "the pipeline stops: make the change compatible (or change the subject's "
                    "compatibility: PUT /config/{subject}), or set on_schema_drift: adapt to "
                    "send such events to the dead-letter queue") from None
            raise ValueError(str(e)) from None  # this event fails alone, with the reason

    def _collection_order(self, event: ChangeEvent) -> int:
        if event.tx_id != self._tx or event.tx_index == 0:
            self._tx, self._per_table = event.tx_id, {}
        table = ".".join((event.database, event.schema, event.table))
        self._per_table[table] = self._per_table.get(table, 0) + 1
        return self._per_table[table]


def _shape(event: ChangeEvent) -> list[tuple[str, str]]:
    seen: dict[str, str] = {}
    for column in [*event.after.columns, *event.before.columns]:
        seen.setdefault(column.name, column.type)
    return list(seen.items())
