"""GTID parsing, comparison, subset and union for MySQL sets and MariaDB positions."""

from __future__ import annotations

import pytest

from tailrace_services.capture_mysql.gtid import (
    MariadbBinlogState,
    MariadbGtid,
    MariadbGtidPosition,
    MysqlGtidSet,
    empty_state,
    parse_state,
)

U1 = "3e11fa47-71ca-11e1-9e33-c80aa9429562"
U2 = "19d69c1e-ae97-4b8c-a1ef-9e12ba966457"


# -- MySQL -----------------------------------------------------------------------------

def test_mysql_parse_normalises_and_prints_canonically() -> None:
    s = MysqlGtidSet.parse(f"{U1.upper()}:7-9:1-5:6,\n {U2}:3")
    assert str(s) == f"{U2}:3,{U1}:1-9"
    assert s.intervals(U1) == [(1, 9)]
    assert len(s) == 10
    assert MysqlGtidSet.parse(str(s)) == s


def test_mysql_parse_uuid_without_dashes_and_tags() -> None:
    s = MysqlGtidSet.parse(f"{U1.replace('-', '')}:1-3:blue:5:7-8")
    assert str(s) == f"{U1}:1-3:blue:5:7-8"
    assert s.contains(f"{U1}:blue:7") and not s.contains(f"{U1}:7")
    assert s.contains(f"{U1}:2") and not s.contains(f"{U1}:blue:2")


@pytest.mark.parametrize("text", ["nope:1", f"{U1}", f"{U1}:0", f"{U1}:5-3", f"{U1}:a-b",
                                  f"{U1}:1,,{U2}:1", f"{U1}:Bad-Tag:1"])
def test_mysql_parse_rejects_bad_sets_naming_them(text: str) -> None:
    with pytest.raises(ValueError, match="invalid GTID"):
        MysqlGtidSet.parse(text)


def test_mysql_empty_set() -> None:
    assert MysqlGtidSet.parse("").is_empty() and str(MysqlGtidSet.parse("  ")) == ""
    assert MysqlGtidSet.parse("").issubset(MysqlGtidSet.parse(f"{U1}:1"))


def test_mysql_add_merges_adjacent_intervals() -> None:
    s = MysqlGtidSet.parse(f"{U1}:1-3:5")
    s.add(f"{U1}:4")
    assert str(s) == f"{U1}:1-5"
    s.add(f"{U2}:10")
    assert str(s) == f"{U2}:10,{U1}:1-5"
    s.add(f"{U1}:3")  # already there: no change
    assert str(s) == f"{U2}:10,{U1}:1-5"


@pytest.mark.parametrize(("a", "b", "subset"), [
    (f"{U1}:1-5", f"{U1}:1-10", True),
    (f"{U1}:1-5", f"{U1}:1-4", False),
    (f"{U1}:1-5:8", f"{U1}:1-6:8-9", True),
    (f"{U1}:1-5:8", f"{U1}:1-7:9", False),  # the gap at 8
    (f"{U1}:1-5", f"{U2}:1-5", False),  # other source
    (f"{U1}:3-4", f"{U1}:1-2:5-9", False),
    (f"{U1}:1-5,{U2}:1", f"{U2}:1-2,{U1}:1-100", True),
    (f"{U1}:1-5", f"{U1}:1-2:3-5", True),  # unmerged text still compares right
])
def test_mysql_subset_is_gtid_subset(a: str, b: str, subset: bool) -> None:
    assert MysqlGtidSet.parse(a).issubset(MysqlGtidSet.parse(b)) is subset
    assert (MysqlGtidSet.parse(a) <= MysqlGtidSet.parse(b)) is subset


def test_mysql_union_and_difference() -> None:
    a = MysqlGtidSet.parse(f"{U1}:1-5:10-12")
    b = MysqlGtidSet.parse(f"{U1}:6-8,{U2}:1")
    assert str(a.union(b)) == f"{U2}:1,{U1}:1-8:10-12"
    assert str(a.difference(MysqlGtidSet.parse(f"{U1}:3-4:11"))) == f"{U1}:1-2:5:10:12"
    assert a.difference(a).is_empty()
    assert str(MysqlGtidSet.parse(f"{U1}:1-100").difference(
        MysqlGtidSet.parse(f"{U1}:1-50"))) == f"{U1}:51-100"


def test_mysql_copy_is_independent() -> None:
    a = MysqlGtidSet.parse(f"{U1}:1")
    b = a.copy()
    b.add(f"{U1}:2")
    assert str(a) == f"{U1}:1" and str(b) == f"{U1}:1-2"


@pytest.mark.parametrize("gtid", [f"{U1}", f"{U1}:0", f"{U1}:x", "a:b:c:d"])
def test_mysql_bad_gtid(gtid: str) -> None:
    with pytest.raises(ValueError):
        MysqlGtidSet.parse(f"{U1}:1").contains(gtid)


# -- MariaDB ---------------------------------------------------------------------------

def test_mariadb_gtid_parse_and_print() -> None:
    g = MariadbGtid.parse(" 1-2-300 ")
    assert (g.domain, g.server_id, g.seq) == (1, 2, 300) and str(g) == "1-2-300"
    for bad in ("1-2", "a-b-c", "1-2-3-4", "-1-2-3", f"{2**32}-1-1"):
        with pytest.raises(ValueError, match="MariaDB GTID"):
            MariadbGtid.parse(bad)


def test_mariadb_position_one_gtid_per_domain_sorted() -> None:
    p = MariadbGtidPosition.parse("2-1-5, 0-1-100,1-3-7")
    assert str(p) == "0-1-100,1-3-7,2-1-5" and p.domains() == [0, 1, 2]
    assert MariadbGtidPosition.parse(str(p)) == p
    with pytest.raises(ValueError, match="appears twice"):
        MariadbGtidPosition.parse("0-1-5,0-2-6")
    assert MariadbGtidPosition.parse("").is_empty()


def test_mariadb_contains_is_per_domain_sequence() -> None:
    p = MariadbGtidPosition.parse("0-1-100,1-3-7")
    assert p.contains("0-1-100") and p.contains("0-2-50")  # server id does not matter for order
    assert not p.contains("0-1-101") and not p.contains("5-1-1")
    assert p.contains("1-3-7") and not p.contains("1-3-8")


def test_mariadb_add_advances_the_domain() -> None:
    p = MariadbGtidPosition()
    for g in ("0-1-1", "0-1-2", "1-2-1", "0-2-3"):
        p.add(g)
    assert str(p) == "0-2-3,1-2-1"
    p.add("0-1-2")  # an older one does not move it back
    assert str(p) == "0-2-3,1-2-1"


@pytest.mark.parametrize(("a", "b", "subset"), [
    ("0-1-5", "0-1-10", True),
    ("0-1-10", "0-1-5", False),
    ("0-1-5,1-1-3", "0-1-5", False),  # b lacks domain 1
    ("0-1-5", "0-1-5,1-1-3", True),
    ("", "0-1-1", True),
    ("0-1-5,1-1-9", "0-2-6,1-1-9", True),
])
def test_mariadb_subset(a: str, b: str, subset: bool) -> None:
    pa, pb = MariadbGtidPosition.parse(a), MariadbGtidPosition.parse(b)
    assert pa.issubset(pb) is subset and (pa <= pb) is subset


def test_mariadb_ahead_of_names_the_domains() -> None:
    ours = MariadbGtidPosition.parse("0-1-100,1-1-5")
    theirs = MariadbGtidPosition.parse("0-1-90")
    assert [(str(a), str(b) if b else None) for a, b in ours.ahead_of(theirs)] == [
        ("0-1-100", "0-1-90"), ("1-1-5", None)]


def test_mariadb_union_takes_the_later_per_domain() -> None:
    a = MariadbGtidPosition.parse("0-1-100,1-1-5")
    b = MariadbGtidPosition.parse("0-1-90,2-3-1")
    assert str(a.union(b)) == "0-1-100,1-1-5,2-3-1"


def test_mariadb_binlog_state_has_seen_per_server() -> None:
    state = MariadbBinlogState.parse("0-1-100,0-2-150,1-1-4")
    assert state.has_seen(MariadbGtid(0, 1, 100)) and state.has_seen(MariadbGtid(0, 1, 3))
    assert not state.has_seen(MariadbGtid(0, 1, 101))
    assert not state.has_seen(MariadbGtid(0, 3, 1))  # never saw server 3 in domain 0
    assert str(state.position()) == "0-2-150,1-1-4"


def test_parse_state_by_flavor() -> None:
    assert isinstance(parse_state(f"{U1}:1", "mysql"), MysqlGtidSet)
    assert isinstance(parse_state("0-1-1", "mariadb"), MariadbGtidPosition)
    assert empty_state("mariadb").is_empty() and empty_state("mysql").is_empty()
    with pytest.raises(ValueError):
        parse_state("0-1-1", "mysql")
    with pytest.raises(ValueError):
        parse_state(f"{U1}:1", "mariadb")
    with pytest.raises(ValueError, match="unknown flavor"):
        parse_state("", "oracle")  # type: ignore[arg-type]
