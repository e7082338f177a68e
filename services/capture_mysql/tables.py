"""Table selection by pattern, and which tables a DDL statement touches.

A MySQL pattern is `db.table`; `%` and `*` are wildcards, so `shop.orders`,
`shop.*`, `shop.order_%` and `%.orders` all work. Names compare as MySQL does
on Linux with the default `lower_case_table_names=0`: case-sensitively.

DDL arrives as the text of a QueryEvent; `ddl_targets` finds the tables it
names (ALTER/CREATE/DROP/RENAME/TRUNCATE TABLE, CREATE/DROP INDEX ... ON),
resolving unqualified names against the event's default database.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass
from functools import lru_cache

__all__ = ["DdlTarget", "TableFilter", "ddl_targets", "is_ddl"]

_SYSTEM_DBS = frozenset({"mysql", "information_schema", "performance_schema", "sys"})


class TableFilter:
    """`matches(db, table)` for the spec's patterns; system databases never match `%`."""

    def __init__(self, patterns: list[str]) -> None:
        self.patterns = list(patterns)
        self._globs: list[tuple[str, str, bool]] = []
        for pattern in patterns:
            db, sep, table = pattern.partition(".")
            if not sep or not db or not table or "." in table:
                raise ValueError(f"table pattern {pattern!r}: use db.table, db.*, db.prefix% "
                                 "or %.table")
            wild_db = any(c in db for c in "%*")
            self._globs.append((db.replace("%", "*"), table.replace("%", "*"), wild_db))

    @lru_cache(maxsize=4096)  # noqa: B019 - one filter per capture, a bounded cache
    def matches(self, database: str, table: str) -> bool:
        for db_glob, table_glob, wild_db in self._globs:
            if wild_db and database in _SYSTEM_DBS:
                continue
            if fnmatch.fnmatchcase(database, db_glob) and fnmatch.fnmatchcase(table, table_glob):
                return True
        return False

    def databases(self) -> set[str] | None:
        """The databases named literally, or None when a pattern has a wildcard database."""
        names = set()
        for db_glob, _, wild_db in self._globs:
            if wild_db:
                return None
            names.add(db_glob)
        return names


@dataclass(frozen=True, slots=True)
class DdlTarget:
    kind: str  # "alter" | "create" | "drop" | "rename" | "truncate" | "index"
    database: str
    table: str


_IDENT = r"(?:`(?:[^`]|``)+`|[A-Za-z0-9_$]+)"
_NAME = rf"({_IDENT}(?:\s*\.\s*{_IDENT})?)"
_COMMENTS = re.compile(r"/\*(?!!).*?\*/|#[^\n]*|--\s[^\n]*", re.S)
_VERSIONED = re.compile(r"/\*!\d*\s*(.*?)\*/", re.S)
_DDL_START = re.compile(
    r"^\s*(ALTER|CREATE|DROP|RENAME|TRUNCATE)\b", re.I)
_PATTERNS: list[tuple[str, re.Pattern[str]]] = [
    ("alter", re.compile(rf"^ALTER\s+(?:ONLINE\s+|IGNORE\s+)*TABLE\s+(?:IF\s+EXISTS\s+)?{_NAME}",
                         re.I)),
    ("create", re.compile(
        rf"^CREATE\s+(?:OR\s+REPLACE\s+)?(?:TEMPORARY\s+)?TABLE\s+(?:IF\s+NOT\s+EXISTS\s+)?{_NAME}",
        re.I)),
    ("truncate", re.compile(rf"^TRUNCATE\s+(?:TABLE\s+)?{_NAME}", re.I)),
    ("index", re.compile(
        rf"^(?:CREATE|DROP)\s+(?:OR\s+REPLACE\s+)?(?:ONLINE\s+)?(?:UNIQUE\s+|FULLTEXT\s+|SPATIAL\s+)?"
        rf"INDEX\s+(?:IF\s+(?:NOT\s+)?EXISTS\s+)?{_IDENT}\s+ON\s+{_NAME}", re.I)),
]
_DROP = re.compile(r"^DROP\s+(?:TEMPORARY\s+)?TABLES?\s+(?:IF\s+EXISTS\s+)?(.*?)"
                   r"(?:\s+(?:RESTRICT|CASCADE))?\s*$", re.I | re.S)
_RENAME = re.compile(r"^RENAME\s+TABLES?\s+(.*)$", re.I | re.S)
_ALTER_RENAME = re.compile(rf"\bRENAME\s+(?:TO\s+|AS\s+)?{_NAME}\s*$", re.I)


def _unquote(ident: str) -> str:
    ident = ident.strip()
    if ident.startswith("`") and ident.endswith("`"):
        return ident[1:-1].replace("``", "`")
    return ident


def _split_name(name: str, default_db: str) -> tuple[str, str]:
    parts = re.findall(_IDENT, name)
    if len(parts) == 2:
        return _unquote(parts[0]), _unquote(parts[1])
    return default_db, _unquote(parts[0])


def _clean(query: str) -> str:
    text = _VERSIONED.sub(r"\1", query)
    return _COMMENTS.sub(" ", text).strip().rstrip(";").strip()


def is_ddl(query: str) -> bool:
    return bool(_DDL_START.match(_clean(query)))


def ddl_targets(query: str, default_db: str) -> list[DdlTarget]:
    """The tables a DDL statement changes; [] for anything else (CREATE DATABASE, views, ...)."""
    text = _clean(query)
    drop = _DROP.match(text)
    if drop and re.match(r"^DROP\s+(?:TEMPORARY\s+)?TABLES?\b", text, re.I):
        return [DdlTarget("drop", *_split_name(n, default_db))
                for n in re.findall(_NAME, drop.group(1))]
    rename = _RENAME.match(text)
    if rename:
        out = []
        for pair in rename.group(1).split(","):
            names = re.findall(_NAME, re.sub(r"\s+TO\s+", " ", pair, flags=re.I).strip())
            out.extend(DdlTarget("rename", *_split_name(n, default_db)) for n in names[:2])
        return out
    for kind, pattern in _PATTERNS:
        m = pattern.match(text)
        if m:
            targets = [DdlTarget(kind, *_split_name(m.group(1), default_db))]
            if kind == "alter":
                renamed = _ALTER_RENAME.search(text)
                if renamed and not re.search(r"\bRENAME\s+(?:COLUMN|INDEX|KEY)\b", text, re.I):
                    targets.append(DdlTarget("rename", *_split_name(renamed.group(1),
                                                                     default_db)))
            return targets
    return []
