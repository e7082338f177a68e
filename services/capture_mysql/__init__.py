"""capture-mysql: the MySQL/MariaDB binlog by GTID through `mysql-replication`, published to the bus.

The parts, with the same names and meanings as in capture-postgres:

- `connection.py` connecting (DSN, TLS options), the binlog settings CDC needs, the facts
                  about the server (`ServerFacts`);
- `reader.py`     the binlog protocol: the library's reader with its faults fixed, as
                  transactions;
- `values.py`     binlog column values -> typed values;
- `events.py`     decoded changes -> `Change`s, fed transaction by transaction to the
                  shared assembler; statement-based changes refused, DDL events;
- `schema.py`     table shapes and fingerprints (table maps, the catalog), registration;
- `position.py`   the checkpointed position <-> the bus `Position`, where a session starts,
                  whether the server still has what follows;
- `identity.py`   who the server is (FirstSeen / Same / Changed) and the reconcile;
- `tables.py`     table selection by pattern, and which tables a statement touches;
- `errors.py`     errno tables and the error -> health mapping;
- `service.py`    the wiring;
- `gtid.py`       (MySQL's own) GTID sets (MySQL) and positions (MariaDB): parsing,
                  comparison, subset, union.

What both sources share is `tailrace_services.capture`.
"""

from tailrace_services.capture_mysql.service import MysqlCapture

__all__ = ["MysqlCapture"]
