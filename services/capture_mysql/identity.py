"""Who the server is, checked on every (re)connect, and the reconcile when it changed.

MySQL has `@@server_uuid`. MariaDB has no server uuid (`@@server_uid` is a hash
of host and port: the *address*, not the server), so its identity combines
`server_id`, the GTID domains of its binlog state and when its data directory
was made (the creation time of the `mysql.global_priv` system table, written
by mariadb-install-db): a fresh server on the same address and with the same
`server_id` differs in the last. Binlog files are not part of it: purging old
binlogs or RESET MASTER does not make a different server. A replica cloned
from a backup shares the data directory's time; continuity is not decided by
identity alone anyway.

Continuity is (position.py): on the same server, nothing after the
checkpoint purged; on any server, the checkpoint's own transaction re-read
by GTID with the same contents. So a promoted replica that holds our history
continues, and a fresh server whose GTIDs `0-1-N` reuse our numbers stops.

Schema drift on a changed server is measured against the schema registry, as for
PostgreSQL (`tailrace_services.capture.drift`): each selected table's structure in
the new server's catalog against its latest registered version. (Identities stored
by older versions carry `schema:<db>.<table>` digests; they are ignored.)

The control service answers FirstSeen (stored now), Same or Changed
(DESIGN guarantee 9): FirstSeen and Same check the position; Changed
reconciles before any event flows — continuity with the *old* checkpoint,
schema drift recorded as a ReconcileRecord, `on_schema_drift: adapt|halt` —
and only then stores the new identity. Streaming then resumes by GTID from
that same checkpoint.

A check that itself fails (the query errs) logs a warning and capture continues;
an answer that leaves continuity in doubt is a lost position.

After a lost position, `run(..., accept=why)` takes the server as it is now (an
operator's `tailrace resnapshot`, `snapshot.mode: when_needed`; the request is in the
snapshot record): a ReconcileRecord with decision `accepted`, and the server's identity
stored with where its new history starts (`accepted_tx_seq`, `accepted_gtid_set`:
`position.Accepted`; not part of the fingerprint, and carried over by later reconciles).
Streaming then starts at the server's current GTID state and the caller has every table
read again. A later session finds the boundary in the stored identity, so a restart
before the sinks checkpoint anything of the new history does not stop again.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pymysql

from tailrace.control_client import ControlClient
from tailrace.control_client import identity as identity_proto
from tailrace.errors import NonRetryableError, PositionLostError, RetryableError
from tailrace.logs import get_logger
from tailrace.proto.control_pb2 import ServerIdentity
from tailrace_services.capture.drift import find_drift
from tailrace_services.capture.lifecycle import reconcile_identity
from tailrace_services.capture.resume import ResumePoint
from tailrace_services.capture_mysql.connection import ServerFacts
from tailrace_services.capture_mysql.position import (
    Accepted,
    CapturePosition,
    CheckpointProof,
    Sameness,
    check_reachable,
    resume_from,
)
from tailrace_services.capture_mysql.reader import read_transaction
from tailrace_services.capture_mysql.schema import catalog_fingerprints

__all__ = ["ServerCheck", "accepted_of", "describe_change", "identity_attributes",
           "identity_fingerprint", "sameness"]

log = get_logger(__name__)

_SCHEMA = "schema:"  # the schema digests identities of older versions carry
_ACCEPTED = "accepted_"  # where an accepted server's history starts (module docstring)
_CHANGED = "server identity changed: "


def identity_attributes(facts: ServerFacts) -> dict[str, str]:
    if facts.flavor == "mysql":
        return {"server_uuid": facts.server_uuid, "server_id": str(facts.server_id)}
    return {
        "server_id": str(facts.server_id),
        "gtid_domains": ",".join(str(d) for d in facts.gtid_binlog_state.position().domains()),
        "datadir_created": str(facts.datadir_created),
    }


def accepted_of(identity: ServerIdentity | None) -> Accepted | None:
    """Where the history of a server accepted as it is now starts, if one was."""
    attributes = identity.attributes if identity is not None else {}
    if _ACCEPTED + "tx_seq" not in attributes:
        return None
    return Accepted(int(attributes[_ACCEPTED + "tx_seq"]),
                    attributes.get(_ACCEPTED + "gtid_set", ""))


def _accepted_attributes(accepted: Accepted | None) -> dict[str, str]:
    if accepted is None:
        return {}
    return {_ACCEPTED + "tx_seq": str(accepted.tx_seq), _ACCEPTED + "gtid_set": accepted.gtid_set}


def sameness(facts: ServerFacts, verdict: str, previous: ServerIdentity | None) -> Sameness:
    """Is this the server our checkpoint was read from? With the facts that say so."""
    if previous is None or verdict == "first_seen":
        return Sameness(None, "a server whose identity was never stored")
    if verdict == "same":
        return Sameness(True, "the same server")
    old = previous.attributes
    if facts.flavor == "mariadb" and old.get("datadir_created") not in (
            None, str(facts.datadir_created)):
        return Sameness(False, "a different server (its data directory was created at "
                               f"{_when(facts.datadir_created)}, the one our checkpoint came "
                               f"from at {_when(int(old['datadir_created']))})")
    changed = describe_change(previous, identity_attributes(facts))
    return Sameness(False, f"a different server ({changed.removeprefix(_CHANGED)})")


def _when(unix: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(unix)) if unix else "an unknown time"


def identity_fingerprint(flavor: str, attributes: dict[str, str]) -> str:
    """SHA-256 of the identity attributes (the schema digests are not part of it)."""
    if flavor == "mysql":
        basis: dict[str, str] = {"server_uuid": attributes.get("server_uuid", "")}
    else:
        basis = {k: v for k, v in attributes.items()
                 if not k.startswith((_SCHEMA, _ACCEPTED))}
    return hashlib.sha256(json.dumps([flavor, basis], sort_keys=True).encode()).hexdigest()


def describe_change(previous: ServerIdentity | None, attributes: dict[str, str]) -> str:
    old = {k: v for k, v in (previous.attributes.items() if previous else ())
           if not k.startswith((_SCHEMA, _ACCEPTED))}
    changed = [f"{k} {old.get(k, '-')!s} -> {v}" for k, v in sorted(attributes.items())
               if not k.startswith((_SCHEMA, _ACCEPTED)) and old.get(k) != v]
    return _CHANGED + ("; ".join(changed) or "fingerprint differs")


@dataclass
class ServerCheck:
    """Identity and position checks of one source, run before streaming starts."""

    control: ControlClient
    source_id: str
    tenant: str
    replica_server_id: int
    on_schema_drift: str  # adapt | halt

    def run(self, conn: pymysql.connections.Connection, connect_kwargs: dict[str, Any],
            facts: ServerFacts, point: ResumePoint, tables: list[tuple[str, str]], *,
            from_now: bool = False, accept: str = "",
            highest: Callable[[], int] = lambda: 0) -> CapturePosition:
        """Raise PositionLostError (lost) or FatalError (halted drift); return where to
        stream from (`position.resume_from`). With `accept` (why), the server is taken as it
        is now (`_accept`), numbering after `highest()`."""
        attributes = identity_attributes(facts)
        fingerprint = identity_fingerprint(facts.flavor, attributes)
        verdict, previous = self.control.compare_identity(self.source_id, facts.flavor,
                                                          attributes, fingerprint)
        same = sameness(facts, verdict, previous)
        if accept:
            return self._accept(facts, previous, verdict, same, accept, highest())
        accepted = accepted_of(previous)
        checkpoint, start = resume_from(point, facts, from_now=from_now, accepted=accepted)
        # The checkpoint decides the reconcile; with none yet, where we start does.
        decisive = checkpoint or (start if start.tx_seq or accepted else None)
        if verdict != "changed":
            self.position(connect_kwargs, facts, decisive, same)
        else:
            self._reconcile(conn, connect_kwargs, facts, decisive, tables, previous, same,
                            {**attributes, **_accepted_attributes(accepted)})
        if checkpoint is not None and start.tx_seq > checkpoint.tx_seq:
            self.position(connect_kwargs, facts, start, same)
        return start

    def _reconcile(self, conn: pymysql.connections.Connection, connect_kwargs: dict[str, Any],
                   facts: ServerFacts, checkpoint: CapturePosition | None,
                   tables: list[tuple[str, str]], previous: ServerIdentity | None,
                   same: Sameness, attributes: dict[str, str]) -> None:
        change = describe_change(previous, identity_attributes(facts))
        log.warning("server identity changed; reconciling", source=self.source_id, change=change)
        checked: list[bool] = []

        def check_position() -> None:
            self.position(connect_kwargs, facts, checkpoint, same)
            checked.append(True)

        drift = reconcile_identity(
            self.control, self.source_id, previous,
            identity_proto(facts.flavor, attributes,
                           identity_fingerprint(facts.flavor, attributes)),
            change=change, on_schema_drift=self.on_schema_drift, check_position=check_position,
            find_drift=lambda: find_drift(
                self.control, self.tenant, lambda: catalog_fingerprints(conn, tables),
                server=same.who, strict=bool(checked),
                errors=(pymysql.err.MySQLError, NonRetryableError)))
        log.warning("reconciled with the changed server; continuing from our checkpoint",
                    source=self.source_id, drift=drift or None)

    def _accept(self, facts: ServerFacts, previous: ServerIdentity | None, verdict: str,
                same: Sameness, why: str, after: int) -> CapturePosition:
        """Take the server as it is now: its current GTID state starts a new history,
        numbered after `after` (position.py); the identity stored with that boundary, and a
        ReconcileRecord saying so (decision `accepted`). Whatever the stored checkpoints say
        is the lost history; the caller has every table read again. Each step can run again
        after a crash: the request stays in the snapshot record until the tables are queued."""
        now = facts.gtid_binlog_pos if facts.flavor == "mariadb" else facts.gtid_executed
        accepted = Accepted(after, str(now))
        attributes = {**identity_attributes(facts), **_accepted_attributes(accepted)}
        new = identity_proto(facts.flavor, attributes,
                             identity_fingerprint(facts.flavor, attributes))
        change = (describe_change(previous, identity_attributes(facts))
                  if verdict == "changed" else same.who)
        self.control.add_reconcile_record(
            self.source_id, previous, new,
            [change, f"accepted as it is now: {why}; streaming from {now or 'the start'}, "
                     f"positions numbered after tx_seq {after}, every table read again"],
            "accepted")
        self.control.store_identity(self.source_id, facts.flavor, attributes, new.fingerprint)
        log.warning("server accepted as it is now; every table is read again",
                    source=self.source_id, server=same.who, gtid=str(now) or None,
                    after_tx_seq=after, why=why)
        return CapturePosition(facts.flavor, gtid_set=str(now), tx_seq=after)

    def position(self, connect_kwargs: dict[str, Any], facts: ServerFacts,
                 checkpoint: CapturePosition | None, same: Sameness) -> None:
        """Raise PositionLostError when this server's history does not continue `checkpoint`."""
        if checkpoint is None:
            return
        check_reachable(checkpoint, facts, self._proof(connect_kwargs, facts, checkpoint), same)

    def _proof(self, connect_kwargs: dict[str, Any], facts: ServerFacts,
               cp: CapturePosition) -> CheckpointProof | None:
        """Read the checkpoint's transaction again on this server (MariaDB, digest known)."""
        if facts.flavor != "mariadb" or not cp.tx_digest or not cp.gtid:
            return None
        try:
            found = read_transaction(connect_kwargs, self.replica_server_id, cp.before(),
                                     cp.gtid)
        except PositionLostError as e:  # the server cannot send from there (1236)
            return CheckpointProof(None, why=e.reason)
        except (pymysql.err.MySQLError, OSError) as e:  # the check failed, not the history
            raise RetryableError(f"cannot re-read the checkpoint's transaction {cp.gtid} "
                                 f"to check continuity: {e}") from None
        if found is None:
            return CheckpointProof(None, why=f"nothing follows {cp.prev_gtid or 'the start'} "
                                             "in its domain")
        return CheckpointProof(found.gtid, found.digest)
