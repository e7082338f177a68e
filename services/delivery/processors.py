"""Processors, applied in declared order to every event before fan-out.

- `filter`: keep events whose op is in `ops`, whose table matches `tables`, and for
  which `where` (a Spark SQL boolean expression) is true;
- `transform`: `set` columns to Spark SQL expressions, `drop` and `rename` columns;
- `route`: a destination template (`cdc.{database}.{table}`) the sinks use instead
  of their own;
- `outbox`: Debezium's outbox event router — an outbox row's insert becomes the message
  it stands for (`ChangeEvent.outbox`: key, payload, headers; routed by a column), the
  outbox table's other events are dropped, other tables' pass.
Expressions see the row's columns (the after-image; the before-image for
deletes) plus `op`, `database`, `schema` and `table` unless the row has a
column of that name. They were compiled when the spec loaded (`tailrace.config`
refuses what the evaluator cannot run); a chain compiles them again once per
worker process and evaluates them per batch, grouped by table, with sqlglot's
Python executor. An expression that fails on an event (its values: a string
divided by a number) marks that event failed (it goes to the DLQ when the journal
is on) and the others go on.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tailrace.config import (
    FilterProcessor,
    OutboxProcessor,
    RouteProcessor,
    TransformProcessor,
    compile_expression,
    evaluation_query,
)
from tailrace.errors import ConfigError
from tailrace.events import Column, Op, json_of, python_of, value_of
from tailrace.events._codec import op_name
from tailrace.proto.event_pb2 import ChangeEvent, OutboxHeader, OutboxMessage, Value
from tailrace.tables import TableMatcher

if TYPE_CHECKING:  # sqlglot is imported where it runs: not every pipeline has expressions
    from sqlglot import exp

Failure = tuple[ChangeEvent, str]


def _compile(expression: str, field: str, *, boolean: bool) -> exp.Expr:
    """As at load; a refusal here (a worker whose sqlglot differs from the driver's) is a
    configuration error that stops the pipeline."""
    try:
        return compile_expression(expression, boolean=boolean)
    except ValueError as e:
        raise ConfigError(f"{field}: {e}") from None


def _row(event: ChangeEvent) -> dict[str, Any]:
    image = event.before if event.op == Op.OP_DELETE else event.after
    row: dict[str, Any] = {"op": op_name(event.op), "database": event.database,
                           "schema": event.schema, "table": event.table}
    for col in image.columns:
        row[col.name] = python_of(col.value)
    return row


@functools.lru_cache(maxsize=64)
def _matcher(patterns: tuple[str, ...]) -> TableMatcher:
    return TableMatcher(patterns)


def table_matches(patterns: Sequence[str], event: ChangeEvent) -> bool:
    """`filter.tables`, with the capture's matcher (`tailrace.tables`): an event's (database,
    table), and a PostgreSQL event's (database, schema, table), so `schema.table` and
    `db.schema.table` select there too."""
    matcher = _matcher(tuple(patterns))
    return matcher.matches(event.database, event.table) or (
        bool(event.schema) and matcher.matches(event.database, event.schema, event.table))


def _evaluate(query: exp.Select, rows: list[dict[str, Any]]) -> list[tuple[Any, ...] | None]:
    """Run `query` (see `evaluation_query`) on `rows`; per row index its selected values, or
    None for rows filtered out."""
    from sqlglot.executor import execute

    columns = sorted({k for r in rows for k in r})
    table = [{**{c: None for c in columns}, **r, "__i": i} for i, r in enumerate(rows)]
    result = execute(query, tables={"t": table}, dialect="spark")
    out: list[tuple[Any, ...] | None] = [None] * len(rows)
    for r in result.rows:
        out[r[0]] = tuple(r[1:])
    return out


def _evaluate_isolating(query: exp.Select, rows: list[dict[str, Any]]
                        ) -> tuple[list[tuple[Any, ...] | None], dict[int, str]]:
    """As `_evaluate`, but an error is pinned to the rows that cause it."""
    try:
        return _evaluate(query, rows), {}
    except Exception:
        results: list[tuple[Any, ...] | None] = []
        errors: dict[int, str] = {}
        for i, row in enumerate(rows):
            try:
                results.extend(_evaluate(query, [row]))
            except Exception as e:  # noqa: BLE001 - reported per event
                results.append(None)
                errors[i] = f"{type(e).__name__}: {e}"
        return results, errors


@dataclass(frozen=True)
class _Filter:
    spec: FilterProcessor
    query: exp.Select | None  # the compiled `where`, if any

    def apply(self, events: list[ChangeEvent]) -> tuple[list[ChangeEvent], list[Failure]]:
        kept = [e for e in events
                if (self.spec.ops is None or op_name(e.op) in self.spec.ops)
                and (self.spec.tables is None or table_matches(self.spec.tables, e))]
        if self.query is None or not kept:
            return kept, []
        data_events = [e for e in kept if e.op not in (Op.OP_DDL, Op.OP_TRUNCATE)]
        keep_ids = {id(e) for e in kept if e.op in (Op.OP_DDL, Op.OP_TRUNCATE)}
        failures: list[Failure] = []
        for group in _by_table(data_events):
            results, errors = _evaluate_isolating(self.query, [_row(e) for e in group])
            for i, event in enumerate(group):
                if i in errors:
                    failures.append((event, f"filter where {self.spec.where!r}: {errors[i]}"))
                elif results[i] is not None:
                    keep_ids.add(id(event))
        return [e for e in kept if id(e) in keep_ids], failures


@dataclass(frozen=True)
class _Transform:
    spec: TransformProcessor
    query: exp.Select | None  # the compiled `set` expressions, if any

    def apply(self, events: list[ChangeEvent]) -> tuple[list[ChangeEvent], list[Failure]]:
        names = list(self.spec.set)
        out: list[ChangeEvent] = []
        failures: list[Failure] = []
        data_events = [e for e in events if e.op not in (Op.OP_DDL, Op.OP_TRUNCATE)]
        computed: dict[int, tuple[Any, ...]] = {}
        if self.query is not None:
            for group in _by_table(data_events):
                results, errors = _evaluate_isolating(self.query, [_row(e) for e in group])
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


def _text(value: Value) -> str:
    """A column's value as header or key text: JSON as written, others as JSON shows them."""
    if value.WhichOneof("kind") == "json_value":
        return value.json_value
    shown = json_of(value)
    return "" if shown is None else shown if isinstance(shown, str) else json.dumps(shown)


def _payload(value: Value) -> bytes:
    """The payload column as the application wrote it: JSON or text as UTF-8, bytes as
    they are, NULL as `null`."""
    kind = value.WhichOneof("kind")
    if kind == "bytes_value":
        return value.bytes_value
    if kind in (None, "null"):
        return b"null"
    return _text(value).encode()


@dataclass(frozen=True)
class _Outbox:
    spec: OutboxProcessor

    def apply(self, events: list[ChangeEvent]) -> tuple[list[ChangeEvent], list[Failure]]:
        out: list[ChangeEvent] = []
        failures: list[Failure] = []
        for event in events:
            if not table_matches([self.spec.table], event):
                out.append(event)
            elif event.op == Op.OP_INSERT:
                try:
                    out.append(self._message(event))
                except KeyError as e:
                    failures.append((event, f"outbox: the outbox row has no column {e}; "
                                            f"set the processor's column names"))
                except ValueError as e:
                    failures.append((event, f"outbox: {e}"))
            # the outbox table's updates, deletes, reads and DDL are not events to send
        return out, failures

    def _message(self, event: ChangeEvent) -> ChangeEvent:
        columns = {c.name: c.value for c in event.after.columns}
        spec = self.spec
        if json_of(columns[spec.route_by]) in (None, ""):
            raise ValueError(f"the outbox row's {spec.route_by} (route_by) is empty or NULL; "
                             "it names the topic, so every outbox row needs one")
        routed = _text(columns[spec.route_by])
        headers = [OutboxHeader(name="id", value=_text(columns[spec.id]).encode())]
        headers += [OutboxHeader(name=header, value=_text(columns[column]).encode())
                    for column, header in spec.additional_fields.items()]
        new = ChangeEvent()
        new.CopyFrom(event)
        # a literal for the sinks' template filling: braces in the value stay braces
        new.route = spec.route.format(routedByValue=routed).replace("{", "{{").replace("}", "}}")
        new.outbox.CopyFrom(OutboxMessage(key=_text(columns[spec.key]).encode(),
                                          payload=_payload(columns[spec.payload]),
                                          headers=headers))
        return new


def _by_table(events: list[ChangeEvent]) -> list[list[ChangeEvent]]:
    groups: dict[tuple[str, str, str], list[ChangeEvent]] = {}
    for e in events:
        groups.setdefault((e.database, e.schema, e.table), []).append(e)
    return list(groups.values())


class ProcessorChain:
    """The spec's processors, compiled once (per worker process), applied in order."""

    def __init__(self, specs: Sequence[Any]) -> None:
        self._steps: list[Any] = []
        for i, spec in enumerate(specs):
            field = f"spec.processors[{i}]"
            if isinstance(spec, FilterProcessor):
                where = (_compile(spec.where, f"{field}.where", boolean=True)
                         if spec.where else None)
                self._steps.append(_Filter(spec, evaluation_query([], where) if where else None))
            elif isinstance(spec, TransformProcessor):
                select = [(name, _compile(text, f"{field}.set.{name}", boolean=False))
                          for name, text in spec.set.items()]
                self._steps.append(_Transform(spec, evaluation_query(select, None)
                                              if select else None))
            elif isinstance(spec, RouteProcessor):
                self._steps.append(_Route(spec))
            elif isinstance(spec, OutboxProcessor):
                self._steps.append(_Outbox(spec))
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
