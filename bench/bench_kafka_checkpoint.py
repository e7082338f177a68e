"""What a new transactional writer of the Kafka sink costs as its checkpoint topic grows.

Every batch of an exactly-once Kafka sink starts a new writer (`init_transactions`, then
the last committed checkpoint read back, `_kafka_tx.read_checkpoint`) and commits one
checkpoint record; compaction leaves the active segment alone, so the topic keeps them.
This writes 10, 1,000, 5,000 and 20,000 checkpoint records to a throwaway noida-db broker
and times a new writer (median of 5) after each step.

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
from tailrace_services.delivery.sinks._kafka_tx import (
    RECONNECT_BACKOFF_MS,
    Message,
    TransactionalWriter,
)
from tailrace_services.delivery.sinks.base import BatchCommit


def main() -> None:
    with NoidaKafka() as broker:
        broker.create_topic("t")
        broker.create_topic("ckpt", config={"cleanup.policy": "compact"})
        client = {"bootstrap.servers": broker.bootstrap,
                  "reconnect.backoff.ms": RECONNECT_BACKOFF_MS}  # as the sink's
        producer = {**client, "linger.ms": 5}

        def writer() -> TransactionalWriter:
            return TransactionalWriter(client, producer, "tx1", "ckpt", "p/s/0", 60)

        current, written = writer(), 0
        for records in (10, 1_000, 5_000, 20_000):
            while written < records:
                written += 1
                current.write([(0, Message("t", b"k", b"v", []))],
                              BatchCommit(pipeline="p", source_id="s", sink_id="s",
                                          position=Position(tx_seq=written), partition=0), {})
            current.close()
            times = []
            for _ in range(5):
                started = time.monotonic()
                fresh = writer()
                times.append(time.monotonic() - started)
                assert fresh.stored is not None and fresh.stored.tx_seq == written
                fresh.close()
            current = writer()
            print(f"checkpoint records {written:>6,}: new writer (init_transactions + "
                  f"checkpoint read) median {statistics.median(times) * 1000:.0f} ms", flush=True)
        current.close()


if __name__ == "__main__":
    main()
