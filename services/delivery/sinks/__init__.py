"""Sinks behind one interface; `build_sink` maps a sink spec to its implementation.

| spec type               | sink                           | tier                                |
|-------------------------|--------------------------------|-------------------------------------|
| `kafka`                 | `kafka.KafkaSink`              | at-least-once (idempotent producer) |
| `kafka`, `exactly_once` | `kafka.TransactionalKafkaSink` | exactly-once (checkpoint in the tx) |
| `nats`                  | `nats.NatsSink`                | exactly-once within the dup. window |
| `redis`                 | `redis.RedisSink`              | exactly-once (checkpoint in EXEC)   |
| `postgres`              | `postgres.PostgresSink`        | exactly-once (checkpoint row in tx) |

The exactly-once ones share `exactly_once.ExactlyOnceSink`: read the stored checkpoint,
skip what it covers, write the rest with the new checkpoint, atomically.
Client libraries are imported only when their sink is built.
"""

from __future__ import annotations

from tailrace.config import KafkaSinkSpec, NatsSinkSpec, PostgresSinkSpec, RedisSinkSpec
from tailrace_services.delivery.sinks.base import (
    BatchCommit,
    PerEventError,
    RetryPolicy,
    Sink,
)


def build_sink(spec: object, *, pipeline: str | None = None,
               on_schema_drift: str = "adapt") -> Sink:
    """The sink for `spec`; `pipeline` names its stored checkpoint before the first write;
    `on_schema_drift` (the source's) says whether a Kafka sink's registry refusing a schema
    stops the pipeline (halt) or fails the event alone (adapt)."""
    if isinstance(spec, RedisSinkSpec):
        from tailrace_services.delivery.sinks.redis import RedisSink

        return RedisSink(spec, pipeline=pipeline)
    if isinstance(spec, KafkaSinkSpec):
        from tailrace_services.delivery.sinks.kafka import KafkaSink, TransactionalKafkaSink

        kind = TransactionalKafkaSink if spec.exactly_once else KafkaSink
        return kind(spec, pipeline=pipeline, on_schema_drift=on_schema_drift)
    if isinstance(spec, NatsSinkSpec):
        from tailrace_services.delivery.sinks.nats import NatsSink

        return NatsSink(spec, pipeline=pipeline)
    if isinstance(spec, PostgresSinkSpec):
        from tailrace_services.delivery.sinks.postgres import PostgresSink

        return PostgresSink(spec, pipeline=pipeline)
    name = getattr(spec, "type", type(spec).__name__)
    raise ValueError(f"unknown sink type {name!r}; use kafka, nats, redis or postgres")


__all__ = ["BatchCommit", "PerEventError", "RetryPolicy", "Sink", "build_sink"]
