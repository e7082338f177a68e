"""Processor expressions: Spark SQL, compiled once when the spec loads.

An expression (`filter.where`, a `transform.set` value) is parsed with sqlglot's Spark
dialect and then run once by the evaluator that runs it on the executors (sqlglot's
Python executor), on a row whose columns are all NULL. What the evaluator cannot run on
any row is refused here, with the reason: a syntax error, a statement instead of an
expression, a function the evaluator does not have, an aggregate or window function (an
expression sees one row). Errors that depend on the values (a string divided by a
number) are left to the rows that cause them: such an event fails alone (dead-letter
queue with the journal on).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

# sqlglot (~0.15 s to import) is imported by the functions that use it: every process that
# imports the config would pay for it (each of delivery's Spark Python workers), and only
# a spec with expressions needs it.
if TYPE_CHECKING:
    from sqlglot import exp

__all__ = ["compile_expression", "evaluation_query"]

INDEX = "__i"  # the row's place in its group, carried through the query
# What an expression sees besides the row's own columns (delivery's processors._row)
_SAMPLE = {"op": "insert", "database": "db", "schema": "public", "table": "t"}
_UNDEFINED = re.compile(r"name '(\w+)' is not defined")


def evaluation_query(select: list[tuple[str, exp.Expr]], where: exp.Expr | None
                     ) -> exp.Select:
    """`SELECT __i, <expression> AS <name>, ... FROM t [WHERE <where>]`: what the evaluator
    runs per table group, one output row per input row kept."""
    from sqlglot import exp

    query = exp.select(INDEX, *(exp.alias_(e.copy(), name, quoted=True) for name, e in select))
    query = query.from_("t")
    return query.where(where.copy()) if where is not None else query


def compile_expression(text: str, *, boolean: bool) -> exp.Expr:
    """The parsed expression; ValueError saying why the evaluator cannot run it. `boolean`:
    a filter's `where` (else a computed column)."""
    import sqlglot
    from sqlglot.errors import SqlglotError

    try:
        tree = sqlglot.parse_one(text, dialect="spark")
    except SqlglotError as e:
        raise ValueError(f"not a valid Spark SQL expression {text!r}: "
                         f"{str(e).splitlines()[0]}") from None
    _refuse_shapes(tree, text)
    _trial(tree, text, boolean)
    return tree


def _refuse_shapes(tree: exp.Expr, text: str) -> None:
    from sqlglot import exp

    if isinstance(tree, exp.Block):
        raise ValueError(f"{text!r} holds more than one expression; write one")
    if isinstance(tree, exp.Query | exp.Command | exp.DDL | exp.DML):
        raise ValueError(f"{text!r} is a statement; write an expression such as "
                         "\"amount > 100 AND op != 'delete'\"")
    for node in tree.walk():
        shown = node.sql(dialect="spark")
        if isinstance(node, exp.AggFunc | exp.Window):
            raise ValueError("aggregate and window functions are not allowed (an expression "
                             f"sees one row at a time): {shown}")
        if isinstance(node, exp.Subquery | exp.Query):
            raise ValueError(f"subqueries are not allowed (an expression sees one row at a "
                             f"time): {shown}")
        if isinstance(node, exp.Alias):
            raise ValueError(f"no alias (AS) here, a computed column is named by its key in "
                             f"`set`: {shown}")
        if isinstance(node, exp.Star):
            raise ValueError("* is not allowed: name the columns")


def _trial(tree: exp.Expr, text: str, boolean: bool) -> None:
    """Run the expression on one row of NULLs: what fails there fails on every row."""
    from sqlglot import exp
    from sqlglot.errors import ExecuteError, SqlglotError
    from sqlglot.executor import execute

    columns = {c.name for c in tree.find_all(exp.Column)}
    row = {**{c: None for c in columns}, **_SAMPLE, INDEX: 0}
    query = (evaluation_query([], tree) if boolean else evaluation_query([("v", tree)], None))
    try:
        execute(query, tables={"t": [row]}, dialect="spark")
    except ExecuteError as e:
        cause = e.__cause__
        if isinstance(cause, NameError):
            raise ValueError(_unsupported(tree, text, str(cause))) from None
        if isinstance(cause, SyntaxError | SqlglotError):
            raise ValueError(f"the processor evaluator (sqlglot's Python executor) cannot run "
                             f"{text!r}: {type(cause).__name__}: {cause}") from None
        # anything else depends on the values: the event that causes it fails alone
    except SqlglotError as e:  # planning: a column qualified by a table, ...
        raise ValueError(f"the processor evaluator cannot run {text!r}: "
                         f"{str(e).splitlines()[0]}") from None


def _unsupported(tree: exp.Expr, text: str, error: str) -> str:
    """`date_format(...)`: the function the evaluator lacks, as the user wrote it."""
    from sqlglot import exp

    found = _UNDEFINED.search(error)
    name = found.group(1) if found else ""
    for node in tree.walk():
        anonymous = isinstance(node, exp.Anonymous) and node.name.upper() == name
        if anonymous or (isinstance(node, exp.Func) and type(node).__name__.upper() == name):
            shown = node.sql(dialect="spark")
            return (f"not supported by the processor evaluator (sqlglot's Python executor has "
                    f"no {name}): {shown}; rewrite {text!r} without it")
    return f"the processor evaluator (sqlglot's Python executor) cannot run {text!r}: {error}"
