"""capture-mysql test helpers (plugin: `tests.fix_mysql`), over
`tailrace_services.capture_mysql.testing`:

- `mysql_spec(server, tables, **kw)`: a pipeline spec of a MariaDB server on the session's
  bus and the test's control service (`control`, from `tests.fix_capture`);
- what a capture published: `events(records)`, `count_events(n)`;
- a capture in a thread: `alive(capture)` fails a bus read once it failed, `lost(capture)`
  waits for it to end on a lost position.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tailrace.devservers import KafkaBroker, MariaDBServer
from tailrace.errors import PositionLostError
from tailrace.proto.event_pb2 import ChangeEvent
from tailrace_services.capture_mysql.testing import CaptureThread, Record, write_spec
from tests.fix_capture import Control


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
