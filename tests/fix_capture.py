"""Shared rig of the capture-postgres tests (plugin: `tests.fix_capture`).

- `control`: a control service in this process (memory storage) and a client;
- `capture_rig(dsn, ...)`: writes a pipeline spec and starts the capture service as a
  subprocess (`python -m tailrace_services.capture`), which tests kill, stop and measure;
- `read_bus(...)`: the internal topic read back from offset 0 with `assign()`;
- checks of what the bus holds: whole, marked transactions; epochs that cut between
  transactions; changes per key in order, once each after delivery-style dedup
  (`deduplicated`), and the rows a sink builds from them (`replayed`);
- `StandbyServer`: a `pg_basebackup -R` copy of a primary that can be promoted.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tailrace.bus import BusReader, BusReadError
from tailrace.config import PipelineSpec, parse_pipeline
from tailrace.control_client import ControlClient
from tailrace.devservers import KafkaBroker, PostgresServer
from tailrace.devservers._process import run_checked
from tailrace.events import ChangeEvent, EpochMarker, Op, position_key, python_of
from tailrace.proto import control_pb2 as pb
from tailrace_services.control.server import ControlServer, serve
from tailrace_services.control.storage import MemoryStorage

ROOT = Path(__file__).resolve().parents[1]

SPEC = """\
apiVersion: tailrace/v1
kind: Pipeline
metadata: {{name: {name}, tenant: acme}}
spec:
  source:
    type: postgres
    id: {source_id}
    dsn: "{dsn}"
    tables: {tables}
    on_schema_drift: {on_schema_drift}
    max_tx_memory_events: {max_tx_memory_events}
    epoch_ms: {epoch_ms}{extra}
  sinks:
    - {{id: {sink_id}, type: redis, url: "redis://127.0.0.1:9"}}
  bus: {{brokers: "{brokers}", partitions: {partitions}}}
  control: {{address: "{control}"}}
"""

SINK = "sink1"

UNIT_SPEC = """
apiVersion: tailrace/v1
kind: Pipeline
metadata: {name: orders}
spec:
  source: {type: postgres, id: pg1, dsn: "postgresql://u@h/db", tables: [public.orders]}
  sinks: [{id: r1, type: redis, url: "redis://127.0.0.1:6379/0"}]
  bus: {brokers: "127.0.0.1:9092"}
"""


def unit_pipeline() -> PipelineSpec:
    """A pipeline for unit tests of the capture wing (source pg1, sink r1; no servers)."""
    return parse_pipeline(UNIT_SPEC, env={})


# -- the control service --------------------------------------------------------------


@dataclass
class Control:
    server: ControlServer
    client: ControlClient

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.server.port}"


@pytest.fixture
def control() -> Iterator[Control]:
    server = serve(MemoryStorage(), "127.0.0.1:0")
    client = ControlClient(f"127.0.0.1:{server.port}", retry_for=10)
    yield Control(server, client)
    client.close()
    server.stop(0)


# -- the capture service as a process -------------------------------------------------


@dataclass
class CaptureProcess:
    proc: subprocess.Popen[bytes]
    log_path: Path
    _log_start: int = 0

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        with open(self.log_path, "rb") as f:
            f.seek(self._log_start)
            return f.read().decode(errors="replace")

    def wait_log(self, text: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.log():
            code = self.proc.poll()
            if code is not None:
                raise AssertionError(f"capture exited with {code} before {text!r}:\n"
                                     + self.tail())
            if time.monotonic() > deadline:
                raise AssertionError(f"no {text!r} in the capture log after {timeout:.0f} s:\n"
                                     + self.tail())
            time.sleep(0.05)

    def wait_streaming(self, timeout: float = 60) -> None:
        self.wait_log('"event": "streaming"', timeout)

    def wait_exit(self, timeout: float = 60) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"capture still running after {timeout:.0f} s:\n"
                                 + self.tail()) from None

    def kill(self) -> None:
        """kill -9."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.kill()
            return -9

    def status(self, field_name: str) -> int:
        """A `/proc/<pid>/status` figure in kB, e.g. VmHWM (peak RSS), VmRSS."""
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith(field_name + ":"):
                return int(line.split()[1])
        raise KeyError(field_name)

    def tail(self, lines: int = 30) -> str:
        return "\n".join(self.log().splitlines()[-lines:])


@dataclass
class CaptureRig:
    """One pipeline: its spec, topic, source id; `start()` runs a capture process for it."""

    dir: Path
    name: str
    dsn: str
    control: Control
    brokers: str
    partitions: int
    spec_path: Path
    processes: list[CaptureProcess] = field(default_factory=list)

    @property
    def source_id(self) -> str:
        return f"src-{self.name}"

    @property
    def topic(self) -> str:
        return f"tailrace.{self.name}"

    @property
    def slot(self) -> str:
        return f"tailrace_{self.name.replace('-', '_')}"

    def start(self, *args: str) -> CaptureProcess:
        log_path = self.dir / f"capture-{self.name}.log"
        start = log_path.stat().st_size if log_path.exists() else 0
        with open(log_path, "ab") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "tailrace_services.capture", str(self.spec_path), *args],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=ROOT,
                env={**os.environ, "PYTHONPATH": str(ROOT)}, start_new_session=True)
        process = CaptureProcess(proc, log_path, start)
        self.processes.append(process)
        return process

    def wait_epoch(self, until: Callable[[pb.Epoch], bool], timeout: float = 120) -> pb.Epoch:
        """The latest recorded epoch once `until(epoch)` holds (cheaper than reading the bus)."""
        deadline = time.monotonic() + timeout
        while True:
            epoch = self.control.client.latest_epoch(self.source_id)
            if epoch is not None and until(epoch):
                return epoch
            assert time.monotonic() < deadline, f"no such epoch after {timeout:.0f} s: {epoch}"
            time.sleep(0.2)

    def snapshot_entry(self, table: str, until: Callable[[pb.SnapshotTable], bool],
                       timeout: float = 120) -> pb.SnapshotTable:
        """The table's entry in the pipeline's snapshot record once `until(entry)` holds."""
        deadline = time.monotonic() + timeout
        while True:
            entry = next((t for t in self.control.client.snapshot_state(self.name).tables
                          if t.table == table), None)
            if entry is not None and until(entry):
                return entry
            assert time.monotonic() < deadline, entry
            time.sleep(0.1)

    def chunks_done(self) -> int:
        """Snapshot chunks stored, over every table of the pipeline's record."""
        try:
            return sum(t.chunks_done for t in self.control.client.snapshot_state(self.name).tables)
        except Exception:  # noqa: BLE001 - not registered yet
            return 0

    def kill_when_chunks_done(self, capture: CaptureProcess, chunks: int,
                              timeout: float = 300) -> CaptureProcess:
        """kill -9 `capture` once `chunks` snapshot chunks are stored (progress, not time),
        then start another and wait until it streams."""
        deadline = time.monotonic() + timeout
        while self.chunks_done() < chunks:
            assert time.monotonic() < deadline, f"{chunks} chunks not done: {capture.tail()}"
            time.sleep(0.05)
        capture.kill()
        capture = self.start()
        capture.wait_streaming()
        return capture

    def read(self, until: Callable[[BusView], bool], timeout: float = 120) -> BusView:
        return read_bus(self.brokers, self.topic, self.partitions, until, timeout)

    def checkpoint(self, epoch: pb.Epoch) -> None:
        """Act as a delivery that delivered everything up to `epoch`: commit the sink's checkpoint."""
        current = self.control.client.get_checkpoint(self.source_id, SINK)
        if current is not None and position_key(current.position) >= position_key(epoch.position):
            return
        cp = pb.Checkpoint(pipeline=self.name, source_id=self.source_id, sink_id=SINK,
                           position=epoch.position, bus_offsets=dict(epoch.end_offsets))
        committed, stored = self.control.client.commit_checkpoint(
            cp, current.version if current is not None else 0)
        assert committed, f"checkpoint refused: {stored}"

    def sink_checkpoint(self) -> pb.Checkpoint | None:
        return self.control.client.get_checkpoint(self.source_id, SINK)


@pytest.fixture
def capture_rig(tmp_path: Path, control: Control, kafka_broker: KafkaBroker
                ) -> Iterator[Callable[..., CaptureRig]]:
    rigs: list[CaptureRig] = []

    def make(dsn: str, tables: str = "[public.*]", *, partitions: int = 1,
             on_schema_drift: str = "adapt", max_tx_memory_events: int = 10_000,
             epoch_ms: int = 200, brokers: str | None = None,
             **source: str | bool | None) -> CaptureRig:
        """`source`: more fields of spec.source (slot, publication, create_slot; None:
        null)."""
        name = f"pgc-{uuid.uuid4().hex[:10]}"
        spec_path = tmp_path / f"{name}.yaml"
        brokers = brokers or kafka_broker.bootstrap
        spec_path.write_text(SPEC.format(
            name=name, source_id=f"src-{name}", dsn=dsn, tables=tables,
            on_schema_drift=on_schema_drift, max_tx_memory_events=max_tx_memory_events,
            epoch_ms=epoch_ms, sink_id=SINK,
            extra="".join(f"\n    {k}: {json.dumps(v)}" for k, v in source.items()),
            brokers=brokers, partitions=partitions,
            control=control.address))
        rig = CaptureRig(tmp_path, name, dsn, control, brokers, partitions, spec_path)
        rigs.append(rig)
        return rig

    yield make
    for rig in rigs:
        for process in rig.processes:
            process.stop()


# -- reading the bus ------------------------------------------------------------------


@dataclass
class BusView:
    """Everything read from the topic: (partition, offset, record) in offset order per partition."""

    events: list[tuple[int, int, ChangeEvent]] = field(default_factory=list)
    markers: list[tuple[int, int, EpochMarker]] = field(default_factory=list)
    # epoch 0: what capture writes to every partition to look for a lost bus again
    # (`resume.bus_lost_epoch`'s probe); no cut, no position, skipped by delivery
    probes: list[tuple[int, int, EpochMarker]] = field(default_factory=list)

    def by_partition(self) -> dict[int, list[tuple[int, ChangeEvent | EpochMarker]]]:
        out: dict[int, list[tuple[int, ChangeEvent | EpochMarker]]] = defaultdict(list)
        for partition, offset, record in [*self.events, *self.markers]:
            out[partition].append((offset, record))
        for records in out.values():
            records.sort(key=lambda r: r[0])
        return out

    def distinct_positions(self) -> int:
        return len({position_key(e.position) for _, _, e in self.events})


def read_bus(brokers: str, topic: str, partitions: int, until: Callable[[BusView], bool],
             timeout: float = 120) -> BusView:
    """Read every partition from offset 0 until `until(view)` holds (checked when idle)."""
    view = BusView()
    deadline = time.monotonic() + timeout
    with BusReader(brokers, topic, client_id="check") as reader:
        reader.assign({p: 0 for p in range(partitions)})
        while True:
            try:
                batch = reader.poll(10_000, 0.5)
            except BusReadError:  # transient (the topic is being created): read on
                batch = []
            for message in batch:
                record = message.record()
                if record.WhichOneof("record") == "event":
                    view.events.append((message.partition, message.offset, record.event))
                elif record.epoch.epoch_id == 0:
                    view.probes.append((message.partition, message.offset, record.epoch))
                else:
                    view.markers.append((message.partition, message.offset, record.epoch))
            if len(batch) < 100 and until(view):
                return view
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"bus {topic}: condition not met after {timeout:.0f} s with "
                    f"{len(view.events)} events and {len(view.markers)} epoch markers")


# -- checks of what the bus holds ---------------------------------------------------------


def key_of(event: ChangeEvent) -> tuple[str, Any]:
    row = event.before if event.before.columns else event.after
    values = {c.name: c.value for c in row.columns}
    key = tuple(values[k].WhichOneof("kind") and str(getattr(values[k], values[k].WhichOneof(
        "kind"))) for k in event.key_columns)
    return event.table, key


def column(row: Any, name: str) -> Any:
    for c in row.columns:
        if c.name == name:
            kind = c.value.WhichOneof("kind")
            return None if kind == "null" else getattr(c.value, kind)
    raise KeyError(name)


def deduplicated(view: BusView) -> list[ChangeEvent]:
    """What a delivery keeps, per partition in offset order: each position once, forward only."""
    out: list[ChangeEvent] = []
    for records in view.by_partition().values():
        hwm = (-1, -1)
        for _, record in records:
            if isinstance(record, ChangeEvent) and position_key(record.position) > hwm:
                out.append(record)
                hwm = position_key(record.position)
    return out


def replayed(events: list[ChangeEvent], table: str, key: str = "id",
             value: str = "v") -> dict[Any, Any]:
    """The rows a sink builds of `table` from `events` in order ({key: value}): a TRUNCATE
    empties it, a delete removes the row, an insert, update or read writes it (DDL events
    change no row)."""
    rows: dict[Any, Any] = {}
    for event in events:
        if event.table != table or event.op == Op.OP_DDL:
            continue
        if event.op == Op.OP_TRUNCATE:
            rows.clear()
            continue
        image = event.after if event.after.columns else event.before
        values = {c.name: python_of(c.value) for c in image.columns}
        if event.op == Op.OP_DELETE:
            rows.pop(values[key], None)
        else:
            rows[values[key]] = values[value]
    return rows


def assert_transactions_whole(view: BusView, partitions: int, *, copies: bool = False,
                              cut_short: int = 0) -> dict[int, int]:
    """Each transaction: one tx id and size, indexes 0..size-1 over all partitions, `tx_end`
    on the last, in one contiguous run per partition. With `copies`, a transaction may be on
    the bus again (published again after a restart) as an identical copy; on one partition,
    at most `cut_short` copies may stop early (a kill -9 mid-publish), as prefixes of the
    whole. A snapshot chunk's read transaction cut short stays so: the source has no copy
    to send again, the rest of the chunk is read again at another position (the snapshot
    tests check every key is read once). Returns {tx_seq: size}."""
    sizes: dict[int, int] = {}
    for partition, records in view.by_partition().items():
        runs: list[list[ChangeEvent]] = []
        for _, record in records:
            if not isinstance(record, ChangeEvent):
                continue
            last = runs[-1][-1] if runs else None
            if (last is not None and last.position.tx_seq == record.position.tx_seq
                    and record.tx_index > last.tx_index):
                runs[-1].append(record)
            else:
                runs.append([record])
        short = 0
        seen_runs: set[int] = set()
        for run in runs:
            first = run[0]
            tx = first.position.tx_seq
            assert len({e.tx_id for e in run}) == 1, f"tx {tx}: several tx ids"
            assert all(e.tx_size == first.tx_size for e in run), f"tx {tx}: several sizes"
            assert sizes.setdefault(tx, first.tx_size) == first.tx_size
            assert all(e.tx_end == (e.tx_index == e.tx_size - 1) for e in run), f"tx {tx}: tx_end"
            assert copies or tx not in seen_runs, (
                f"tx {tx} is not contiguous on partition {partition}")
            seen_runs.add(tx)
            if partitions == 1:
                indexes = [e.tx_index for e in run]
                assert indexes == list(range(len(run))), f"tx {tx}: indexes {indexes[:20]}"
                short += len(run) < first.tx_size
        assert short <= cut_short, f"{short} copies cut short on partition {partition}"
    # over all partitions, each transaction has exactly its indexes
    indexes: dict[int, set[int]] = defaultdict(set)
    reads: set[int] = set()
    for _, _, event in view.events:
        indexes[event.position.tx_seq].add(event.tx_index)
        if event.op == Op.OP_SNAPSHOT_READ:
            reads.add(event.position.tx_seq)
    for tx, size in sizes.items():
        if cut_short and tx in reads and indexes[tx] == set(range(len(indexes[tx]))):
            continue  # a prefix: cut short (docstring)
        assert indexes[tx] == set(range(size)), f"tx {tx} is missing events"
    # all events of one position are the same event (ids and content)
    seen: dict[tuple[int, int], ChangeEvent] = {}
    for _, _, event in view.events:
        copy = ChangeEvent()
        copy.CopyFrom(event)
        copy.ts_captured_micros = 0
        first = seen.setdefault(position_key(event.position), copy)
        assert first == copy, f"two different events at {position_key(event.position)}"
    return sizes


def assert_epochs_between_transactions(view: BusView, control: ControlClient, source_id: str,
                                       partitions: int) -> int:
    """Every marker comes after whole transactions: on each partition, the events before a
    marker are of transactions at or below its position and those after it above. Every
    partition has the same markers, at the offsets the control service recorded. Returns
    the number of epochs."""
    by_partition = view.by_partition()
    epoch_ids: dict[int, list[int]] = {}
    for partition in range(partitions):
        highest_before, cut = -1, -1
        ids = []
        for offset, record in by_partition.get(partition, []):
            if isinstance(record, ChangeEvent):
                tx = record.position.tx_seq
                assert tx > cut, (f"partition {partition} offset {offset}: tx {tx} after the "
                                  f"epoch cut at {cut}: an epoch split a transaction")
                highest_before = max(highest_before, tx)
            else:
                assert highest_before <= record.position.tx_seq, (
                    f"epoch {record.epoch_id} at {record.position.tx_seq} comes after tx "
                    f"{highest_before}")
                cut = record.position.tx_seq
                ids.append(record.epoch_id)
        epoch_ids[partition] = ids
    assert len({tuple(ids) for ids in epoch_ids.values()}) == 1, "markers differ per partition"
    recorded = {e.epoch_id: e for e in control.epoch_range(source_id, limit=100_000)}
    for partition, offset, marker in view.markers:
        epoch = recorded.get(marker.epoch_id)
        assert epoch is not None, f"epoch {marker.epoch_id} on the bus was not recorded"
        assert epoch.end_offsets[partition] == offset + 1
        assert position_key(epoch.position) == position_key(marker.position)
    return len(epoch_ids[0])


# -- PostgreSQL helpers ---------------------------------------------------------------------


LOST = re.compile(r"position lost: (.+?)\. Re-snapshot required\.")


def stream_and_checkpoint(rig: CaptureRig, dsn: str, first_id: int, rows: int = 20
                          ) -> CaptureProcess:
    """Start capture (unless running), write `rows` single-row transactions, wait for them on
    the bus and commit the sink checkpoint at the latest epoch, as a delivery would."""
    capture = rig.processes[-1] if rig.processes and rig.processes[-1].proc.poll() is None \
        else rig.start()
    capture.wait_streaming()
    with psycopg.connect(dsn, autocommit=True) as conn:
        for i in range(first_id, first_id + rows):
            conn.execute("INSERT INTO items VALUES (%s, 'x')", (i,))
    view = rig.read(lambda v: any(e.after.columns and e.after.columns[0].value.int_value ==
                                  first_id + rows - 1 for _, _, e in v.events), timeout=60)
    last_tx = max(e.position.tx_seq for _, _, e in view.events)
    epoch = rig.wait_epoch(lambda e: e.position.tx_seq >= last_tx, timeout=30)
    rig.checkpoint(epoch)
    return capture


def assert_position_lost(rig: CaptureRig, capture: CaptureProcess, reason: str,
                         exit_code: int | None = 1) -> str:
    """The exact error text in the log and in the control service's health; the exit code."""
    if exit_code is not None:
        assert capture.wait_exit(60) == exit_code, capture.tail()
    else:
        capture.wait_log("Re-snapshot required.")
    found = LOST.search(capture.log())
    assert found is not None, capture.tail()
    assert reason in found.group(1), found.group(0)
    # capture logs why before it reports to the control service: wait for the report
    deadline = time.monotonic() + 30
    while (health := rig.control.client.get_health(rig.source_id)) is None or \
            health.state != pb.HEALTH_POSITION_LOST:
        assert time.monotonic() < deadline, f"health not reported as position lost: {health}"
        time.sleep(0.05)
    assert health.reason == found.group(0)
    return found.group(0)


def side_url(capture: CaptureProcess) -> str:
    capture.wait_log('"event": "http side port"')
    return str(next(json.loads(line)["url"] for line in capture.log().splitlines()
                    if '"event": "http side port"' in line))


def operator_resnapshots(rig: CaptureRig, capture: CaptureProcess,
                         capsys: pytest.CaptureFixture[str]) -> None:
    """A capture stopped on a lost position (503, waiting) brought back the operator's
    way: `tailrace resnapshot` is refused while the pipeline runs, then pause,
    resnapshot, resume; returns once capture streams again."""
    from tailrace_services.cli.main import main

    assert http_health(capture)[0] == 503
    capture.wait_log("waiting for an operator")
    control = ["--control", rig.control.address]
    assert main([*control, "resnapshot", rig.name, "--confirm", rig.source_id]) == 1, \
        "refused while the pipeline runs"
    assert "pause it first" in capsys.readouterr().err
    assert main([*control, "pause", rig.name]) == 0
    assert main([*control, "resnapshot", rig.name, "--confirm", rig.source_id]) == 0
    assert main([*control, "resume", rig.name]) == 0
    capture.wait_log("resnapshot requested by an operator")
    capture.wait_streaming()


def http_health(capture: CaptureProcess) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(side_url(capture) + "/health", timeout=5) as r:
            return r.status, {}
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def setup_items(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS items (id bigint PRIMARY KEY, v text)")




def slot_row(dsn: str, slot: str) -> tuple[str, int] | None:
    """(wal_status, confirmed_flush_lsn) of a slot, None when it does not exist."""
    from tailrace_services.capture_postgres.connection import str_to_lsn

    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT coalesce(wal_status, ''), confirmed_flush_lsn::text FROM "
                           "pg_replication_slots WHERE slot_name = %s", (slot,)).fetchone()
    return (row[0], str_to_lsn(row[1])) if row else None


class StandbyServer(PostgresServer):
    """A streaming standby of `primary` (pg_basebackup -R); `promote()` makes it a primary."""

    def __init__(self, primary: PostgresServer, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.primary = primary

    def _prepare(self, directory: Path) -> None:
        if self._user is not None:
            import pwd

            entry = pwd.getpwnam(self._user)
            os.chown(directory, entry.pw_uid, entry.pw_gid)
        run_checked(
            [str(self.bindir / "pg_basebackup"), "-h", self.primary.host,
             "-p", str(self.primary.port), "-U", "postgres", "-D", str(self.datadir),
             "-R", "-X", "stream", "-c", "fast", "--no-sync"],
            log_path=self.log_path, what="pg_basebackup", cwd=directory, user=self._user)
        with open(self.datadir / "postgresql.conf", "a") as conf:
            conf.write(f"\n# standby\nport = {self.port}\n"
                       f"unix_socket_directories = '{directory}'\n")

    def promote(self) -> None:
        self.execute("SELECT pg_promote(true, 60)")


class RestoredServer(PostgresServer):
    """A file-level copy of a stopped server's data directory, slots included, started as a
    server of its own: the same cluster (system identifier, timeline, LSNs) as of the copy —
    what a disk snapshot or a restored file backup gives. `copy_of(origin)` copies now.
    With `standby_of`, the copy follows that primary as a streaming standby (its logical
    slots kept, as PostgreSQL 17 slot synchronisation would), and `promote()` makes it one."""

    def __init__(self, snapshot: Path, standby_of: PostgresServer | None = None,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.snapshot = snapshot
        self.standby_of = standby_of

    def promote(self) -> None:
        self.execute("SELECT pg_promote(true, 60)")

    @staticmethod
    def copy_of(origin: PostgresServer, dest: Path) -> Path:
        """Copy the data directory of `origin`, which must be stopped (keep_data=True)."""
        assert not origin.running, "a copy of a running server's files is not consistent"
        subprocess.run(["cp", "-a", str(origin.datadir), str(dest)], check=True)
        return dest

    def _prepare(self, directory: Path) -> None:
        subprocess.run(["cp", "-a", str(self.snapshot), str(self.datadir)], check=True)
        (self.datadir / "postmaster.pid").unlink(missing_ok=True)
        if self._user is not None:
            import pwd

            entry = pwd.getpwnam(self._user)
            os.chown(directory, entry.pw_uid, entry.pw_gid)
        with open(self.datadir / "postgresql.conf", "a") as conf:
            conf.write(f"\n# restored copy\nport = {self.port}\n"
                       f"unix_socket_directories = '{directory}'\n")
            if self.standby_of is not None:
                conf.write(f"primary_conninfo = 'host={self.standby_of.host} "
                           f"port={self.standby_of.port} user=postgres'\n")
        if self.standby_of is not None:
            (self.datadir / "standby.signal").touch()
            if self._user is not None:
                shutil.chown(self.datadir / "standby.signal", self._user, self._user)
