"""Sinks behind one interface; `build_sink` maps a sink spec to its implementation.

| spec type  | sink                     | tier                                              |
|------------|--------------------------|---------------------------------------------------|
| `kafka`    | `kafka.KafkaSink`        | at-least-once; exactly-once with `exactly_once`   |
| `nats`     | `nats.NatsSink`          | exactly-once within the stream's duplicate window |
| `redis`    | `redis.RedisSink`        | exactly-once (checkpoint in the same MULTI/EXEC)  |
| `postgres` | `postgres.PostgresSink`  | exactly-once (checkpoint row in the same tx)      |

Client libraries are imported only when their sink is built.
"""

from __future__ import annotations

from tailrace.config._model import KafkaSinkSpec, NatsSinkSpec, PostgresSinkSpec, RedisSinkSpec
from tailrace_services.delivery.sinks.base import (
    BatchCommit,
    ErrorClass,
    PerEventError,
    RetryPolicy,
    Sink,
)


def build_sink(spec: object, *, pipeline: str | None = None) -> Sink:
    """The sink for `spec`; `pipeline` names its stored checkpoint before the first write."""
    if isinstance(spec, RedisSinkSpec):
        from tailrace_services.delivery.sinks.redis import RedisSink

        return RedisSink(spec, pipeline=pipeline)
    if isinstance(spec, KafkaSinkSpec):
        from tailrace_services.delivery.sinks.kafka import KafkaSink

        return KafkaSink(spec, pipeline=pipeline)
    if isinstance(spec, NatsSinkSpec):
        from tailrace_services.delivery.sinks.nats import NatsSink

        return NatsSink(spec, pipeline=pipeline)
    if isinstance(spec, PostgresSinkSpec):
        from tailrace_services.delivery.sinks.postgres import PostgresSink

        return PostgresSink(spec, pipeline=pipeline)
    kind = getattr(spec, "type", type(spec).__name__)
    raise ValueError(f"unknown sink type {kind!r}; use kafka, nats, redis or postgres")


__all__ = ["BatchCommit", "ErrorClass", "PerEventError", "RetryPolicy", "Sink", "build_sink"]
