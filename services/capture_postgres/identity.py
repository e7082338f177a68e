"""Who the server is, checked on every (re)connect, and the reconcile when it changed.

Identity is `system_identifier` + timeline (IDENTIFY_SYSTEM). A promoted standby
or a point-in-time restore keeps the system identifier and moves to a new
timeline; an independent server on the same address has another system
identifier. A copy of the cluster that did not change timeline (a disk snapshot,
a base backup started without recovery) has the very same identity: continuity
is not decided by identity alone (`position.py`, `history.py`). The control
service answers FirstSeen (stored now), Same or Changed (DESIGN guarantee 9):

- FirstSeen and Same: the position is checked (`position.check_position`);
- Changed: before any event flows, the reconcile checks the position (a
  different cluster never had our LSNs, whatever they say; the same cluster on
  a new timeline must hold our checkpoint in its history, and our slot),
  compares each table with its latest registered schema (the drift check both
  sources share, `tailrace_services.capture.drift`), records a ReconcileRecord
  with the decision (`resnapshot`, `halt` or `adapt`), and only on `adapt` stores
  the new identity.

Whatever the verdict, the stream then checks the re-read transactions against
the ones we published (`history.HistoryCheck`) before it publishes anything.

A check that itself fails (a catalog query, TIMELINE_HISTORY) is not an answer.
On a known server (FirstSeen, Same) it logs a warning and capture continues,
with the re-read still required to show our checkpoint's transaction. On a
changed one it never leads to `adapt`: a transient failure retries the session,
any other stops capture (`failed`, naming the server and the error), and the
new identity stays unstored until the check has run.

PostgreSQL 15 does not copy logical slots to standbys, so after promoting one the
slot is missing and a position that sinks have checkpointed is lost: that is
reported, not papered over by creating a new slot that would start later.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import psycopg

from tailrace.control_client import ControlClient
from tailrace.control_client import identity as identity_proto
from tailrace.errors import FatalError, NonRetryableError, PositionLostError, RetryableError
from tailrace.logs import get_logger
from tailrace.proto.control_pb2 import ServerIdentity
from tailrace_services.capture.drift import find_drift
from tailrace_services.capture.lifecycle import reconcile_identity
from tailrace_services.capture.resume import ResumePoint
from tailrace_services.capture_postgres.connection import (
    ReplicationConnection,
    ServerFacts,
    SystemIdentity,
    lsn_to_str,
    read_facts,
)
from tailrace_services.capture_postgres.history import HistoryCheck, expected_transactions
from tailrace_services.capture_postgres.position import (
    Resume,
    check_numbering,
    check_position,
    check_slot,
    describe_server,
)
from tailrace_services.capture_postgres.schema import catalog_fingerprints

__all__ = ["FLAVOR", "Checked", "ServerCheck", "describe_change", "different_cluster",
           "era_of_identity", "identity_attributes", "identity_fingerprint"]

log = get_logger(__name__)

FLAVOR = "postgresql"
_CHECK_ERRORS = (psycopg.Error, RetryableError, NonRetryableError)


def identity_attributes(system: SystemIdentity, era: int = 0) -> dict[str, str]:
    """What identifies the server, and the era its positions are numbered in (position.py)."""
    attributes = {"system_identifier": system.system_id, "timeline": str(system.timeline),
                  "database": system.dbname}
    if era:
        attributes["era"] = str(era)
    return attributes


def era_of_identity(identity: ServerIdentity | None) -> int:
    return int(identity.attributes.get("era", "0")) if identity is not None else 0


def identity_fingerprint(system: SystemIdentity) -> str:
    return hashlib.sha256(f"{system.system_id}/{system.timeline}".encode()).hexdigest()


def describe_change(previous: ServerIdentity | None, system: SystemIdentity) -> str:
    old = dict(previous.attributes) if previous is not None else {}
    if old.get("system_identifier") == system.system_id:
        return (f"promoted standby or restored backup (same cluster, another timeline): "
                f"system_identifier {system.system_id}, timeline {old.get('timeline')} -> "
                f"{system.timeline}")
    return (f"a different server: system_identifier {old.get('system_identifier')} -> "
            f"{system.system_id}")


def different_cluster(previous: ServerIdentity | None, system: SystemIdentity, slot: str,
                      resume: Resume) -> PositionLostError | None:
    """The loss when the server is another cluster: its LSNs say nothing about ours."""
    old = dict(previous.attributes) if previous is not None else {}
    old_system = old.get("system_identifier")
    if old_system == system.system_id:
        return None
    read = (f"{resume.describe()} was read from slot {slot!r} of that cluster"
            if resume.has_position else
            f"nothing was published yet, but slot {slot!r} and the stored identity belong to "
            "that cluster")
    return PositionLostError(
        f"the server changed (system_identifier {old_system} -> {system.system_id}): this is "
        f"a different cluster (timeline {system.timeline}, WAL at "
        f"{lsn_to_str(system.xlogpos)}), not the one on timeline {old.get('timeline')} we "
        f"streamed from; {read}, and its LSNs do not exist here")


@dataclass(frozen=True)
class Checked:
    """The outcome of the checks: where to stream from and what the re-read must show."""

    resume: Resume
    history: HistoryCheck
    era: int  # positions are numbered in it (position.py)


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
            system: SystemIdentity, point: ResumePoint, tables: list[tuple[str, str]],
            accept: str = "") -> Checked:
        """Raise PositionLostError (lost), FatalError (halted drift, a check that cannot
        run on a changed server); return where to stream from and what the stream must
        find when it re-reads. With `accept` (why: an operator's `tailrace resnapshot`,
        `snapshot.mode: when_needed`), the server is taken as it is now (`_accept`)."""
        verdict, previous = self.control.compare_identity(
            self.source_id, FLAVOR, identity_attributes(system), identity_fingerprint(system))
        era = era_of_identity(previous)
        if accept:
            return self._accept(repl, conn, system, previous, verdict, era, accept)
        resume = Resume.of(point.checkpoint, point.latest_epoch, era)
        if verdict != "changed":
            if verdict == "first_seen" and resume.has_position:
                log.warning("no identity was stored for a source with a position; the re-read "
                            "of our checkpoint's transaction decides", source=self.source_id,
                            resume=resume.describe())
            facts = self._facts_or_none(repl, conn, system)
            if facts is not None:
                check_position(facts, system, self.slot, resume, self.create_slot)
            return Checked(resume, HistoryCheck(resume.lsn,
                                                expected_transactions(resume, facts, system)),
                           era)
        change = describe_change(previous, system)
        log.warning("server identity changed", source=self.source_id, change=change)
        checked: list[ServerFacts] = []
        drift = reconcile_identity(
            self.control, self.source_id, previous,
            identity_proto(FLAVOR, identity_attributes(system, era), identity_fingerprint(system)),
            change=change, on_schema_drift=self.on_schema_drift,
            check_position=lambda: checked.append(
                self._reconcile_position(repl, conn, system, previous, resume)),
            find_drift=lambda: find_drift(
                self.control, self.tenant,
                lambda: catalog_fingerprints(conn, system.dbname, tables),
                server=describe_server(system), strict=bool(checked), errors=(psycopg.Error,)))
        log.warning("reconciled with the changed server; continuing", source=self.source_id,
                    drift=drift or None)
        return Checked(resume, HistoryCheck(resume.lsn,
                                            expected_transactions(resume, checked[0], system)),
                       era)

    def _accept(self, repl: ReplicationConnection, conn: psycopg.Connection[Any],
                system: SystemIdentity, previous: ServerIdentity | None, verdict: str,
                era: int, why: str) -> Checked:
        """Take the server as it is now: a new era (position.py), a new slot, the stored
        identity, and a ReconcileRecord saying so (decision `accepted`). Whatever the
        stored checkpoints say is the lost history; streaming starts from the new slot,
        and the caller has every table read again. Each step can run again after a crash:
        the request stays in the snapshot record until the tables are queued."""
        new_era = era + 1
        check_numbering(system.timeline, new_era)
        change = (describe_change(previous, system) if verdict == "changed" else
                  f"the same server ({describe_server(system)})")
        new = identity_proto(FLAVOR, identity_attributes(system, new_era),
                             identity_fingerprint(system))
        self.control.add_reconcile_record(
            self.source_id, previous, new,
            [change, f"accepted as it is now: {why}; positions numbered in era {new_era}, "
                     "every table read again"], "accepted")
        if not self.create_slot:  # the operator's slot, used as it is: it must be usable
            check_slot(self._facts(repl, conn, system).slot, self.slot, Resume(), False,
                       system.dbname)
        else:
            dropped = conn.execute(
                "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                "WHERE slot_name = %s", (self.slot,)).fetchall()
            if dropped:
                log.warning("replication slot dropped: it held the lost history",
                            slot=self.slot)
        self.control.store_identity(self.source_id, FLAVOR, dict(new.attributes),
                                    new.fingerprint)
        log.warning("server accepted as it is now; every table is read again",
                    source=self.source_id, server=describe_server(system), era=new_era,
                    why=why)
        return Checked(Resume(), HistoryCheck(0, []), new_era)

    def _facts(self, repl: ReplicationConnection, conn: psycopg.Connection[Any],
               system: SystemIdentity) -> ServerFacts:
        return read_facts(repl, conn, self.slot, system)

    def _facts_or_none(self, repl: ReplicationConnection, conn: psycopg.Connection[Any],
                       system: SystemIdentity) -> ServerFacts | None:
        """A known server: a failed check logs a warning and capture continues (DESIGN 9)."""
        try:
            return self._facts(repl, conn, system)
        except _CHECK_ERRORS as e:
            log.warning("position check failed; continuing, the re-read of our checkpoint's "
                        "transaction still decides", server=describe_server(system),
                        error=str(e))
            return None

    def _reconcile_position(self, repl: ReplicationConnection, conn: psycopg.Connection[Any],
                            system: SystemIdentity, previous: ServerIdentity | None,
                            resume: Resume) -> ServerFacts:
        """Raise PositionLostError when the changed server cannot continue our position.

        A check that fails here is never taken for an answer: it raises RetryableError
        (transient) or FatalError, so that nothing is recorded and no identity stored.
        """
        lost = different_cluster(previous, system, self.slot, resume)
        if lost is not None:
            raise lost
        try:
            facts = self._facts(repl, conn, system)
        except (psycopg.OperationalError, RetryableError) as e:
            raise RetryableError(
                f"cannot check the position on {describe_server(system)}, whose identity "
                f"changed: {e}; it is not adopted until the check has run") from e
        except _CHECK_ERRORS as e:
            raise FatalError(
                f"cannot check the position on {describe_server(system)}, whose identity "
                f"changed: {e}; it is not adopted until the check has run: fix the cause and "
                "restart") from e
        check_position(facts, system, self.slot, resume, self.create_slot)
        return facts
