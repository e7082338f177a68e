"""capture-mysql: the MySQL/MariaDB binlog by GTID through `mysql-replication`, published to the bus.

The parts, as in capture-postgres:

- `connection.py` — DSN, the binlog settings CDC needs, the facts about the server;
- `identity.py` — who the server is (FirstSeen/Same/Changed) and the reconcile;
- `position.py` — the checkpointed position and whether the server still has what follows;
- `gtid.py` — GTID sets (MySQL) and positions (MariaDB): parsing, comparison, subset, union;
- `stream.py` — the binlog reader, its library faults fixed, as transactions;
- `schema.py`, `decoder.py`, `events.py` — table shapes, typed values, change events;
- `tables.py` — table patterns and DDL targets; `resume.py` — what the bus already holds;
- `service.py` — the lifecycle; `metrics.py` — Prometheus; `testing.py` — test helpers.
"""
