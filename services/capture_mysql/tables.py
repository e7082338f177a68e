"""Table selection by pattern, and which tables a DDL statement touches.

A MySQL pattern is `db.table`; `%` and `*` are wildcards, so `shop.orders`,
`shop.*`, `shop.order_%` and `%.orders` all work. Names compare as MySQL does
on Linux with the default `lower_case_table_names=0`: case-sensitively; the system
databases (`mysql`, `information_schema`, `performance_schema`, `sys`) never match a
wildcard database. The matcher is `tailrace.tables`, the one delivery's filters use.

DDL arrives as the text of a QueryEvent; `ddl_targets` finds the tables it
names (ALTER/CREATE/DROP/RENAME/TRUNCATE TABLE, CREATE/DROP INDEX ... ON),
resolving unqualified names against the event's default database.

A row-format server still logs a session's DML as statement text when that
session set `binlog_format` to STATEMENT or MIXED. `written_tables` tells which
tables such a statement may write, so capture can stop on one that touches a
captured table instead of skipping it; None means it cannot be told (a
function or procedure call, an unparsable statement) and counts as touching.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from tailrace.tables import TableMatcher

__all__ = ["SYSTEM_DATABASES", "DdlTarget", "TableFilter", "ddl_targets", "is_ddl",
           "written_tables"]

SYSTEM_DATABASES = frozenset({"mysql", "information_schema", "performance_schema", "sys"})


class TableFilter(TableMatcher):
    """`matches(db, table)` for the spec's `db.table` patterns (ValueError for another form);
    `exclude`d tables (the snapshot signal table) never match."""

    def __init__(self, patterns: Iterable[str], exclude: Iterable[tuple[str, str]] = ()) -> None:
        super().__init__(patterns, levels=(2,), system_databases=SYSTEM_DATABASES)
        self.exclude = frozenset(exclude)

    def matches(self, *names: str) -> bool:
        return names not in self.exclude and super().matches(*names)


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
        out: list[DdlTarget] = []
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


# -- statement-based data changes ------------------------------------------------------

# Logged statements that write no table rows (DDL is checked separately).
_NO_ROWS = re.compile(
    r"^(?:$|GRANT|REVOKE|FLUSH|ANALYZE|OPTIMIZE|REPAIR|CHECK|INSTALL|UNINSTALL|"
    r"SET\s+(?:PASSWORD|DEFAULT\s+ROLE|ROLE)\b|"
    r"(?:CREATE|ALTER|DROP|RENAME)\s+(?:OR\s+REPLACE\s+)?(?:DEFINER\s*=\s*\S+\s+)?"
    r"(?:SQL\s+SECURITY\s+\w+\s+)?(?:ALGORITHM\s*=\s*\w+\s+)?"
    r"(?:DATABASE|SCHEMA|USER|ROLE|VIEW|TRIGGER|PROCEDURE|FUNCTION|EVENT|SERVER|SEQUENCE|"
    r"AGGREGATE\s+FUNCTION|PACKAGE)\b)", re.I)
_SET_STATEMENT = re.compile(r"^SET\s+STATEMENT\s+.*?\s+FOR\s+", re.I | re.S)
_STRINGS = re.compile(r"'(?:[^'\\]|\\.|'')*'|\"(?:[^\"\\]|\\.|\"\")*\"", re.S)
_INSERT = re.compile(rf"^(?:INSERT|REPLACE)\s+(?:(?:LOW_PRIORITY|DELAYED|HIGH_PRIORITY|IGNORE)\s+)*"
                     rf"(?:INTO\s+)?{_NAME}", re.I)
_LOAD = re.compile(rf"^LOAD\s+(?:DATA|XML)\b.*?\bINTO\s+TABLE\s+{_NAME}", re.I | re.S)
_UPDATE = re.compile(r"^UPDATE\s+(?:(?:LOW_PRIORITY|IGNORE)\s+)*(.*?)\s+SET\s", re.I | re.S)
_DELETE = re.compile(r"^DELETE\s+(?:(?:LOW_PRIORITY|QUICK|IGNORE)\s+)*(.*)$", re.I | re.S)
_DELETE_END = re.compile(r"\s+(?:WHERE|ORDER\s+BY|LIMIT|RETURNING|PARTITION)\b.*$", re.I | re.S)
_JOIN = re.compile(r",|\b(?:NATURAL\s+)?(?:(?:LEFT|RIGHT|INNER|CROSS|FULL)\s+)?(?:OUTER\s+)?"
                   r"(?:JOIN|STRAIGHT_JOIN)\b", re.I)
_ON = re.compile(r"\s+(?:ON|USING)\b.*$", re.I | re.S)
_CREATE_SELECT = re.compile(r"\bSELECT\b", re.I)


def _references(text: str, default_db: str) -> list[tuple[str, str]] | None:
    """The tables of a `table_references` list (joins, commas, aliases, ON/USING dropped)."""
    out = []
    for part in _JOIN.split(text.replace("(", " ").replace(")", " ")):
        part = _ON.sub("", part).strip()
        if not part:
            continue
        if part.upper().startswith("SELECT"):
            return None  # a derived table in the references: not parsed
        m = re.match(_NAME, part)
        if m is None:
            return None
        out.append(_split_name(m.group(1), default_db))
    return out or None


def written_tables(query: str, default_db: str) -> list[tuple[str, str]] | None:
    """The tables a logged statement may write rows of: [] for none, None when unknown.

    A multi-table UPDATE or DELETE counts every table it names (a superset is
    safe: it can only stop capture, never skip a change).
    """
    text = _SET_STATEMENT.sub("", _clean(query))
    if _STRINGS.search(text):
        text = _STRINGS.sub("''", text)
    if is_ddl(text):
        created = ddl_targets(text, default_db)
        if created and created[0].kind == "create" and _CREATE_SELECT.search(text):
            return [(created[0].database, created[0].table)]  # CREATE TABLE ... SELECT
        return []
    if _NO_ROWS.match(text):
        return []
    for pattern in (_INSERT, _LOAD):
        m = pattern.match(text)
        if m:
            return [_split_name(m.group(1), default_db)]
    m = _UPDATE.match(text)
    if m:
        return _references(m.group(1), default_db)
    m = _DELETE.match(text)
    if m:
        # DELETE FROM t ... | DELETE t1, t2 FROM refs ... | DELETE FROM t1, t2 USING refs ...
        rest = _DELETE_END.sub("", m.group(1))
        first, _, after_from = re.split(r"(?:^|\s)(FROM)\s+", rest, maxsplit=1, flags=re.I) \
            if re.search(r"(?:^|\s)FROM\s", rest, re.I) else (rest, "", "")
        refs = re.split(r"\s+USING\s+", after_from, maxsplit=1, flags=re.I)[-1]
        return _references(refs, default_db)
    return None  # SELECT f(), DO, CALL, WITH ...: may write anywhere
