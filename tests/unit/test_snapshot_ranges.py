"""`ranges.TableRead`: how readers on several connections share one table's read (pure
logic; against real servers: tests/integration/test_pg_snapshot.py, test_mysql_snapshot.py)."""

from __future__ import annotations

import threading
from collections.abc import Callable

from tailrace.proto import control_pb2 as pb
from tailrace_services.capture.snapshot.chunks import TablePlan
from tailrace_services.capture.snapshot.progress import Progress
from tailrace_services.capture.snapshot.ranges import WAIT, Span, TableRead

STOPPED = threading.Event()


def table_read(*, cursor: str = "", chunks_done: int = 0, reset: bool = False,
               rows: int = 35) -> tuple[TableRead, list[list[str] | None]]:
    """A read of a table of keys 1..`rows`, ends found 10 rows apart (`boundary`)."""
    entry = pb.SnapshotTable(table="public.t", request_id=1, cursor=cursor,
                             chunks_done=chunks_done, reset=reset)
    read = TableRead(entry, TablePlan("public.t", ("id",)), set(), Progress(0, rows), 2)
    asked: list[list[str] | None] = []

    def find_end(after: list[str] | None) -> list[str] | None:
        asked.append(after)
        start = int(after[0]) if after else 0
        return [str(start + 10)] if start + 10 < rows else None

    ENDS[id(read)] = find_end
    return read, asked


ENDS: dict[int, Callable[[list[str] | None], list[str] | None]] = {}


def claim(read: TableRead, block: bool = False) -> Span | None:
    return read.claim(ENDS[id(read)], STOPPED, block=block)


def done(read: TableRead, span: Span, last: bool = False, cursor: str = "") -> None:
    read.done(span, pb.SnapshotChunk(chunk=span.number, cursor=cursor or str(span.upto),
                                     last=last))


def test_ranges_are_handed_out_in_key_order_each_ending_where_the_next_starts() -> None:
    read, asked = table_read(cursor='["5"]', chunks_done=2)
    spans = [claim(read) for _ in range(3)]
    assert spans == [Span(3, ["5"], ["15"]), Span(4, ["15"], ["25"]), Span(5, ["25"], None)]
    assert asked == [["5"], ["15"], ["25"]]
    assert claim(read) is WAIT, "nothing after the last range until it is done"
    assert not read.joinable()


def test_the_last_range_waits_for_every_range_before_it() -> None:
    read, _ = table_read(rows=15)
    first, last = claim(read), claim(read)
    assert first is not None and last is not None and last.last
    waited = threading.Thread(target=read.wait_before, args=(last, STOPPED))
    waited.start()
    waited.join(0.2)
    assert waited.is_alive(), "chunk 1 is not done"
    done(read, first)
    waited.join(2)
    assert not waited.is_alive()
    done(read, last, last=True)
    assert read.ended and claim(read, block=True) is None


def test_a_last_range_that_found_more_rows_hands_out_ranges_after_them() -> None:
    """Rows inserted after the end was looked for: the last range read `chunk_size` of them
    and says more follow; ranges go on from its last key."""
    read, asked = table_read(rows=5)
    last = claim(read)
    assert last == Span(1, None, None)
    done(read, last, last=False, cursor='["7"]')
    assert not read.ended
    assert claim(read) == Span(2, ["7"], None)
    assert asked[-1] == ["7"]


def test_a_reset_reads_its_first_chunk_alone() -> None:
    """The first chunk of a reset read publishes the TRUNCATE: no other range before it is
    done."""
    read, _ = table_read(reset=True)
    first = claim(read)
    assert first is not None and read.resets(first)
    assert claim(read) is WAIT and not read.joinable()
    done(read, first)
    second = claim(read)
    assert second is not None and not read.resets(second) and read.joinable()


def test_cursors_are_stored_in_chunk_order_whatever_order_chunks_are_done_in() -> None:
    read, _ = table_read()
    one, two, three = claim(read), claim(read), claim(read)
    assert one and two and three
    done(read, three)
    done(read, two)
    assert read.to_store(0) is None, "chunk 1 is not done: the cursor may not pass it"
    done(read, one)
    assert read.to_store(3) is None, "three waiting, up to three may wait"
    order = []
    while (chunk := read.to_store(0)) is not None:
        order.append(chunk.chunk)
        read.stored(chunk)
    assert order == [1, 2, 3]


def test_a_stopped_read_hands_out_nothing_and_wakes_the_waiting() -> None:
    read, _ = table_read(rows=15)
    first, last = claim(read), claim(read)
    assert first is not None and last is not None
    answer: list[bool] = []
    waiting = threading.Thread(target=lambda: answer.append(read.wait_before(last, STOPPED)))
    waiting.start()
    read.release(first)
    waiting.join(2)
    assert answer == [False] and claim(read, block=True) is None


def test_a_reader_waiting_for_ranges_does_not_keep_another_from_hearing_it_must_wait() -> None:
    """Reader A waits (block) while the last range is out; reader B, holding a chunk the
    last range waits for, asks without blocking: it must hear WAIT at once (and go finish
    its chunk), not queue behind A — that was a deadlock of four readers."""
    read, _ = table_read(rows=25)
    held, _middle, last = claim(read), claim(read), claim(read)
    assert held is not None and last is not None and last.last
    waiting = threading.Thread(target=claim, args=(read, True), daemon=True)
    waiting.start()
    waiting.join(0.2)
    assert waiting.is_alive()
    answers: list[Span | None] = []
    asking = threading.Thread(target=lambda: answers.append(claim(read)), daemon=True)
    asking.start()
    asking.join(2)
    assert answers == [WAIT]
    read.stop()
    waiting.join(2)
    assert not waiting.is_alive()
