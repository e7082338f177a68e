"""Table patterns: one matcher for the tables a capture reads and the events a filter keeps.

A pattern is dotted names: `shop.orders`, `shop.*`, `shop.order_%`, `%.orders`,
`public.orders` or `shop.public.orders`. `*` and `%` match any run of characters
within one name, never across a dot; names compare case-sensitively, as MySQL does
on Linux (`lower_case_table_names=0`) and PostgreSQL does with quoted identifiers.

A pattern of n names matches the last n names of a qualified name. So a source
gives its tables' full names and each source's patterns mean what its docs say:

- MySQL names a table (database, table): patterns are `db.table`;
- PostgreSQL names it (database, schema, table): `schema.table` matches in the
  DSN's database, `db.schema.table` names the database too;
- delivery's `filter.tables` tries an event's (database, table), and for a
  PostgreSQL event (database, schema, table) as well.

`system_databases` are never matched by a wildcard in a pattern's database part (the
first name of a pattern as long as the qualified name): `%.orders` must not select
MySQL's `mysql.orders`, but `mysql.orders` written out does.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable

__all__ = ["TableMatcher", "split_pattern"]

_CACHE_MAX = 4096


def split_pattern(pattern: str, levels: Collection[int] = (2, 3)) -> tuple[str, ...]:
    """The names of a pattern; ValueError when it has none empty and not `levels` of them."""
    parts = tuple(pattern.split("."))
    if len(parts) not in levels or not all(parts):
        forms = " or ".join({2: "db.table", 3: "db.schema.table"}.get(n, f"{n} names")
                            for n in sorted(levels))
        raise ValueError(f"table pattern {pattern!r}: use {forms}, with * or % as wildcards "
                         "(db.*, db.prefix%, %.table)")
    return parts


def _glob(name: str) -> re.Pattern[str] | str:
    """A compiled wildcard, or the name itself when it has none (compared with ==)."""
    if "*" not in name and "%" not in name:
        return name
    return re.compile(".*".join(re.escape(piece) for piece in re.split(r"[*%]", name)),
                      re.DOTALL)


class TableMatcher:
    """`matches(*names)` for a list of patterns; answers are cached (a capture asks for the
    same few tables for every row)."""

    def __init__(self, patterns: Iterable[str], *, levels: Collection[int] = (2, 3),
                 system_databases: Collection[str] = ()) -> None:
        self.patterns = list(patterns)
        self._system = frozenset(system_databases)
        self._parsed = [tuple(_glob(p) for p in split_pattern(pattern, levels))
                        for pattern in self.patterns]
        self._cache: dict[tuple[str, ...], bool] = {}

    def matches(self, *names: str) -> bool:
        """Does a pattern match the table qualified by `names` (database first)?"""
        found = self._cache.get(names)
        if found is None:
            if len(self._cache) >= _CACHE_MAX:
                self._cache.clear()
            found = self._cache[names] = any(self._match(p, names) for p in self._parsed)
        return found

    def _match(self, pattern: tuple[re.Pattern[str] | str, ...], names: tuple[str, ...]) -> bool:
        if len(pattern) > len(names):
            return False
        tail = names[len(names) - len(pattern):]
        if (len(pattern) == len(names) and not isinstance(pattern[0], str)
                and names[0] in self._system):
            return False
        return all(p == n if isinstance(p, str) else p.fullmatch(n) is not None
                   for p, n in zip(pattern, tail, strict=True))
