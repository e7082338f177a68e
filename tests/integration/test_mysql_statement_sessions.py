"""Rows a STATEMENT or MIXED session writes on a ROW server: a loud stop, never a skip.

The server is configured right (binlog_format=ROW), but `binlog_format` is also a
session variable: such a session's DML reaches the binlog as statement text, which
capture cannot turn into row changes (issue 11.1).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from tailrace.devservers import KafkaBroker, MariaDBServer
from tailrace.events import Op, python_of
from tailrace.proto.control_pb2 import HEALTH_POSITION_LOST
from tests.fix_capture import Control
from tests.fix_mysql import BusReader, CaptureThread, alive, events, lost

pytestmark = pytest.mark.integration


@pytest.fixture
def db(mariadb_server: MariaDBServer) -> str:
    name = f"s_{uuid.uuid4().hex[:10]}"
    mariadb_server.create_database(name)
    for table in ("t", "other"):
        mariadb_server.execute(f"CREATE TABLE {name}.{table} (id int PRIMARY KEY, v text)")
    return name


def _ids(reader: BusReader) -> list[int]:
    return [python_of(e.after.columns[0].value) for e in events(reader.records)
            if e.op == Op.OP_INSERT]


def _load_file(tmp_path: Path) -> Path:
    path = tmp_path / "rows.csv"
    path.write_text("3,c\n4,d\n")
    return path


# Each writes row 3 (and 4) of the captured table in a way the binlog logs as a statement.
STATEMENT_WRITES = {
    "statement-insert": ["SET SESSION binlog_format = 'STATEMENT'",
                         "INSERT INTO t VALUES (3, 'c')"],
    "mixed-update-after-rows": ["SET SESSION binlog_format = 'MIXED'", "BEGIN",
                                "INSERT INTO t VALUES (3, UUID())",  # unsafe: logged as rows
                                "UPDATE t SET v = 'c' WHERE id = 3",  # safe: a statement
                                "COMMIT"],
    "statement-load-data": ["SET SESSION binlog_format = 'STATEMENT'",
                            "LOAD DATA LOCAL INFILE '{file}' INTO TABLE t "
                            "FIELDS TERMINATED BY ','"],
    "statement-create-select": ["SET SESSION binlog_format = 'STATEMENT'",
                                "CREATE TABLE t2 SELECT * FROM other"],
}


@pytest.mark.parametrize("case", list(STATEMENT_WRITES))
def test_a_statement_based_change_to_a_captured_table_stops_capture_loudly(
        case: str, mysql_spec: Callable[..., Path], mariadb_server: MariaDBServer,
        kafka_broker: KafkaBroker, control: Control, db: str, tmp_path: Path) -> None:
    spec = mysql_spec(mariadb_server, [f"{db}.t", f"{db}.t2"])
    cap = CaptureThread(spec).start()
    cap.wait_streaming()
    mariadb_server.execute(f"INSERT INTO {db}.t VALUES (1, 'a')")  # a ROW session
    reader = BusReader(kafka_broker.bootstrap, cap.spec.bus_topic)
    reader.read_until(lambda rs: 1 in _ids(reader), timeout=60, alive=alive(cap))

    # a statement-based change to a table *not* captured is skipped, capture goes on
    conn = mariadb_server.connect(db, local_infile=True)
    with conn.cursor() as cur:
        cur.execute("SET SESSION binlog_format = 'STATEMENT'")
        cur.execute("INSERT INTO other VALUES (1, 'x')")
        cur.execute("SET SESSION binlog_format = 'ROW'")
        cur.execute("INSERT INTO t VALUES (2, 'b')")
    reader.read_until(lambda rs: 2 in _ids(reader), timeout=60, alive=alive(cap))

    with conn.cursor() as cur:
        for sql in STATEMENT_WRITES[case]:
            cur.execute(sql.format(file=_load_file(tmp_path)))
        cur.execute("SELECT @@gtid_binlog_pos")
        (gtid,) = cur.fetchone()
    conn.close()
    err = lost(cap)
    print(f"\n{case}: {err}")
    text = str(err)
    assert text.startswith(f"position lost: transaction {gtid} (mysql-bin.")
    assert "binlog_format STATEMENT or MIXED" in text and text.endswith("Re-snapshot required.")
    table = f"{db}.t2" if case == "statement-create-select" else f"{db}.t"
    assert f"changed captured table {table} with a statement" in text
    health = control.client.get_health(cap.spec.spec.source.id)
    assert health is not None and health.state == HEALTH_POSITION_LOST and health.reason == text
    reader.poll(2.0)
    assert _ids(reader) == [1, 2], "nothing of the statement's transaction on the bus"
    assert not [e for e in events(reader.records) if e.position.mysql.gtid == gtid]
    cap.stop()

    # the checkpoint did not move past it: a restart stops at the same transaction
    again = CaptureThread(spec).start()
    assert str(lost(again)) == text
    again.stop()
    reader.close()


def _own_server(make_mariadb_server: Callable[..., MariaDBServer]) -> tuple[MariaDBServer, str]:
    """A server of this test's own: a capture from its first binlog meets no other test's
    statements (one that stops capture would stop every later capture of a shared server)."""
    server = make_mariadb_server()
    server.execute("CREATE DATABASE shop")
    for table in ("t", "other"):
        server.execute(f"CREATE TABLE shop.{table} (id int PRIMARY KEY, v text)")
    return server, "shop"


def test_a_function_call_logged_as_a_statement_stops_capture(
        mysql_spec: Callable[..., Path], make_mariadb_server: Callable[..., MariaDBServer],
        kafka_broker: KafkaBroker) -> None:
    """`SELECT f()` whose function writes rows is logged as that SELECT: tables unknown."""
    mariadb_server, db = _own_server(make_mariadb_server)
    mariadb_server.execute(
        f"CREATE FUNCTION {db}.add_row(i int) RETURNS int DETERMINISTIC MODIFIES SQL DATA "
        f"BEGIN INSERT INTO {db}.t VALUES (i, 'f'); RETURN i; END")
    cap = CaptureThread(mysql_spec(mariadb_server, [f"{db}.t"])).start()
    cap.wait_streaming()
    conn = mariadb_server.connect(db)
    with conn.cursor() as cur:
        cur.execute("SET SESSION binlog_format = 'STATEMENT'")
        cur.execute("SELECT add_row(7)")
    conn.close()
    err = lost(cap)
    assert "tables that cannot be told from the statement" in str(err), str(err)
    cap.stop()


def test_a_statement_on_a_table_whose_trigger_writes_a_captured_table_stops_capture(
        mysql_spec: Callable[..., Path], make_mariadb_server: Callable[..., MariaDBServer],
        kafka_broker: KafkaBroker) -> None:
    """The binlog holds `INSERT INTO other`; the trigger's rows in `t` are not in it."""
    mariadb_server, db = _own_server(make_mariadb_server)
    mariadb_server.execute(f"CREATE TRIGGER {db}.copy AFTER INSERT ON {db}.other FOR EACH ROW "
                           f"INSERT INTO {db}.t VALUES (NEW.id + 100, NEW.v)")
    cap = CaptureThread(mysql_spec(mariadb_server, [f"{db}.t"])).start()
    cap.wait_streaming()
    conn = mariadb_server.connect(db)
    with conn.cursor() as cur:
        cur.execute("SET SESSION binlog_format = 'STATEMENT'")
        cur.execute("INSERT INTO other VALUES (1, 'x')")
    conn.close()
    err = lost(cap)
    assert f"changed table {db}.other, whose triggers may write captured tables" in str(err)
    cap.stop()
