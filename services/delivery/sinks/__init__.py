"""Sinks behind one interface; `build_sink` maps a sink spec to its implementation."""

from __future__ import annotations

from tailrace.config._model import RedisSinkSpec
from tailrace_services.delivery.sinks.base import Sink


def build_sink(spec: object) -> Sink:
    if isinstance(spec, RedisSinkSpec):
        from tailrace_services.delivery.sinks.redis import RedisSink

        return RedisSink(spec)
    kind = getattr(spec, "type", type(spec).__name__)
    raise NotImplementedError(f"sink type {kind!r} is not available yet")


__all__ = ["Sink", "build_sink"]
