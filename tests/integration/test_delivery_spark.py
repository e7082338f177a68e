"""The Spark delivery job alone: synthetic transactions on a real bus reach Redis once, in order."""

from __future__ import annotations

import json
import threading

import pytest
import redis

from tailrace.config import parse_pipeline
from tailrace.control_client import ControlClient
from tailrace.events import ChangeEvent, Column, Op, Position, Row, value_of
from tailrace_services.capture.publisher import BusPublisher
from tailrace_services.control.server import serve
from tailrace_services.control.storage import MemoryStorage

pytestmark = pytest.mark.integration


def make_tx(seq: int, keys: list[int]) -> list[ChangeEvent]:
    return [ChangeEvent(
        source_id="syn", tenant="t", database="db", table="items", op=Op.OP_INSERT,
        key_columns=["id"], tx_id=str(seq), tx_index=i, tx_size=len(keys),
        tx_end=i == len(keys) - 1, id=f"{seq}-{i}",
        after=Row(columns=[Column(name="id", value=value_of(k)),
                           Column(name="seq", value=value_of(seq))]),
        position=Position(tx_seq=seq, event_index=i)) for i, k in enumerate(keys)]


def test_job_delivers_each_event_once_and_commits_checkpoint(kafka_broker, redis_server):
    control = serve(MemoryStorage(), "127.0.0.1:0")
    address = f"127.0.0.1:{control.port}"
    spec = parse_pipeline(f"""
apiVersion: tailrace/v1
kind: Pipeline
metadata: {{name: syn}}
spec:
  source: {{type: postgres, id: syn, dsn: "host=unused", tables: [public.items]}}
  sinks: [{{id: r, type: redis, url: "{redis_server.url}", stream: "syn.{{table}}"}}]
  bus: {{brokers: "{kafka_broker.bootstrap}", topic: syn-bus}}
  control: {{address: "{address}"}}
""")
    kafka_broker.create_topic("syn-bus", 1)
    client = ControlClient(address)
    pub = BusPublisher(kafka_broker.bootstrap, "syn-bus", 1, "syn", client, epoch_ms=0)
    for seq in range(1, 51):
        pub.publish_transaction(make_tx(seq, [seq % 7, seq % 7 + 100]))
    # a restarted capture publishes transactions 41..50 a second time: delivered once
    for seq in range(41, 51):
        pub.publish_transaction(make_tx(seq, [seq % 7, seq % 7 + 100]))
    pub.close()

    from tailrace_services.delivery import job

    r = redis.Redis.from_url(redis_server.url)
    done = threading.Event()

    def watch() -> None:
        import time
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and not done.is_set():
            cp = client.get_checkpoint("syn", "r")
            if cp is not None and cp.position.tx_seq == 50:
                done.set()
            time.sleep(0.5)

    watcher = threading.Thread(target=watch)
    watcher.start()
    # stop_after_s bounds the run; the watcher tells us when the checkpoint got there
    job.run(spec, master="local[2]", stop_after_s=120, stop_when=done.is_set)
    watcher.join()

    entries = [json.loads(f[b"event"]) for _, f in r.xrange("syn.items")]
    assert len(entries) == 100
    seqs = [(e["position"]["tx_seq"], e["position"]["event_index"]) for e in entries]
    assert seqs == sorted(seqs) and len(set(seqs)) == 100
    cp = client.get_checkpoint("syn", "r")
    assert cp.position.tx_seq == 50 and cp.bus_offsets[0] > 0
    control.stop()
