"""capture-postgres: logical replication with pgoutput through psycopg 3, published to the bus.

The parts, with the same names and meanings as in capture-mysql:

- `connection.py` connecting: the walsender connection (COPY_BOTH, IDENTIFY_SYSTEM, status
                  updates, keepalives), the server settings CDC needs, the facts about the
                  server (`ServerFacts`: the slot, the timeline history);
- `reader.py`     the log protocol: the pgoutput parser;
- `values.py`     pgoutput column text -> typed values;
- `events.py`     decoded changes -> `Change`s (before-images, unchanged TOAST, ids),
                  fed transaction by transaction to the shared assembler;
- `schema.py`     table shapes and fingerprints (Relation messages, the catalog),
                  registration and drift, and each table's key;
- `position.py`   timeline-qualified commit LSNs <-> the bus `Position`, whether the
                  server still has what follows our checkpoint, confirming the slot;
- `identity.py`   who the server is (FirstSeen / Same / Changed) and the reconcile;
- `tables.py`     table selection by pattern, and the publication;
- `errors.py`     SQLSTATE tables and the error -> health mapping;
- `service.py`    the wiring;
- `history.py`    (PostgreSQL's own) the check that re-read WAL is the history we published.

What both sources share is `tailrace_services.capture`.
"""

from tailrace_services.capture_postgres.service import PostgresCapture

__all__ = ["PostgresCapture"]
