"""Prometheus metrics of capture-postgres."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

EVENTS = Counter("tailrace_capture_events_total", "change events published", ["source"])
TRANSACTIONS = Counter("tailrace_capture_transactions_total", "transactions published", ["source"])
BYTES = Counter("tailrace_capture_wal_bytes_total", "pgoutput payload bytes received", ["source"])
LAG_BYTES = Gauge("tailrace_capture_lag_bytes", "server WAL end minus the last LSN received",
                  ["source"])
LAG_SECONDS = Gauge("tailrace_capture_lag_seconds", "now minus the commit time of the last "
                    "transaction published", ["source"])
RETAINED_BYTES = Gauge("tailrace_capture_retained_bytes", "WAL held back by the slot: server WAL "
                       "end minus the confirmed (all-sinks) LSN", ["source"])
SPILL_BYTES = Gauge("tailrace_capture_spill_bytes", "bytes of the current transaction spilled to "
                    "disk", ["source"])
