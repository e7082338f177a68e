"""The control service's Prometheus metrics about every pipeline, read at scrape time.

The control service is where every pipeline's state is known (an operator's pause, the
health delivery and capture report), so the state gauge is exported here, on
`tailrace-control --http-port`:

- `tailrace_pipeline_state{pipeline, state}`: 1 for the pipeline's current state, 0 for
  the others (`running`, `paused`, `failed`, `degraded`), so `== 1` selects it;
- per sink (`pipeline`, `sink`): `tailrace_sink_lag_offsets`, `tailrace_sink_lag_seconds`,
  `tailrace_sink_lag_bytes` (PostgreSQL), `tailrace_sink_lag_transactions`
  (MySQL/MariaDB) — see lag.py — and `tailrace_sink_failing` (1 while the sink's last
  batch failed) with `tailrace_sink_failed_batches`;
- `tailrace_health_state{subject, state}`: 1 for the state each source (capture) and
  pipeline (delivery) last reported, among `running`, `position_lost`, `failed`, `paused`,
  `degraded` — a lost position is `state="position_lost"`;
- `tailrace_source_retained_bytes{subject}`: the source log its server keeps for it;
- `tailrace_dlq_entries{pipeline}`: entries in the pipeline's dead-letter queue now.

Nothing is kept in memory: each scrape reads the storage, so every control replica
answers the same.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import REGISTRY, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from tailrace.control_client import HEALTH_STATES, PIPELINE_STATES
from tailrace.logs import get_logger
from tailrace_services.control.admin import sink_checkpoints
from tailrace_services.control.checkpoints import CheckpointStore
from tailrace_services.control.dlq import DeadLetterStore
from tailrace_services.control.epochs import EpochStore
from tailrace_services.control.health import HealthStore
from tailrace_services.control.pipelines import PipelineRegistry
from tailrace_services.control.storage import Storage

__all__ = ["STATES", "PipelineCollector", "register_pipeline_metrics"]

log = get_logger(__name__)

STATES = ("running", "paused", "failed", "degraded")


class PipelineCollector(Collector):
    def __init__(self, storage: Storage, health: HealthStore) -> None:
        self._pipelines = PipelineRegistry(storage, health)
        self._checkpoints = CheckpointStore(storage)
        self._epochs = EpochStore(storage)
        self._health = health
        self._dlq = DeadLetterStore(storage)

    def collect(self) -> Iterator[Metric]:
        state = GaugeMetricFamily("tailrace_pipeline_state",
                                  "1 for the pipeline's current state, 0 for the others",
                                  labels=["pipeline", "state"])
        sink = ["pipeline", "sink"]
        offsets = GaugeMetricFamily("tailrace_sink_lag_offsets",
                                    "Bus records between the sink's checkpoint and the latest "
                                    "epoch", labels=sink)
        seconds = GaugeMetricFamily("tailrace_sink_lag_seconds",
                                    "Source seconds between the sink's checkpoint and the "
                                    "latest epoch", labels=sink)
        wal = GaugeMetricFamily("tailrace_sink_lag_bytes",
                                "PostgreSQL: WAL bytes between the sink's checkpoint and the "
                                "latest epoch", labels=sink)
        txs = GaugeMetricFamily("tailrace_sink_lag_transactions",
                                "MySQL/MariaDB: source transactions between the sink's "
                                "checkpoint and the latest epoch", labels=sink)
        failing = GaugeMetricFamily("tailrace_sink_failing",
                                    "1 while the sink's last batch failed", labels=sink)
        failed = GaugeMetricFamily("tailrace_sink_failed_batches",
                                   "Batches in a row the sink did not acknowledge", labels=sink)
        health = GaugeMetricFamily("tailrace_health_state",
                                   "1 for the state a source or pipeline last reported, 0 for "
                                   "the others", labels=["subject", "state"])
        retained = GaugeMetricFamily("tailrace_source_retained_bytes",
                                     "Source log the server keeps for this source (last "
                                     "measured by capture)", labels=["subject"])
        dlq = GaugeMetricFamily("tailrace_dlq_entries",
                                "Entries in the pipeline's dead-letter queue", labels=["pipeline"])
        try:
            pipelines = self._pipelines.list()
            answers = [sink_checkpoints(self._pipelines, self._checkpoints, self._epochs, info)
                       for info in pipelines]
            reports = self._health.list()
            dead_letters = [self._dlq.count(info.name).count for info in pipelines]
        except Exception as e:  # a scrape must not fail because the storage is away
            log.warning("cannot read pipelines for metrics", error=str(e))
            return
        for info, answer in zip(pipelines, answers, strict=True):
            current = PIPELINE_STATES.get(info.state, "unknown")
            for name in STATES:
                state.add_metric([info.name, name], 1.0 if name == current else 0.0)
            for s in answer.sinks:
                labels = [info.name, s.sink_id]
                offsets.add_metric(labels, s.lag_offsets)
                seconds.add_metric(labels, s.lag_seconds)
                if s.HasField("lag_bytes"):
                    wal.add_metric(labels, s.lag_bytes)
                if s.HasField("lag_transactions"):
                    txs.add_metric(labels, s.lag_transactions)
                failing.add_metric(labels, 1.0 if s.last_error else 0.0)
                failed.add_metric(labels, s.failed_batches)
        names = {code: name for name, code in HEALTH_STATES.items()}
        for report in reports:
            for name in HEALTH_STATES:
                health.add_metric([report.subject_id, name],
                                  1.0 if names.get(report.state) == name else 0.0)
            if report.HasField("retained_bytes"):
                retained.add_metric([report.subject_id], report.retained_bytes)
        for info, count in zip(pipelines, dead_letters, strict=True):
            dlq.add_metric([info.name], count)
        yield from (state, offsets, seconds, wal, txs, failing, failed, health, retained, dlq)


def register_pipeline_metrics(storage: Storage, health: HealthStore) -> PipelineCollector:
    """Export the pipeline metrics on the default registry (what `/metrics` serves)."""
    collector = PipelineCollector(storage, health)
    REGISTRY.register(collector)
    return collector
