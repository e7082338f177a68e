"""Prometheus metrics of capture-mysql (names shared with capture-postgres where they mean the same)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

EVENTS = Counter("tailrace_capture_mysql_events_total", "change events published", ["source"])
TRANSACTIONS = Counter("tailrace_capture_mysql_transactions_total", "transactions published",
                       ["source"])
BYTES = Counter("tailrace_capture_mysql_event_bytes_total",
                "serialized bytes of the change events published", ["source"])
ROWS_DECODED = Counter("tailrace_capture_mysql_rows_decoded_total",
                       "binlog rows decoded (selected tables)", ["source"])
LAG_SECONDS = Gauge("tailrace_capture_mysql_lag_seconds",
                    "now minus the commit time of the last transaction read", ["source"])
SPILL_BYTES = Gauge("tailrace_capture_mysql_spill_bytes",
                    "bytes of the current transaction spilled to disk", ["source"])
RECONNECTS = Counter("tailrace_capture_mysql_reconnects_total",
                     "binlog connections re-established after a loss", ["source"])
