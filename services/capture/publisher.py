"""Publishing to the internal topic: whole transactions, then epoch markers.

The assembler of both capture sources hands complete, stamped transactions to `BusPublisher`.
It never drops: a full producer queue blocks the caller (backpressure up to
the source), and a failed delivery raises so the capture service restarts
from its checkpoint. After a transaction, at most every `epoch_ms`, a marker
goes to every partition; once the broker has acknowledged them all, the
marker offsets are recorded in the control service as the new epoch, which
is what the delivery service plans its batches from. Publishing does not wait
for those acks: epochs in flight are recorded, in order, as their acks arrive
(a marker's ack also covers every record before it in its partition).
"""

from __future__ import annotations

import contextlib
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import cast

import grpc
from confluent_kafka import KafkaError, Message, Producer

from tailrace.bus import ensure_topic, partition_for, producer_config
from tailrace.control_client import ControlClient, ControlRefused
from tailrace.errors import FatalError, RetryableError
from tailrace.events import bus_key, decode_record, encode_epoch, encode_event
from tailrace.links import LINKS
from tailrace.logs import get_logger
from tailrace.proto import control_pb2
from tailrace.proto.event_pb2 import ChangeEvent, EpochMarker, Position
from tailrace_services.capture.resume import AT_TIMEOUT_S, BusUnanswered, bus_lost_epoch

log = get_logger(__name__)

# The producer's local queue is what a slow bus fills first: bounded so that a large source
# transaction or a bus outage cannot grow the capture process by hundreds of MB.
QUEUE_MAX_KBYTES = 32 * 1024
QUEUE_MAX_MESSAGES = 50_000
EPOCH_ACK_TIMEOUT_S = 30.0
# Epochs emitted but not yet acknowledged: at least this many, and as many as close in
# IN_FLIGHT_S. Past them the publisher waits for the bus, so a slow or cut-off bus stops the
# source reading within a few epochs (backpressure), while a bus whose acks take a few
# hundred ms does not stall a source whose epochs close every 100 ms.
MIN_EPOCHS_IN_FLIGHT = 3
IN_FLIGHT_S = 0.6
# while idle: how often the bus is asked for the latest epoch's marker (from the last check
# or the last epoch recorded, which the control service refuses if the bus went backwards)
BUS_CHECK_S = 10.0
# an epoch not acknowledged this long: the bus is asked whether it lost what it held (a
# broker restarted empty never acknowledges this producer again)
BUS_SUSPECT_S = 5.0
IDLE_PER_EPOCH = 4  # how often a quiet source is reported idle per epoch_ms (`idle_report_s`)
MIN_IDLE_REPORT_S = 0.01


def epochs_in_flight(epoch_ms: int) -> int:
    """How many emitted epochs may wait for the bus's acks before publishing waits."""
    return max(MIN_EPOCHS_IN_FLIGHT, round(IN_FLIGHT_S * 1000 / epoch_ms) if epoch_ms else 0)


def idle_report_s(epoch_ms: int, longest_s: float) -> float:
    """How long a feed waits for its quiet source before it reports it idle (`IDLE`).

    The publisher acts between transactions only when called: an epoch acknowledged by the
    bus is recorded, and one pending since the last transaction before a pause is closed, at
    the next transaction or `IDLE`. So a quiet source reports it a few times an epoch
    (`epoch_ms` / IDLE_PER_EPOCH), never less often than its own `longest_s`: reported every
    200 ms (PostgreSQL's read timeout) or 500 ms (MariaDB's heartbeat), a lone transaction's
    epoch reached delivery that much later."""
    if not epoch_ms:
        return longest_s
    return min(longest_s, max(MIN_IDLE_REPORT_S, epoch_ms / 1000 / IDLE_PER_EPOCH))


def write_markers(brokers: str, topic: str, markers: Sequence[EpochMarker], client_id: str,
                  client_config: Mapping[str, str] | None, timeout_s: float,
                  why: str) -> dict[int, int]:
    """Each marker written to its partition by a producer of its own, and the offsets the
    broker gave them. Its own: after a broker restarted empty, a producer that wrote to it
    before may never be acknowledged again (its idempotence state is gone with the broker),
    and a restarted capture must not wait on what an earlier one sent. RetryableError, saying
    `why` it wrote, when not every marker is acknowledged within `timeout_s`."""
    producer = Producer(producer_config(brokers, client_id, client_config))
    offsets: dict[int, int] = {}
    errors: list[str] = []

    def acked(err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            errors.append(err.str())
        else:
            offsets[cast(int, msg.partition())] = cast(int, msg.offset())

    for marker in markers:
        producer.produce(topic, encode_epoch(marker), partition=marker.partition,
                         on_delivery=acked)
    left = producer.flush(timeout_s)
    if errors or left or len(offsets) < len(markers):
        producer.purge()
        producer.flush(0)
        if errors:  # the broker answered, and refused
            raise RetryableError(f"cannot write to the bus to {why}: {'; '.join(errors)}")
        raise BusUnanswered(f"cannot write to the bus to {why}: no answer within "
                            f"{timeout_s:.0f} s")
    return offsets


@dataclass
class _EpochInFlight:
    epoch: control_pb2.Epoch
    sent_at: float  # time.monotonic()
    bus_checked: bool = False  # once it waited BUS_SUSPECT_S (`_record_acked_epochs`)
    acked: dict[int, int] = field(default_factory=dict)  # partition -> offset after the marker


class BusPublisher:
    """`idle` is called about every 100 ms while the publisher waits for the bus (a full
    queue, an epoch's acks), so the caller can keep its source connection alive.
    `client_config`: the spec's `bus.client_config` (SASL, TLS)."""

    def __init__(self, brokers: str, topic: str, partitions: int, source_id: str,
                 control: ControlClient, epoch_ms: int = 100,
                 idle: Callable[[], None] | None = None,
                 client_config: Mapping[str, str] | None = None,
                 heartbeat_ms: int = 0) -> None:
        config = producer_config(brokers, f"tailrace-capture-{source_id}", client_config)
        config["queue.buffering.max.kbytes"] = min(int(config["queue.buffering.max.kbytes"]),
                                                   QUEUE_MAX_KBYTES)
        config["queue.buffering.max.messages"] = min(
            int(config["queue.buffering.max.messages"]), QUEUE_MAX_MESSAGES)
        self._producer = Producer(config)
        self.idle = idle  # None while the source is gone
        self._topic = topic
        self._partitions = partitions
        self._source_id = source_id
        self._control = control
        self._epoch_s = epoch_ms / 1000
        self._max_in_flight = epochs_in_flight(epoch_ms)
        self._error: KafkaError | None = None
        self._last_position: Position | None = None
        self._last_source_ms = 0  # source commit time of the last transaction published
        self._epoch_pending = False
        self._last_epoch_at = 0.0
        # a position an epoch may close at with nothing published (`advance`), at most
        # every heartbeat_ms (`source.heartbeat_ms`)
        self._advance: tuple[Position, int] | None = None
        self._heartbeat_s = heartbeat_ms / 1000
        self._advanced_at = 0.0
        self._in_flight: deque[_EpochInFlight] = deque()
        latest = control.latest_epoch(source_id)
        self._epoch_id = latest.epoch_id if latest else 0
        self.events_published = 0
        self.bytes_published = 0  # of the change events' bus records
        self.transactions_published = 0
        self._bus = (brokers, client_config)
        self._link = f"bus at {brokers}"  # its name in `tailrace.links`
        self.generation = latest.bus_generation if latest else 0
        self.generation_start = dict(latest.generation_start) if latest else {}
        self.generation_opened = False  # by this session: the bus lost what it held
        self._bus_checked_at = time.monotonic()
        if self._bus_lost(latest):
            assert latest is not None
            self._open_generation(latest)
        LINKS.ok(self._link)  # the bus answered (the topic was made or found before)

    def _open_generation(self, latest: control_pb2.Epoch) -> None:
        """The bus lost what this source published: publish from here on as the next bus
        generation (`tailrace.bus_generation`). It starts after a marker of epoch 0 on every
        partition, at the offsets the broker acknowledged for them (what the session that
        was running when the bus lost its data left on the new topic comes before it, and
        is not read). The caller resumes from the sinks' checkpoint, so everything they
        have not acknowledged is published again."""
        # by a producer of its own, acknowledged before this one sends anything: the
        # generation's start comes before all it publishes
        acked = {p: o + 1 for p, o in write_markers(
            self._bus[0], self._topic, self._epoch_zero_markers(),
            f"tailrace-capture-generation-{self._source_id}", self._bus[1],
            EPOCH_ACK_TIMEOUT_S, "start a new bus generation").items()}
        self.generation, self.generation_start = latest.bus_generation + 1, acked
        self.generation_opened = True
        lost = ", ".join(f"partition {p} up to offset {o:,}"
                         for p, o in sorted(latest.end_offsets.items()))
        log.error("the bus lost what this source published: republishing from the sinks' "
                  "checkpoint onto a new bus generation", topic=self._topic,
                  generation=self.generation, start=acked, latest_epoch=latest.epoch_id,
                  lost=lost)
        self._control.add_reconcile_record(
            self._source_id, None, None,
            [f"bus topic {self._topic} no longer holds epoch {latest.epoch_id} ({lost})",
             f"bus generation {self.generation} starts at "
             + ", ".join(f"partition {p} offset {o:,}" for p, o in sorted(acked.items()))],
            "republish")

    def _on_delivery(self, err: KafkaError | None, _msg: Message) -> None:
        if err is not None and self._error is None:
            self._error = err

    def _check(self) -> None:
        if self._error is not None:
            err, self._error = self._error, None
            if err.fatal():
                raise FatalError(f"bus producer failed fatally: {err.str()}")
            raise RetryableError(f"bus delivery failed: {err.str()}")

    def _produce(self, key: bytes | None, value: bytes, partition: int,
                 on_delivery: Callable[[KafkaError | None, Message], None] | None = None
                 ) -> None:
        while True:
            try:
                self._producer.produce(self._topic, value=value, key=key, partition=partition,
                                       on_delivery=on_delivery or self._on_delivery)
                return
            except BufferError:
                # The local queue is full: wait for the broker instead of dropping.
                self._wait(0.1)
                self._check()

    def _wait(self, timeout: float) -> None:
        self._producer.poll(timeout)
        if self.idle is not None:
            self.idle()

    def publish_transaction(self, events: Iterable[ChangeEvent]) -> None:
        """A transaction of stamped events (tests and tools; capture stamps records)."""
        self.publish_records((bus_key(event), encode_event(event)) for event in events)

    def publish_records(self, records: Iterable[tuple[bytes, bytes]],
                        last: Position | None = None, source_ms: int = 0) -> None:
        """A transaction in bus form: (bus key, serialized `BusRecord`) per event. `last`
        is its last event's position and `source_ms` its source commit time, read from
        its last record when not given."""
        count = nbytes = 0
        value = b""
        produce, topic, partitions = self._producer.produce, self._topic, self._partitions
        on_delivery = self._on_delivery
        for key, value in records:
            partition = partition_for(key, partitions)
            try:  # the common case inline: a Python call less per record
                produce(topic, value, key, partition, on_delivery)
            except BufferError:
                self._produce(key, value, partition)
            count += 1
            nbytes += len(value)
        if count and last is None:
            event = decode_record(value).event
            last, source_ms = event.position, event.ts_source_micros // 1000
        self._published(count, nbytes, last if count else None, source_ms)

    def _published(self, count: int, nbytes: int, last: Position | None,
                   source_ms: int) -> None:
        self.events_published += count
        self.bytes_published += nbytes
        self._producer.poll(0)
        self._check()
        self._record_acked_epochs()
        if last is None:
            return
        self.transactions_published += 1
        self._advance = None  # behind what was just published
        self._last_position = last
        self._last_source_ms = source_ms
        self._epoch_pending = True
        if time.monotonic() - self._last_epoch_at >= self._epoch_s:
            self._emit_epoch()

    def advance(self, position: Position, source_ms: int) -> None:
        """Nothing to publish, but an epoch may close at `position` (a source's heartbeat:
        the checkpoints move while the captured tables are idle); at most every
        heartbeat_ms, the latest such position then. Anything published after it wins."""
        self._advance = (position, source_ms)
        self.tick()

    def tick(self) -> None:
        """Call when idle: closes a pending epoch once `epoch_ms` has passed, and
        BUS_CHECK_S after the last epoch recorded, with nothing in flight, checks that the
        bus still holds the latest epoch (an idle source records no epoch that the control
        service could refuse)."""
        self._producer.poll(0)
        self._check()
        self._record_acked_epochs()
        if self._advance is not None and \
                time.monotonic() - self._advanced_at >= self._heartbeat_s:
            (self._last_position, self._last_source_ms), self._advance = self._advance, None
            self._advanced_at = time.monotonic()
            self._epoch_pending = True
        if self._epoch_pending and time.monotonic() - self._last_epoch_at >= self._epoch_s:
            self._emit_epoch()
        elif not self._in_flight and time.monotonic() - self._bus_checked_at >= BUS_CHECK_S:
            self._bus_checked_at = time.monotonic()
            # a bus or control service that does not answer now shows it when something
            # is published; the check reads at most AT_TIMEOUT_S when the bus is up
            self._check_bus("checked while idle", unanswered_is_fine=True)

    def _epoch_zero_markers(self) -> list[EpochMarker]:
        now_us = int(time.time() * 1_000_000)
        return [EpochMarker(epoch_id=0, source_id=self._source_id, partition=p, ts_micros=now_us)
                for p in range(self._partitions)]

    def _bus_lost(self, latest: control_pb2.Epoch | None) -> bool:
        brokers, config = self._bus

        def probe() -> None:  # the topic may be gone with the broker's data: made again
            ensure_topic(brokers, self._topic, self._partitions, extra=config)
            write_markers(brokers, self._topic, self._epoch_zero_markers(),
                          f"tailrace-capture-probe-{self._source_id}", config, AT_TIMEOUT_S,
                          "look for the latest epoch's marker again")

        # briefly: the publisher does not keep the source's connection alive meanwhile
        return bus_lost_epoch(brokers, self._topic, self._partitions, self._source_id, latest,
                              timeout_s=AT_TIMEOUT_S, client_config=config, probe=probe)

    def _check_bus(self, why: str, unanswered_is_fine: bool = False) -> None:
        """RetryableError when the bus lost the latest recorded epoch's marker: the next
        session opens a new bus generation (`_open_generation`). `unanswered_is_fine`: a
        bus or control service that cannot tell now is not an error."""
        lost = False
        with contextlib.suppress(*((RetryableError,) if unanswered_is_fine else ())):
            lost = self._bus_lost(self._control.latest_epoch(self._source_id))
            if not lost:  # it answered, with our marker
                LINKS.ok(self._link)
        if lost:
            raise RetryableError(f"the bus lost what this source published ({why}); starting "
                                 "again to republish from the sinks' checkpoint")

    def emit_epoch(self) -> None:
        """Close the epoch now and wait until it is recorded in control (what follows a
        publish in tests and tools; the capture loop closes epochs without waiting)."""
        self._emit_epoch()
        self.drain()

    def _emit_epoch(self) -> None:
        """Write a marker to every partition; the cut is recorded in control once all are
        acknowledged (`_record_acked_epochs`)."""
        if self._last_position is None:
            return
        self.drain(keep=self._max_in_flight - 1)
        self._epoch_id += 1
        now_us = int(time.time() * 1_000_000)
        flight = _EpochInFlight(
            control_pb2.Epoch(source_id=self._source_id, epoch_id=self._epoch_id,
                              position=self._last_position, ts_unix_ms=now_us // 1000,
                              source_ts_unix_ms=self._last_source_ms,
                              bus_generation=self.generation,
                              generation_start=self.generation_start),
            sent_at=time.monotonic())

        def on_marker(err: KafkaError | None, msg: Message) -> None:
            if err is not None:
                self._on_delivery(err, msg)
            else:  # delivered: the message has its partition and offset
                flight.acked[cast(int, msg.partition())] = cast(int, msg.offset()) + 1

        for partition in range(self._partitions):
            marker = EpochMarker(epoch_id=self._epoch_id, source_id=self._source_id,
                                 position=self._last_position, partition=partition,
                                 ts_micros=now_us)
            self._produce(None, encode_epoch(marker), partition, on_marker)
        self._in_flight.append(flight)
        self._epoch_pending = False
        self._last_epoch_at = time.monotonic()

    def _record_acked_epochs(self) -> None:
        """Record, oldest first, every epoch whose markers are all acknowledged; raise if the
        oldest waits longer than EPOCH_ACK_TIMEOUT_S."""
        while self._in_flight:
            flight = self._in_flight[0]
            if len(flight.acked) < self._partitions:
                waited = time.monotonic() - flight.sent_at
                if waited > EPOCH_ACK_TIMEOUT_S:
                    raise RetryableError(f"bus did not acknowledge epoch {flight.epoch.epoch_id} "
                                         f"within {EPOCH_ACK_TIMEOUT_S:.0f} s")
                if waited >= 1.0:  # not for every epoch on its way
                    LINKS.failed(self._link, f"epoch {flight.epoch.epoch_id} not acknowledged "
                                 f"for {waited:.0f} s", since=flight.sent_at)
                if waited > BUS_SUSPECT_S and not flight.bus_checked:
                    flight.bus_checked = True  # once: a slow bus is not asked again
                    self._check_bus(f"epoch {flight.epoch.epoch_id} not acknowledged within "
                                    f"{BUS_SUSPECT_S:.0f} s", unanswered_is_fine=True)
                return
            LINKS.ok(self._link)  # acknowledged: whatever the control service says next
            for partition, offset in flight.acked.items():
                flight.epoch.end_offsets[partition] = offset
            try:
                self._control.record_epoch(flight.epoch)
            except ControlRefused as e:
                if e.code == grpc.StatusCode.FAILED_PRECONDITION:
                    self._check_bus(e.details)
                raise
            # Recorded: its offsets were not behind the latest epoch's, which is what a bus
            # that lost what it held shows. So the idle check (`tick`) waits BUS_CHECK_S from
            # here: it reads the bus for ~0.5 s, and the transactions of a source writing a
            # few a second waited behind it every 10 s.
            self._bus_checked_at = time.monotonic()
            self._in_flight.popleft()

    def drain(self, keep: int = 0) -> None:
        """Wait until at most `keep` emitted epochs are not yet acknowledged and recorded."""
        while len(self._in_flight) > keep:
            self._wait(0.1)
            self._check()
            self._record_acked_epochs()

    def close(self) -> None:
        if self._epoch_pending:
            self._emit_epoch()
        self.drain()
        self._producer.flush(10)

    def abort(self) -> None:
        """Drop what is not acknowledged yet, without an epoch: after a failure the capture
        service publishes again from its checkpoint, and nothing past the last recorded
        epoch counts as delivered."""
        self._producer.purge()
        self._producer.flush(0)
        self._in_flight.clear()
        LINKS.ok(self._link)  # the next session finds out again
