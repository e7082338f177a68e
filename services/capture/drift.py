"""Schema drift on a changed server, for both sources: measured against the schema registry.

When the control service says the server's identity changed (a failover, a
replaced server), the reconcile (`lifecycle.reconcile_identity`) asks which
selected tables have another structure there than the one we captured. The one
answer for both sources: a table whose structure as the new server's catalog shows
it now has another fingerprint than its latest version in the schema registry —
the version the events captured so far carry. A table never registered (nothing of
it captured yet) has nothing to differ from.

Each source gives its tables' current fingerprints, computed as it fingerprints the
structures of its stream (PostgreSQL: Relation messages, `capture_postgres/schema.py`;
MySQL: table maps, `capture_mysql/schema.py`), under the names it registers them
with: (database, `schema.table`) for PostgreSQL, (database, table) for MySQL.

A comparison that fails (the catalog query, the registry) is no answer: when the
position check passed (`strict`) the session is retried, so that a server is never
adopted unchecked; when the position is lost anyway, the failure is noted in the
reconcile record instead.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from tailrace.control_client import ControlClient
from tailrace.errors import RetryableError
from tailrace.logs import get_logger

__all__ = ["find_drift"]

log = get_logger(__name__)

Fingerprints = Mapping[tuple[str, str], str]
"""(database, table as registered) -> fingerprint of its structure on the server now."""


def find_drift(control: ControlClient, tenant: str, current: Callable[[], Fingerprints], *,
               server: str, strict: bool,
               errors: tuple[type[Exception], ...] = ()) -> list[str]:
    """The drift notes for the reconcile record: one per table whose structure differs from
    its latest registered version. `current` reads the server's catalog; `errors` are the
    source driver's errors it may raise (RetryableError always counts); `server` names the
    server in messages."""
    drift: list[str] = []
    failures: tuple[type[Exception], ...] = (RetryableError, *errors)
    try:
        for (database, table), fingerprint in current().items():
            versions = control.list_schemas(tenant, database, table)
            if versions and fingerprint != versions[-1].fingerprint:
                drift.append(f"{database}.{table}: structure differs from schema version "
                             f"{versions[-1].version}")
    except failures as e:
        what = (f"cannot compare the tables of {server}, whose identity changed, with their "
                f"registered schemas: {e}")
        if strict:
            raise RetryableError(f"{what}; it is not adopted until they are compared") from e
        log.warning(what)
        drift.append(what)
    return drift
