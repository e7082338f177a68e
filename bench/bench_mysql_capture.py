"""capture-mysql: the library's raw decode rate vs. the service's publish rate, in one run.

    .venv/bin/python bench/bench_mysql_capture.py [--rows 100000] [--tx 1000]

Starts a throwaway MariaDB, a Kafka-protocol broker and an in-process control
service; writes a backlog of rows (int, varchar, decimal, datetime(6), an
unsigned bigint) in transactions of `--tx` rows; then

1. raw: `mysql-replication` reads the backlog and decodes every row, nothing else;
2. raw, rows in C: the same reader, every row read by capture's own decoder
   (`RowDecoder.images`, `_cwire.binlog_rows`) into serialized Rows instead;
3. service: `MysqlCapture` reads the same backlog and publishes every change to
   the bus (decode, typed values, ids, keys, protobuf, produce, epochs);

and prints rows/s for each and the process's RSS. Figures, not assertions.
"""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the rig lives in tests/

from pymysqlreplication.row_event import WriteRowsEvent  # noqa: E402

from tailrace.devservers import KafkaBroker, MariaDBServer  # noqa: E402
from tailrace_services.capture_mysql.reader import _Reader, row_images  # noqa: E402
from tailrace_services.capture_mysql.schema import shape_from_table_map  # noqa: E402
from tailrace_services.capture_mysql.values import RowDecoder  # noqa: E402
from tests.fix_mysql import CaptureThread, start_control, write_spec  # noqa: E402


def rss_mb() -> tuple[float, float]:
    """(current, peak) resident set size in MB."""
    current = 0.0
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                current = int(line.split()[1]) / 1024
    return current, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def write_backlog(server: MariaDBServer, rows: int, tx: int) -> float:
    server.execute("CREATE DATABASE bench")
    server.execute("CREATE TABLE bench.t (id int PRIMARY KEY, name varchar(40), "
                   "amount decimal(12,2), at datetime(6), big bigint unsigned)")
    conn = server.connect("bench")
    t0 = time.perf_counter()
    with conn.cursor() as cur:
        for start in range(0, rows, tx):
            cur.execute("BEGIN")
            cur.executemany("INSERT INTO t VALUES (%s, %s, %s, %s, %s)", [
                (i, f"customer-{i:08d}", f"{i % 100000}.{i % 100:02d}",
                 "2024-05-06 07:08:09.123456", 2**63 + i) for i in range(start, min(start + tx,
                                                                                   rows))])
            cur.execute("COMMIT")
    conn.close()
    return time.perf_counter() - t0


def raw_decode(server: MariaDBServer, rows: int, in_c: bool = False) -> float:
    reader = _Reader(connection_settings=dict(server.connect_kwargs(), read_timeout=30),
                     server_id=9001, blocking=True, is_mariadb=True, auto_position="",
                     only_events=[WriteRowsEvent], enable_logging=False)
    seen = 0
    decoders: dict[int, RowDecoder] = {}
    t0 = time.perf_counter()
    for event in reader:
        if in_c:
            decoder = decoders.get(event.table_id)
            if decoder is None:
                shape = shape_from_table_map(event.schema, event.table, event.columns, {})
                decoder = decoders[event.table_id] = RowDecoder(shape, event.columns)
            where = row_images(event)
            images = decoder.images(*where) if where is not None else None
            if images is None:
                raise SystemExit("a row the C decoder does not read: the bench table changed?")
            seen += len(images)
        else:
            seen += len(event.rows)
        if seen >= rows:
            break
    elapsed = time.perf_counter() - t0
    reader.close()
    return elapsed


def service_publish(server: MariaDBServer, broker: KafkaBroker, control: str, rows: int,
                    directory: Path) -> float:
    spec = write_spec(directory, dsn=server.dsn(), brokers=broker.bootstrap, control=control,
                      tables=["bench.t"], name="bench")
    capture = CaptureThread(spec)
    counter = capture.capture.metrics.events
    t0 = time.perf_counter()
    capture.start()
    while counter._value.get() < rows + 1:  # + the CREATE TABLE event
        if capture.error is not None:
            raise SystemExit(f"capture failed: {capture.error}")
        time.sleep(0.05)
    elapsed = time.perf_counter() - t0
    capture.stop()
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--tx", type=int, default=1000)
    args = parser.parse_args()
    with MariaDBServer() as server, KafkaBroker() as broker, \
            tempfile.TemporaryDirectory() as tmp:
        control = start_control()
        write_s = write_backlog(server, args.rows, args.tx)
        before = rss_mb()
        raw_s = raw_decode(server, args.rows)
        raw_c_s = raw_decode(server, args.rows, in_c=True)
        service_s = service_publish(server, broker, control.address, args.rows, Path(tmp))
        after = rss_mb()
        control.stop()
    print(f"backlog: {args.rows:,} rows in transactions of {args.tx} "
          f"(written in {write_s:.1f} s)")
    print(f"raw library decode : {args.rows / raw_s:>9,.0f} rows/s ({raw_s:.1f} s)")
    print(f"raw, rows read in C: {args.rows / raw_c_s:>9,.0f} rows/s ({raw_c_s:.1f} s; "
          f"{raw_s / raw_c_s:.1f}x the library's)")
    print(f"service to the bus : {args.rows / service_s:>9,.0f} rows/s ({service_s:.1f} s, "
          "start-up and identity checks included)")
    print(f"service / raw      : {raw_s / service_s:>9.0%}")
    print(f"RSS: {before[0]:.0f} MB before, {after[0]:.0f} MB after, peak {after[1]:.0f} MB")


if __name__ == "__main__":
    main()
