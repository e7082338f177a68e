"""What a new transactional writer of the Kafka sink costs as its checkpoint topic grows.

Every batch of an exactly-once Kafka sink starts a new writer (`init_transactions`, then
the last committed checkpoint read back, `_kafka_tx.read_checkpoint`) and commits one
checkpoint record; compaction leaves the active segment alone, so the topic keeps them.
This writes 10, 1,000, 5,000 and 20,000 checkpoint records to a throwaway noida-db broker
through the sink's own writer and times a new one, as the sink makes it after each batch
(median of 5).

    .venv/bin/python bench/bench_kafka_checkpoint.py
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tailrace.devservers.noida import NoidaKafka
from tailrace.proto.event_pb2 import Position
from tailrace_services.delivery.sinks import build_sink
from tailrace_services.delivery.sinks._kafka_tx import Message
from tailrace_services.delivery.sinks.base import BatchCommit
from tailrace_services.delivery.sinks.kafka import TransactionalKafkaSink
from tests.fix_sinks import sink_spec


def main() -> None:
    with NoidaKafka() as broker:
        broker.create_topic("t")
        sink = build_sink(sink_spec(id="s", type="kafka", brokers=broker.bootstrap, topic="t",
                                    exactly_once=True, checkpoint_topic="ckpt"), pipeline="p")
        assert isinstance(sink, TransactionalKafkaSink)
        written = 0
        for records in (10, 1_000, 5_000, 20_000):
            writer = sink._writer(0)
            while written < records:
                written += 1
                writer.write([(0, Message("t", b"k", b"v", []))],
                             BatchCommit(pipeline="p", source_id="s", sink_id="s",
                                         position=Position(tx_seq=written), partition=0), {})
            times = []
            for _ in range(5):
                sink.start_partition(0, kept=False)  # a worker new to the partition: a new writer
                started = time.monotonic()
                stored = sink.read_checkpoint("p", 0, 0)
                times.append(time.monotonic() - started)
                assert stored is not None and stored.tx_seq == written
            print(f"checkpoint records {written:>6,}: new writer (init_transactions + "
                  f"checkpoint read) median {statistics.median(times) * 1000:.0f} ms", flush=True)
        sink.close()


if __name__ == "__main__":
    main()
