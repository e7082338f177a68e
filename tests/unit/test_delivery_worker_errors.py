"""What the driver makes of a Python worker's error (Spark hands back only its text), what a
worker's task leaves as it found it, and the checkpoints the driver hands to a batch's tasks."""

from __future__ import annotations

import gc
import json
import weakref
from collections.abc import Iterator
from typing import Any

import pytest

from tailrace.errors import FatalError
from tailrace.proto.control_pb2 import Checkpoint
from tailrace_services.delivery import executor
from tailrace_services.delivery.executor import FULL_COLLECTION_EVERY, collector_paused
from tailrace_services.delivery.handoff import handed_batch, handing, worker_id
from tailrace_services.delivery.job import _raised

TRACEBACK = """org.apache.spark.api.python.PythonException: Traceback (most recent call last):
  File "/work/services/delivery/executor.py", line 102, in deliver_range
    result = deliver_slice(
tailrace_services.delivery.sinks.exactly_once.SinkLostWrites: sink r lost writes it had \
acknowledged: on bus partition 0 its stored checkpoint holds nothing
\tat org.apache.spark.api.python.BasePythonRunner$ReaderIterator.handlePythonException
"""


def test_a_fatal_error_is_known_by_its_subclass_in_the_traceback() -> None:
    assert _raised(TRACEBACK, FatalError) == (
        "sink r lost writes it had acknowledged: on bus partition 0 its stored checkpoint "
        "holds nothing")


def test_other_errors_and_unknown_classes_are_not_fatal() -> None:
    assert _raised("tailrace_services.delivery.runtime.BusChanged: moved", FatalError) is None
    assert _raised("tailrace_services.nowhere.Nope: x", FatalError) is None
    assert _raised("ValueError: tailrace_services.x.Y: z", FatalError) is None


def test_a_task_runs_without_the_cyclic_collector_and_gives_it_back_even_if_it_fails() -> None:
    assert gc.isenabled()
    with collector_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(RuntimeError), collector_paused():
        raise RuntimeError("a sink failed")
    assert gc.isenabled()
    gc.disable()  # a caller that had it off keeps it off
    try:
        with collector_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


class _Node:
    me: _Node | None = None


@pytest.fixture(autouse=True)
def _heap_as_found(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """`collector_paused` freezes the heap, as a Spark worker's task does: not for the rest
    of this test process (its teardowns collect clients left in reference cycles)."""
    monkeypatch.setattr(executor, "_tasks", 0)
    yield
    gc.unfreeze()


def test_a_task_freezes_what_lives_at_its_start_and_every_hundredth_task_unfreezes_it(
        ) -> None:
    survivor = _Node()
    survivor.me = survivor  # a cycle alive when the task starts
    died = weakref.ref(survivor)
    with collector_paused():
        assert gc.get_freeze_count() > 0
    del survivor
    gc.collect()  # what Spark's worker runs after a task: the frozen cycle stays
    assert died() is not None
    for _ in range(FULL_COLLECTION_EVERY - 2):
        with collector_paused():
            pass
    with collector_paused():  # the hundredth task
        assert gc.get_freeze_count() == 0
    gc.collect()
    assert died() is None  # collected after it


class _Driver:
    """The driver thread's local properties, as Spark keeps them."""

    def __init__(self) -> None:
        self.properties: dict[str, str] = {}

    def setLocalProperty(self, key: str, value: str | None) -> None:  # noqa: N802 - Spark's
        if value is None:
            self.properties.pop(key, None)
        else:
            self.properties[key] = value


class _Task:
    def __init__(self, properties: dict[str, str], attempt: int) -> None:
        self.properties, self.attempt = properties, attempt

    def getLocalProperty(self, key: str) -> str | None:  # noqa: N802 - Spark's name
        return self.properties.get(key)

    def attemptNumber(self) -> int:  # noqa: N802 - Spark's name
        return self.attempt


def _in_task(monkeypatch: pytest.MonkeyPatch, properties: dict[str, str], batch: int,
             attempt: int = 0) -> None:
    import pyspark

    task = _Task({**properties, "streaming.sql.batchId": str(batch)}, attempt)
    monkeypatch.setattr(pyspark.TaskContext, "get", staticmethod(lambda: task))


def test_a_task_delivers_against_the_checkpoints_the_driver_handed_to_its_batch(
        monkeypatch: pytest.MonkeyPatch) -> None:
    driver = _Driver()
    stored = Checkpoint(sink_id="r", version=7, rewind=2)
    stored.bus_offsets[0] = 1234
    with handing(driver, 41, {"r": stored, "new": None}, {}):
        _in_task(monkeypatch, driver.properties, 41)
        assert handed_batch().checkpoints == {"r": stored, "new": None}
    assert driver.properties == {}  # a later job of the driver's thread carries nothing


def test_a_task_without_its_batchs_checkpoints_delivers_nothing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    driver = _Driver()
    with handing(driver, 41, {"r": Checkpoint(sink_id="r", version=7)}, {}):
        _in_task(monkeypatch, driver.properties, 42)
        with pytest.raises(RuntimeError, match="batch 42 got the checkpoints of batch 41"):
            handed_batch()
    _in_task(monkeypatch, driver.properties, 42)
    with pytest.raises(RuntimeError, match="got no checkpoints"):
        handed_batch()


def test_a_worker_keeps_a_partitions_state_only_if_it_delivered_its_last_batch(
        monkeypatch: pytest.MonkeyPatch) -> None:
    driver = _Driver()
    with handing(driver, 5, {}, {0: worker_id(), 1: "otherhost/12/ab12cd34"}):
        _in_task(monkeypatch, driver.properties, 5)
        handoff = handed_batch()
        assert handoff.continues(0)
        assert not handoff.continues(1)  # another worker delivered it last: it fenced ours
        assert not handoff.continues(2)  # nobody in this query yet
        _in_task(monkeypatch, driver.properties, 5, attempt=1)
        assert not handed_batch().continues(0)  # a retry: the failed attempt may have run


class _Writer:
    def __init__(self, kept: bool = False) -> None:
        self.closed, self.kept = False, kept

    def keep(self) -> None:
        self.kept = True

    def close(self) -> None:
        self.closed = True


def _kafka_sink() -> Any:
    from tailrace.config import KafkaSinkSpec
    from tailrace_services.delivery.sinks.kafka import TransactionalKafkaSink

    return TransactionalKafkaSink(KafkaSinkSpec(id="k", type="kafka", brokers="127.0.0.1:1",
                                                topic="t", exactly_once=True), pipeline="p")


def test_the_kafka_sink_keeps_a_partitions_writer_only_while_the_worker_continues_it() -> None:
    sink = _kafka_sink()
    kept, dropped = _Writer(), _Writer()
    sink._writers = {sink._transactional_id(0): kept, sink._transactional_id(1): dropped}
    sink.start_partition(0, kept=True)
    sink.start_partition(1, kept=False)
    assert kept.kept and not kept.closed
    assert dropped.closed
    assert list(sink._writers) == [sink._transactional_id(0)]


def test_a_kept_writer_fenced_since_gives_the_batch_up_and_a_new_one_fenced_stops() -> None:
    """Fenced since its last batch, by another delivery instance: a new writer now would
    fence that one's in turn, and which owns the pipeline the driver asks the control
    service before the next batch. So the batch is given up, not retried in the task."""
    from confluent_kafka import KafkaError, KafkaException

    from tailrace.errors import NonRetryableError
    from tailrace_services.delivery.sinks.base import BatchCommit
    from tailrace_services.delivery.sinks.kafka import ProducerFencedError

    sink = _kafka_sink()
    commit = BatchCommit(pipeline="p", source_id="s", sink_id="k", position=None, partition=0)
    fenced = KafkaException(KafkaError(KafkaError._FENCED, "fenced", fatal=True))
    sink._writers = {sink._transactional_id(0): _Writer(kept=True)}
    failure = sink.write_failed(fenced, commit)
    assert isinstance(failure, NonRetryableError), failure
    assert "given up" in str(failure)
    assert sink._writers == {}  # the next batch's writer is new
    sink._writers = {sink._transactional_id(0): _Writer(kept=False)}
    assert isinstance(sink.write_failed(fenced, commit), ProducerFencedError)


def test_a_kept_writer_that_failed_fatally_is_retried_with_a_new_one_and_a_new_one_stops() -> None:
    """A broker that lost its producer state answers a kept producer with a fatal sequence
    error: the new writer's checkpoint read then finds what the broker lost."""
    from confluent_kafka import KafkaError, KafkaException

    from tailrace.errors import FatalError, RetryableError
    from tailrace_services.delivery.sinks.base import BatchCommit

    sink = _kafka_sink()
    commit = BatchCommit(pipeline="p", source_id="s", sink_id="k", position=None, partition=0)
    desync = KafkaException(KafkaError(KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER,
                                       "sequence desynchronization", fatal=True))
    sink._writers = {sink._transactional_id(0): _Writer(kept=True)}
    assert isinstance(sink.write_failed(desync, commit), RetryableError)
    assert sink._writers == {}
    sink._writers = {sink._transactional_id(0): _Writer(kept=False)}
    failure = sink.write_failed(desync, commit)
    assert isinstance(failure, FatalError) and not isinstance(failure, RetryableError)


def test_a_kept_writer_reads_its_checkpoint_back_when_the_topic_lost_its_last_record() -> None:
    import time

    from tailrace_services.delivery.sinks._common import checkpoint_name
    from tailrace_services.delivery.sinks._kafka_tx import TransactionalWriter

    sink = _kafka_sink()
    sink._checked = True  # no broker here: open() has nothing to do

    class Kept(TransactionalWriter):  # the real check, without a broker
        def __init__(self, holds: bool) -> None:
            self.kept = True
            self.checkpoint_key = checkpoint_name("p", "k", 0, sep="/", rewind=0).encode()
            self.stored, self.read_at, self.checked = "remembered", time.monotonic(), True
            self.holds, self.reads = holds, 0

        def still_reaches(self) -> None:
            pass

        def holds_last(self) -> bool:
            return self.holds

        def read_stored(self) -> None:
            self.reads += 1
            self.stored = "read back"

    for holds, expected in ((True, "remembered"), (False, "read back")):
        writer = Kept(holds)
        sink._writers = {sink._transactional_id(0): writer}
        sink.start_partition(0, kept=True)  # a new batch: checked against the topic once
        assert sink.read_checkpoint("p", 0, 0) == expected
        assert sink.read_checkpoint("p", 0, 0) == expected
        assert writer.reads == (0 if holds else 1)


def test_a_tasks_read_is_decoded_as_it_comes_and_closed_even_when_decoding_fails() -> None:
    """`_TimedRead`: the read's chunks in order, `done` only once the read ended, and the
    reader closed (its `with` left) when what takes the chunks stops early."""
    closed: list[bool] = []

    def chunks() -> Iterator[tuple[list[int], list[bytes]]]:
        try:
            yield [0, 1], [b"a", b"b"]
            yield [2], [b"c"]
        finally:
            closed.append(True)

    read = executor._TimedRead(chunks())
    assert list(read) == [([0, 1], [b"a", b"b"]), ([2], [b"c"])]
    assert read.done and read.seconds >= 0 and closed == [True]

    closed.clear()
    read = executor._TimedRead(chunks())
    for _ in read:
        break  # as decode_slice does when a chunk does not decode
    assert not read.done and closed == []
    read.close()
    assert closed == [True]


def _pipeline(client_config: dict[str, str] | None = None) -> Any:
    """A pipeline whose bus is on a port nothing listens on (its clients make no I/O here)."""
    from tailrace.config import parse_pipeline

    return parse_pipeline(json.dumps({
        "apiVersion": "tailrace/v1", "kind": "Pipeline", "metadata": {"name": "p"},
        "spec": {"source": {"type": "postgres", "id": "syn", "dsn": "host=unused",
                            "tables": ["public.items"]},
                 "sinks": [{"id": "r", "type": "redis", "url": "redis://127.0.0.1:1"}],
                 "bus": {"brokers": "127.0.0.1:1", "client_config": client_config or {}}}}))


@pytest.fixture
def _no_readers(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(executor, "_READERS", {})
    yield
    for _, reader in executor._READERS.values():
        reader.close()


@pytest.mark.usefixtures("_no_readers")
def test_a_worker_keeps_its_bus_reader_per_partition_until_the_generation_changes() -> None:
    p = _pipeline()
    first = executor._bus_reader(p, 0, generation=0)
    assert executor._bus_reader(p, 0, generation=0) is first  # the next batch reads on
    assert executor._bus_reader(p, 1, generation=0) is not first
    renewed = executor._bus_reader(p, 0, generation=1)  # the bus was republished: new offsets
    assert renewed is not first
    assert [r for _, r in executor._READERS.values()].count(first) == 0
    changed = _pipeline({"client.rack": "b"})  # a new spec's bus settings
    assert executor._bus_reader(changed, 0, generation=1) is not renewed


@pytest.mark.usefixtures("_no_readers")
def test_a_worker_keeps_at_most_kept_readers_the_least_recently_used_closed() -> None:
    p = _pipeline()
    readers = [executor._bus_reader(p, n, 0) for n in range(executor.KEPT_READERS)]
    executor._bus_reader(p, 0, 0)  # partition 0 used again: 1 is now the oldest
    executor._bus_reader(p, executor.KEPT_READERS, 0)
    kept = [r for _, r in executor._READERS.values()]
    assert len(kept) == executor.KEPT_READERS
    assert readers[1] not in kept and readers[0] in kept


class _FakeReader:
    """A BusReader as `executor._bus_reader` makes it: what each range asked for."""

    def __init__(self, *_: Any, **__: Any) -> None:
        self.read_on: list[bool] = []
        self.closed = False

    def read_range(self, partition: int, start: int, end: int, timeout_s: float, chunk: int,
                   read_on: bool = False) -> Iterator[tuple[list[int], list[bytes]]]:
        self.read_on.append(read_on)
        yield list(range(start, end)), [b""] * (end - start)

    def close(self) -> None:
        self.closed = True


@pytest.mark.usefixtures("_no_readers")
def test_a_task_reads_on_only_where_its_worker_delivered_the_partitions_last_batch(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """And a failed task closes its reader; a partition another worker took, that one's."""
    from types import SimpleNamespace

    from tailrace_services.delivery.handoff import BatchHandoff

    failing: list[bool] = [False]

    def deliver_slice(partition: int, read: Any, *_: Any, **__: Any) -> Any:
        for _chunk in read:
            pass
        if failing[0]:
            raise RuntimeError("a sink failed")
        return SimpleNamespace(partition=partition, end_offset=0, epoch_position=None,
                               events=0, outcomes=[], dead_letters=[])

    monkeypatch.setattr(executor, "BusReader", _FakeReader)
    monkeypatch.setattr(executor, "deliver_slice", deliver_slice)
    monkeypatch.setattr(executor, "_sinks", lambda *_: [])
    p, me = _pipeline(), worker_id()

    def task(partition: int, last_workers: dict[int, str], attempt: int = 0) -> _FakeReader:
        executor.deliver_range(p, BatchHandoff({}, last_workers, attempt), partition, 0, 2)
        return executor._READERS[(p.name, partition)][1]  # type: ignore[return-value]

    reader = task(0, {})  # a query's first batch
    assert task(0, {0: me}) is reader  # this worker delivered the last one
    task(0, {0: me}, attempt=1)  # a retried task: its first attempt may have read further
    assert reader.read_on == [False, True, False]
    again = task(0, {0: "another worker"})  # which read further than this reader
    assert reader.closed and again is not reader and again.read_on == [False]
    other = task(1, {})
    task(0, {0: me, 1: "another worker"})  # 1's last batch is another worker's now
    assert other.closed and (p.name, 1) not in executor._READERS
    failing[0] = True
    with pytest.raises(RuntimeError):
        task(0, {0: me})
    assert again.closed and (p.name, 0) not in executor._READERS
