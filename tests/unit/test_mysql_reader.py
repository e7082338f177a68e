"""The stream's library workarounds and its transaction assembly, without a server."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Any

import pymysql
import pytest
from pymysqlreplication import BinLogStreamReader
from pymysqlreplication.event import (
    FormatDescriptionEvent,
    GtidEvent,
    HeartbeatLogEvent,
    MariadbGtidEvent,
    QueryEvent,
    RotateEvent,
    XidEvent,
)
from pymysqlreplication.row_event import WriteRowsEvent

from tailrace.errors import PositionLostError
from tailrace_services.capture_mysql.gtid import MariadbGtidPosition, MysqlGtidSet
from tailrace_services.capture_mysql.reader import (
    BinlogStream,
    Idle,
    RowChange,
    Statement,
    StreamLostError,
    TxBegin,
    TxCommit,
    _Reader,
)

U1 = "3e11fa47-71ca-11e1-9e33-c80aa9429562"


class FakeCursor:
    def __init__(self, conn: FakeConnection) -> None:
        self.conn = conn

    def execute(self, sql: str, args: Any = None) -> None:
        self.conn.statements.append(sql)

    def fetchone(self) -> Any:
        return {"Value": "FULL"} if self.conn.dict_rows else None

    def close(self) -> None:
        pass


class FakeConnection:
    """Enough of pymysql's Connection for BinLogStreamReader to connect and then lose it."""

    def __init__(self, **kwargs: Any) -> None:
        self.dict_rows = "cursorclass" in kwargs
        self.statements: list[str] = []
        self.written: list[bytes] = []
        self.charset = "utf8"

    def cursor(self) -> FakeCursor:
        return FakeCursor(self)

    def _write_bytes(self, data: bytes) -> None:
        self.written.append(data)

    def _read_packet(self) -> Any:
        raise pymysql.err.OperationalError(2013, "Lost connection to server during query")

    def close(self) -> None:
        pass


def _declared_and_actual(prelude: bytes) -> tuple[int, int]:
    return struct.unpack("<I", prelude[:4])[0] & 0xFFFFFF, len(prelude) - 4


def test_mariadb_dump_request_declares_its_true_length() -> None:
    conn = FakeConnection()
    reader = _Reader(connection_settings={}, server_id=77, is_mariadb=True,
                     auto_position="0-1-5", blocking=True, pymysql_wrapper=FakeConnection)
    reader._stream_connection = conn
    declared, actual = _declared_and_actual(reader._BinLogStreamReader__set_mariadb_settings())
    assert declared == actual == 15
    assert "SET @slave_connect_state = %s" in conn.statements
    # the fault being worked around: the library's own request is one byte short
    lib_declared, lib_actual = _declared_and_actual(
        BinLogStreamReader._BinLogStreamReader__set_mariadb_settings(reader))
    assert lib_actual == lib_declared + 1


def test_the_library_does_not_reconnect_by_itself() -> None:
    made: list[FakeConnection] = []

    def wrapper(**kwargs: Any) -> FakeConnection:
        made.append(FakeConnection(**kwargs))
        return made[-1]

    reader = _Reader(connection_settings={}, server_id=77, is_mariadb=True, auto_position="0-1-5",
                     blocking=True, pymysql_wrapper=wrapper)
    with pytest.raises(StreamLostError, match="binlog connection lost"):
        reader.fetchone()
    stream_conns = [c for c in made if c.written]
    assert len(stream_conns) == 1, "one dump request only: no silent re-read from the start"


# -- transaction assembly --------------------------------------------------------------

class RawPacket:
    """The bytes of a binlog event as pymysql holds them: OK byte, 19-byte header, body."""

    def __init__(self, body: bytes) -> None:
        self.data = b"\x00" + b"h" * 19 + body + b"csum"

    def get_all_data(self) -> bytes:
        return self.data


def ev(cls: type, log_pos: int = 100, timestamp: int = 1_700_000_000, body: bytes = b"",
       **attrs: Any) -> Any:
    e = object.__new__(cls)
    e.timestamp = timestamp
    body = body or b"tableid.fl" + f"row@{log_pos}".encode()
    e.packet = type("P", (), {"log_pos": log_pos, "packet": RawPacket(body)})()
    e.event_size, e.event_type, e.schema, e.table = len(body), 23, "shop", "t"
    for k, v in attrs.items():
        setattr(e, k, v)
    return e


class FakeReader:
    def __init__(self, events: list[Any]) -> None:
        self.events = iter(events)

    def fetchone(self) -> Any:
        return next(self.events, None)

    def close(self) -> None:
        pass


def stream_of(events: list[Any], start: Any) -> BinlogStream:
    s = BinlogStream.__new__(BinlogStream)
    s.state, s.flavor, s.file, s.file_created = start.copy(), start.flavor, "", 0
    s._reader, s._blocking = FakeReader(events), True
    return s


def take(items: Iterator[Any], n: int) -> list[Any]:
    return [next(items) for _ in range(n)]


def mgtid(gtid: str, flags: int = 0x0C, **kw: Any) -> Any:
    return ev(MariadbGtidEvent, gtid=gtid, flags=flags, **kw)


def query(text: str, schema: bytes = b"shop", **kw: Any) -> Any:
    return ev(QueryEvent, query=text, schema=schema, **kw)


def test_mariadb_transactions_ddl_and_skipping_done_gtids() -> None:
    row = ev(WriteRowsEvent)
    events = [
        ev(RotateEvent, timestamp=0, next_binlog="mysql-bin.000003"),
        ev(FormatDescriptionEvent, timestamp=1_699_999_999),
        mgtid("0-1-5"), row, ev(XidEvent, log_pos=500),  # already done: skipped
        mgtid("0-1-6"), row, row, ev(XidEvent, log_pos=800),
        mgtid("0-1-7", flags=0x29), query("ALTER TABLE t ADD x int", log_pos=900),
        mgtid("0-1-8"), row, query("COMMIT", log_pos=1000),  # non-transactional engine
        ev(HeartbeatLogEvent),
    ]
    items = stream_of(events, MariadbGtidPosition.parse("0-1-5")).items()
    got = take(items, 11)
    assert [type(i) for i in got] == [TxBegin, RowChange, RowChange, TxCommit, TxBegin,
                                      Statement, TxCommit, TxBegin, RowChange, TxCommit, Idle]
    first = got[3]
    assert (first.gtid, first.gtid_set, first.file, first.offset, first.file_created_unix) == (
        "0-1-6", "0-1-6", "mysql-bin.000003", 800, 1_699_999_999)
    assert got[5] == Statement("ALTER TABLE t ADD x int", "shop", "mysql-bin.000003:900")
    assert got[6].offset == 900 and got[9].gtid_set == "0-1-8"
    with pytest.raises(StreamLostError, match="ended the binlog stream"):
        next(items)


def commits(events: list[Any], start: str = "") -> list[TxCommit]:
    items = stream_of(events, MariadbGtidPosition.parse(start)).items()
    out = []
    try:
        for item in items:
            if isinstance(item, TxCommit):
                out.append(item)
    except StreamLostError:
        return out
    return out


def test_the_digest_is_of_contents_not_of_where_the_server_keeps_them() -> None:
    def tx(gtid: str, ts: int, rows: list[bytes], pos: int) -> list[Any]:
        return [mgtid(gtid, timestamp=ts),
                *[ev(WriteRowsEvent, log_pos=pos + i, timestamp=ts, body=b"ID" * 3 + b"fl" + r)
                  for i, r in enumerate(rows)],
                ev(XidEvent, log_pos=pos + 50)]

    ours = commits([*tx("0-1-6", 100, [b"a"], 10), *tx("0-1-7", 100, [b"b", b"c"], 900)], "0-1-5")
    assert [c.prev_gtid for c in ours] == ["0-1-5", "0-1-6"]
    # a replica: other table ids (the first 6 bytes), offsets and files; the same contents
    replica = [mgtid("0-1-7", timestamp=100),
               ev(WriteRowsEvent, log_pos=7, timestamp=100, body=b"XXXXXXfl" + b"b"),
               ev(WriteRowsEvent, log_pos=8, timestamp=100, body=b"YYYYYYfl" + b"c"),
               ev(XidEvent, log_pos=77)]
    assert commits(replica, "0-1-6")[0].digest == ours[1].digest
    # a fresh server reusing 0-1-7: another time, or other rows, or another table
    for other in (tx("0-1-7", 101, [b"b", b"c"], 900), tx("0-1-7", 100, [b"b", b"d"], 900),
                  tx("0-1-7", 100, [b"b"], 900)):
        assert commits(other, "0-1-6")[0].digest != ours[1].digest
    moved = tx("0-1-7", 100, [b"b", b"c"], 900)
    moved[1].table = "u"
    assert commits(moved, "0-1-6")[0].digest != ours[1].digest


def test_mysql_begin_and_standalone_ddl() -> None:
    g = [ev(GtidEvent, sid=bytes.fromhex(U1.replace("-", "")), gno=n) for n in (1, 2, 3)]
    events = [g[0], query("BEGIN"), ev(WriteRowsEvent), ev(XidEvent, log_pos=300),
              g[1], query("CREATE TABLE t (id int)", log_pos=400),
              g[2], query("BEGIN"), ev(WriteRowsEvent), query("COMMIT", log_pos=600)]
    got = take(stream_of(events, MysqlGtidSet()).items(), 9)
    assert [type(i) for i in got] == [TxBegin, RowChange, TxCommit, TxBegin, Statement, TxCommit,
                                      TxBegin, RowChange, TxCommit]
    assert got[5].gtid_set == f"{U1}:1-2" and got[8].gtid_set == f"{U1}:1-3"


def test_a_gtid_without_commit_stops_the_stream() -> None:
    events = [mgtid("0-1-1"), ev(WriteRowsEvent), mgtid("0-1-2")]
    items = stream_of(events, MariadbGtidPosition()).items()
    take(items, 2)
    with pytest.raises(Exception, match="has no commit before 0-1-2"):
        next(items)


def test_server_errors_are_classified() -> None:
    class Failing(FakeReader):
        def __init__(self, exc: Exception) -> None:
            self.exc = exc

        def fetchone(self) -> Any:
            raise self.exc

    s = stream_of([], MariadbGtidPosition())
    s._reader = Failing(pymysql.err.OperationalError(1236, "Could not find GTID state"))
    with pytest.raises(PositionLostError, match="cannot send the binlog from our position"):
        next(s.items())
    s._reader = Failing(pymysql.err.OperationalError(2013, "Lost connection"))
    with pytest.raises(StreamLostError):
        next(s.items())
