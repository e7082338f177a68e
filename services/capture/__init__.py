"""The capture wing: what both capture sources share, and the entry point of `tailrace-capture`.

A source (`capture_postgres`, `capture_mysql`) supplies the same parts under the same
names — `connection`, `reader`, `values`, `events`, `schema`, `position`, `identity`,
`tables`, `errors`, `service` — and runs on these shared ones:

- `lifecycle.py`  sessions, reconnects with backoff, health; the reconcile of a changed server;
- `resume.py`     where a session resumes: the one resume rule, with its per-source hook;
- `assembler.py`  the transaction loop: buffer -> stamp -> publish -> epoch;
- `changes.py`    a streamed row change kept as bytes, stamped into its bus record at commit;
- `txbuffer.py`   a whole source transaction, spilling to disk;
- `publisher.py`  whole transactions and epoch markers to the internal topic;
- `drift.py`      schema drift on a changed server, against the registry;
- `metrics.py`    the Prometheus metrics, labelled by `source_type`;
- `main.py`       `tailrace-capture PIPELINE.yaml`.
"""

from tailrace_services.capture.assembler import BEGIN, IDLE, Assembler, Commit, FeedItem
from tailrace_services.capture.drift import find_drift
from tailrace_services.capture.lifecycle import (
    CaptureLifecycle,
    CaptureService,
    Fail,
    Reconnect,
    Stop,
    reconcile_identity,
)
from tailrace_services.capture.metrics import CaptureMetrics
from tailrace_services.capture.publisher import BusPublisher
from tailrace_services.capture.resume import ResumePoint, ResumeRule, published_tail
from tailrace_services.capture.txbuffer import TransactionBuffer

__all__ = ["BEGIN", "IDLE", "Assembler", "BusPublisher", "CaptureLifecycle", "CaptureMetrics",
           "CaptureService", "Commit", "Fail", "FeedItem", "Reconnect", "ResumePoint",
           "ResumeRule", "Stop", "TransactionBuffer", "find_drift", "published_tail",
           "reconcile_identity"]
