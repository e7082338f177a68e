"""MySQL snapshot logic without a server: the chunk query, cursor text, the signal table's
rows, where a new snapshotting pipeline starts, and the feed turning signal transactions
into watermarks that the merger replaces with read transactions (real-server tests:
tests/integration/test_mysql_snapshot.py)."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Callable, Iterator
from typing import Any

from pymysqlreplication.row_event import DeleteRowsEvent, WriteRowsEvent

from tailrace.events import ChangeEvent, Op, Row, decode_record, value_of
from tailrace_services.capture.assembler import BEGIN, Commit, Prepared
from tailrace_services.capture.metrics import CaptureMetrics
from tailrace_services.capture.resume import ResumePoint
from tailrace_services.capture.snapshot import ChunkRows, SnapshotMerger, watermark_content
from tailrace_services.capture.snapshot.merger import Chunk
from tailrace_services.capture_mysql.connection import ConnectionSettings, ServerFacts
from tailrace_services.capture_mysql.events import ChangeFeed, EventFactory
from tailrace_services.capture_mysql.gtid import MariadbGtidPosition
from tailrace_services.capture_mysql.position import CapturePosition, resume_from
from tailrace_services.capture_mysql.reader import RowChange, TxBegin, TxCommit
from tailrace_services.capture_mysql.schema import TableShape
from tailrace_services.capture_mysql.signal_table import DEFAULT_SIGNAL_TABLE, SignalTable
from tailrace_services.capture_mysql.snapshot import MysqlChunks, _Table, binlog_form, cursor_text
from tailrace_services.capture_mysql.tables import TableFilter
from tailrace_services.capture_mysql.values import RowDecoder

SIGNAL = SignalTable.parse(None)


def _table(keys: tuple[str, ...], binary: frozenset[str] = frozenset(), given: bool = False
           ) -> _Table:
    shape = TableShape("shop", "t", ())
    return _Table("shop", "t", shape, RowDecoder(shape), keys, "`a`, `b`", [], binary, 0,
                  given=given)


def test_the_chunk_query_ranges_on_the_first_key_column_and_escapes_the_filter() -> None:
    query, params = MysqlChunks._query(_table(("id",)), None, None, 10, "")
    assert (query, params) == ("SELECT `a`, `b` FROM `shop`.`t` ORDER BY `id` LIMIT 11", [])
    query, params = MysqlChunks._query(_table(("r", "id"), frozenset({"id"})),
                                       ["r3", "00ff"], None, 5, "body LIKE 'b%'")
    assert query == ("SELECT `a`, `b` FROM `shop`.`t` WHERE `r` >= %s AND ((`r` > %s) OR "
                     "(`r` = %s AND `id` > UNHEX(%s))) AND (body LIKE 'b%%') "
                     "ORDER BY `r`, `id` LIMIT 6")
    assert params == ["r3", "r3", "r3", "00ff"]


def test_a_key_range_is_read_whole_up_to_its_end_key() -> None:
    """A range found by `boundary`: every row up to and including its end, no LIMIT (the
    range's rows were counted when its end was found)."""
    query, params = MysqlChunks._query(_table(("id",)), ["10"], ["20"], 10, "")
    assert query == "SELECT `a`, `b` FROM `shop`.`t` WHERE (`id` > %s) AND `id` <= %s AND " \
                    "NOT ((`id` > %s)) ORDER BY `id`"
    assert params == ["10", "20", "20"]
    query, params = MysqlChunks._query(_table(("r", "id"), frozenset({"id"})), None,
                                       ["r9", "0a"], 5, "")
    assert query == ("SELECT `a`, `b` FROM `shop`.`t` WHERE `r` <= %s AND NOT (`r` >= %s AND "
                     "((`r` > %s) OR (`r` = %s AND `id` > UNHEX(%s)))) ORDER BY `r`, `id`")
    assert params == ["r9", "r9", "r9", "r9", "0a"]


def test_a_chunk_by_a_given_key_says_which_row_repeats_the_key_before_it() -> None:
    """`snapshot.key_columns`: the same chunk, each row flagged when the server compares its
    key equal to the row's before it (the extra row included)."""
    query, params = MysqlChunks._query(_table(("h", "n"), given=True), ["a", "1"], None, 5, "")
    assert query == ("SELECT c.*, c.`h` <=> LAG(c.`h`) OVER w AND c.`n` <=> LAG(c.`n`) OVER w "
                     "FROM (SELECT `a`, `b` FROM `shop`.`t` WHERE `h` >= %s AND ((`h` > %s) OR "
                     "(`h` = %s AND `n` > %s)) ORDER BY `h`, `n` LIMIT 6) AS c "
                     "WINDOW w AS (ORDER BY `h`, `n`) ORDER BY `h`, `n`")
    assert params == ["a", "a", "a", "1"]


def test_cursor_values_are_text_the_server_compares_like_the_column() -> None:
    assert cursor_text(b"\x00\xff") == "00ff"
    assert cursor_text(dt.datetime(2024, 1, 2, 3, 4, 5, 6)) == "2024-01-02 03:04:05.000006"
    assert cursor_text(dt.timedelta(hours=-838, seconds=1.5)) == "-837:59:58.500000"
    assert cursor_text(2**64 - 1) == "18446744073709551615"


def test_the_signal_table_name_and_its_rows() -> None:
    assert SIGNAL.name == DEFAULT_SIGNAL_TABLE == "tailrace.snapshot_signal"
    assert SignalTable.parse("ops.sig").quoted == "`ops`.`sig`"
    rows: list[dict[str, Any]] = [{"values": {"content": watermark_content("a:1", high=True)}},
            {"values": {"content": "not json"}}, {"values": {}}]
    assert SignalTable.watermarks(rows) == [("a:1", True)]
    matcher = TableFilter(["%.%"], exclude=[("tailrace", "snapshot_signal")])
    assert matcher.matches("shop", "t") and not matcher.matches("tailrace", "snapshot_signal")


def test_a_new_pipeline_with_an_initial_snapshot_streams_from_the_current_position() -> None:
    facts = ServerFacts(flavor="mariadb", version="10.11", server_id=1, binlogs=["b.1"],
                        gtid_binlog_pos=MariadbGtidPosition.parse("0-1-500"))
    nothing = ResumePoint(None, None, None)
    assert resume_from(nothing, facts)[1].gtid_set == ""  # the oldest binlog
    assert resume_from(nothing, facts, from_now=True)[1].gtid_set == "0-1-500"


class _Stream:
    def __init__(self, items: list[Any]) -> None:
        self._items = items

    def items(self) -> Iterator[Any]:
        yield from self._items


def _rows_event(cls: Any, table: tuple[str, str], rows: list[dict[str, Any]]) -> RowChange:
    event = object.__new__(cls)  # no packet: the rows are given
    event.schema, event.table = table
    event._RowsEvent__rows = rows
    return RowChange(event)


def _signal_tx(n: int, token: str, high: bool) -> list[Any]:
    return [TxBegin(f"0-1-{n}", 0),
            _rows_event(WriteRowsEvent, ("tailrace", "snapshot_signal"),
                        [{"values": {"content": watermark_content(token, high)}}]),
            TxCommit(f"0-1-{n}", f"0-1-{n}", "b.1", n * 100, 0, 0)]


def test_signal_transactions_become_watermarks_and_the_read_takes_the_high_ones_place() -> None:
    """tx_seq counts every binlog transaction once: the read transaction is at its high
    watermark's position, in place of that transaction's empty commit."""
    items = [*_signal_tx(1, "c1", False), *_signal_tx(2, "c1", True),
             *_signal_tx(3, "other-pipeline", True),
             TxBegin("0-1-4", 0),  # a delete of old signal rows: an ordinary empty commit
             _rows_event(DeleteRowsEvent, ("tailrace", "snapshot_signal"), []),
             TxCommit("0-1-4", "0-1-4", "b.1", 400, 0, 0)]
    feed = ChangeFeed(_Stream(items), EventFactory("src", "acme"), None,  # type: ignore[arg-type]
                      TableFilter(["shop.t"], exclude=[("tailrace", "snapshot_signal")]),
                      ConnectionSettings("h"), CaptureMetrics("src", "mysql"),
                      CapturePosition("mariadb", tx_seq=10), server_id=1, identity="i",
                      signal=SIGNAL)
    merger = SnapshotMerger("src", "acme")
    merger.record("shop.t", ("id",))
    chunk = Chunk("shop.t", ("id",), request_id=1, number=1, last=True)
    merger.open("c1", chunk)
    template = ChangeEvent(database="shop", table="t", op=Op.OP_SNAPSHOT_READ)
    row = Row(columns=[{"name": "id", "value": value_of(7)}])
    merger.fill("c1", ChunkRows(template, {(value_of(7).SerializeToString(),):
                                           (b"shop..t", row.SerializeToString())}, ["7"], False))
    out = list(merger.items(feed.items()))
    commits = [i for i in out if isinstance(i, Commit | Prepared)]
    assert [c.position.tx_seq for c in commits] == [11, 12, 13, 14]
    assert [c.tx_id for c in commits] == ["0-1-1", "snapshot-1-1", "0-1-3", "0-1-4"]
    read = commits[1]
    assert isinstance(read, Prepared) and chunk.outcome == "published"
    [(key, value)] = read.records
    stamped = decode_record(value).event
    assert key == b"shop..t" and stamped.after == row
    assert stamped.position.tx_seq == 12 and stamped.position.mysql.gtid == "0-1-2"
    assert stamped.snapshot.chunk == 1 and stamped.snapshot.last
    assert out.count(BEGIN) == 4  # one per binlog transaction; the read comes whole


def test_values_read_by_select_take_the_binlog_librarys_form() -> None:
    """What `values.converter_for` then expects, per type (MariaDB and MySQL; the MariaDB
    types are also compared with the real binlog in the integration test)."""
    def form(type_name: str, flavor: str = "mariadb") -> Callable[[Any], Any]:
        found = binlog_form(type_name, flavor)
        assert found is not None, type_name
        return found

    assert binlog_form("int", "mariadb") is None
    assert form("bit(10)")(b"\x02\xab") == "1010101011"
    uid = "f7954029-e7bb-11f1-ae82-02fc00000001"
    assert form("uuid")(uid) == uuid.UUID(uid).bytes
    assert form("inet6")("::ffff:1.2.3.4") == b"\x00" * 10 + b"\xff\xff\x01\x02\x03\x04"
    for zero_date in ("date", "datetime", "datetime(6)"):
        assert form(zero_date)("0000-00-00") is None
    assert form("timestamp(6)")("0000-00-00 00:00:00") == dt.datetime(1970, 1, 1)
    assert binlog_form("json", "mariadb") is None  # MariaDB's JSON is text in the binlog too
    # MySQL's binary JSON is parsed by the library; its text form parsed alike (numbers as
    # the library's doubles), then printed compactly by `values._json_text`
    assert form("json", "mysql")('{"a": [1, 2.5], "b": null}') == {"a": [1, 2.5], "b": None}


def test_a_new_pipeline_streams_from_now_only_while_no_table_snapshot_got_anywhere() -> None:
    from types import SimpleNamespace

    from tailrace.proto import control_pb2 as pb
    from tailrace_services.capture_mysql.service import MysqlCapture

    def covers(mode: str, *tables: pb.SnapshotTable) -> bool:
        fake = SimpleNamespace(
            source=SimpleNamespace(snapshot=SimpleNamespace(mode=mode)),
            pipeline=SimpleNamespace(name="p"),
            control=SimpleNamespace(snapshot_state=lambda _: pb.SnapshotState(tables=tables)))
        return MysqlCapture._snapshot_covers_the_past(fake)  # type: ignore[arg-type]

    assert covers("initial") and covers("initial_only")
    assert not covers("never")
    assert covers("initial", pb.SnapshotTable(table="a", state=pb.SNAPSHOT_PENDING),
                  pb.SnapshotTable(table="b", state=pb.SNAPSHOT_RUNNING))
    for later in (pb.SnapshotTable(table="a", state=pb.SNAPSHOT_DONE),
                  pb.SnapshotTable(table="a", state=pb.SNAPSHOT_FAILED),
                  pb.SnapshotTable(table="a", state=pb.SNAPSHOT_CANCELLED),
                  pb.SnapshotTable(table="a", state=pb.SNAPSHOT_RUNNING, chunks_done=2,
                                   cursor='["5"]')):
        assert not covers("initial", later), later
