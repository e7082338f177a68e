"""`recovery.settle`: which chunks an earlier process handed to the bus are done after a
restart, and which keys the bus holds already."""

from __future__ import annotations

from tailrace.proto import control_pb2 as pb
from tailrace_services.capture.snapshot.recovery import (
    Found,
    OnBus,
    ahead_of_a_gap,
    read_lost_again,
    settle,
    still_in_flight,
)


def _entry(*attempts: pb.SnapshotChunk, reset: bool = False) -> pb.SnapshotTable:
    return pb.SnapshotTable(table="public.t", request_id=3, reset=reset, inflight=attempts)


def _on_bus(size: int, *keys: int, partition: int = 0) -> OnBus:
    return OnBus(size, {(bytes([k]),) for k in keys}, {partition: (100, 100 + len(keys))})


def test_a_chunk_whole_on_the_bus_is_done_and_one_cut_short_is_read_again_without_its_keys(
) -> None:
    entry = _entry(pb.SnapshotChunk(chunk=1, tx_seq=11, rows=2, cursor="[\"2\"]"),
                   pb.SnapshotChunk(chunk=2, tx_seq=12, rows=3, cursor="[\"5\"]"))
    found = Found(reads={11: _on_bus(2, 1, 2), 12: _on_bus(3, 3, 4)})
    settled = settle(entry, covered=10, found=found)
    assert [c.chunk for c in settled.done] == [1]
    assert settled.exclude == {(b"\x03",), (b"\x04",)}
    assert [(c.chunk, dict(c.partial_from)) for c in settled.partial] == [(2, {0: 100})]
    assert settled.newly_found == 2


def test_chunks_are_done_in_order_only() -> None:
    entry = _entry(pb.SnapshotChunk(chunk=1, tx_seq=11, rows=2),
                   pb.SnapshotChunk(chunk=2, tx_seq=12, rows=1))
    settled = settle(entry, covered=10, found=Found(reads={11: _on_bus(2, 1),
                                                           12: _on_bus(1, 3)}))
    assert settled.done == []
    assert settled.exclude == {(b"\x01",), (b"\x03",)}


def test_a_chunk_is_done_only_right_after_the_one_before() -> None:
    """Ranges read on several connections reach the bus in any order: chunk 3 whole in a
    recorded epoch while chunk 2 never got there. The cursor must not pass chunk 2's range;
    chunk 3's keys are excluded from the reading again."""
    entry = _entry(pb.SnapshotChunk(chunk=1, tx_seq=11, rows=2, cursor="[\"2\"]"),
                   pb.SnapshotChunk(chunk=3, tx_seq=9, rows=2, cursor="[\"6\"]"))
    entry.chunks_done = 0
    settled = settle(entry, covered=12, found=Found(reads={9: _on_bus(2, 5, 6)}))
    assert [c.chunk for c in settled.done] == [1]
    assert settled.exclude == {(b"\x05",), (b"\x06",)}
    assert [c.chunk for c in settled.partial] == [3]


def test_an_earlier_attempt_of_a_done_chunk_still_excludes_its_keys() -> None:
    """Chunk 2 was read twice (a restart in between): the earlier attempt, found on the bus
    part-way and kept, may reach past where the done attempt ends (rows deleted since),
    and those keys are on the bus: they stay excluded."""
    earlier = pb.SnapshotChunk(chunk=2, tx_seq=13, rows=2, partial_from={0: 5},
                               partial_to={0: 7})
    done = pb.SnapshotChunk(chunk=2, tx_seq=21, rows=1, cursor="[\"4\"]")
    settled = settle(pb.SnapshotTable(table="public.t", request_id=3, chunks_done=1,
                                      inflight=[earlier, done]), covered=21,
                     found=Found(reads={13: _on_bus(2, 4, 5)}))
    assert [c.tx_seq for c in settled.done] == [21]
    assert settled.exclude == {(b"\x04",), (b"\x05",)}


def test_a_chunk_in_a_recorded_epoch_is_done_whatever_the_bus_shows() -> None:
    entry = _entry(pb.SnapshotChunk(chunk=1, tx_seq=9, rows=2, cleared_tx_seq=8), reset=True)
    assert [c.chunk for c in settle(entry, covered=10, found=Found()).done] == [1]


def test_a_reset_chunk_whose_truncate_was_lost_on_another_partition_is_read_again() -> None:
    """The read transaction landed whole on partition 1; the TRUNCATE before it, on
    partition 0, did not (kill -9). Counting the chunk done would leave the sinks with the
    rows deleted during the loss."""
    entry = _entry(pb.SnapshotChunk(chunk=1, tx_seq=12, rows=2, cleared_tx_seq=11,
                                    last=True), reset=True)
    lost = settle(entry, covered=10, found=Found(reads={12: _on_bus(2, 1, 2, partition=1)}))
    assert lost.done == []
    assert lost.exclude == set(), "published before the TRUNCATE read again: excludes nothing"
    assert [c.chunk for c in lost.partial] == [1]

    landed = settle(entry, covered=10, found=Found(reads={12: _on_bus(2, 1, 2, partition=1)},
                                                   truncates={11}))
    assert [c.chunk for c in landed.done] == [1]
    assert landed.partial == []


def test_a_truncate_already_in_a_recorded_epoch_needs_no_finding() -> None:
    entry = _entry(pb.SnapshotChunk(chunk=1, tx_seq=12, rows=2, cleared_tx_seq=9),
                   reset=True)
    settled = settle(entry, covered=10, found=Found(reads={12: _on_bus(2, 1, 2)}))
    assert [c.chunk for c in settled.done] == [1]


def test_attempts_found_part_way_before_a_reset_truncate_exclude_nothing_once_it_is_stored(
) -> None:
    """Process A: reset chunk 1 (its TRUNCATE lost on another partition) and chunk 2 whole
    on the bus. Restart B: chunk 1 is read again (a new TRUNCATE, which will clear chunk 2's
    keys from the sinks: they exclude nothing), chunk 2's attempt is kept in the record.
    Once B stores chunk 1 it is dropped: a restart C must read those keys again, not
    exclude them."""
    a1 = pb.SnapshotChunk(chunk=1, tx_seq=12, rows=2, cleared_tx_seq=11)
    a2 = pb.SnapshotChunk(chunk=2, tx_seq=13, rows=2)
    at_b = settle(_entry(a1, a2, reset=True), covered=10,
                  found=Found(reads={12: _on_bus(2, 1, 2, partition=1),
                                     13: _on_bus(2, 3, 4, partition=1)}))
    assert at_b.done == [] and at_b.exclude == set()
    assert [c.chunk for c in at_b.partial] == [1, 2]
    b1 = pb.SnapshotChunk(chunk=1, tx_seq=21, rows=2, cleared_tx_seq=20, cursor="[\"2\"]")
    b2 = pb.SnapshotChunk(chunk=2, tx_seq=22, rows=1)  # B's own, published after TRUNCATE 20
    kept = still_in_flight([*at_b.partial, b1, b2], b1)
    assert kept == [b2], "the attempts from before TRUNCATE 20 are dropped"
    at_c = settle(pb.SnapshotTable(table="public.t", request_id=3, reset=True, chunks_done=1,
                                   inflight=kept), covered=20,
                  found=Found(reads={22: _on_bus(2, 5)}))
    assert at_c.exclude == {(b"\x05",)}


def test_without_a_reset_an_attempt_found_part_way_stays_until_the_table_is_done() -> None:
    partial = pb.SnapshotChunk(chunk=2, tx_seq=13, rows=2, partial_from={0: 5}, partial_to={0: 6})
    later = pb.SnapshotChunk(chunk=3, tx_seq=14, rows=2)
    assert still_in_flight([partial, later], pb.SnapshotChunk(chunk=2)) == [partial, later]
    assert still_in_flight([partial, later], pb.SnapshotChunk(chunk=3)) == [partial]
    assert still_in_flight([partial, later], pb.SnapshotChunk(chunk=3, last=True)) == []


def _done(chunk: int, tx_seq: int, rows: int = 100) -> pb.SnapshotChunk:
    return pb.SnapshotChunk(chunk=chunk, cursor=f"[{chunk * rows}]", tx_seq=tx_seq, rows=rows)


def test_chunks_the_lost_bus_held_past_the_sinks_checkpoint_are_read_again() -> None:
    entry = pb.SnapshotTable(table="t", state=pb.SNAPSHOT_DONE, cursor="[500]", rows_done=500,
                             chunks_done=5, recent=[_done(n, 10 * n) for n in range(1, 6)])
    entry.inflight.add(chunk=6, tx_seq=60)
    assert read_lost_again(entry, covered=30)  # chunks 1-3 delivered, 4 and 5 lost
    assert (entry.cursor, entry.chunks_done, entry.rows_done) == ("[300]", 3, 300)
    assert [c.chunk for c in entry.recent] == [1, 2, 3] and not entry.inflight
    assert entry.state == pb.SNAPSHOT_RUNNING

    whole = pb.SnapshotTable(table="t", state=pb.SNAPSHOT_DONE, cursor="[200]", rows_done=200,
                             chunks_done=2, recent=[_done(1, 10), _done(2, 20)])
    assert not read_lost_again(whole, covered=20)  # all delivered: nothing to read again
    assert whole.state == pb.SNAPSHOT_DONE and whole.cursor == "[200]"

    assert read_lost_again(whole, covered=5)  # nothing delivered: from the start
    assert (whole.cursor, whole.chunks_done, whole.rows_done) == ("", 0, 0)

    forgotten = pb.SnapshotTable(table="t", state=pb.SNAPSHOT_RUNNING, cursor="[900]",
                                 rows_done=900, chunks_done=9,
                                 recent=[_done(8, 80), _done(9, 90)])
    assert read_lost_again(forgotten, covered=50)  # chunk 7 is no longer known
    assert (forgotten.cursor, forgotten.chunks_done, forgotten.rows_done) == ("", 0, 0)


def test_ranges_delivered_out_of_order_go_back_to_the_first_lost_chunk() -> None:
    """Chunks 4 and 5 were read on two connections: 5 reached the bus (and the sinks)
    before 4, which the bus lost. Reading goes back to the end of chunk 3."""
    entry = pb.SnapshotTable(table="t", state=pb.SNAPSHOT_RUNNING, cursor="[500]",
                             rows_done=500, chunks_done=5,
                             recent=[_done(1, 10), _done(2, 20), _done(3, 30), _done(4, 50),
                                     _done(5, 40)])
    assert read_lost_again(entry, covered=45)
    assert (entry.cursor, entry.chunks_done, entry.rows_done) == ("[300]", 3, 300)
    assert [c.chunk for c in entry.recent] == [1, 2, 3]


def test_a_reset_chunk_whose_truncate_the_bus_lost_is_read_again() -> None:
    """A reset read's first chunk may publish only its TRUNCATE (no rows: tx_seq 0)."""
    first = _done(1, 0, rows=0)
    first.cleared_tx_seq = 40
    entry = pb.SnapshotTable(table="t", state=pb.SNAPSHOT_DONE, cursor="[100]", reset=True,
                             chunks_done=2, recent=[first, _done(2, 50)])
    assert read_lost_again(entry, covered=30)
    assert (entry.cursor, entry.chunks_done) == ("", 0) and entry.reset


def test_covered_attempts_past_a_gap_are_the_ones_to_look_for_on_the_bus() -> None:
    """Chunks 3 and 4 are covered by the epoch in order, 6 is covered past chunk 5 (read on
    another connection, never published): only 6 needs its keys found; 7 is past the epoch
    (the scan after it finds it)."""
    entry = pb.SnapshotTable(table="t", chunks_done=2, inflight=[
        pb.SnapshotChunk(chunk=3, tx_seq=30), pb.SnapshotChunk(chunk=4, tx_seq=20),
        pb.SnapshotChunk(chunk=6, tx_seq=25), pb.SnapshotChunk(chunk=7, tx_seq=60),
        pb.SnapshotChunk(chunk=5, tx_seq=4, partial_from={0: 1}, partial_to={0: 2})])
    assert [c.chunk for c in ahead_of_a_gap(entry, covered=40)] == [6]
