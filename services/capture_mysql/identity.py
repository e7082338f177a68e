"""Who the server is, checked on every (re)connect, and the reconcile when it changed.

MySQL has `@@server_uuid`. MariaDB has no server uuid (`@@server_uid` is a hash
of host and port: the *address*, not the server), so its identity combines
what a different server, a rebuilt one or a RESET MASTER would change:
`server_id`, the GTID domains of its binlog state, and the first binlog's
fingerprint (file name + creation time from its Format_description event).
Purging binlogs changes the first binlog too: that, like any change, leads
to a reconcile, whose position check is exactly what a purge calls for.

The identity attributes also carry one `schema:<db>.<table>` digest per
selected table (information_schema: names, types, keys), refreshed on every
connect and after DDL. They are not part of the fingerprint; on a change they
are what the schema drift is measured against.

The control service answers FirstSeen (stored now), Same or Changed
(DESIGN guarantee 9): FirstSeen and Same check the position; Changed
reconciles before any event flows — position reachability with the *old*
checkpoint, schema drift recorded as a ReconcileRecord, `on_schema_drift:
adapt|halt` — and only then stores the new identity. Streaming then resumes
by GTID from that same checkpoint: GTIDs are global, so a promoted replica
continues where the old primary stopped; file/offset of the old server mean
nothing here and are taken from the new server's stream.

A check that itself fails logs a warning and capture continues.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

import pymysql

from tailrace.control_client import ControlClient
from tailrace.control_client import identity as identity_proto
from tailrace.errors import RetryableError
from tailrace.lifecycle import reconcile_identity
from tailrace.logs import get_logger
from tailrace.proto.control_pb2 import ServerIdentity
from tailrace_services.capture_mysql.connection import ServerFacts, binlog_gtid_pos
from tailrace_services.capture_mysql.position import (
    CapturePosition,
    CheckpointFile,
    check_reachable,
)
from tailrace_services.capture_mysql.stream import read_binlog_header

__all__ = ["ServerCheck", "identity_attributes", "identity_fingerprint", "table_digests"]

log = get_logger(__name__)

_SCHEMA = "schema:"


def identity_attributes(facts: ServerFacts) -> dict[str, str]:
    if facts.flavor == "mysql":
        return {"server_uuid": facts.server_uuid, "server_id": str(facts.server_id)}
    first = facts.first_binlog
    return {
        "server_id": str(facts.server_id),
        "gtid_domains": ",".join(str(d) for d in facts.gtid_binlog_state.position().domains()),
        "first_binlog": first.file if first else "",
        "first_binlog_created": str(first.created_unix) if first else "",
    }


def identity_fingerprint(flavor: str, attributes: dict[str, str]) -> str:
    """SHA-256 of the identity attributes (the schema digests are not part of it)."""
    if flavor == "mysql":
        basis: dict[str, str] = {"server_uuid": attributes.get("server_uuid", "")}
    else:
        basis = {k: v for k, v in attributes.items() if not k.startswith(_SCHEMA)}
    return hashlib.sha256(json.dumps([flavor, basis], sort_keys=True).encode()).hexdigest()


def table_digests(conn: pymysql.connections.Connection, tables: list[tuple[str, str]]
                  ) -> dict[str, str]:
    """`schema:db.table` -> SHA-256 of (name, column type, key) per column, in order."""
    out: dict[str, str] = {}
    with conn.cursor() as cur:
        for db, table in tables:
            cur.execute("SELECT COLUMN_NAME, COLUMN_TYPE, COLUMN_KEY FROM information_schema."
                        "COLUMNS WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s "
                        "ORDER BY ORDINAL_POSITION", (db, table))
            shape = [list(map(str, row)) for row in cur.fetchall()]
            out[f"{_SCHEMA}{db}.{table}"] = hashlib.sha256(
                json.dumps(shape).encode()).hexdigest()
    return out


def describe_change(previous: ServerIdentity | None, attributes: dict[str, str]) -> str:
    old = {k: v for k, v in (previous.attributes.items() if previous else ())
           if not k.startswith(_SCHEMA)}
    changed = [f"{k} {old.get(k, '-')!s} -> {v}" for k, v in sorted(attributes.items())
               if not k.startswith(_SCHEMA) and old.get(k) != v]
    return "server identity changed: " + ("; ".join(changed) or "fingerprint differs")


def schema_drift(previous: ServerIdentity | None, attributes: dict[str, str]) -> list[str]:
    old = {k: v for k, v in (previous.attributes.items() if previous else ())
           if k.startswith(_SCHEMA)}
    new = {k: v for k, v in attributes.items() if k.startswith(_SCHEMA)}
    drift = []
    for key in sorted(set(old) | set(new)):
        table = key.removeprefix(_SCHEMA)
        if key not in new:
            drift.append(f"{table}: missing on the new server")
        elif key not in old:
            drift.append(f"{table}: not known on the old server")
        elif old[key] != new[key]:
            drift.append(f"{table}: structure differs from the old server's")
    return drift


@dataclass
class ServerCheck:
    """Identity and position checks of one source, run before streaming starts."""

    control: ControlClient
    source_id: str
    replica_server_id: int
    on_schema_drift: str  # adapt | halt

    def run(self, conn: pymysql.connections.Connection, connect_kwargs: dict[str, Any],
            facts: ServerFacts, checkpoint: CapturePosition | None,
            tables: list[tuple[str, str]]) -> None:
        """Raise PositionLostError (lost) or FatalError (halted drift); return to stream."""
        attributes = identity_attributes(facts)
        fingerprint = identity_fingerprint(facts.flavor, attributes)
        try:
            attributes.update(table_digests(conn, tables))
        except pymysql.err.MySQLError as e:
            log.warning("cannot read table structures for drift checks", error=str(e))
        verdict, previous = self.control.compare_identity(self.source_id, facts.flavor,
                                                          attributes, fingerprint)
        if verdict != "changed":
            self.position(conn, connect_kwargs, facts, checkpoint)
            if verdict == "same":  # refresh the schema digests kept with it
                self.control.store_identity(self.source_id, facts.flavor, attributes,
                                            fingerprint)
            return
        change = describe_change(previous, attributes)
        log.warning("server identity changed; reconciling", source=self.source_id, change=change)
        drift = reconcile_identity(
            self.control, self.source_id, previous,
            identity_proto(facts.flavor, attributes, fingerprint), change=change,
            on_schema_drift=self.on_schema_drift,
            check_position=lambda: self.position(conn, connect_kwargs, facts, checkpoint),
            find_drift=lambda: schema_drift(previous, attributes))
        log.warning("reconciled with the changed server; continuing from our checkpoint",
                    source=self.source_id, drift=drift or None)

    def refresh(self, conn: pymysql.connections.Connection, facts: ServerFacts,
                tables: list[tuple[str, str]]) -> None:
        """After DDL: store the identity again with fresh schema digests (best effort)."""
        attributes = identity_attributes(facts)
        try:
            attributes.update(table_digests(conn, tables))
            self.control.store_identity(self.source_id, facts.flavor, attributes,
                                        identity_fingerprint(facts.flavor, attributes))
        except (pymysql.err.MySQLError, RetryableError) as e:
            log.warning("cannot refresh the stored identity after DDL", error=str(e))

    def position(self, conn: pymysql.connections.Connection, connect_kwargs: dict[str, Any],
                 facts: ServerFacts, checkpoint: CapturePosition | None) -> None:
        """Raise PositionLostError when the server lost the history after `checkpoint`."""
        if checkpoint is None:
            return
        try:
            cp_file = self._checkpoint_file(conn, connect_kwargs, facts, checkpoint)
        except (pymysql.err.MySQLError, RetryableError, OSError) as e:
            log.warning("position check failed; continuing without it", error=str(e))
            return
        check_reachable(checkpoint, facts, cp_file)

    def _checkpoint_file(self, conn: pymysql.connections.Connection,
                         connect_kwargs: dict[str, Any], facts: ServerFacts,
                         cp: CapturePosition) -> CheckpointFile | None:
        if facts.flavor != "mariadb" or not cp.file or cp.server_id != facts.server_id:
            return None
        if cp.file not in facts.binlogs:
            return CheckpointFile(exists=False)
        header = read_binlog_header(connect_kwargs, self.replica_server_id, cp.file)
        return CheckpointFile(True, header.created_unix, binlog_gtid_pos(conn, cp.file,
                                                                         cp.offset))
