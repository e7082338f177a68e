"""A delivery-only pipeline for tests: synthetic transactions on a real bus, a real control
service, real Redis sinks (optionally behind a TcpProxy to cut them), the real Spark job."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import redis

from tailrace.config import PipelineSpec, parse_pipeline
from tailrace.control_client import ControlClient
from tailrace.events import ChangeEvent, Column, Op, Position, Row, value_of
from tailrace_services.capture.publisher import BusPublisher
from tailrace_services.control.server import serve
from tailrace_services.control.storage import MemoryStorage


def synthetic_tx(seq: int, keys: list[int], table: str = "items") -> list[ChangeEvent]:
    now_us = int(time.time() * 1e6)
    return [ChangeEvent(
        source_id="syn", tenant="t", database="db", table=table, op=Op.OP_UPDATE,
        key_columns=["id"], tx_id=str(seq), tx_index=i, tx_size=len(keys),
        tx_end=i == len(keys) - 1, id=f"{seq}-{i}", idempotency_key=f"t|db.{table}|{seq}|{seq}-{i}",
        ts_source_micros=now_us,
        after=Row(columns=[Column(name="id", value=value_of(k)),
                           Column(name="seq", value=value_of(seq))]),
        position=Position(tx_seq=seq, event_index=i)) for i, k in enumerate(keys)]


@dataclass
class DeliveryRig:
    name: str
    control_address: str
    brokers: str
    topic: str
    sinks: list[dict[str, Any]]
    extra: str = ""
    control_server: Any = None
    client: ControlClient = field(init=False)
    publisher: BusPublisher | None = None
    _thread: threading.Thread | None = None
    _stop: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None

    def __post_init__(self) -> None:
        self.client = ControlClient(self.control_address)

    @property
    def spec(self) -> PipelineSpec:
        sinks = ", ".join(
            "{" + ", ".join(f"{k}: {json.dumps(v)}" for k, v in s.items()) + "}"
            for s in self.sinks)
        return parse_pipeline(f"""
apiVersion: tailrace/v1
kind: Pipeline
metadata: {{name: {self.name}}}
spec:
  source: {{type: postgres, id: syn, dsn: "host=unused", tables: [public.items]}}
  sinks: [{sinks}]
  bus: {{brokers: "{self.brokers}", topic: {self.topic}}}
  control: {{address: "{self.control_address}"}}
{self.extra}
""")

    def publish(self, first: int, last: int, keys: Callable[[int], list[int]]) -> None:
        if self.publisher is None:
            self.publisher = BusPublisher(self.brokers, self.topic, 1, "syn", self.client, 0)
        for seq in range(first, last + 1):
            self.publisher.publish_transaction(synthetic_tx(seq, keys(seq)))
        self.publisher.emit_epoch()

    def start_job(self, timeout: float = 300) -> None:
        from tailrace_services.delivery import job

        def run() -> None:
            try:
                job.run(self.spec, master="local[2]", stop_after_s=timeout,
                        stop_when=self._stop.is_set)
            except BaseException as e:  # noqa: BLE001 - surfaced to the test
                self.error = e

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()

    def stop_job(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(60)

    def checkpoint_seq(self, sink_id: str) -> int:
        cp = self.client.get_checkpoint("syn", sink_id)
        return cp.position.tx_seq if cp is not None else 0

    def wait(self, predicate: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.error is not None:
                raise AssertionError(f"delivery job failed: {self.error}")
            if predicate():
                return
            time.sleep(0.5)
        raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def stream_seqs(url: str, stream: str) -> list[tuple[int, int]]:
    client = redis.Redis.from_url(url)
    out = []
    for _, fields in client.xrange(stream):
        event = json.loads(fields[b"event"])
        out.append((event["position"]["tx_seq"], event["position"]["event_index"]))
    return out


@pytest.fixture
def delivery_rig(kafka_broker: Any) -> Iterator[Callable[..., DeliveryRig]]:
    control = serve(MemoryStorage(), "127.0.0.1:0")
    rigs: list[DeliveryRig] = []

    def make(sinks: list[dict[str, Any]], extra: str = "") -> DeliveryRig:
        name = f"rig{len(rigs)}-{int(time.time() * 1000) % 10**8}"
        topic = f"{name}-bus"
        kafka_broker.create_topic(topic, 1)
        rig = DeliveryRig(name, f"127.0.0.1:{control.port}", kafka_broker.bootstrap, topic, sinks,
                          extra, control)
        rigs.append(rig)
        return rig

    yield make
    for rig in rigs:
        rig.stop_job()
    control.stop()
