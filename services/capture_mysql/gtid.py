"""GTID positions of both flavours: parsing, comparison, subset and union — our own, not the library's.

MySQL
    A GTID is `uuid:n` (MySQL 8.3+ also `uuid:tag:n`); a GTID *set* is
    `uuid:1-5:7-9,uuid2:1-3` — intervals of transaction numbers per source
    uuid. `MysqlGtidSet` keeps them normalised (sorted, merged, lowercase
    uuids), so equal sets print alike. `@@gtid_executed`, `@@gtid_purged` and
    checkpoints are sets; subset is the test behind `GTID_SUBSET()`.

MariaDB
    A GTID is `domain-server-seq`. A *position* (`@@gtid_binlog_pos`,
    `@@gtid_slave_pos`, `@slave_connect_state`) holds the last GTID of each
    replication domain: sequence numbers grow within a domain, domains are
    independent. `MariadbGtidPosition` compares per domain; a position is
    "at or before" another when every domain it names is at or before the other's.
    `@@gtid_binlog_state` keeps one entry per (domain, server): that is
    `MariadbBinlogState`, which answers "has this server's history seen d-s-n".

Both position types offer `add(gtid)`, `contains(gtid)`, `issubset(other)`
and `union(other)`, so the capture service treats them alike (`GtidState`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Literal, Protocol, Self

__all__ = [
    "Flavor",
    "GtidState",
    "MariadbBinlogState",
    "MariadbGtid",
    "MariadbGtidPosition",
    "MysqlGtidSet",
    "empty_state",
    "parse_state",
]

Flavor = Literal["mysql", "mariadb"]

_UUID = re.compile(r"^[0-9a-f]{8}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{12}$")
_TAG = re.compile(r"^[a-z_][a-z0-9_]{0,31}$")
_MARIADB_GTID = re.compile(r"^(\d+)-(\d+)-(\d+)$")
_U32 = 2**32
_U64 = 2**64


class GtidState(Protocol):
    """What the capture service needs from a GTID position of either flavour."""

    flavor: Flavor

    def add(self, gtid: str) -> None: ...
    def contains(self, gtid: str) -> bool: ...
    def issubset(self, other: Self) -> bool: ...
    def copy(self) -> Self: ...
    def is_empty(self) -> bool: ...


# -- MySQL -----------------------------------------------------------------------------

def _norm_uuid(text: str) -> str:
    u = text.strip().lower()
    if not _UUID.match(u):
        raise ValueError(f"invalid GTID source uuid {text!r}: expected 8-4-4-4-12 hex digits")
    u = u.replace("-", "")
    return f"{u[:8]}-{u[8:12]}-{u[12:16]}-{u[16:20]}-{u[20:]}"


def _merge(intervals: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for start, end in sorted(intervals):
        if out and start <= out[-1][1] + 1:
            if end > out[-1][1]:
                out[-1] = (out[-1][0], end)
        else:
            out.append((start, end))
    return out


def _parse_interval(text: str, whole: str) -> tuple[int, int]:
    first, _, last = text.partition("-")
    try:
        start = int(first)
        end = int(last) if last else start
    except ValueError:
        raise ValueError(f"invalid GTID interval {text!r} in {whole!r}: expected n or n-m") from None
    if start < 1 or end < start or end >= 2**63:
        raise ValueError(f"invalid GTID interval {text!r} in {whole!r}: need 1 <= n <= m < 2^63")
    return start, end


@dataclass(frozen=True, slots=True, order=True)
class _Sid:
    """A GTID source: the server uuid plus an optional tag (MySQL 8.3+)."""

    uuid: str
    tag: str = ""


class MysqlGtidSet:
    """A normalised MySQL GTID set: `{(uuid, tag): [(start, end), ...]}`, intervals inclusive."""

    flavor: Flavor = "mysql"

    def __init__(self, intervals: dict[_Sid, list[tuple[int, int]]] | None = None) -> None:
        self._sets: dict[_Sid, list[tuple[int, int]]] = {}
        for sid, ivs in (intervals or {}).items():
            merged = _merge(ivs)
            if merged:
                self._sets[sid] = merged

    @classmethod
    def parse(cls, text: str) -> MysqlGtidSet:
        """`uuid:1-5:7,uuid2:tag:3` (whitespace and newlines, as MySQL prints them, allowed)."""
        result: dict[_Sid, list[tuple[int, int]]] = {}
        cleaned = re.sub(r"\s+", "", text or "")
        if not cleaned:
            return cls()
        for member in cleaned.split(","):
            if not member:
                raise ValueError(f"invalid GTID set {text!r}: empty member between commas")
            parts = member.split(":")
            uuid = _norm_uuid(parts[0])
            if len(parts) < 2:
                raise ValueError(f"invalid GTID set {text!r}: {member!r} has no transaction numbers")
            tag = ""
            for part in parts[1:]:
                if part and not part[0].isdigit():
                    if not _TAG.match(part.lower()):
                        raise ValueError(f"invalid GTID tag {part!r} in {text!r}")
                    tag = part.lower()
                    continue
                result.setdefault(_Sid(uuid, tag), []).append(_parse_interval(part, text))
        return cls(result)

    @staticmethod
    def parse_gtid(gtid: str) -> tuple[_Sid, int]:
        """One GTID `uuid:n` or `uuid:tag:n` -> (source, n)."""
        parts = gtid.strip().split(":")
        if len(parts) not in (2, 3):
            raise ValueError(f"invalid MySQL GTID {gtid!r}: expected uuid:n or uuid:tag:n")
        tag = parts[1].lower() if len(parts) == 3 else ""
        if tag and not _TAG.match(tag):
            raise ValueError(f"invalid GTID tag {parts[1]!r} in {gtid!r}")
        try:
            number = int(parts[-1])
        except ValueError:
            raise ValueError(f"invalid MySQL GTID {gtid!r}: the transaction number is not an "
                             "integer") from None
        if number < 1:
            raise ValueError(f"invalid MySQL GTID {gtid!r}: transaction numbers start at 1")
        return _Sid(_norm_uuid(parts[0]), tag), number

    # -- queries ---------------------------------------------------------------------

    def __str__(self) -> str:
        by_uuid: dict[str, list[str]] = {}
        for sid in sorted(self._sets):
            text = ":".join(f"{s}" if s == e else f"{s}-{e}" for s, e in self._sets[sid])
            by_uuid.setdefault(sid.uuid, []).append(f"{sid.tag}:{text}" if sid.tag else text)
        return ",".join(f"{u}:{':'.join(parts)}" for u, parts in by_uuid.items())

    def __repr__(self) -> str:
        return f"MysqlGtidSet({str(self)!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, MysqlGtidSet) and self._sets == other._sets

    def __hash__(self) -> int:
        return hash(str(self))

    def __len__(self) -> int:
        """Number of transactions in the set."""
        return sum(e - s + 1 for ivs in self._sets.values() for s, e in ivs)

    def is_empty(self) -> bool:
        return not self._sets

    def sources(self) -> list[str]:
        return sorted({sid.uuid for sid in self._sets})

    def intervals(self, uuid: str, tag: str = "") -> list[tuple[int, int]]:
        return list(self._sets.get(_Sid(_norm_uuid(uuid), tag), []))

    def contains(self, gtid: str) -> bool:
        sid, n = self.parse_gtid(gtid)
        return any(s <= n <= e for s, e in self._sets.get(sid, ()))

    def issubset(self, other: MysqlGtidSet) -> bool:
        """Every transaction of self is in other: MySQL's `GTID_SUBSET(self, other)`."""
        for sid, ivs in self._sets.items():
            theirs = other._sets.get(sid)
            if not theirs:
                return False
            j = 0
            for s, e in ivs:
                while j < len(theirs) and theirs[j][1] < s:
                    j += 1
                if j == len(theirs) or not (theirs[j][0] <= s and e <= theirs[j][1]):
                    return False
        return True

    def __le__(self, other: MysqlGtidSet) -> bool:
        return self.issubset(other)

    def union(self, other: MysqlGtidSet) -> MysqlGtidSet:
        merged = {sid: list(ivs) for sid, ivs in self._sets.items()}
        for sid, ivs in other._sets.items():
            merged.setdefault(sid, []).extend(ivs)
        return MysqlGtidSet(merged)

    def difference(self, other: MysqlGtidSet) -> MysqlGtidSet:
        """Transactions in self but not in other (`GTID_SUBTRACT(self, other)`)."""
        out: dict[_Sid, list[tuple[int, int]]] = {}
        for sid, ivs in self._sets.items():
            remaining = list(ivs)
            for cs, ce in other._sets.get(sid, ()):
                nxt: list[tuple[int, int]] = []
                for s, e in remaining:
                    if ce < s or cs > e:
                        nxt.append((s, e))
                        continue
                    if s < cs:
                        nxt.append((s, cs - 1))
                    if e > ce:
                        nxt.append((ce + 1, e))
                remaining = nxt
            if remaining:
                out[sid] = remaining
        return MysqlGtidSet(out)

    # -- updates ---------------------------------------------------------------------

    def add(self, gtid: str) -> None:
        sid, n = self.parse_gtid(gtid)
        self._sets[sid] = _merge([*self._sets.get(sid, []), (n, n)])

    def copy(self) -> MysqlGtidSet:
        return MysqlGtidSet({sid: list(ivs) for sid, ivs in self._sets.items()})


# -- MariaDB ---------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class MariadbGtid:
    domain: int
    server_id: int
    seq: int

    @classmethod
    def parse(cls, text: str) -> MariadbGtid:
        m = _MARIADB_GTID.match(text.strip())
        if not m:
            raise ValueError(f"invalid MariaDB GTID {text!r}: expected domain-server-seq like 0-1-42")
        domain, server, seq = (int(g) for g in m.groups())
        if domain >= _U32 or server >= _U32 or seq >= _U64:
            raise ValueError(f"invalid MariaDB GTID {text!r}: a part is out of range")
        return cls(domain, server, seq)

    def __str__(self) -> str:
        return f"{self.domain}-{self.server_id}-{self.seq}"


def _parse_mariadb_list(text: str) -> Iterator[MariadbGtid]:
    for member in re.sub(r"\s+", "", text or "").split(","):
        if member:
            yield MariadbGtid.parse(member)


class MariadbGtidPosition:
    """The last GTID per replication domain (`@@gtid_binlog_pos`, `@slave_connect_state`)."""

    flavor: Flavor = "mariadb"

    def __init__(self, gtids: Iterable[MariadbGtid] = ()) -> None:
        self._domains: dict[int, MariadbGtid] = {}
        for g in gtids:
            self._advance(g)

    @classmethod
    def parse(cls, text: str) -> MariadbGtidPosition:
        """`0-1-100,1-2-7`; a domain named twice is an error (that is a binlog *state*)."""
        seen: set[int] = set()
        gtids = []
        for g in _parse_mariadb_list(text):
            if g.domain in seen:
                raise ValueError(f"invalid MariaDB GTID position {text!r}: domain {g.domain} "
                                 "appears twice (a position holds one GTID per domain)")
            seen.add(g.domain)
            gtids.append(g)
        return cls(gtids)

    def _advance(self, g: MariadbGtid) -> None:
        current = self._domains.get(g.domain)
        if current is None or g.seq >= current.seq:
            self._domains[g.domain] = g

    def __str__(self) -> str:
        return ",".join(str(self._domains[d]) for d in sorted(self._domains))

    def __repr__(self) -> str:
        return f"MariadbGtidPosition({str(self)!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, MariadbGtidPosition) and self._domains == other._domains

    def __hash__(self) -> int:
        return hash(str(self))

    def __iter__(self) -> Iterator[MariadbGtid]:
        return iter(self._domains[d] for d in sorted(self._domains))

    def get(self, domain: int) -> MariadbGtid | None:
        return self._domains.get(domain)

    def domains(self) -> list[int]:
        return sorted(self._domains)

    def is_empty(self) -> bool:
        return not self._domains

    def contains(self, gtid: str) -> bool:
        """True when `gtid` is at or before this position in its domain (already applied)."""
        g = MariadbGtid.parse(gtid)
        current = self._domains.get(g.domain)
        return current is not None and g.seq <= current.seq

    def issubset(self, other: MariadbGtidPosition) -> bool:
        """Every domain of self is at or before other's: self is not ahead anywhere."""
        return not self.ahead_of(other)

    def __le__(self, other: MariadbGtidPosition) -> bool:
        return self.issubset(other)

    def ahead_of(self, other: MariadbGtidPosition) -> list[tuple[MariadbGtid, MariadbGtid | None]]:
        """Domains where self is past other (other missing the domain counts): (ours, theirs)."""
        out = []
        for d, ours in sorted(self._domains.items()):
            theirs = other._domains.get(d)
            if theirs is None or ours.seq > theirs.seq:
                out.append((ours, theirs))
        return out

    def union(self, other: MariadbGtidPosition) -> MariadbGtidPosition:
        """Per domain the later GTID."""
        return MariadbGtidPosition([*self, *other])

    def add(self, gtid: str) -> None:
        self._advance(MariadbGtid.parse(gtid))

    def copy(self) -> MariadbGtidPosition:
        return MariadbGtidPosition(self)


class MariadbBinlogState:
    """`@@gtid_binlog_state`: the last sequence number per (domain, server_id) in the binlog."""

    def __init__(self, gtids: Iterable[MariadbGtid] = ()) -> None:
        self._last: dict[tuple[int, int], int] = {}
        for g in gtids:
            key = (g.domain, g.server_id)
            self._last[key] = max(self._last.get(key, 0), g.seq)

    @classmethod
    def parse(cls, text: str) -> MariadbBinlogState:
        return cls(_parse_mariadb_list(text))

    def has_seen(self, gtid: MariadbGtid) -> bool:
        """Did server `gtid.server_id` write domain `gtid.domain` up to at least `gtid.seq` here?

        A replica or promoted replica that applied our transaction keeps its
        originating server_id in this state; an independent server whose own
        numbers merely passed ours does not.
        """
        last = self._last.get((gtid.domain, gtid.server_id))
        return last is not None and last >= gtid.seq

    def position(self) -> MariadbGtidPosition:
        return MariadbGtidPosition(
            MariadbGtid(d, s, n) for (d, s), n in sorted(self._last.items()))

    def __str__(self) -> str:
        return ",".join(f"{d}-{s}-{n}" for (d, s), n in sorted(self._last.items()))


# -- either flavour --------------------------------------------------------------------

def parse_state(text: str, flavor: Flavor) -> MysqlGtidSet | MariadbGtidPosition:
    if flavor == "mysql":
        return MysqlGtidSet.parse(text)
    if flavor == "mariadb":
        return MariadbGtidPosition.parse(text)
    raise ValueError(f"unknown flavor {flavor!r}: expected mysql or mariadb")


def empty_state(flavor: Flavor) -> MysqlGtidSet | MariadbGtidPosition:
    return parse_state("", flavor)
