"""Parser of the pgoutput logical replication protocol, versions 1 and 2.

The payload of each XLogData message is one pgoutput message. Relation ('R') and
Type ('Y') messages describe tables and custom types before the first change that
needs them, once per session (again after a DDL); `PgOutputDecoder` keeps them so
that Insert/Update/Delete can name their columns and convert their values.

Column values come out serialized, as the `Value` each becomes in an event (see
`values.py`: the server's text straight to those bytes, in C where `_cwire` is built,
without a Python value in between): NULL is `NULL_VALUE`; a TOASTed value the server did
not send because it did not change is `UNCHANGED_VALUE` (`tailrace.events.UNCHANGED_TOAST`,
never NULL). An old tuple of kind 'K' (replica identity DEFAULT or USING INDEX) carries
only the key columns: its other columns are NULL, which means "not sent"; the
`old_is_key_only` flag says which kind it is.

Version 2 adds streamed transactions (`streaming 'on'`): the server sends a large
transaction's changes while it is still open, in blocks between a StreamStart and a
StreamStop, then its StreamCommit or StreamAbort (of it or of one of its
subtransactions). Inside a block every change, Relation, Type and Truncate carries the
xid of its (sub)transaction after its type byte, a transactional Message its top
transaction's: `PgOutputDecoder.xid` holds the last one read, 0 outside blocks. A Relation
in a block is the streamed transaction's own until it commits (`stream_relations`): the
structure a DDL in it gives a table, which other transactions do not have yet.

Timestamps (`commit_ts_us`) are converted from the PostgreSQL epoch (2000-01-01)
to Unix microseconds.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from tailrace.events import UNCHANGED_TOAST, value_of
from tailrace.events._wire import NULL, column_prefix, cwire
from tailrace_services.capture_postgres.values import (
    ARRAY_ELEMENTS,
    Encoder,
    encoder_for,
    kind_for,
)

__all__ = [
    "STREAM_STOP",
    "Begin",
    "Commit",
    "Delete",
    "Insert",
    "LogicalMessage",
    "Message",
    "Origin",
    "PgOutputDecoder",
    "Relation",
    "RelationColumn",
    "StreamAbort",
    "StreamCommit",
    "StreamStart",
    "StreamStop",
    "Truncate",
    "TypeInfo",
    "Update",
    "format_type",
]

NULL_VALUE = NULL
UNCHANGED_VALUE = value_of(UNCHANGED_TOAST).SerializeToString()

PG_EPOCH_US = 946_684_800_000_000  # 2000-01-01 00:00:00 UTC in Unix microseconds

_BEGIN = struct.Struct(">QqI")
_COMMIT = struct.Struct(">bQQq")
_U64 = struct.Struct(">Q")
_U32 = struct.Struct(">I")
_U16 = struct.Struct(">H")
_COLUMN = struct.Struct(">Ii")
_TRUNCATE = struct.Struct(">IB")
_STREAM_START = struct.Struct(">IB")
_STREAM_COMMIT = struct.Struct(">IbQQq")
_STREAM_ABORT = struct.Struct(">II")
# the messages that carry their (sub)transaction's xid inside a stream block: Insert,
# Update, Delete, Truncate, Relation, Type, Message
_STREAMED_KINDS = frozenset(b"IUDTRYM")


# Not frozen: a frozen dataclass's __init__ sets each field through object.__setattr__
# (~3x the time), and one of these is made per WAL message.
@dataclass(slots=True)
class Begin:
    final_lsn: int
    commit_ts_us: int
    xid: int


@dataclass(slots=True)
class Commit:
    flags: int
    commit_lsn: int
    end_lsn: int
    commit_ts_us: int


@dataclass(frozen=True, slots=True)
class StreamStart:
    """A block of an open transaction's changes follows (`first`: its first block)."""

    xid: int
    first: bool


@dataclass(frozen=True, slots=True)
class StreamStop:
    """The block ends; the next message may be of any transaction."""


STREAM_STOP = StreamStop()


@dataclass(frozen=True, slots=True)
class StreamCommit:
    """The streamed transaction `xid` committed: as `Commit`, with its xid."""

    xid: int
    flags: int
    commit_lsn: int
    end_lsn: int
    commit_ts_us: int


@dataclass(frozen=True, slots=True)
class StreamAbort:
    """The streamed transaction `xid` rolled back (`subxid == xid`), or only its
    subtransaction `subxid` (ROLLBACK TO SAVEPOINT): drop that one's changes and those
    of its own subtransactions, which came after its first."""

    xid: int
    subxid: int


@dataclass(frozen=True, slots=True)
class Origin:
    lsn: int
    name: str


@dataclass(frozen=True, slots=True)
class LogicalMessage:
    """`pg_logical_emit_message` output (sent with the `messages` option): snapshot
    watermarks are non-transactional ones with the prefix `tailrace`."""

    transactional: bool
    lsn: int
    prefix: str
    content: bytes


@dataclass(frozen=True, slots=True)
class TypeInfo:
    """A non-built-in type (enum, domain, composite, their arrays) used by a column."""

    oid: int
    namespace: str
    name: str


@dataclass(frozen=True, slots=True)
class RelationColumn:
    name: str
    type_oid: int
    type_modifier: int
    is_key: bool


@dataclass(frozen=True, slots=True)
class Relation:
    """A table as the stream describes it; `namespace` is the schema ('' for pg_catalog)."""

    oid: int
    namespace: str
    name: str
    replica_identity: str  # 'd' default, 'n' nothing, 'f' full, 'i' index
    columns: tuple[RelationColumn, ...]
    types: Mapping[int, TypeInfo] = field(default_factory=dict, repr=False, compare=False)
    encoders: tuple[Encoder, ...] = field(init=False, repr=False, compare=False)
    """Each column's text -> serialized `Value`; `kinds`: which the C side does itself."""
    kinds: bytes = field(init=False, repr=False, compare=False)
    type_names: tuple[str, ...] = field(init=False, repr=False, compare=False)
    """Readable SQL type of each column, as `format_type` prints it (no round-trip)."""
    prefixes: tuple[bytes, ...] = field(init=False, repr=False, compare=False)
    """Each column's `Column` fields but its value, serialized (`_wire.row_bytes`)."""

    def __post_init__(self) -> None:
        custom = [_custom_name(self.types, c.type_oid) for c in self.columns]
        object.__setattr__(self, "encoders", tuple(
            encoder_for(c.type_oid, name) for c, name in zip(self.columns, custom, strict=True)))
        object.__setattr__(self, "kinds", bytes(
            kind_for(c.type_oid, name) for c, name in zip(self.columns, custom, strict=True)))
        names = tuple(format_type(c.type_oid, c.type_modifier, self.types) for c in self.columns)
        object.__setattr__(self, "type_names", names)
        object.__setattr__(self, "prefixes", tuple(
            column_prefix(c.name, name) for c, name in zip(self.columns, names, strict=True)))

    def type_name(self, index: int) -> str:
        """Readable SQL type of column `index`, as `format_type` prints it (no round-trip)."""
        return self.type_names[index]


@dataclass(slots=True)
class Insert:
    relation: Relation
    new: list[bytes]  # serialized `Value`s


@dataclass(slots=True)
class Update:
    """`old` is None unless the key changed or the replica identity is FULL."""

    relation: Relation
    old: list[bytes] | None
    old_is_key_only: bool
    new: list[bytes]


@dataclass(slots=True)
class Delete:
    relation: Relation
    old: list[bytes]
    old_is_key_only: bool


@dataclass(frozen=True, slots=True)
class Truncate:
    relations: list[Relation]
    cascade: bool
    restart_identity: bool


Message = (Begin | Commit | Origin | Relation | TypeInfo | Insert | Update | Delete | Truncate
           | LogicalMessage | StreamStart | StreamStop | StreamCommit | StreamAbort)


class PgOutputDecoder:
    """Decodes pgoutput v1 and v2 payloads; holds the relations and custom types seen so far.

    Keep one per stream. After a reconnect the server sends every Relation again
    before its first change, so a fresh decoder and a reused one both work.
    """

    def __init__(self) -> None:
        self.relations: dict[int, Relation] = {}
        self.types: dict[int, TypeInfo] = {}
        self.in_block = False
        """Between a StreamStart and its StreamStop."""
        self.xid = 0
        """The (sub)transaction of the last message read in a stream block; 0 outside."""
        self.stream_relations: dict[int, dict[int, Relation]] = {}
        """Of each transaction streamed while open (top xid): the Relations its blocks sent,
        which its changes are read with before `relations`; merged into it at its commit."""
        self._block_relations: dict[int, Relation] = {}

    def decode(self, payload: bytes) -> Message | None:
        """One pgoutput message."""
        kind = payload[0]
        if self.in_block and kind in _STREAMED_KINDS:
            (self.xid,) = _U32.unpack_from(payload, 1)
            payload = payload[:1] + payload[5:]  # the v1 layout
        if kind == 0x49:  # 'I'
            relation = self._relation(payload)
            if payload[5] != 0x4E:  # 'N'
                raise ValueError(f"insert without a new tuple: {payload[:8]!r}")
            new, _ = self._tuple(payload, 6, relation)
            return Insert(relation, new)
        if kind == 0x55:  # 'U'
            return self._update(payload)
        if kind == 0x44:  # 'D'
            relation = self._relation(payload)
            old, _ = self._tuple(payload, 6, relation)
            return Delete(relation, old, payload[5] == 0x4B)
        if kind == 0x42:  # 'B'
            final_lsn, ts, xid = _BEGIN.unpack_from(payload, 1)
            return Begin(final_lsn, ts + PG_EPOCH_US, xid)
        if kind == 0x43:  # 'C'
            flags, commit_lsn, end_lsn, ts = _COMMIT.unpack_from(payload, 1)
            return Commit(flags, commit_lsn, end_lsn, ts + PG_EPOCH_US)
        if kind == 0x52:  # 'R'
            return self._relation_message(payload)
        if kind == 0x59:  # 'Y'
            (oid,) = _U32.unpack_from(payload, 1)
            namespace, pos = _string(payload, 5)
            name, _ = _string(payload, pos)
            info = TypeInfo(oid, namespace, name)
            self.types[oid] = info
            return info
        if kind == 0x4F:  # 'O'
            (lsn,) = _U64.unpack_from(payload, 1)
            return Origin(lsn, _string(payload, 9)[0])
        if kind == 0x54:  # 'T'
            return self._truncate(payload)
        if kind == 0x4D:  # 'M'
            flags = payload[1]
            (lsn,) = _U64.unpack_from(payload, 2)
            prefix, pos = _string(payload, 10)
            (length,) = _U32.unpack_from(payload, pos)
            return LogicalMessage(bool(flags & 1), lsn, prefix,
                                  bytes(payload[pos + 4 : pos + 4 + length]))
        return self._stream_message(kind, payload)

    def keep_stream_relations(self, xid: int, relations: Iterable[Relation]) -> None:
        """After a subtransaction of streamed transaction `xid` rolled back: the Relations its
        later changes are read with are `relations`, those the rest of it announced (what
        the rolled-back part announced went with it)."""
        self.stream_relations[xid] = {relation.oid: relation for relation in relations}

    def _stream_message(self, kind: int, payload: bytes) -> Message:
        if kind == 0x53:  # 'S'
            if self.in_block:
                raise ValueError("a StreamStart inside a stream block")
            xid, first = _STREAM_START.unpack_from(payload, 1)
            self.in_block, self.xid = True, xid
            if first == 1:
                self.stream_relations[xid] = {}
            self._block_relations = self.stream_relations.setdefault(xid, {})
            return StreamStart(xid, first == 1)
        if kind == 0x45:  # 'E'
            if not self.in_block:
                raise ValueError("a StreamStop outside a stream block")
            self.in_block, self.xid = False, 0
            self._block_relations = {}
            return STREAM_STOP
        if kind == 0x63:  # 'c'
            xid, flags, commit_lsn, end_lsn, ts = _STREAM_COMMIT.unpack_from(payload, 1)
            self.relations.update(self.stream_relations.pop(xid, {}))
            return StreamCommit(xid, flags, commit_lsn, end_lsn, ts + PG_EPOCH_US)
        if kind == 0x41:  # 'A'
            xid, subxid = _STREAM_ABORT.unpack_from(payload, 1)
            if subxid == xid:
                self.stream_relations.pop(xid, None)
            return StreamAbort(xid, subxid)
        raise ValueError(
            f"unknown pgoutput message type {chr(kind)!r}: is the stream using proto_version"
            " '1' or '2'?"
        )

    def _relation(self, payload: bytes) -> Relation:
        (oid,) = _U32.unpack_from(payload, 1)
        try:
            if self.in_block and oid in self._block_relations:
                return self._block_relations[oid]
            return self.relations[oid]
        except KeyError:
            raise ValueError(
                f"change for relation oid {oid} before its Relation message: "
                "restart the stream from the slot"
            ) from None

    def _relation_message(self, payload: bytes) -> Relation:
        (oid,) = _U32.unpack_from(payload, 1)
        namespace, pos = _string(payload, 5)
        name, pos = _string(payload, pos)
        identity = chr(payload[pos])
        (count,) = _U16.unpack_from(payload, pos + 1)
        pos += 3
        columns = []
        for _ in range(count):
            flags = payload[pos]
            column_name, pos = _string(payload, pos + 1)
            type_oid, modifier = _COLUMN.unpack_from(payload, pos)
            pos += 8
            columns.append(RelationColumn(column_name, type_oid, modifier, bool(flags & 1)))
        relation = Relation(oid, namespace, name, identity, tuple(columns), dict(self.types))
        if self.in_block:
            self._block_relations[oid] = relation
        else:
            self.relations[oid] = relation
        return relation

    def _update(self, payload: bytes) -> Update:
        relation = self._relation(payload)
        marker = payload[5]
        old = None
        pos = 6
        if marker in (0x4B, 0x4F):  # 'K' key only, 'O' whole old row
            old, pos = self._tuple(payload, 6, relation)
            if payload[pos] != 0x4E:
                raise ValueError(f"update without a new tuple in {relation.name}")
            pos += 1
        elif marker != 0x4E:
            raise ValueError(f"unexpected update tuple marker {chr(marker)!r}")
        new, _ = self._tuple(payload, pos, relation)
        return Update(relation, old, marker == 0x4B, new)

    def _truncate(self, payload: bytes) -> Truncate:
        count, options = _TRUNCATE.unpack_from(payload, 1)
        oids = struct.unpack_from(f">{count}I", payload, 6)
        relations = []
        for oid in oids:
            relation = self._block_relations.get(oid) if self.in_block else None
            relation = relation or self.relations.get(oid)
            if relation is None:
                raise ValueError(f"truncate of relation oid {oid} before its Relation message")
            relations.append(relation)
        return Truncate(relations, bool(options & 1), bool(options & 2))

    @staticmethod
    def _tuple(payload: bytes, pos: int, relation: Relation) -> tuple[list[bytes], int]:
        """TupleData at `pos`: each column's serialized `Value`; returns them and the end."""
        if cwire is not None:
            try:
                values, end = cwire.pg_tuple(payload, pos, relation.kinds, relation.encoders,
                                             UNCHANGED_VALUE)
                return values, end
            except (ValueError, ArithmeticError):
                pass  # the twin names the column (and raises) — or says why not
        return _py_tuple(payload, pos, relation)


def _py_tuple(payload: bytes, pos: int, relation: Relation) -> tuple[list[bytes], int]:
    """`_cwire.pg_tuple`'s twin (tests/unit/test_wire.py holds them to the same bytes), with
    errors that name the column."""
    size = len(payload)
    if pos + 2 > size:
        raise ValueError(f"tuple of {relation.name} cut short before its column count")
    (count,) = _U16.unpack_from(payload, pos)
    pos += 2
    encoders = relation.encoders
    if count != len(encoders):
        raise ValueError(
            f"tuple of {relation.namespace}.{relation.name} has {count} columns,"
            f" its Relation message {len(encoders)}"
        )
    unpack_len = _U32.unpack_from
    values: list[bytes] = []
    append = values.append
    for index in range(count):
        if pos >= size:
            raise ValueError(f"tuple of {relation.name} cut short at column {index}")
        kind = payload[pos]
        if kind == 0x74:  # 't': text
            if pos + 5 > size:
                raise ValueError(f"tuple of {relation.name} cut short at column {index}")
            (length,) = unpack_len(payload, pos + 1)
            pos += 5
            raw = payload[pos : pos + length]
            if len(raw) < length:
                raise ValueError(f"tuple of {relation.name} cut short at column {index}")
            pos += length
            try:
                append(encoders[index](raw.decode()))
            except (ValueError, ArithmeticError) as exc:
                raise ValueError(
                    f"cannot decode {relation.name}.{relation.columns[index].name}"
                    f" ({relation.type_name(index)}) from {raw[:80]!r}: {exc}"
                ) from exc
        elif kind == 0x6E:  # 'n': NULL
            append(NULL_VALUE)
            pos += 1
        elif kind == 0x75:  # 'u': unchanged TOAST
            append(UNCHANGED_VALUE)
            pos += 1
        else:
            raise ValueError(
                f"unsupported tuple value kind {chr(kind)!r} in {relation.name}:"
                " binary mode is never requested"
            )
    return values, pos


def _string(payload: bytes, pos: int) -> tuple[str, int]:
    end = payload.index(b"\0", pos)
    return payload[pos:end].decode(), end + 1


def _custom_name(types: Mapping[int, TypeInfo], oid: int) -> str | None:
    info = types.get(oid)
    return info.name if info is not None else None


# -- type names ----------------------------------------------------------------------

# format_type() of the built-in scalar types (pg_type OIDs below 10000).
_TYPE_NAMES: dict[int, str] = {
    16: "boolean", 17: "bytea", 18: '"char"', 19: "name", 20: "bigint", 21: "smallint",
    22: "int2vector", 23: "integer", 24: "regproc", 25: "text", 26: "oid", 27: "tid",
    28: "xid", 29: "cid", 30: "oidvector", 114: "json", 142: "xml", 194: "pg_node_tree",
    600: "point", 601: "lseg", 602: "path", 603: "box", 604: "polygon", 628: "line",
    650: "cidr", 700: "real", 701: "double precision", 705: "unknown", 718: "circle",
    774: "macaddr8", 790: "money", 829: "macaddr", 869: "inet", 1033: "aclitem",
    1042: "character", 1043: "character varying", 1082: "date",
    1083: "time without time zone", 1114: "timestamp without time zone",
    1184: "timestamp with time zone", 1186: "interval", 1266: "time with time zone",
    1560: "bit", 1562: "bit varying", 1700: "numeric", 1790: "refcursor",
    2202: "regprocedure", 2203: "regoper", 2204: "regoperator", 2205: "regclass",
    2206: "regtype", 2249: "record", 2275: "cstring", 2950: "uuid", 2970: "txid_snapshot",
    3220: "pg_lsn", 3614: "tsvector", 3615: "tsquery", 3642: "gtsvector", 3734: "regconfig",
    3769: "regdictionary", 3802: "jsonb", 3904: "int4range", 3906: "numrange",
    3908: "tsrange", 3910: "tstzrange", 3912: "daterange", 3926: "int8range",
    4072: "jsonpath", 4089: "regnamespace", 4096: "regrole", 4191: "regcollation",
    4451: "int4multirange", 4532: "nummultirange", 4533: "tsmultirange",
    4534: "tstzmultirange", 4535: "datemultirange", 4536: "int8multirange",
    5038: "pg_snapshot", 5069: "xid8",
}  # fmt: skip

# Interval field masks (1 << YEAR etc. from datetime.h) -> the words typmodout prints.
_INTERVAL_FIELDS: dict[int, str] = {
    1 << 2: " year", 1 << 1: " month", 1 << 3: " day", 1 << 10: " hour",
    1 << 11: " minute", 1 << 12: " second", (1 << 2) | (1 << 1): " year to month",
    (1 << 3) | (1 << 10): " day to hour", (1 << 3) | (1 << 10) | (1 << 11): " day to minute",
    (1 << 3) | (1 << 10) | (1 << 11) | (1 << 12): " day to second",
    (1 << 10) | (1 << 11): " hour to minute", (1 << 10) | (1 << 11) | (1 << 12): " hour to second",
    (1 << 11) | (1 << 12): " minute to second", 0x7FFF: "",
}  # fmt: skip


def _with_precision(name: str, precision: int) -> str:
    """`timestamp with time zone`, 3 -> `timestamp(3) with time zone`."""
    head, _, tail = name.partition(" ")
    return f"{head}({precision}) {tail}".rstrip()


def _modified(oid: int, name: str, typmod: int) -> str:
    if oid == 1700:  # numeric: ((precision << 16) | scale) + 4, scale an 11-bit signed int
        value = typmod - 4
        scale = ((value & 0x7FF) ^ 1024) - 1024
        return f"numeric({(value >> 16) & 0xFFFF},{scale})"
    if oid in (1042, 1043):  # character, character varying: length + 4
        return f"{name}({typmod - 4})"
    if oid in (1560, 1562):  # bit, bit varying: the length itself
        return f"{name}({typmod})"
    if oid in (1083, 1114, 1184, 1266):  # time(stamp) precision
        return _with_precision(name, typmod)
    if oid == 1186:  # interval: (fields << 16) | precision, 0xFFFF = no precision
        fields, precision = (typmod >> 16) & 0x7FFF, typmod & 0xFFFF
        text = "interval" + _INTERVAL_FIELDS.get(fields, "")
        return text if precision == 0xFFFF else f"{text}({precision})"
    return name


def format_type(
    type_oid: int, type_modifier: int = -1, types: Mapping[int, TypeInfo] | None = None
) -> str:
    """Readable SQL type, like PostgreSQL's `format_type(oid, typmod)`.

    Custom types come from the Type messages in `types`; they are schema-qualified
    unless in `public`. An unknown OID prints as `oid:<n>`.
    """
    element = ARRAY_ELEMENTS.get(type_oid)
    if element is not None:
        return format_type(element, type_modifier, types) + "[]"
    name = _TYPE_NAMES.get(type_oid)
    if name is not None:
        return name if type_modifier < 0 else _modified(type_oid, name, type_modifier)
    info = (types or {}).get(type_oid)
    if info is None:
        return f"oid:{type_oid}"
    base, suffix = info.name, ""
    if base.startswith("_"):  # the array type of a custom type
        base, suffix = base[1:], "[]"
    if info.namespace not in ("", "public", "pg_catalog"):
        base = f"{info.namespace}.{base}"
    return base + suffix
