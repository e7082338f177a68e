"""Prometheus metrics of the capture service: one set for both sources.

Every metric has the labels `source` (the spec's source id) and `source_type`
(`postgres` or `mysql`), so one dashboard covers both and the same quantity has the
same name. `lag_bytes` is PostgreSQL's only, because only WAL bytes compare across a
source's history (binlog offsets restart with every file); `retained_bytes` is each
server's own measure of what it keeps (`retained.py`).
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge

__all__ = ["CaptureMetrics"]

_LABELS = ("source", "source_type")


def _counter(name: str, doc: str) -> Counter:
    return Counter(f"tailrace_capture_{name}", doc, _LABELS)


def _gauge(name: str, doc: str) -> Gauge:
    return Gauge(f"tailrace_capture_{name}", doc, _LABELS)


EVENTS = _counter("events_total", "change events published")
TRANSACTIONS = _counter("transactions_total", "source transactions published")
EVENT_BYTES = _counter("event_bytes_total", "serialized bytes of the change events published")
LOG_BYTES = _counter("log_bytes_total", "bytes of the source's log received (pgoutput "
                                        "messages; binlog row and query events)")
ROWS = _counter("rows_total", "row changes of selected tables read from the source's log")
RECONNECTS = _counter("reconnects_total", "sessions started again after a transient failure")
LAG_SECONDS = _gauge("lag_seconds", "now minus the source commit time of the last transaction "
                                    "read")
SPILL_BYTES = _gauge("spill_bytes", "bytes of the last transaction spilled to disk")
LAG_BYTES = _gauge("lag_bytes", "PostgreSQL: server WAL end minus the last LSN received")
RETAINED_BYTES = _gauge("retained_bytes", "source log the server keeps for this pipeline: "
                                          "PostgreSQL, WAL from the slot's confirmed position "
                                          "to the server's WAL end; MySQL/MariaDB, binlog "
                                          "bytes from the sinks' minimum checkpoint")
RETAINED_OVER_LIMIT = _gauge("retained_over_limit",
                             "1 while the source log kept is past source.max_retained and the "
                             "control service could detach no sink (a required sink holds it)")

_TABLE = (*_LABELS, "table")
SNAPSHOT_ROWS = Counter("tailrace_capture_snapshot_rows_total",
                        "snapshot read events published, per table", _TABLE)
SNAPSHOT_ESTIMATED = Gauge("tailrace_capture_snapshot_rows_estimated",
                           "rows the table holds, as the source estimates, when its snapshot "
                           "started", _TABLE)
SNAPSHOT_RATE = Gauge("tailrace_capture_snapshot_rows_per_second",
                      "snapshot rows per second over the last progress interval", _TABLE)
SNAPSHOT_CHUNKS_READ_AGAIN = Counter("tailrace_capture_snapshot_chunks_read_again_total",
                                     "snapshot chunks discarded and read again (a transaction "
                                     "committed but not visible to the read)", _LABELS)


class CaptureMetrics:
    """The metrics of one source, labelled once (labelling per call costs in the hot path)."""

    def __init__(self, source_id: str, source_type: str) -> None:
        labels = (source_id, source_type)
        self.events = EVENTS.labels(*labels)
        self.transactions = TRANSACTIONS.labels(*labels)
        self.event_bytes = EVENT_BYTES.labels(*labels)
        self.log_bytes = LOG_BYTES.labels(*labels)
        self.rows = ROWS.labels(*labels)
        self.lag_seconds = LAG_SECONDS.labels(*labels)
        self.spill_bytes = SPILL_BYTES.labels(*labels)
        self.reconnects = RECONNECTS.labels(*labels)
        self.lag_bytes = LAG_BYTES.labels(*labels)
        self.retained_bytes = RETAINED_BYTES.labels(*labels)
        self.retained_over_limit = RETAINED_OVER_LIMIT.labels(*labels)
        self.labels = labels
        self.chunks_read_again = SNAPSHOT_CHUNKS_READ_AGAIN.labels(*labels)

    def snapshot_progress(self, table: str, rows: int, estimated: int, rows_per_s: float
                          ) -> None:
        SNAPSHOT_ROWS.labels(*self.labels, table).inc(rows)
        SNAPSHOT_ESTIMATED.labels(*self.labels, table).set(estimated)
        SNAPSHOT_RATE.labels(*self.labels, table).set(rows_per_s)
