"""Fan-out: retries by class, giving up leaves the sink behind, fatal stops, order is shared."""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import pytest

from tailrace.errors import FatalError, NonRetryableError, RetryableError
from tailrace.events import ChangeEvent, Position, position_key
from tailrace.retry import backoff_delays, call_with_retry
from tailrace_services.delivery.fanout import _pending, fan_out
from tailrace_services.delivery.sinks._common import fresh_indexes
from tailrace_services.delivery.sinks.base import BatchCommit, PerEventError, RetryPolicy, Sink
from tailrace_services.delivery.sinks.exactly_once import AtomicWrite, ExactlyOnceSink


class FlakySink(Sink):
    """Fails the first `failures` writes with `error`, then records."""

    def __init__(self, sink_id: str, failures: int = 0, error: Exception | None = None,
                 required: bool = True) -> None:
        self.id, self.required = sink_id, required
        self.retry = RetryPolicy(base_s=0.001, max_s=0.002, attempts=3)
        self.failures, self.error = failures, error
        self.events: list[ChangeEvent] = []
        self.calls = 0

    def write(self, events: Sequence[ChangeEvent], commit: BatchCommit | None = None) -> None:
        self.calls += 1
        if self.calls <= self.failures:
            raise self.error  # type: ignore[misc]
        self.events.extend(events)


def batches() -> list[list[ChangeEvent]]:
    return [[ChangeEvent(table=f"{t}.{i}", position=Position(tx_seq=t, event_index=i))
             for i in range(2)] for t in (1, 2, 3)]


def commit_for(sink: Sink, position: Position) -> BatchCommit:
    return BatchCommit("p", "s", sink.id, position)


@pytest.mark.parametrize("error, failures, acked, calls, error_class", [
    (RetryableError("broker down"), 2, True, 5, ""),            # recovers on the 3rd attempt
    (RetryableError("broker down"), 3, False, 3, "retryable"),   # gives up after 3 attempts
    (NonRetryableError("auth failed"), 1, False, 1, "non_retryable"),  # fails at once
    (TimeoutError("timed out"), 1, True, 4, ""),                 # plain timeouts are retryable
])
def test_classification_table(error, failures, acked, calls, error_class):
    sink = FlakySink("k", failures, error)
    (outcome,) = fan_out([sink], batches(), {"k": None}, commit_for, dead_letter=False)
    assert outcome.acked is acked and sink.calls == calls and outcome.error_class == error_class
    if acked:
        assert [e.table for e in sink.events] == [f"{t}.{i}" for t in (1, 2, 3) for i in (0, 1)]


def test_fatal_stops_everything():
    with pytest.raises(FatalError, match="fenced"):
        fan_out([FlakySink("k", 1, FatalError("producer fenced"))], batches(), {"k": None},
                commit_for, dead_letter=False)


def test_every_sink_same_order_and_ahead_sink_skips():
    a, b = FlakySink("a"), FlakySink("b")
    outcomes = fan_out([a, b], batches(), {"a": Position(tx_seq=2, event_index=1), "b": None},
                       commit_for, dead_letter=False)
    assert [e.table for e in a.events] == ["3.0", "3.1"]
    assert [e.table for e in b.events] == [f"{t}.{i}" for t in (1, 2, 3) for i in (0, 1)]
    assert [(o.delivered, o.skipped) for o in outcomes] == [(2, 4), (6, 0)]


def test_optional_failure_does_not_stop_required():
    req, opt = FlakySink("req"), FlakySink("opt", 99, RetryableError("down"), required=False)
    out = {o.sink_id: o for o in fan_out([req, opt], batches(), {}, commit_for, False)}
    assert out["req"].acked and not out["opt"].acked and len(req.events) == 6


def test_backoff_has_jitter_and_cap():
    delays = backoff_delays(0.1, 10, 6)
    assert len(delays) == 5 and all(0 <= d <= min(10, 0.1 * 2**n) for n, d in enumerate(delays))
    slept: list[float] = []
    with pytest.raises(RetryableError):
        call_with_retry(lambda: (_ for _ in ()).throw(RetryableError("x")), base_s=0.1, max_s=10,
                        attempts=3, retryable=lambda e: True, sleep=slept.append)
    assert len(slept) == 2


class PickySink(FlakySink):
    """Refuses the events whose table is in `refuse` with a per-event error, like a sink
    rejecting a too-large message; nothing of such a batch is written."""

    def __init__(self, refuse: set[str]) -> None:
        super().__init__("p")
        self.refuse = refuse

    def write(self, events: Sequence[ChangeEvent], commit: BatchCommit | None = None) -> None:
        from tailrace_services.delivery.sinks.base import PerEventError

        bad = [(i, f"{e.table} too large") for i, e in enumerate(events) if e.table in self.refuse]
        if bad:
            raise PerEventError(f"{len(bad)} event(s) refused", bad)
        self.events.extend(events)


@pytest.mark.parametrize("refuse, written", [
    ({"1.1", "3.0"}, ["1.0", "2.0", "2.1", "3.1"]),        # some fail: the rest goes on
    ({f"{t}.{i}" for t in (1, 2, 3) for i in (0, 1)}, []),  # all fail: all dead-lettered
])
def test_per_event_failures_go_to_dead_letters_with_the_journal(refuse, written):
    sink = PickySink(refuse)
    (outcome,) = fan_out([sink], batches(), {"p": None}, commit_for, dead_letter=True)
    assert outcome.acked and [e.table for e in sink.events] == written
    assert sorted(e.table for e, _ in outcome.dead_letters) == sorted(refuse)
    assert all("too large" in reason for _, reason in outcome.dead_letters)


def test_per_event_failure_without_journal_blocks_the_sink():
    sink = PickySink({"2.0"})
    (outcome,) = fan_out([sink], batches(), {"p": None}, commit_for, dead_letter=False)
    assert not outcome.acked and outcome.error_class == "non_retryable"
    assert [e.table for e in sink.events] == ["1.0", "1.1"], "stops at the failing batch"


def _refused(events: Sequence[ChangeEvent]) -> list[tuple[int, str]]:
    return [(i, "too large") for i, e in enumerate(events) if e.table == "bad"]


class _Transaction(AtomicWrite):
    def __init__(self, sink: AtomicPickySink) -> None:
        self.sink = sink
        self.stored = sink.stored

    def write(self, events: Sequence[ChangeEvent], indexes: list[int],
              commit: BatchCommit) -> None:
        bad = [(i, r) for i, r in _refused(events) if i in indexes]
        if bad:
            raise PerEventError("refused", bad)
        self.sink.rows.extend(events[i].id for i in indexes)
        self.sink.stored = commit.position


class AtomicPickySink(ExactlyOnceSink):
    """An exactly-once sink (its checkpoint stored with its rows) refusing the events of
    table 'bad' one by one, as the Redis, PostgreSQL and transactional Kafka sinks do."""

    id, required, pipeline = "k", True, "p"
    retry = RetryPolicy(base_s=0.001, max_s=0.002, attempts=3)

    def __init__(self) -> None:
        self.rows: list[str] = []
        self.stored: Position | None = None

    @contextmanager
    def begin(self, commit: BatchCommit) -> Iterator[AtomicWrite]:
        yield _Transaction(self)

    def read_checkpoint(self, pipeline: str, partition: int, rewind: int) -> Position | None:
        return self.stored

    def write_unchecked(self, events: Sequence[ChangeEvent]) -> None:
        raise AssertionError("always with a commit here")

    def write_failed(self, error: Exception, commit: BatchCommit | None) -> Exception:
        return error

    def per_event_failures(self, events: Sequence[ChangeEvent]) -> list[tuple[int, str]]:
        return _refused(events)


def test_dead_letters_lost_with_a_task_are_found_again_in_what_the_sink_holds() -> None:
    """Attempt 1 dead-letters e1 and the sink commits e0, e2 with its checkpoint; the task's
    result (its dead letters) never reaches the control service, whose checkpoint stays.
    Attempt 2 skips what the sink holds, but finds e1's dead letter again: e1 is neither
    lost nor written."""
    events = [ChangeEvent(id=f"e{i}", table="bad" if i == 1 else "t",
                          position=Position(tx_seq=1, event_index=i)) for i in range(3)]
    sink = AtomicPickySink()
    (first,) = fan_out([sink], [events], {"k": None}, commit_for, dead_letter=True)
    assert [e.id for e, _ in first.dead_letters] == ["e1"]
    assert sink.rows == ["e0", "e2"]
    (again,) = fan_out([sink], [events], {"k": None}, commit_for, dead_letter=True)
    assert again.acked and again.skipped == 3
    assert [(e.id, r) for e, r in again.dead_letters] == [("e1", "sink k: too large")]
    assert sink.rows == ["e0", "e2"]
    (caught_up,) = fan_out([sink], [events], {"k": events[-1].position}, commit_for,
                           dead_letter=True)
    assert caught_up.dead_letters == [], "once the control service's checkpoint covers them"


def test_exactly_once_sink_reports_what_it_stored_and_dead_letters_alone_store_nothing():
    events = [ChangeEvent(id=f"e{i}", table="bad" if i == 2 else "t",
                          position=Position(tx_seq=1, event_index=i)) for i in range(3)]
    sink = AtomicPickySink()
    (outcome,) = fan_out([sink], [events[:2], events[2:]], {"k": None}, commit_for,
                         dead_letter=True)
    assert outcome.acked and sink.rows == ["e0", "e1"]
    assert outcome.stored == (1, 1), "the batch of only a dead letter stored nothing"
    plain = FlakySink("f")
    (outcome,) = fan_out([plain], batches(), {"f": None}, commit_for, dead_letter=False)
    assert outcome.stored is None, "a sink that keeps no checkpoint reports none"


@pytest.mark.parametrize("stored", [None, Position(tx_seq=2, event_index=1)])
def test_a_sink_behind_what_it_acknowledged_stops_the_pipeline(stored):
    """The sink acknowledged storing tx 3.1 (the control checkpoint's `sink_stored`) but its
    own checkpoint says less: it lost acknowledged writes (a broker restarted without its
    log). Writing on would leave the gap for good; nothing is written."""
    sink = AtomicPickySink()
    sink.stored = stored
    with pytest.raises(FatalError, match=r"sink k lost writes it had acknowledged: on bus "
                                         r"partition 0 .* acknowledged storing tx 3\.1.*"
                                         r"tailrace rewind p k --"):
        fan_out([sink], batches(), {"k": Position(tx_seq=3, event_index=1)}, commit_for,
                dead_letter=False, acked={"k": Position(tx_seq=3, event_index=1)})
    assert sink.rows == []


def test_a_sink_at_or_past_what_it_acknowledged_goes_on():
    sink = AtomicPickySink()
    sink.stored = Position(tx_seq=2, event_index=1)  # past the control checkpoint: a crash
    (outcome,) = fan_out([sink], batches(), {"k": Position(tx_seq=1, event_index=1)},
                         commit_for, dead_letter=False,
                         acked={"k": Position(tx_seq=1, event_index=1)})
    assert outcome.acked and outcome.skipped == 4 and outcome.stored == (3, 1)


def test_a_sink_that_loses_a_batch_it_acknowledged_within_the_slice_stops_the_pipeline():
    """Checked inside each write too: the first batch stored tx 1.1; the sink is then emptied
    (a server restarted without its data), and the next write finds its checkpoint gone."""
    sink = AtomicPickySink()
    original = sink.begin

    @contextmanager
    def emptied_after_first(commit: BatchCommit) -> Iterator[AtomicWrite]:
        if sink.rows:
            sink.rows, sink.stored = [], None
        with original(commit) as unit:
            yield unit

    sink.begin = emptied_after_first  # type: ignore[method-assign]
    with pytest.raises(FatalError, match=r"^sink k lost writes it had acknowledged: .* holds "
                                         r"nothing .* storing tx 1\.1.*--reset --confirm k"):
        fan_out([sink], batches(), {"k": None}, commit_for, dead_letter=False)
    assert sink.rows == [], "nothing written past the gap"


@pytest.mark.parametrize("seed", range(20))
def test_pending_events_are_the_same_from_known_keys_and_ascending_batches_whole(
        seed: int) -> None:
    """`_pending` takes an ascending batch past the mark whole, and otherwise goes event by
    event (a capture that published a transaction twice); `fresh_indexes` bisects what
    ascends. Each gives what the plain loop gives."""
    rng = random.Random(seed)
    batch = [ChangeEvent(position=Position(tx_seq=rng.randint(1, 6), event_index=rng.randint(0, 3)))
             for _ in range(rng.randint(0, 12))]
    if seed % 2:
        batch.sort(key=lambda e: position_key(e.position))  # ascending, maybe with copies
    keys = [position_key(e.position) for e in batch]
    for hwm in [(-1, -1), (0, 0), (3, 1), (6, 3), *keys[:3]]:
        expected, mark = [], hwm
        for event, key in zip(batch, keys, strict=True):
            if key > mark:
                expected.append(event)
                mark = key
        assert _pending(batch, hwm, keys) == expected
        assert _pending(batch, hwm) == expected
        for mark in [hwm, *(position_key(e.position) for e in expected)]:  # stored: any
            stored = Position(tx_seq=mark[0], event_index=mark[1]) if mark[0] >= 0 else None
            assert fresh_indexes(expected, stored, ascending=True) == \
                fresh_indexes(expected, stored)
    assert fresh_indexes(batch, None, ascending=False) == list(range(len(batch)))
