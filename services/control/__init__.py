"""The control service: the one place that owns a pipeline's durable state.

- `storage/` — the primitives (KV with compare-and-set, Log, Slot, Queue) on SQLite,
  PostgreSQL or memory; everything below is written against them;
- `checkpoints.py`, `commits.py` — per-sink checkpoints and the commit policy;
- `epochs.py` — bus cuts recorded by capture, planned from by delivery;
- `schemas.py` — the schema registry; `identities.py`, `health.py` — server identities,
  reconcile records and health reports;
- `dlq.py` — the dead-letter queues; `pipelines.py`, `admin.py` — the admin API;
- `roles.py`, `tokens.py`, `auth.py`, `audit.py` — which role each RPC needs, the tokens,
  the check of every call, and the audit log of every change;
- `status.py`, `server.py`, `main.py` — gRPC status, wiring (TLS), entry point;
- `testing.py` — the service as a real subprocess for tests.
"""
