"""Checks across fields, once every field is valid on its own; each names the field to fix."""

from __future__ import annotations

from tailrace.config._model import FilterProcessor, OutboxProcessor, PipelineSpec

__all__ = ["cross_field_problems"]


def cross_field_problems(pipeline: PipelineSpec) -> list[tuple[str, str]]:
    """(field, problem) pairs; none for a spec that can run as written."""
    spec = pipeline.spec
    policy = spec.commit_policy
    problems: list[tuple[str, str]] = []
    if policy != "required":
        name = "all" if policy == "all" else "quorum"
        counted = ("every sink must acknowledge" if policy == "all"
                   else "every sink counts toward the quorum")
        problems += [(f"spec.sinks[{i}].required",
                      f"required: false has no effect under commit_policy {name} ({counted}); "
                      "remove it, or use commit_policy: required to let this sink fall behind")
                     for i, sink in enumerate(spec.sinks) if not sink.required]
    if not isinstance(policy, str) and policy.quorum > len(spec.sinks):
        problems.append(("spec.commit_policy.quorum",
                         f"{policy.quorum} can never be met by {len(spec.sinks)} sink(s); set "
                         f"it between 1 and {len(spec.sinks)}"))
    outbox = [i for i, p in enumerate(spec.processors) if isinstance(p, OutboxProcessor)]
    if outbox:
        problems += [(f"spec.sinks[{i}].type",
                      f"a {sink.type} sink cannot write outbox messages yet (key, payload, "
                      "headers): with an outbox processor, use kafka sinks")
                     for i, sink in enumerate(spec.sinks) if sink.type != "kafka"]
        problems += [(f"spec.processors[{i}].delete_delivered",
                      f"deleting delivered outbox rows is built for PostgreSQL sources, not "
                      f"{spec.source.type}; delete them in the application (e.g. in the "
                      "transaction that inserts them), and remove delete_delivered")
                     for i, p in enumerate(spec.processors) if isinstance(p, OutboxProcessor)
                     and p.delete_delivered and spec.source.type != "postgres"]
        if spec.bus.partitions > 1:
            problems.append(("spec.bus.partitions",
                             f"{spec.bus.partitions} bus partitions shard by the outbox row's "
                             "key, not the aggregate's, so one aggregate's events could pass "
                             "each other; use 1 with an outbox processor"))
    problems += _start_problems(pipeline)
    return problems


def _start_problems(pipeline: PipelineSpec) -> list[tuple[str, str]]:
    """`start: snapshot` promises the sink every row's current value: refused where a
    filter drops the snapshot's read events before any sink sees them."""
    spec = pipeline.spec
    dropping = [(i, p) for i, p in enumerate(spec.processors)
                if isinstance(p, FilterProcessor) and p.ops is not None and "read" not in p.ops]
    if not dropping:
        return []
    at, dropper = dropping[0]
    return [(f"spec.sinks[{i}].start",
             f"start: snapshot reads the tables for this sink, but spec.processors[{at}] "
             f"keeps only ops {', '.join(dropper.ops or [])} and drops the snapshot's read "
             "events; add read to its ops, or use start: now")
            for i, sink in enumerate(spec.sinks) if sink.start == "snapshot"]
