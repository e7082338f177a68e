"""The merger's rules on a hand-made feed (pure logic): the window rule, a reset chunk's
TRUNCATE at its low watermark, and what a reset chunk must not trust. The same rules
against real servers: tests/integration/test_pg_snapshot.py, tests/chaos/test_pg_resnapshot.py."""

from __future__ import annotations

from collections.abc import Iterable

import pytest

from tailrace.events import Op, bus_key, decode_record, event_id
from tailrace.proto.control_pb2 import Checkpoint, Epoch
from tailrace.proto.event_pb2 import ChangeEvent, Position, PostgresPosition, Row, Value
from tailrace_services.capture.assembler import BEGIN, Commit, FeedItem, Prepared
from tailrace_services.capture.snapshot import ChunkRows, SnapshotMerger, Watermark, key_of
from tailrace_services.capture.snapshot import merger as merger_module
from tailrace_services.capture.snapshot.merger import Chunk
from tailrace_services.capture.snapshot.records import read_transaction
from tailrace_services.capture_postgres.position import (
    Resume,
    era_of,
    lsn_of,
    timeline_of,
    tx_seq_of,
)
from tailrace_services.capture_postgres.snapshot import _invisible

KEYS = ("id",)


def row(i: int) -> Row:
    r = Row()
    r.columns.add(name="id", value=Value(int_value=i))
    return r


def read(i: int) -> ChangeEvent:
    return ChangeEvent(schema="public", table="t", op=Op.OP_SNAPSHOT_READ, after=row(i),
                       key_columns=KEYS)


def change(i: int) -> ChangeEvent:
    return ChangeEvent(schema="public", table="t", op=Op.OP_UPDATE, after=row(i),
                       key_columns=KEYS)


def tx(tx_id: str, *ids: int) -> list[FeedItem]:
    return [BEGIN, *[change(i) for i in ids],
            Commit(lambda e, i, n: e, Position(tx_seq=int(tx_id)), 0, tx_id)]


def mark(high: bool, tx_seq: int) -> Watermark:
    return Watermark("tok", high, Position(tx_seq=tx_seq))


def published(merger: SnapshotMerger, feed: Iterable[FeedItem | Watermark]
              ) -> list[list[ChangeEvent]]:
    """The transactions the merger lets through, as lists of their (stamped) events."""
    out: list[list[ChangeEvent]] = []
    current: list[ChangeEvent] = []
    for item in merger.items(feed):
        if item is BEGIN:
            current = []
        elif isinstance(item, ChangeEvent):
            current.append(item)
        elif isinstance(item, list):
            current.extend(item)
        elif isinstance(item, Commit):
            out.append([item.stamp(e, i, len(current)) for i, e in enumerate(current)])
        elif isinstance(item, Prepared):
            out.append([decode_record(value).event for _, value in item.records])
    return out


def encoded(events: Iterable[ChangeEvent]) -> dict[tuple[bytes, ...], tuple[bytes, bytes]]:
    """Read events as a source hands them to the merger (`ChunkRows.rows`)."""
    return {key_of(e.after, KEYS): (bus_key(e), e.after.SerializeToString()) for e in events}


def chunk_of(merger: SnapshotMerger, ids: range, *, cleared: bool = False,
             hidden: set[str] | None = None, remember_before: bool = True) -> Chunk:
    merger.record("public.t", KEYS, remember_before=remember_before)
    truncate = ChangeEvent(schema="public", table="t", op=Op.OP_TRUNCATE, key_columns=KEYS)
    chunk = Chunk("public.t", KEYS, request_id=1, number=1,
                  cleared=truncate if cleared else None)
    merger.open("tok", chunk)
    template = ChangeEvent(schema="public", table="t", op=Op.OP_SNAPSHOT_READ, key_columns=KEYS)
    merger.fill("tok", ChunkRows(template, encoded(read(i) for i in ids), [str(ids[-1])],
                                 more=False, hidden=(hidden or set()).__contains__))
    return chunk


def ids(events: list[ChangeEvent]) -> list[int]:
    return [e.after.columns[0].value.int_value for e in events if e.after.columns]


def test_a_key_changed_between_the_watermarks_is_left_to_the_log() -> None:
    merger = SnapshotMerger("src", "acme")
    chunk = chunk_of(merger, range(1, 6))
    out = published(merger, [*tx("10", 9), mark(False, 11), *tx("12", 2, 4),
                             mark(True, 13), *tx("14", 3)])
    assert [ids(t) for t in out] == [[9], [2, 4], [1, 3, 5], [3]]
    assert all(e.position.tx_seq == 13 for e in out[2]) and chunk.outcome == "published"


def test_a_change_before_the_low_watermark_its_read_could_not_see_is_left_to_the_log() -> None:
    """Tx 10 is in the stream before the low watermark, but its commit was not yet visible
    to the read's snapshot, and it was newer than every completed transaction: the
    snapshot counts it as at or past its xmax, not as running (PostgreSQL's
    `pg_current_snapshot()`; a loaded machine showed it). Its key is left to the log: the
    read's older row must not follow the change."""
    merger = SnapshotMerger("src", "acme")
    chunk = chunk_of(merger, range(1, 4))
    chunk.rows.hidden = _invisible(10, running=[7])  # type: ignore[union-attr]
    out = published(merger, [*tx("9", 3), *tx("10", 2), mark(False, 11), mark(True, 13)])
    assert [ids(t) for t in out] == [[3], [2], [1, 3]], "2 left to tx 10; 3 seen by the read"


def test_a_reset_chunk_whose_read_missed_a_transaction_past_its_xmax_is_read_again() -> None:
    """As with a transaction listed as running: streamed before the TRUNCATE, not in the
    read, so the chunk is read again rather than losing its row."""
    merger = SnapshotMerger("src", "acme")
    chunk = chunk_of(merger, range(1, 4), cleared=True)
    chunk.rows.hidden = _invisible(10, running=[])  # type: ignore[union-attr]
    out = published(merger, [*tx("10", 2), mark(False, 11), mark(True, 13)])
    assert chunk.outcome == "discarded"
    assert [ids(t) for t in out] == [[2], []]  # the change, the TRUNCATE; no read


def test_a_transaction_streamed_before_the_recording_and_hidden_from_the_read_reads_again(
        ) -> None:
    """Tx 10 was streamed before the merger recorded the table, so its keys are not known;
    its commit was not yet visible to the read (a synchronous standby can hold it back for
    as long as it likes). The read may be older than tx 10's change, which is on the bus
    already: the chunk is read again. A transaction streamed before that the read did see
    is no reason to."""
    merger = SnapshotMerger("src", "acme")
    published(merger, [*tx("9", 1), *tx("10", 2)])
    chunk = chunk_of(merger, range(1, 4), hidden={"10"})
    assert published(merger, [mark(False, 11), mark(True, 13)]) == []
    assert chunk.outcome == "discarded"

    merger = SnapshotMerger("src", "acme")
    published(merger, [*tx("9", 1), *tx("10", 2)])
    chunk = chunk_of(merger, range(1, 4), hidden={"8"})
    assert [ids(t) for t in published(merger, [mark(False, 11), mark(True, 13)])] == [[1, 2, 3]]


def test_the_commits_remembered_before_a_recording_are_the_last_few_and_recent(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the last RECENT_COMMITS commits, streamed within RECENT_S, are taken as unknown
    (an id from long ago could wrap around and look new to the snapshot); a source whose
    reads see every commit streamed before them remembers none; a transaction no chunk
    can name any more is forgotten."""
    monkeypatch.setattr(merger_module, "RECENT_COMMITS", 2)
    merger = SnapshotMerger("src", "acme")
    published(merger, [*tx("8", 1), *tx("9", 1), *tx("10", 2)])
    chunk = chunk_of(merger, range(1, 4), hidden={"8"})
    assert [ids(t) for t in published(merger, [mark(False, 11), mark(True, 13)])] == [[1, 2, 3]]
    assert chunk.outcome == "published", "8 fell out of the last two"

    merger = SnapshotMerger("src", "acme")
    published(merger, tx("10", 2))
    merger._recent[-1] = (merger._recent[-1][0] - merger_module.RECENT_S - 1, "10")
    chunk = chunk_of(merger, range(1, 4), hidden={"10"})
    published(merger, [mark(False, 11), mark(True, 13)])
    assert chunk.outcome == "published", "10 was streamed too long ago"

    merger = SnapshotMerger("src", "acme")
    published(merger, tx("10", 2))
    chunk = chunk_of(merger, range(1, 4), hidden={"10"}, remember_before=False)  # MySQL
    published(merger, [mark(False, 11), mark(True, 13)])
    assert chunk.outcome == "published"

    merger = SnapshotMerger("src", "acme")
    published(merger, tx("10", 2))
    chunk = chunk_of(merger, range(1, 4))
    chunk.rows.forgettable = {"10"}.__contains__  # type: ignore[union-attr]
    published(merger, [mark(False, 11), mark(True, 13)])
    assert chunk.outcome == "published" and merger._unrecorded["public.t"] == set()


def test_a_transaction_under_way_when_the_recording_began_counts_as_unrecorded() -> None:
    """Tx 10 changed key 2 before the merger recorded the table and key 3 after: the
    recording knows only key 3. Hidden from the read, tx 10 would leave key 2's older read
    to follow its change; the chunk is read again."""
    merger = SnapshotMerger("src", "acme")
    chunks: list[Chunk] = []

    def feed() -> Iterable[FeedItem | Watermark]:
        yield BEGIN
        yield change(2)
        chunks.append(chunk_of(merger, range(1, 4), hidden={"10"}))
        yield change(3)
        yield Commit(lambda e, i, n: e, Position(tx_seq=10), 0, "10")
        yield mark(False, 11)
        yield mark(True, 13)

    assert [ids(t) for t in published(merger, feed())] == [[2, 3]]
    assert chunks[0].outcome == "discarded"


def test_what_a_postgres_snapshot_could_not_see() -> None:
    invisible = _invisible(2**32 + 100, running=[2**32 + 95])  # xid8 values of epoch 1
    assert [invisible(t) for t in ("94", "95", "96", "99", "100", "101")] == [
        False, True, False, False, True, True]
    wrapped = _invisible(2**32 + 3, running=[2**32 - 2])  # 32-bit ids wrap around
    assert [invisible_ for invisible_ in map(wrapped, ("4294967293", "4294967294", "2", "3", "4"))
            ] == [False, True, False, True, True]


def test_a_reset_chunk_truncates_at_its_low_watermark_then_reads_everything_after() -> None:
    merger = SnapshotMerger("src", "acme")
    chunk_of(merger, range(1, 4), cleared=True)
    out = published(merger, [*tx("10", 1), mark(False, 11), *tx("12", 2), mark(True, 13)])
    assert [[e.op for e in t] for t in out][1] == [Op.OP_TRUNCATE]
    assert out[1][0].position.tx_seq == 11  # after the change to 1, before the one to 2
    assert [ids(t) for t in out] == [[1], [], [2], [1, 3]]


def test_a_reset_chunk_whose_read_missed_a_transaction_before_its_truncate_is_read_again(
        ) -> None:
    """Tx 10 is in the stream before the low watermark (so before the TRUNCATE) but was not
    visible to the read: keeping its key out of the read, as without a reset, would lose
    the row; the chunk is discarded and read again."""
    merger = SnapshotMerger("src", "acme")
    chunk = chunk_of(merger, range(1, 4), cleared=True, hidden={"10"})
    out = published(merger, [*tx("10", 2), mark(False, 11), mark(True, 13)])
    assert chunk.outcome == "discarded"
    assert [ids(t) for t in out] == [[2], []]  # the change, the TRUNCATE; no read


def test_a_reset_chunk_reads_again_the_keys_an_earlier_attempt_left_on_the_bus() -> None:
    merger = SnapshotMerger("src", "acme")
    chunk = chunk_of(merger, range(1, 4), cleared=True)
    chunk.exclude = {key_of(row(1), KEYS)}  # on the bus before the new TRUNCATE: gone
    out = published(merger, [mark(False, 11), mark(True, 13)])
    assert [ids(t) for t in out] == [[], [1, 2, 3]]


def test_positions_of_a_new_era_sort_after_any_lsn_of_the_old_one() -> None:
    old = tx_seq_of(timeline=3, lsn=0xFFFF_FFFF_FFFF)
    new = tx_seq_of(timeline=1, lsn=0x100, era=1)
    assert new > old and new < 2**63
    assert (era_of(new), lsn_of(new), timeline_of(Position(tx_seq=new))) == (1, 0x100, 1)
    checkpoint = Checkpoint(position=Position(tx_seq=old))
    epoch = Epoch(position=Position(tx_seq=tx_seq_of(1, 0x200, era=1)))
    resume = Resume.of(checkpoint, epoch, era=1)  # the checkpoint is of the lost history
    assert (resume.lsn, resume.published_lsn) == (0, 0x200)
    assert Resume.of(checkpoint, None, era=1).has_position is False


def test_a_read_transaction_is_what_stamping_each_event_gives() -> None:
    """Records written field by field (`records.py`) parse to the events the stamping
    rules describe, and carry the same bus keys as those events."""
    template = ChangeEvent(source_id="src", tenant="acme", database="shop", schema="public",
                           table="t", op=Op.OP_SNAPSHOT_READ, key_columns=KEYS,
                           schema_version="v1")
    events = []
    for i in (7, 300, 2**40):
        event = ChangeEvent()
        event.CopyFrom(template)
        event.after.CopyFrom(row(i))
        events.append(event)
    position = Position(tx_seq=2**56 + 99, postgres=PostgresPosition(commit_lsn=99, timeline=1))
    prepared = read_transaction(template, list(encoded(events).values()), source_id="src",
                                tenant="acme", request_id=4, chunk=12, last=True,
                                position=position, tx_id="snapshot-4-12", ts_us=1_700_000_000_123_456)
    assert prepared.position == position and prepared.last.event_index == 2
    for index, (event, (key, value)) in enumerate(zip(events, prepared.records, strict=True)):
        expected = ChangeEvent()
        expected.CopyFrom(event)
        expected.tx_id, expected.tx_index, expected.tx_size = "snapshot-4-12", index, 3
        expected.tx_end = index == 2
        expected.position.CopyFrom(position)
        expected.position.event_index = index
        expected.ts_source_micros = expected.ts_captured_micros = 1_700_000_000_123_456
        expected.id = event_id("src", f"{position.tx_seq:X}", index, 1_700_000_000_123)
        expected.idempotency_key = f"acme|shop.public.t|snapshot-4-12|{expected.id}"
        expected.snapshot.request_id, expected.snapshot.chunk = 4, 12
        expected.snapshot.last = index == 2
        assert decode_record(value).event == expected
        assert key == bus_key(expected)


def test_a_discarded_chunk_leaves_the_other_ranges_of_its_table_alone() -> None:
    """Two readers read ranges 1-2 and 3-4 of one table at once. Chunk 1 is discarded at
    its high watermark (a transaction hidden from its read that the stream passed before
    it recorded the table): its range is read again, and chunk 2, whose range ends where it
    was found before either read, is published — their keys never meet."""
    merger = SnapshotMerger("src", "acme")
    published(merger, tx("77", 9))
    merger.record("public.t", KEYS)
    template = ChangeEvent(schema="public", table="t", op=Op.OP_SNAPSHOT_READ, key_columns=KEYS)
    first = Chunk("public.t", KEYS, request_id=1, number=1)
    second = Chunk("public.t", KEYS, request_id=1, number=2)
    merger.open("t1", first)
    merger.open("t2", second)
    merger.fill("t1", ChunkRows(template, encoded(read(i) for i in (1, 2)), ["2"], more=True,
                                hidden={"77"}.__contains__))
    merger.fill("t2", ChunkRows(template, encoded(read(i) for i in (3, 4)), ["4"], more=True))
    out = published(merger, [
        Watermark("t1", False, Position(tx_seq=11)), Watermark("t2", False, Position(tx_seq=12)),
        Watermark("t1", True, Position(tx_seq=13)), Watermark("t2", True, Position(tx_seq=14))])
    assert (first.outcome, second.outcome) == ("discarded", "published")
    assert [ids(t) for t in out] == [[3, 4]]


def test_a_transaction_is_forgotten_only_when_no_chunk_still_merging_could_hide_it() -> None:
    """Chunk A's read (snapshot xmin 50) is older than chunk B's (xmin 100), but B reaches
    its high watermark first. Tx 60 committed in the window of both, hidden from A's read:
    B must not forget it, or A would publish its stale row of key 1 after tx 60's change."""
    merger = SnapshotMerger("src", "acme")
    merger.record("public.t", KEYS)
    template = ChangeEvent(schema="public", table="t", op=Op.OP_SNAPSHOT_READ, key_columns=KEYS)
    older = Chunk("public.t", KEYS, request_id=1, number=1)
    newer = Chunk("public.t", KEYS, request_id=1, number=2)
    merger.open("a", older)
    merger.open("b", newer)
    merger.fill("a", ChunkRows(template, encoded(read(i) for i in (1, 2)), ["2"], more=True,
                               hidden={"60"}.__contains__,
                               forgettable=lambda tx: int(tx) < 50))
    merger.fill("b", ChunkRows(template, encoded(read(i) for i in (3, 4)), ["4"], more=True,
                               forgettable=lambda tx: int(tx) < 100))
    out = published(merger, [*tx("59", 8), *tx("60", 1), Watermark("a", False, Position(tx_seq=61)),
                             Watermark("b", False, Position(tx_seq=62)),
                             Watermark("b", True, Position(tx_seq=63)),
                             Watermark("a", True, Position(tx_seq=64))])
    assert [ids(t) for t in out] == [[8], [1], [3, 4], [2]], "key 1 left to tx 60"


def test_a_chunk_still_being_read_lets_forget_what_was_forgettable_when_it_was_announced(
) -> None:
    """Two readers, always one chunk each being read: the other reader's chunk, announced
    before this one's rows came, has no snapshot yet to ask. Its snapshot is newer than that
    of the chunk filled last before it was announced, so what that one could forget is
    forgotten (tx 30), and nothing more (tx 45) — else the record grows for the whole read."""
    merger = SnapshotMerger("src", "acme")
    merger.record("public.t", KEYS)
    template = ChangeEvent(schema="public", table="t", op=Op.OP_SNAPSHOT_READ, key_columns=KEYS)

    def rows(ids: tuple[int, ...], xmin: int) -> ChunkRows:
        return ChunkRows(template, encoded(read(i) for i in ids), [str(ids[-1])], more=True,
                         forgettable=lambda tx: int(tx) < xmin)

    earlier = Chunk("public.t", KEYS, request_id=1, number=1)
    merger.open("z", earlier)
    merger.fill("z", rows((1,), 40))
    mine, other = Chunk("public.t", KEYS, 1, 2), Chunk("public.t", KEYS, 1, 3)
    merger.open("a", mine)
    merger.open("b", other)  # being read: no rows yet
    merger.fill("a", rows((2, 3), 50))
    published(merger, [*tx("30", 8), *tx("45", 9), Watermark("a", False, Position(tx_seq=47)),
                       Watermark("a", True, Position(tx_seq=49))])  # chunk 1 still merging
    assert sorted(merger._recorded["public.t"]) == ["45"]
