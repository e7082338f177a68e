"""Table shapes: fingerprints, registration, drift, and which columns are the key.

Shapes come from Relation messages (and from the catalog at failover, for the
drift check `tailrace_services.capture.drift`); each is fingerprinted, registered
with the control service, and a structure never registered for a table with
registered versions is drift (`on_schema_drift: adapt|halt`).

The event key of each table is its primary key, or its replica-identity index.
pgoutput flags the columns of the table's replica identity in every Relation message.
Those flags are the key only for two identities:

| replica identity | `key_columns` of its events | before-image of an update or delete |
|---|---|---|
| DEFAULT | the primary key (pgoutput's flags) | the key columns |
| USING INDEX | the index's columns (pgoutput's flags) | those columns |
| FULL | the primary key, read from `pg_index` | the whole old row |
| NOTHING | the primary key, read from `pg_index` | none (updates and deletes are refused) |

Under DEFAULT and USING INDEX the server reads its catalog as of the change, so the
flags are the key the change was written under. Under FULL it flags every column and
under NOTHING none, so the key is read from the live catalog when the Relation
message arrives (once per table and session, and again after a DDL). Key columns are
listed in table column order whatever the identity, so switching a table between
DEFAULT and FULL does not change its key.

A table without a primary key (and not USING INDEX) has no key: its events carry an
empty `key_columns`. The capture service says so at start for every selected table
(`keyless_tables`) and again when such a table first appears in the stream.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg

from tailrace.control_client import ControlClient
from tailrace.errors import ConfigError, FatalError
from tailrace.logs import get_logger
from tailrace.proto.event_pb2 import Position
from tailrace_services.capture_postgres.connection import connect
from tailrace_services.capture_postgres.reader import Relation

__all__ = ["KeyCatalog", "KeylessTable", "SchemaTracker", "Shape", "catalog_fingerprints",
           "catalog_shapes", "check_key_columns", "choose_key", "configured_key", "fingerprint",
           "keyless_fix", "keyless_tables", "schema_json", "shape_of"]

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


def catalog_fingerprints(conn: psycopg.Connection[Any], database: str,
                         tables: list[tuple[str, str]]) -> dict[tuple[str, str], str]:
    """(database, `schema.table`) -> fingerprint, as the registry names them, from the catalog."""
    return {(database, f"{schema}.{table}"): fingerprint(schema, table, shape)
            for (schema, table), shape in catalog_shapes(conn, tables).items()}


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
    # the fingerprint of a table's structure as committed in the catalog (`KeyCatalog`)
    committed: Callable[[Relation], str | None] | None = None
    _known: dict[int, tuple[str, int]] = field(default_factory=dict)  # relation oid -> (fp, seq)
    _sequences: dict[str, int] = field(default_factory=dict)  # fp -> seq, of `registered`
    # fps `registered` found nowhere, until `on_relation` registers them (the server announces
    # a structure again at each block after a DDL: one registry call, not one a block)
    _unregistered: set[str] = field(default_factory=set)

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
        self._unregistered.discard(fp)
        if versions and record.created:
            log.info("schema version registered", table=table, version=record.version,
                     sequence=record.sequence)
        return self._known[relation.oid]

    def registered(self, relation: Relation) -> tuple[str, int | None]:
        """(fingerprint, registry sequence) of a structure a transaction streamed while open
        announces. One the registry holds has its sequence, and so has the committed one of
        a table the registry holds nothing of yet (registered now, as `on_relation` would: a
        first structure is no drift). Any other (a DDL in that transaction, which may still
        roll back; or one the catalog has, read now, not as of the change) has None, and is
        registered, drift checked, at the transaction's commit (`on_relation`)."""
        fp = fingerprint(relation.namespace, relation.name, shape_of(relation))
        known = self._known.get(relation.oid)
        if known is not None and known[0] == fp:
            return known
        if fp in self._sequences:
            return fp, self._sequences[fp]
        if fp in self._unregistered:
            return fp, None
        table = f"{relation.namespace}.{relation.name}"
        versions = self.control.list_schemas(self.tenant, self.database, table)
        for version in versions:
            if version.fingerprint == fp:
                self._sequences[fp] = version.sequence
                return fp, version.sequence
        if not versions and self.committed is not None and self.committed(relation) == fp:
            return self.on_relation(relation, None)
        self._unregistered.add(fp)
        return fp, None

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


# -- keys --------------------------------------------------------------------------------

IDENTITY_NAMES = {"d": "DEFAULT", "n": "NOTHING", "f": "FULL", "i": "USING INDEX"}
_FROM_FLAGS = ("d", "i")  # identities whose pgoutput flags are the key
NO_KEY = ("table has no key: its events carry no key columns, so kafka keeps all of them in "
          "one partition and the postgres sink cannot apply their updates and deletes")

_PRIMARY_KEY = """
SELECT c.relname, (SELECT array_agg(a.attname::text ORDER BY a.attnum)
                     FROM pg_index i
                     JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)
                    WHERE i.indrelid = c.oid AND i.indisprimary)
  FROM pg_class c WHERE c.oid = %s"""

_KEYLESS = """
SELECT n.nspname, c.relname, c.relreplident::text
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
  JOIN unnest(%s::text[], %s::text[]) AS t(s, r) ON t.s = n.nspname AND t.r = c.relname
 WHERE NOT EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = c.oid AND
                   CASE WHEN c.relreplident = 'i' THEN i.indisreplident ELSE i.indisprimary END)
 ORDER BY 1, 2"""


def keyless_fix(schema: str, table: str) -> str:
    """What to do about a table without a key (the end of every message that names one)."""
    return (f"add a primary key to {schema}.{table}, or ALTER TABLE {schema}.{table} REPLICA "
            "IDENTITY USING INDEX <a unique index on NOT NULL columns>")


def choose_key(relation: Relation, primary_key: Sequence[str] | None) -> list[str]:
    """The key columns of `relation`'s events, in column order.

    `primary_key`: the table's primary-key columns from the catalog (None when the table
    is not in the catalog any more); only read under FULL and NOTHING. A primary key
    naming a column the Relation message lacks (the catalog moved on since the change
    was written) gives no key rather than a wrong one.
    """
    if relation.replica_identity in _FROM_FLAGS:
        return [c.name for c in relation.columns if c.is_key]
    if not primary_key:
        return []
    wanted = set(primary_key)
    keys = [c.name for c in relation.columns if c.name in wanted]
    return keys if len(keys) == len(wanted) else []


def configured_key(relation: Relation, configured: Mapping[str, Sequence[str]]) -> list[str]:
    """The key `snapshot.key_columns` gives a table without one of its own, when its events
    carry those columns (REPLICA IDENTITY FULL; `check_key_columns`); [] otherwise."""
    columns = configured.get(f"{relation.namespace}.{relation.name}")
    if not columns or relation.replica_identity != "f":
        return []
    present = {c.name for c in relation.columns}
    return list(columns) if set(columns) <= present else []


def check_key_columns(conn: psycopg.Connection[Any], tables: Sequence[tuple[str, str]],
                      configured: Mapping[str, Sequence[str]]) -> None:
    """Each table `snapshot.key_columns` names is selected, has no key of its own, has
    the columns, and is REPLICA IDENTITY FULL (so its updates and deletes carry them)."""
    selected = {f"{s}.{t}" for s, t in tables}
    keyless = {f"{t.schema}.{t.table}": t.replica_identity for t in keyless_tables(conn, tables)}
    for table, columns in configured.items():
        where = f"spec.source.snapshot.key_columns: {table}"
        if table not in selected:
            raise ConfigError(f"{where} is not a selected table (it does not exist, or "
                              "spec.source.tables does not select it)")
        if table not in keyless:
            raise ConfigError(f"{where} has a key of its own (its primary key or replica "
                              "identity index): remove it from key_columns")
        schema, name = table.split(".")
        found = {r[0]: r[1] for r in conn.execute(
            "SELECT a.attname::text, a.attnotnull FROM pg_attribute a JOIN pg_class c ON "
            "c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace WHERE "
            "n.nspname = %s AND c.relname = %s AND a.attnum > 0 AND NOT a.attisdropped",
            (schema, name))}
        missing = [c for c in columns if c not in found]
        if missing:
            raise ConfigError(f"{where} has no column {', '.join(missing)}")
        nullable = [c for c in columns if not found[c]]
        if nullable:  # a NULL in a key compares to nothing: chunks would skip rows
            raise ConfigError(f"{where}: {', '.join(nullable)} may be NULL; key columns must be "
                              f"NOT NULL (ALTER TABLE {table} ALTER COLUMN ... SET NOT NULL)")
        if keyless[table] != "FULL":
            raise ConfigError(
                f"{where} is REPLICA IDENTITY {keyless[table]}: its updates and deletes would "
                f"not carry {', '.join(columns)}; run ALTER TABLE {table} REPLICA IDENTITY FULL")


class KeyCatalog:
    """`key_of(relation)` for the stream; the catalog connection opens on first need.
    `configured`: `snapshot.key_columns` (`configured_key`)."""

    def __init__(self, dsn: str, configured: Mapping[str, Sequence[str]] | None = None
                 ) -> None:
        self._dsn = dsn
        self._configured = configured or {}
        self._conn: psycopg.Connection[Any] | None = None
        self._warned: set[int] = set()

    def key_of(self, relation: Relation) -> list[str]:
        primary_key = None
        if relation.replica_identity not in _FROM_FLAGS:
            primary_key = self.primary_key(relation.oid)
        keys = choose_key(relation, primary_key) or configured_key(relation, self._configured)
        if not keys and relation.oid not in self._warned:
            self._warned.add(relation.oid)
            self._warn(relation, primary_key)
        return keys

    def committed_fingerprint(self, relation: Relation) -> str | None:
        """The fingerprint of the table's structure as committed (None: not in the catalog)."""
        table = (relation.namespace, relation.name)
        shape = catalog_shapes(self._catalog(), [table]).get(table)
        return fingerprint(relation.namespace, relation.name, shape) if shape else None

    def _catalog(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed:
            self._conn = connect(self._dsn)
        return self._conn

    def primary_key(self, oid: int) -> list[str] | None:
        """The primary-key columns of the table `oid` ([] without one, None if it is gone)."""
        row = self._catalog().execute(_PRIMARY_KEY, (oid,)).fetchone()
        if row is None:
            return None
        return list(row[1] or [])

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    @staticmethod
    def _warn(relation: Relation, primary_key: list[str] | None) -> None:
        table = f"{relation.namespace}.{relation.name}"
        identity = IDENTITY_NAMES.get(relation.replica_identity, relation.replica_identity)
        if primary_key is None:
            why = "it is no longer in the catalog"
        elif primary_key:
            why = (f"its primary key ({', '.join(primary_key)}) names columns the stream "
                   "does not have yet")
        else:
            why = f"it has no primary key (replica identity {identity})"
        log.warning(NO_KEY, table=table, replica_identity=identity, reason=why,
                    fix=keyless_fix(relation.namespace, relation.name))


@dataclass(frozen=True)
class KeylessTable:
    schema: str
    table: str
    replica_identity: str  # DEFAULT, FULL, ...


def keyless_tables(conn: psycopg.Connection[Any], tables: Sequence[tuple[str, str]]
                   ) -> list[KeylessTable]:
    """The selected tables whose events would carry no key (no primary key, or an
    identity index that no longer exists)."""
    if not tables:
        return []
    rows = conn.execute(_KEYLESS, ([s for s, _ in tables], [t for _, t in tables])).fetchall()
    return [KeylessTable(r[0], r[1], IDENTITY_NAMES.get(r[2], r[2])) for r in rows]
