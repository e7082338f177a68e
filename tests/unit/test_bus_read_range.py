"""`BusReader.read_range` over the consumer's messages as they come: chunks in offset order,
what is outside the range left out, a partition's end noted, any other error raised."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import KafkaError

from tailrace.bus import BusReader, BusReadError


class _Msg:
    """What `Consumer.consume` returns: a record, or an event with its error."""

    def __init__(self, offset: int = -1, value: bytes = b"", error: int | None = None) -> None:
        self._offset, self._value = offset, value
        self._error = KafkaError(error) if error is not None else None

    def error(self) -> KafkaError | None:
        return self._error

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return self._offset

    def value(self) -> bytes:
        return self._value


class _Consumer:
    def __init__(self, batches: list[list[_Msg]]) -> None:
        self.batches = batches
        self.assigned: list[int] = []  # the offset of every assignment
        self.high = 1_000  # the partition's end, as the broker answers it

    def assign(self, partitions: Any) -> None:
        self.assigned += [tp.offset for tp in partitions]

    def get_watermark_offsets(self, _: Any, timeout: float) -> tuple[int, int]:
        return 0, self.high

    def consume(self, _n: int, _timeout: float) -> list[_Msg]:
        return self.batches.pop(0)


def _reader(batches: list[list[_Msg]]) -> BusReader:
    reader = BusReader("127.0.0.1:1", "t")
    reader._consumer = reader._probe = _Consumer(batches)  # type: ignore[assignment]
    return reader


EOF_ = KafkaError._PARTITION_EOF


def test_records_in_chunks_what_is_outside_the_range_left_out_and_the_end_noted() -> None:
    reader = _reader([
        [_Msg(3, b"old"), _Msg(5, b"a"), _Msg(6, b"b"), _Msg(error=EOF_)],
        [_Msg(7, b"c"), _Msg(8, b"d"), _Msg(9, b"past")],
    ])
    assert list(reader.read_range(0, 5, 9, chunk=3)) == [([5, 6, 7], [b"a", b"b", b"c"]),
                                                         ([8], [b"d"])]
    assert reader.at_end == set()  # records came after the end event


def test_a_partition_end_after_the_last_record_stays_noted() -> None:
    reader = _reader([[_Msg(0, b"a"), _Msg(error=EOF_)], [_Msg(1, b"b"), _Msg(error=EOF_)]])
    assert list(reader.read_range(0, 0, 2)) == [([0, 1], [b"a", b"b"])]
    assert reader.at_end == {0}


def test_another_error_is_raised_naming_the_partition() -> None:
    reader = _reader([[_Msg(0, b"a"), _Msg(error=KafkaError._TRANSPORT)]])
    with pytest.raises(BusReadError, match=r"bus t\[0\]"):
        list(reader.read_range(0, 0, 2))


def _assigned(reader: BusReader) -> list[int]:
    return reader._consumer.assigned  # type: ignore[attr-defined]


def test_a_range_from_where_the_last_ended_reads_on_and_any_other_start_assigns_anew() -> None:
    reader = _reader([[_Msg(0, b"a"), _Msg(1, b"b")], [_Msg(2, b"c"), _Msg(3, b"d")],
                      [_Msg(1, b"b"), _Msg(2, b"c")]])
    assert list(reader.read_range(0, 0, 2, read_on=True)) == [([0, 1], [b"a", b"b"])]
    assert list(reader.read_range(0, 2, 4, read_on=True)) == [([2, 3], [b"c", b"d"])]
    assert _assigned(reader) == [0]  # the second range read on what the consumer fetched
    assert list(reader.read_range(0, 1, 3, read_on=True)) == [([1, 2], [b"b", b"c"])]  # rewind
    assert _assigned(reader) == [0, 1]


def test_a_record_handed_out_past_the_range_makes_the_next_range_assign_anew() -> None:
    reader = _reader([[_Msg(0, b"a"), _Msg(1, b"b"), _Msg(2, b"next")], [_Msg(2, b"next")]])
    assert list(reader.read_range(0, 0, 2, read_on=True)) == [([0, 1], [b"a", b"b"])]
    assert list(reader.read_range(0, 2, 3, read_on=True)) == [([2], [b"next"])]  # not lost
    assert _assigned(reader) == [0, 2]


def test_a_read_stopped_before_its_end_makes_the_next_range_assign_anew() -> None:
    reader = _reader([[_Msg(0, b"a"), _Msg(1, b"b")], [_Msg(2, b"c")], [_Msg(2, b"c")]])
    read = reader.read_range(0, 0, 3, chunk=2, read_on=True)
    assert next(read) == ([0, 1], [b"a", b"b"])
    read.close()  # the task failed: where the consumer stands is not known
    assert list(reader.read_range(0, 2, 3, read_on=True)) == [([2], [b"c"])]
    assert _assigned(reader) == [0, 2]


def test_an_assignment_or_a_poll_in_between_assigns_anew() -> None:
    reader = _reader([[_Msg(0, b"a")], [_Msg(1, b"b")], [_Msg(2, b"c")], [_Msg(2, b"c")],
                      [_Msg(3, b"d")], [_Msg(3, b"d")]])
    assert list(reader.read_range(0, 0, 1, read_on=True)) == [([0], [b"a"])]
    reader.assign({0: 5})
    assert list(reader.read_range(0, 1, 2, read_on=True)) == [([1], [b"b"])]
    assert _assigned(reader) == [0, 5, 1]
    assert list(reader.read_range(1, 2, 3, read_on=True)) == [([2], [b"c"])]  # another partition
    assert list(reader.read_range(0, 2, 3, read_on=True)) == [([2], [b"c"])]  # and back
    assert _assigned(reader) == [0, 5, 1, 2, 2]
    assert [m.offset for m in reader.poll()] == [3]  # the consumer moved on
    assert list(reader.read_range(0, 3, 4, read_on=True)) == [([3], [b"d"])]
    assert _assigned(reader) == [0, 5, 1, 2, 2, 3]


def test_a_partition_that_no_longer_reaches_the_range_is_read_again_not_from_the_fetch() -> None:
    """A bus that lost its records (a broker restarted empty) since the last range: what the
    consumer fetched before is not taken for the range."""
    reader = _reader([[_Msg(0, b"a")], [_Msg(1, b"b")], [_Msg(2, b"c")]])
    assert list(reader.read_range(0, 0, 1, read_on=True)) == [([0], [b"a"])]
    reader._consumer.high = 2  # type: ignore[attr-defined]  # past the next range's start
    assert list(reader.read_range(0, 1, 2, read_on=True)) == [([1], [b"b"])]
    assert _assigned(reader) == [0]
    reader._consumer.high = 2  # type: ignore[attr-defined]  # not past it: restarted empty
    assert list(reader.read_range(0, 2, 3, read_on=True)) == [([2], [b"c"])]
    assert _assigned(reader) == [0, 2]


def test_without_read_on_a_range_from_where_the_last_ended_assigns_anew() -> None:
    """Delivery's first batch of a query (after a restart or a resume) is fetched again."""
    reader = _reader([[_Msg(0, b"a")], [_Msg(1, b"b")]])
    assert list(reader.read_range(0, 0, 1)) == [([0], [b"a"])]
    assert list(reader.read_range(0, 1, 2)) == [([1], [b"b"])]  # (read_on=False: the default)
    assert _assigned(reader) == [0, 1]
