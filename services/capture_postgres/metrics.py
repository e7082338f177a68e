"""Prometheus metrics of capture-postgres (capture-mysql has the same ones, `..._mysql_...`)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

EVENTS = Counter("tailrace_capture_postgres_events_total", "change events published", ["source"])
TRANSACTIONS = Counter("tailrace_capture_postgres_transactions_total", "transactions published",
                       ["source"])
BYTES = Counter("tailrace_capture_postgres_wal_bytes_total", "pgoutput payload bytes received",
                ["source"])
LAG_BYTES = Gauge("tailrace_capture_postgres_lag_bytes",
                  "server WAL end minus the last LSN received", ["source"])
LAG_SECONDS = Gauge("tailrace_capture_postgres_lag_seconds",
                    "now minus the commit time of the last transaction published", ["source"])
RETAINED_BYTES = Gauge("tailrace_capture_postgres_retained_bytes",
                       "WAL held back by the slot: server WAL end minus the LSN every sink has "
                       "checkpointed", ["source"])
SPILL_BYTES = Gauge("tailrace_capture_postgres_spill_bytes",
                    "bytes of the last transaction spilled to disk", ["source"])
RECONNECTS = Counter("tailrace_capture_postgres_reconnects_total",
                     "replication sessions started again after a failure", ["source"])
