"""Who the server is, checked on every (re)connect, and the reconcile when it changed.

Identity is `system_identifier` + timeline (IDENTIFY_SYSTEM). A promoted standby
keeps the system identifier and moves to a new timeline; an independent server
on the same address has another system identifier. The control service answers
FirstSeen (stored now), Same or Changed (DESIGN guarantee 9):

- FirstSeen and Same: the position is checked (`position.py`);
- Changed: before any event flows, the reconcile checks the position (a
  different cluster cannot have our LSNs; a promoted standby must have our
  slot and our checkpoint on its timeline), compares each table with its
  latest registered schema, records a ReconcileRecord with the decision
  (`resnapshot`, `halt` or `adapt`), and only on `adapt` stores the new identity.

A check that itself fails (a catalog query, the control service) logs a warning
and lets capture continue; a lost position raises `PositionLostError`.

PostgreSQL 15 does not copy logical slots to standbys, so after promoting one the
slot is missing and a position that sinks have checkpointed is lost: that is
reported, not papered over by creating a new slot that would start later.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from typing import Any

import psycopg

from tailrace.control_client import ControlClient
from tailrace.control_client import identity as identity_proto
from tailrace.errors import PositionLostError, RetryableError
from tailrace.lifecycle import reconcile_identity
from tailrace.logs import get_logger
from tailrace.proto.control_pb2 import ServerIdentity
from tailrace_services.capture_postgres.position import (
    Resume,
    check_slot,
    check_timeline,
    read_slot,
)
from tailrace_services.capture_postgres.replication import ReplicationConnection, SystemIdentity
from tailrace_services.capture_postgres.schema import catalog_shapes, fingerprint

__all__ = ["FLAVOR", "ServerCheck", "identity_attributes", "identity_fingerprint"]

log = get_logger(__name__)

FLAVOR = "postgresql"


def identity_attributes(system: SystemIdentity) -> dict[str, str]:
    return {"system_identifier": system.system_id, "timeline": str(system.timeline),
            "database": system.dbname}


def identity_fingerprint(system: SystemIdentity) -> str:
    return hashlib.sha256(f"{system.system_id}/{system.timeline}".encode()).hexdigest()


def describe_change(previous: ServerIdentity | None, system: SystemIdentity) -> str:
    old = dict(previous.attributes) if previous is not None else {}
    if old.get("system_identifier") == system.system_id:
        return (f"promoted standby: system_identifier {system.system_id}, timeline "
                f"{old.get('timeline')} -> {system.timeline}")
    return (f"a different server: system_identifier {old.get('system_identifier')} -> "
            f"{system.system_id}")


@dataclass
class ServerCheck:
    """Identity and position checks of one source, run before streaming starts."""

    control: ControlClient
    source_id: str
    tenant: str
    slot: str
    create_slot: bool
    on_schema_drift: str  # adapt | halt

    def run(self, repl: ReplicationConnection, conn: psycopg.Connection[Any],
            system: SystemIdentity, resume: Resume, tables: list[tuple[str, str]]) -> None:
        """Raise PositionLostError (lost), FatalError (halted drift); return to stream."""
        verdict, previous = self.control.compare_identity(
            self.source_id, FLAVOR, identity_attributes(system), identity_fingerprint(system))
        if verdict != "changed":
            self._position(repl, conn, system, resume)
            return
        change = describe_change(previous, system)
        log.warning("server identity changed", source=self.source_id, change=change)
        drift = reconcile_identity(
            self.control, self.source_id, previous,
            identity_proto(FLAVOR, identity_attributes(system), identity_fingerprint(system)),
            change=change, on_schema_drift=self.on_schema_drift,
            check_position=lambda: self._reconcile_position(repl, conn, system, previous, resume),
            find_drift=lambda: self._drift(conn, system.dbname, tables))
        log.warning("reconciled with the changed server; continuing", source=self.source_id,
                    drift=drift or None)

    def _position(self, repl: ReplicationConnection, conn: psycopg.Connection[Any],
                  system: SystemIdentity, resume: Resume) -> None:
        try:
            state = read_slot(conn, self.slot)
            history = repl.timeline_history(system.timeline) if resume.timeline else []
        except (psycopg.Error, RetryableError) as e:
            log.warning("position check failed; continuing without it", error=str(e))
            return
        check_slot(state, self.slot, resume, self.create_slot)
        check_timeline(history, system.timeline, resume)

    def _reconcile_position(self, repl: ReplicationConnection, conn: psycopg.Connection[Any],
                            system: SystemIdentity, previous: ServerIdentity | None,
                            resume: Resume) -> None:
        """Raise PositionLostError when the changed server cannot continue our position."""
        old_system = dict(previous.attributes).get("system_identifier") if previous else None
        if old_system != system.system_id and (resume.lsn or resume.published):
            raise PositionLostError(
                f"the server changed (system_identifier {old_system} -> {system.system_id}): "
                "it is a different cluster, and the positions of the old one do not exist here")
        # The slot of a server we streamed from is missing: changes since are gone.
        self._position(repl, conn, system, replace(resume, published=True))

    def _drift(self, conn: psycopg.Connection[Any], database: str,
               tables: list[tuple[str, str]]) -> list[str]:
        """Tables whose structure differs from their latest registered schema."""
        drift: list[str] = []
        try:
            for (schema, table), shape in catalog_shapes(conn, tables).items():
                versions = self.control.list_schemas(self.tenant, database, f"{schema}.{table}")
                if versions and fingerprint(schema, table, shape) != versions[-1].fingerprint:
                    drift.append(f"{database}.{schema}.{table}: structure differs from schema "
                                 f"version {versions[-1].version}")
        except (psycopg.Error, RetryableError) as e:
            log.warning("schema drift check failed; continuing without it", error=str(e))
        return drift
