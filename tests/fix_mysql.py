"""capture-mysql test and bench rig (plugin: `tests.fix_mysql`).

    control = start_control()                      # in-process, memory storage
    spec = write_spec(tmp_path, dsn=..., brokers=..., control=control.address, tables=[...])
    with CaptureThread(spec) as capture: ...       # or CaptureProcess(spec).start() / .kill()
    records = BusReader(brokers, topic).read_until(lambda rs: ...)

- `mysql_spec(server, tables, **kw)`: a pipeline spec of a MariaDB server on the session's
  bus and the test's control service (`control`, from `tests.fix_capture`);
- what a capture published: `events(records)`, `count_events(n)`;
- a capture in a thread: `alive(capture)` fails a bus read once it failed, `lost(capture)`
  waits for it to end on a lost position;
- binlogs: `wait_no_binlog_readers(server)`, `purge_binlogs_to(server, newest)`;
- `mysql_rig(server, tables, snapshot=...)`: the `CaptureRig` of `tests.fix_capture` for a
  MariaDB pipeline (capture as a process: kill -9, logs, bus reads).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import pytest

from tailrace import bus
from tailrace.config import PipelineSpec, load_pipeline
from tailrace.control_client import ControlClient
from tailrace.devservers import KafkaBroker, MariaDBServer
from tailrace.errors import PositionLostError
from tailrace.proto.event_pb2 import BusRecord, ChangeEvent
from tailrace_services.cli.supervisor import service_argv
from tests.fix_capture import CaptureRig, Control

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
        from tailrace_services.capture_mysql import MysqlCapture

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


class BusReader:
    """Reads a topic's partitions from the start, keeping what it read between calls
    (over the bus's one reader, `tailrace.bus.BusReader`)."""

    def __init__(self, brokers: str, topic: str, partitions: int = 1) -> None:
        self.records: list[Record] = []
        self._reader = bus.BusReader(brokers, topic, client_id="test-reader",
                                     committed_only=False)
        self._reader.assign({p: 0 for p in range(partitions)})

    def poll(self, seconds: float) -> int:
        got = 0
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                messages = self._reader.poll(10_000, 0.2)
            except bus.BusReadError as e:
                raise AssertionError(f"bus read failed: {e}") from None
            self.records.extend(Record(m.partition, m.offset, m.record()) for m in messages)
            got += len(messages)
            if not messages and got:
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
        self._reader.close()


# -- fixtures and checks ----------------------------------------------------------------


@pytest.fixture
def mysql_spec(tmp_path: Path, kafka_broker: KafkaBroker, control: Control
               ) -> Callable[..., Path]:
    def make(server: MariaDBServer, tables: list[str], **kw: Any) -> Path:
        """`kw`: more of `write_spec` (name, epoch_ms, max_tx, partitions, drift)."""
        return write_spec(tmp_path, dsn=server.dsn(), brokers=kafka_broker.bootstrap,
                          control=control.address, tables=tables, **kw)

    return make


def events(records: list[Record]) -> list[ChangeEvent]:
    return [r.record.event for r in records if r.record.WhichOneof("record") == "event"]


def count_events(n: int) -> Callable[[list[Record]], bool]:
    return lambda rs: sum(r.record.WhichOneof("record") == "event" for r in rs) >= n


def alive(capture: CaptureThread) -> Callable[[], None]:
    def check() -> None:
        if capture.error is not None:
            raise AssertionError(f"capture failed: {capture.error}")
    return check


def lost(capture: CaptureThread, timeout: float = 60) -> PositionLostError:
    capture.join(timeout)
    assert isinstance(capture.error, PositionLostError), (
        f"expected a lost position, got {capture.error!r}")
    return capture.error


def wait_no_binlog_readers(server: MariaDBServer, timeout: float = 30) -> None:
    """A stopped capture's binlog dump thread lingers on the server for a moment."""
    deadline = time.monotonic() + timeout
    while any(row[4] == "Binlog Dump" for row in server.execute("SHOW PROCESSLIST")):
        assert time.monotonic() < deadline, "a binlog dump thread is still attached"
        time.sleep(0.1)


def purge_binlogs_to(server: MariaDBServer, newest: str, timeout: float = 30) -> None:
    """PURGE until it took effect: MariaDB keeps a binlog that a dump thread still reads or
    whose binlog checkpoint (written in the background after FLUSH) is not done yet."""
    wait_no_binlog_readers(server, timeout)
    deadline = time.monotonic() + timeout
    while True:
        server.execute(f"PURGE BINARY LOGS TO '{newest}'")
        if server.execute("SHOW BINARY LOGS")[0][0] == newest:
            return
        assert time.monotonic() < deadline, "binary logs were not purged"
        time.sleep(0.2)


@pytest.fixture
def mysql_rig(tmp_path: Path, control: Control, kafka_broker: KafkaBroker
              ) -> Iterator[Callable[..., CaptureRig]]:
    """`mysql_rig(server, tables, snapshot={...})`: a pipeline of a MariaDB server whose capture
    runs as a process (`CaptureRig.start()`, kill -9 and all), like `capture_rig` for
    PostgreSQL."""
    rigs: list[CaptureRig] = []

    def make(server: MariaDBServer, tables: list[str], *, snapshot: dict[str, Any] | None = None,
             epoch_ms: int = 200, dsn: str | None = None, partitions: int = 1) -> CaptureRig:
        """`dsn`: another user's (default root's)."""
        name = f"myc-{uuid.uuid4().hex[:10]}"
        dsn = dsn or server.dsn()
        spec_path = write_spec(tmp_path, dsn=dsn, brokers=kafka_broker.bootstrap,
                               control=control.address, tables=tables, epoch_ms=epoch_ms,
                               name=name, partitions=partitions)
        if snapshot:
            text = spec_path.read_text().replace(
                "    on_schema_drift:", f"    snapshot: {json.dumps(snapshot)}\n    on_schema_drift:")
            spec_path.write_text(text)
        rig = CaptureRig(tmp_path, name, dsn, control, kafka_broker.bootstrap, partitions,
                         spec_path)
        rigs.append(rig)
        return rig

    yield make
    for rig in rigs:
        for process in rig.processes:
            process.stop()
