"""capture-postgres: logical replication with pgoutput through psycopg 3, published to the bus.

The parts, in the order a change passes through them:

- `service.py`   the lifecycle: sessions, reconnect with backoff, health;
- `identity.py`  who the server is (FirstSeen / Same / Changed) and the reconcile;
- `position.py`  positions (timeline-qualified commit LSNs) and whether they still exist;
- `tables.py`    table patterns and the publication, refreshed while streaming;
- `replication.py` the walsender connection (COPY_BOTH, status updates, keepalives);
- `decoder.py`, `values.py` pgoutput messages and typed column values;
- `schema.py`    fingerprints, registration, drift (`on_schema_drift: adapt|halt`);
- `events.py`    `ChangeEvent`s: rows, before-images, unchanged TOAST, ids;
- `stream.py`    whole transactions (spilling), published with epochs; backpressure;
- `metrics.py`   Prometheus metrics.
"""
