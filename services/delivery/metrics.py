"""Prometheus metrics of the delivery service (recorded in the driver from task outcomes)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

BATCH_EVENTS = Histogram("tailrace_delivery_batch_events", "events per micro-batch",
                         ["pipeline"], buckets=(1, 10, 100, 1000, 5000, 20000, 100000))
BATCH_SECONDS = Histogram("tailrace_delivery_batch_seconds", "micro-batch wall time by stage",
                          ["pipeline", "stage"])
SINK_SECONDS = Histogram("tailrace_delivery_sink_write_seconds", "time writing to a sink per batch",
                         ["pipeline", "sink"])
E2E_SECONDS = Histogram("tailrace_delivery_end_to_end_seconds",
                        "source commit -> sink ack, worst event of a batch", ["pipeline"],
                        buckets=(0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 300))
EVENTS = Counter("tailrace_delivery_events_total", "events delivered", ["pipeline", "sink"])
SINK_ERRORS = Counter("tailrace_delivery_sink_errors_total", "sink batches given up, by class",
                      ["pipeline", "sink", "error_class"])
DLQ_EVENTS = Counter("tailrace_delivery_dead_letters_total", "events sent to the DLQ", ["pipeline"])
CHECKPOINT_LAG = Gauge("tailrace_delivery_checkpoint_lag_offsets",
                       "bus offsets between the latest epoch and a sink's checkpoint",
                       ["pipeline", "sink"])
RESTARTS_WITHOUT_PROGRESS = Gauge("tailrace_delivery_restarts_without_progress",
                                  "query restarts in a row without a checkpoint advancing",
                                  ["pipeline"])
