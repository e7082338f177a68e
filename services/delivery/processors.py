"""Processors, applied in declared order to every event before fan-out.

- `filter`: keep events whose op is in `ops`, whose table matches `tables`, and for
  which `where` (a Spark SQL boolean expression) is true;
- `transform`: `set` columns to Spark SQL expressions, `drop` and `rename` columns;
- `route`: a destination template (`cdc.{database}.{table}`) the sinks use instead
  of their own.
Expressions see the row's columns (the after-image; the before-image for
deletes) plus `op`, `database`, `schema` and `table` unless the row has a
column of that name. They are parsed with sqlglot's Spark dialect and
evaluated per batch, grouped by table. An expression that fails on an event
marks that event failed (it goes to the DLQ when the journal is on) and the
others go on.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import sqlglot
from sqlglot import exp
from sqlglot.executor import execute

from tailrace.config._model import FilterProcessor, RouteProcessor, TransformProcessor
from tailrace.errors import ConfigError
from tailrace.events import Column, Op, python_of, value_of
from tailrace.events._codec import op_name
from tailrace.proto.event_pb2 import ChangeEvent

Failure = tuple[ChangeEvent, str]


def _parse(expression: str, field: str) -> exp.Expression:
    try:
        return sqlglot.parse_one(expression, dialect="spark")
    except sqlglot.errors.ParseError as e:
        raise ConfigError(f"{field}: not a valid Spark SQL expression {expression!r}: "
                          f"{str(e).splitlines()[0]}") from None


def _row(event: ChangeEvent) -> dict[str, Any]:
    image = event.before if event.op == Op.OP_DELETE else event.after
    row: dict[str, Any] = {"op": op_name(event.op), "database": event.database,
                           "schema": event.schema, "table": event.table}
    for col in image.columns:
        row[col.name] = python_of(col.value)
    return row


def _table_matches(patterns: Sequence[str], event: ChangeEvent) -> bool:
    names = [f"{event.database}.{event.table}"]
    if event.schema:
        names += [f"{event.schema}.{event.table}", f"{event.database}.{event.schema}.{event.table}"]
    return any(fnmatch.fnmatchcase(n, p.replace("%", "*")) for p in patterns for n in names)


def _evaluate(select: list[str], where: str | None, rows: list[dict[str, Any]]
              ) -> list[tuple[Any, ...] | None]:
    """Run `SELECT select FROM t WHERE where` per row index; None for rows filtered out."""
    columns = sorted({k for r in rows for k in r})
    table = [{**{c: None for c in columns}, **r, "__i": i} for i, r in enumerate(rows)]
    query = f"SELECT __i{''.join(', ' + s for s in select)} FROM t"
    if where:
        query += f" WHERE {where}"
    result = execute(query, tables={"t": table}, dialect="spark")
    out: list[tuple[Any, ...] | None] = [None] * len(rows)
    for r in result.rows:
        out[r[0]] = tuple(r[1:])
    return out


def _evaluate_isolating(select: list[str], where: str | None, rows: list[dict[str, Any]]
                        ) -> tuple[list[tuple[Any, ...] | None], dict[int, str]]:
    """As `_evaluate`, but an error is pinned to the rows that cause it."""
    try:
        return _evaluate(select, where, rows), {}
    except Exception:
        results: list[tuple[Any, ...] | None] = []
        errors: dict[int, str] = {}
        for i, row in enumerate(rows):
            try:
                results.extend(_evaluate(select, where, [row]))
            except Exception as e:  # noqa: BLE001 - reported per event
                results.append(None)
                errors[i] = f"{type(e).__name__}: {e}"
        return results, errors


@dataclass(frozen=True)
class _Filter:
    spec: FilterProcessor

    def apply(self, events: list[ChangeEvent]) -> tuple[list[ChangeEvent], list[Failure]]:
        kept = [e for e in events
                if (self.spec.ops is None or op_name(e.op) in self.spec.ops)
                and (self.spec.tables is None or _table_matches(self.spec.tables, e))]
        if not self.spec.where or not kept:
            return kept, []
        data_events = [e for e in kept if e.op not in (Op.OP_DDL, Op.OP_TRUNCATE)]
        keep_ids = {id(e) for e in kept if e.op in (Op.OP_DDL, Op.OP_TRUNCATE)}
        failures: list[Failure] = []
        for group in _by_table(data_events):
            results, errors = _evaluate_isolating([], self.spec.where, [_row(e) for e in group])
            for i, event in enumerate(group):
                if i in errors:
                    failures.append((event, f"filter where {self.spec.where!r}: {errors[i]}"))
                elif results[i] is not None:
                    keep_ids.add(id(event))
        return [e for e in kept if id(e) in keep_ids], failures


@dataclass(frozen=True)
class _Transform:
    spec: TransformProcessor

    def apply(self, events: list[ChangeEvent]) -> tuple[list[ChangeEvent], list[Failure]]:
        names = list(self.spec.set)
        select = [f"{expr} AS `{name}`" for name, expr in self.spec.set.items()]
        out: list[ChangeEvent] = []
        failures: list[Failure] = []
        data_events = [e for e in events if e.op not in (Op.OP_DDL, Op.OP_TRUNCATE)]
        computed: dict[int, tuple[Any, ...]] = {}
        for group in _by_table(data_events) if select else []:
            results, errors = _evaluate_isolating(select, None, [_row(e) for e in group])
            for i, event in enumerate(group):
                if i in errors:
                    failures.append((event, f"transform: {errors[i]}"))
                else:
                    computed[id(event)] = results[i] or ()
        failed = {id(e) for e, _ in failures}
        for event in events:
            if id(event) in failed:
                continue
            new = ChangeEvent()
            new.CopyFrom(event)
            for image in (new.before, new.after):
                if not image.columns:
                    continue
                self._reshape(image, names, computed.get(id(event)))
            out.append(new)
        return out, failures

    def _reshape(self, image: Any, names: list[str], values: tuple[Any, ...] | None) -> None:
        cols = [c for c in image.columns if c.name not in set(self.spec.drop)]
        for c in cols:
            c.name = self.spec.rename.get(c.name, c.name)
        if values is not None:
            by_name = {c.name: c for c in cols}
            for name, value in zip(names, values, strict=True):
                if name in by_name:
                    by_name[name].value.CopyFrom(value_of(value))
                else:
                    cols.append(Column(name=name, type="computed", value=value_of(value)))
        kept = [Column(name=c.name, type=c.type, value=c.value) for c in cols]
        del image.columns[:]
        image.columns.extend(kept)


@dataclass(frozen=True)
class _Route:
    spec: RouteProcessor

    def apply(self, events: list[ChangeEvent]) -> tuple[list[ChangeEvent], list[Failure]]:
        for event in events:
            event.route = self.spec.to
        return events, []


def _by_table(events: list[ChangeEvent]) -> list[list[ChangeEvent]]:
    groups: dict[tuple[str, str, str], list[ChangeEvent]] = {}
    for e in events:
        groups.setdefault((e.database, e.schema, e.table), []).append(e)
    return list(groups.values())


class ProcessorChain:
    """The spec's processors, validated once, applied in order."""

    def __init__(self, specs: Sequence[Any]) -> None:
        self._steps: list[Any] = []
        for i, spec in enumerate(specs):
            field = f"spec.processors[{i}]"
            if isinstance(spec, FilterProcessor):
                if spec.where:
                    _parse(spec.where, f"{field}.where")
                self._steps.append(_Filter(spec))
            elif isinstance(spec, TransformProcessor):
                for name, expression in spec.set.items():
                    _parse(expression, f"{field}.set.{name}")
                self._steps.append(_Transform(spec))
            elif isinstance(spec, RouteProcessor):
                self._steps.append(_Route(spec))
            else:
                raise ConfigError(f"{field}: unknown processor {spec!r}")

    def __bool__(self) -> bool:
        return bool(self._steps)

    def apply(self, events: list[ChangeEvent]) -> tuple[list[ChangeEvent], list[Failure]]:
        """The events that go on, in order, and the (event, reason) pairs that failed."""
        failures: list[Failure] = []
        for step in self._steps:
            events, failed = step.apply(events)
            failures.extend(failed)
        return events, failures
