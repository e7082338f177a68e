"""Table schemas: fingerprints from Relation messages (and from the catalog at failover),
registration with the control service, and drift handling (`on_schema_drift: adapt|halt`)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

import psycopg

from tailrace.control_client import ControlClient
from tailrace.errors import FatalError
from tailrace.logs import get_logger
from tailrace.proto.event_pb2 import Position
from tailrace_services.capture_postgres.decoder import Relation

log = get_logger(__name__)

Shape = list[tuple[str, int, int, bool]]  # (name, type oid, type modifier, is key)


def shape_of(relation: Relation) -> Shape:
    return [(c.name, c.type_oid, c.type_modifier, c.is_key) for c in relation.columns]


def fingerprint(schema: str, table: str, shape: Shape) -> str:
    """SHA-256 of the table's structure: names, types, modifiers, key flags."""
    doc = {"schema": schema, "table": table, "columns": [list(c) for c in shape]}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


def schema_json(relation: Relation) -> str:
    return json.dumps({
        "schema": relation.namespace, "table": relation.name,
        "replica_identity": relation.replica_identity,
        "columns": [{"name": c.name, "type": relation.type_name(i), "type_oid": c.type_oid,
                     "key": c.is_key} for i, c in enumerate(relation.columns)],
    })


def catalog_shapes(conn: psycopg.Connection[Any], tables: list[tuple[str, str]]
                   ) -> dict[tuple[str, str], Shape]:
    """Shapes as pgoutput would describe them, read from the catalog (for failover checks)."""
    out: dict[tuple[str, str], Shape] = {}
    for schema, table in tables:
        rows = conn.execute("""
            SELECT a.attname, a.atttypid::int, a.atttypmod,
                   coalesce(a.attnum = ANY(i.indkey::int2[]), false)
              FROM pg_attribute a
              JOIN pg_class c ON c.oid = a.attrelid
              JOIN pg_namespace n ON n.oid = c.relnamespace
              LEFT JOIN pg_index i ON i.indrelid = c.oid AND (
                   (c.relreplident = 'd' AND i.indisprimary) OR
                   (c.relreplident = 'i' AND i.indisreplident))
             WHERE n.nspname = %s AND c.relname = %s AND a.attnum > 0 AND NOT a.attisdropped
               AND a.attgenerated = ''
             ORDER BY a.attnum""", (schema, table)).fetchall()
        full = conn.execute("SELECT c.relreplident = 'f' FROM pg_class c JOIN pg_namespace n "
                            "ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relname = %s",
                            (schema, table)).fetchone()
        out[(schema, table)] = [(r[0], r[1], r[2], bool(r[3]) or bool(full and full[0]))
                                for r in rows]
    return out


@dataclass
class SchemaTracker:
    """Registers each table structure the stream announces; tells drift from a replay.

    `on_relation` runs once per Relation message (the server sends one before the
    first change of a table in a session, and again after its structure changed);
    `of` gives the (fingerprint, registry sequence) that events of that table carry.

    Drift is a structure never registered for a table that has registered versions.
    A restart that re-reads older changes meets older, registered structures: that
    is not drift. With `halt` the new structure is recorded as a reconcile record
    and not registered, so a restart halts again until the operator switches to
    `adapt` (or re-snapshots).
    """

    control: ControlClient
    source_id: str
    tenant: str
    database: str
    on_drift: str  # adapt | halt
    _known: dict[int, tuple[str, int]] = field(default_factory=dict)  # relation oid -> (fp, seq)

    def on_relation(self, relation: Relation, position: Position | None) -> tuple[str, int]:
        """Register the relation's structure; raises FatalError on drift with `halt`."""
        fp = fingerprint(relation.namespace, relation.name, shape_of(relation))
        known = self._known.get(relation.oid)
        if known is not None and known[0] == fp:
            return known
        table = f"{relation.namespace}.{relation.name}"
        versions = self.control.list_schemas(self.tenant, self.database, table)
        if versions and fp not in {v.fingerprint for v in versions}:
            self._drift(relation, table, versions[-1].version)
        record = self.control.register_schema(self.tenant, self.database, table, fp,
                                              schema_json(relation), position)
        self._known[relation.oid] = (fp, record.sequence)
        if versions and record.created:
            log.info("schema version registered", table=table, version=record.version,
                     sequence=record.sequence)
        return self._known[relation.oid]

    def of(self, relation: Relation) -> tuple[str, int]:
        """(fingerprint, sequence) of a relation `on_relation` has seen."""
        known = self._known.get(relation.oid)
        return known if known is not None else self.on_relation(relation, None)

    def _drift(self, relation: Relation, table: str, latest: int) -> None:
        columns = ", ".join(f"{c.name} {relation.type_name(i)}"
                            for i, c in enumerate(relation.columns))
        drift = [f"{self.database}.{table}: structure changed after schema version {latest}; "
                 f"columns now {columns}"]
        decision = "halt" if self.on_drift == "halt" else "adapt"
        self.control.add_reconcile_record(self.source_id, None, None, drift, decision)
        log.warning("schema drift", table=table, previous_version=latest, decision=decision,
                    columns=columns)
        if decision == "halt":
            raise FatalError(
                f"schema drift on {self.database}.{table} ({drift[0].split(': ', 1)[1]}) and "
                "spec.source.on_schema_drift is halt: review the change, then set "
                "on_schema_drift: adapt, or re-snapshot")
