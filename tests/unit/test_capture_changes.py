"""Streamed changes kept as bytes and stamped at their commit (`capture/changes.py`): each
record equals what stamping the change as an event gives, in C and in Python."""

from __future__ import annotations

import pytest

from tailrace.events import ChangeEvent, Op, bus_key, decode_record, encode_event
from tailrace.events._wire import cwire
from tailrace.proto.event_pb2 import BusRecord
from tailrace_services.capture import changes
from tailrace_services.capture.assembler import RUN, Commit, transaction_records
from tailrace_services.capture.changes import Change, ChangeStamp, _py_change_records
from tailrace_services.capture.txbuffer import TransactionBuffer
from tailrace_services.capture_mysql.events import EventFactory as MysqlFactory
from tailrace_services.capture_mysql.position import CapturePosition
from tailrace_services.capture_mysql.schema import shape_from_table_map
from tailrace_services.capture_mysql.values import RowDecoder
from tailrace_services.capture_postgres.events import ChangeFeed, _HeldRelation, _Streamed
from tailrace_services.capture_postgres.events import EventFactory as PgFactory
from tailrace_services.capture_postgres.position import Timelines
from tailrace_services.capture_postgres.reader import Begin as PgBegin
from tailrace_services.capture_postgres.reader import Commit as PgCommit
from tailrace_services.capture_postgres.schema import choose_key
from tests.unit.test_mysql_values import COLUMNS, HINTS
from tests.unit.test_pg_keys import ALL, BIG, delete_msg, insert_msg, relation, update_msg

XID, TX_SEQ, END_LSN, TS_US = 9, 0x1_0000_0200, 0x200, 1_795_000_000_123_456
CAPTURED = TS_US + 5  # the transaction's capture time, for its changes and events alike


def pg_factory() -> PgFactory:
    return PgFactory("src", "acme", "shop", Timelines(1), lambda rel: choose_key(rel, ["id"]))


def pg_changes(factory: PgFactory) -> list[Change]:
    """Every kind of row change, under FULL and DEFAULT, at small and large LSNs."""
    out: list[Change] = []
    for identity in ("d", "f"):
        rel = relation(identity, ALL if identity == "f" else (True, False, False))
        for lsn in (0, 100, 2**40):
            for msg in (insert_msg(rel, [5, "a", BIG]), insert_msg(rel, [lsn, None, ""]),
                        update_msg(rel, None, False, [5, "n", "b"]),
                        update_msg(rel, [4, None, None], True, [5, "n", "b"]),
                        update_msg(rel, [5, "o", BIG], False, [5, "n", "b"]),
                        delete_msg(rel, [5, None, None], True),
                        delete_msg(rel, [6, "o", BIG], False)):
                out.append(factory.from_change(msg, lsn, ("fp", 1)))
    return out


def pg_stamp(factory: PgFactory) -> ChangeStamp:
    return ChangeStamp("src", str(XID), factory.stamp(
        ChangeEvent(), xid=XID, tx_seq=TX_SEQ, end_lsn=END_LSN, commit_ts_us=TS_US, index=0,
        size=1).position, f"{TX_SEQ:X}", TS_US, CAPTURED)


def pg_commit(factory: PgFactory) -> Commit:
    def stamp(event: ChangeEvent, index: int, size: int) -> ChangeEvent:
        return factory.stamp(event, xid=XID, tx_seq=TX_SEQ, end_lsn=END_LSN,
                             commit_ts_us=TS_US, index=index, size=size, captured_us=CAPTURED)

    # the position without its per-event fields: what a feed's Commit holds
    position = factory.stamp(ChangeEvent(), xid=XID, tx_seq=TX_SEQ, end_lsn=END_LSN,
                             commit_ts_us=TS_US, index=0, size=1).position
    return Commit(stamp, position, TS_US, str(XID), None, pg_stamp(factory))


def records_as_events(records: list[tuple[bytes, bytes]]) -> list[tuple[bytes, ChangeEvent]]:
    return [(key, decode_record(value).event) for key, value in records]


def test_a_stamped_pg_change_is_the_event_stamping_gives() -> None:
    factory = pg_factory()
    items = pg_changes(factory)
    size = len(items)
    commit = pg_commit(factory)
    stamped = list(transaction_records(items, commit, size))
    expected = [commit.stamp(change.event(), index, size) for index, change in enumerate(items)]
    assert records_as_events(stamped) == [(bus_key(e), e) for e in expected]
    for (_, value), event in zip(stamped, expected, strict=True):
        assert BusRecord.FromString(value).WhichOneof("record") == "event"
        assert event.position.HasField("postgres")


def test_the_c_records_are_byte_for_byte_the_python_ones() -> None:
    if cwire is None:
        pytest.fail("_cwire is not built: run `make setup`")
    factory = pg_factory()
    items = pg_changes(factory)
    stamp = pg_stamp(factory)
    size = len(items) + 3
    for first in (0, 1, 3):
        c = stamp.records(items, first, size)
        saved = changes.change_records
        changes.change_records = _py_change_records
        try:
            py = stamp.records(items, first, size)
        finally:
            changes.change_records = saved
        assert c == py
    with pytest.raises(ValueError, match="past the transaction's size"):
        stamp.records(items, 4, size)
    with pytest.raises(TypeError):
        stamp.records([(b"", b"", 3, b"", b"", "not bytes")], 0, 1)  # type: ignore[list-item]


def test_a_transaction_of_changes_and_events_spilled_to_disk_keeps_its_order() -> None:
    """More changes than a C call stamps at once, a TRUNCATE between them, half of them
    read back from the spill file: each record is the stamped event, index by index."""
    factory = pg_factory()
    some = pg_changes(factory)
    rel = relation("d")
    truncate = factory.truncate(rel, 500, ("fp", 1))
    items: list[Change | ChangeEvent] = [some[i % len(some)] for i in range(RUN + 7)]
    items[3:3] = [truncate]
    items.append(factory.truncate(rel, 501, ("fp", 1)))
    buffer = TransactionBuffer(max_in_memory=RUN // 2)
    for item in items:
        buffer.append(ChangeEvent.FromString(item.SerializeToString())
                      if isinstance(item, ChangeEvent) else item)
    assert buffer.spilled_bytes > 0
    size = len(items)
    commit = pg_commit(factory)
    got = records_as_events(list(transaction_records(buffer, commit, size)))
    expected = [commit.stamp(item.event() if isinstance(item, Change) else item, index, size)
                for index, item in enumerate(items)]
    assert got == [(bus_key(e), e) for e in expected]
    assert [e.op for _, e in got][3] == Op.OP_TRUNCATE
    assert [e.tx_index for _, e in got] == list(range(size)) and got[-1][1].tx_end


def test_a_change_without_its_commit_records_is_refused() -> None:
    factory = pg_factory()
    commit = pg_commit(factory)
    bare = Commit(commit.stamp, commit.position, TS_US)
    with pytest.raises(TypeError, match="no `records`"):
        list(transaction_records(pg_changes(factory)[:1], bare, 1))


def test_a_stamped_mysql_change_is_the_event_stamping_gives() -> None:
    shape = shape_from_table_map("shop", "t", COLUMNS, HINTS)
    decoder, factory = RowDecoder(shape), MysqlFactory("src", "acme")
    row = {"id": 7, "txt": "é", "y": 2024}
    other = {"id": 8, "txt": None, "y": 1999}
    items = [factory.template(shape, 1, Op.OP_INSERT).change(
                 b"", decoder.row_bytes(None), decoder.row_bytes(row)),
             factory.template(shape, 1, Op.OP_UPDATE).change(
                 b"", decoder.row_bytes(row), decoder.row_bytes(other)),
             factory.template(shape, 2, Op.OP_DELETE).change(
                 b"", decoder.row_bytes(other), decoder.row_bytes(None))]
    position = CapturePosition("mariadb", tx_seq=41, gtid="0-1-41", gtid_set="0-1-41",
                               file="b.000001", offset=4, server_id=1, identity="id-1")
    native, commit_ts, captured_us = position.to_proto(), 1_795_000_000, 1_795_000_000_654_321

    def stamp(event: ChangeEvent, index: int, size: int) -> ChangeEvent:
        return factory.stamp(event, position, index=index, size=size, commit_ts=commit_ts,
                             native=native, captured_us=captured_us)

    commit = Commit(stamp, native, commit_ts * 1_000_000, position.gtid, None,
                    ChangeStamp("src", position.gtid, native, position.gtid,
                                commit_ts * 1_000_000, captured_us))
    got = records_as_events(list(transaction_records(items, commit, len(items))))
    expected = [stamp(c.event(), i, len(items)) for i, c in enumerate(items)]
    assert got == [(bus_key(e), e) for e in expected]
    assert encode_event(expected[0]) != b""  # the events are whole
    # an update is keyed by its old row (7, as the insert), a delete by its row (8)
    assert got[0][0] == got[1][0] != got[2][0]



def test_a_pg_transaction_s_changes_and_events_carry_one_capture_time() -> None:
    """The feed's Commit stamps a TRUNCATE and the row changes around it alike."""
    factory = pg_factory()
    feed = ChangeFeed(None, factory, None, None, None, 0)  # type: ignore[arg-type]
    commit = feed._commit(PgBegin(END_LSN - 8, TS_US, XID), PgCommit(0, END_LSN - 8, END_LSN,
                                                                     TS_US))
    items: list[Change | ChangeEvent] = [*pg_changes(factory)[:2],
                                         factory.truncate(relation("d"), 500, ("fp", 1))]
    got = records_as_events(list(transaction_records(items, commit, len(items))))
    assert len({event.ts_captured_micros for _, event in got}) == 1
    assert [event.tx_id for _, event in got] == [str(XID)] * 3


def test_a_streamed_transaction_drops_a_rolled_back_subtransaction_and_those_after_it() -> None:
    """What `ChangeFeed` holds of a transaction streamed while open (top xid 10): a Stream
    Abort of a subtransaction cuts from its first change, its nested ones with it; one with
    no change sent, or an unknown one, changes nothing."""
    held = _Streamed(10, TransactionBuffer(max_in_memory=2))
    for table, xid in [("a", 10), ("b", 11), ("c", 11), ("d", 12), ("e", 13), ("f", 10)]:
        held.add(ChangeEvent(table=table), xid)
    assert not held.abort(14)
    assert [e.table for e in held.items] == ["a", "b", "c", "d", "e", "f"]
    assert held.abort(12)  # ROLLBACK TO a savepoint whose first change is d; e was nested
    assert [e.table for e in held.items] == ["a", "b", "c"]
    assert held.subxacts == {11: (1, 0, 0)}
    held.note(15)  # a Relation of subtransaction 15 first, then its change
    d = relation("d")
    held.relations.append(_HeldRelation(d, 7, ("fp", None), ["id"]))
    held.add(ChangeEvent(table="g"), 15)
    held.truncates += 1
    found = held.held(d)
    assert found is not None and found.schema == ("fp", None)
    assert held.abort(15)  # its Relation goes with it, and the TRUNCATE count
    assert held.relations == [] and [e.table for e in held.items] == ["a", "b", "c"]
    assert held.held(d) is None and held.truncates == 0
    held.add(ChangeEvent(table="h"), 16)
    assert held.abort(11)
    assert [e.table for e in held.items] == ["a"]
    assert held.subxacts == {}
