"""Test and bench helpers for capture-mysql: a spec, the capture in a thread or as a process,
and reading the bus back.

    control = start_control()                      # in-process, memory storage
    spec = write_spec(tmp_path, dsn=..., brokers=..., control=control.address, tables=[...])
    with CaptureThread(spec) as capture: ...       # or CaptureProcess(spec).start() / .kill()
    records = BusReader(brokers, topic).read_until(lambda rs: ...)
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Self

from confluent_kafka import Consumer, KafkaError, TopicPartition

from tailrace.bus import consumer_config
from tailrace.config import PipelineSpec, load_pipeline
from tailrace.control_client import ControlClient
from tailrace.events import decode_record
from tailrace.proto.event_pb2 import BusRecord
from tailrace_services.cli.supervisor import service_argv

__all__ = ["BusReader", "CaptureProcess", "CaptureThread", "ControlHandle", "Record",
           "start_control", "write_spec"]

SPEC = """\
apiVersion: tailrace/v1
kind: Pipeline
metadata: {{name: {name}, tenant: acme}}
spec:
  source:
    type: mysql
    id: {source_id}
    dsn: "{dsn}"
    tables: [{tables}]
    epoch_ms: {epoch_ms}
    max_tx_memory_events: {max_tx}
    on_schema_drift: {drift}
  sinks:
    - {{id: sink1, type: redis, url: "redis://127.0.0.1:1/0"}}
  bus: {{brokers: "{brokers}", partitions: {partitions}}}
  control: {{address: "{control}"}}
"""


@dataclass
class ControlHandle:
    server: object
    address: str
    client: ControlClient

    def stop(self) -> None:
        self.client.close()
        self.server.stop()  # type: ignore[attr-defined]


def start_control() -> ControlHandle:
    """The control service in this process, on a free port, with memory storage."""
    from tailrace_services.control.server import serve
    from tailrace_services.control.storage import MemoryStorage

    server = serve(MemoryStorage(), "127.0.0.1:0")
    address = f"127.0.0.1:{server.port}"
    return ControlHandle(server, address, ControlClient(address))


def write_spec(directory: Path, *, dsn: str, brokers: str, control: str, tables: list[str],
               epoch_ms: int = 200, max_tx: int = 10_000, partitions: int = 1,
               drift: str = "adapt", name: str | None = None) -> Path:
    name = name or f"my-{uuid.uuid4().hex[:8]}"
    path = directory / f"{name}.yaml"
    path.write_text(SPEC.format(name=name, source_id=f"src-{name}", dsn=dsn,
                                tables=", ".join(tables), epoch_ms=epoch_ms, max_tx=max_tx,
                                drift=drift, brokers=brokers, partitions=partitions,
                                control=control))
    return path


class CaptureThread:
    """`MysqlCapture.run()` in a daemon thread; `error` holds what it raised."""

    def __init__(self, spec_path: Path, **overrides: object) -> None:
        from tailrace_services.capture_mysql.service import MysqlCapture

        self.spec: PipelineSpec = load_pipeline(str(spec_path))
        self.control = ControlClient(self.spec.spec.control.address)
        self.capture = MysqlCapture(self.spec, self.control)
        for key, value in overrides.items():
            setattr(self.capture, key, value)
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            self.capture.run()
        except BaseException as e:  # noqa: BLE001 - handed to the test
            self.error = e

    def start(self) -> Self:
        self._thread.start()
        return self

    def wait_streaming(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not self.capture.ready:
            if self.error is not None:
                raise AssertionError(f"capture failed before streaming: {self.error}")
            if time.monotonic() > deadline:
                raise AssertionError("capture did not start streaming")
            time.sleep(0.05)

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def stop(self) -> None:
        self.capture.stop()
        self._thread.join(30)
        self.control.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


class CaptureProcess:
    """`tailrace-capture SPEC --exit-on-fatal` as a child process, for kill -9."""

    def __init__(self, spec_path: Path, log_path: Path) -> None:
        self.spec_path = spec_path
        self.log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> Self:
        argv = service_argv("tailrace-capture", str(self.spec_path), "--exit-on-fatal")
        log = self.log_path.open("ab")
        self.process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                        start_new_session=True)
        log.close()
        return self

    def wait_log(self, text: str, timeout: float = 60, after: int = 0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if text in self.log()[after:]:
                return
            if self.process is not None and self.process.poll() is not None:
                raise AssertionError(f"capture exited with {self.process.returncode}:\n"
                                     + self.log()[-3000:])
            time.sleep(0.1)
        raise AssertionError(f"no {text!r} in the capture log:\n" + self.log()[-3000:])

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def kill(self) -> None:
        assert self.process is not None
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.kill()


@dataclass
class Record:
    partition: int
    offset: int
    record: BusRecord


@dataclass
class BusReader:
    """Reads a topic's partitions from the start, keeping what it read between calls."""

    brokers: str
    topic: str
    partitions: int = 1
    records: list[Record] = field(default_factory=list)

    def __post_init__(self) -> None:
        config = consumer_config(self.brokers, f"test-reader-{uuid.uuid4().hex[:8]}")
        config["isolation.level"] = "read_uncommitted"
        self._consumer = Consumer(config)
        self._consumer.assign([TopicPartition(self.topic, p, 0) for p in range(self.partitions)])

    def poll(self, seconds: float) -> int:
        got = 0
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            msgs = self._consumer.consume(10_000, 0.2)
            for msg in msgs:
                if msg.error() is not None:
                    if msg.error().code() != KafkaError._PARTITION_EOF:
                        raise AssertionError(f"bus read failed: {msg.error().str()}")
                    continue
                self.records.append(Record(msg.partition(), msg.offset(),
                                           decode_record(msg.value())))
                got += 1
            if not msgs and got:
                break
        return got

    def read_until(self, done: Callable[[list[Record]], bool], timeout: float = 120,
                   alive: Callable[[], None] | None = None) -> list[Record]:
        deadline = time.monotonic() + timeout
        while not done(self.records):
            if time.monotonic() > deadline:
                raise AssertionError(f"bus: condition not met after {timeout} s with "
                                     f"{len(self.records)} records")
            if alive is not None:
                alive()
            self.poll(1.0)
        return self.records

    def events(self) -> list[Record]:
        return [r for r in self.records if r.record.WhichOneof("record") == "event"]

    def close(self) -> None:
        self._consumer.close()
