"""The binlog stream against a real MariaDB: reconnects never re-read, names come from table maps."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

import pytest
from pymysqlreplication import BinLogStreamReader
from pymysqlreplication.event import MariadbGtidEvent

from tailrace.devservers import MariaDBServer, TcpProxy
from tailrace_services.capture_mysql.gtid import MariadbGtidPosition
from tailrace_services.capture_mysql.reader import (
    BinlogStream,
    RowChange,
    StreamLostError,
    TxCommit,
    read_binlog_header,
)

pytestmark = pytest.mark.integration


@pytest.fixture
def db(mariadb_server: MariaDBServer) -> str:
    name = f"s_{uuid.uuid4().hex[:10]}"
    mariadb_server.create_database(name)
    mariadb_server.execute(f"CREATE TABLE {name}.t (id int PRIMARY KEY, v varchar(20))")
    return name


def _via(proxy: TcpProxy, server: MariaDBServer) -> dict[str, object]:
    return {**server.connect_kwargs(), "port": proxy.port}


def _start(server: MariaDBServer) -> MariadbGtidPosition:
    return MariadbGtidPosition.parse(server.execute("SELECT @@gtid_binlog_pos")[0][0])


def test_a_lost_connection_is_reported_and_resuming_from_our_state_repeats_nothing(
        mariadb_server: MariaDBServer, db: str, tcp_proxy: Callable[..., TcpProxy]) -> None:
    proxy = tcp_proxy(mariadb_server.port)
    start = _start(mariadb_server)
    for i in range(20):
        mariadb_server.execute(f"INSERT INTO {db}.t VALUES (%s, 'a')", (i,))
    stream = BinlogStream(_via(proxy, mariadb_server), replica_server_id=4242, start=start)
    seen: list[str] = []
    items = stream.items()
    with pytest.raises(StreamLostError):
        for item in items:
            if isinstance(item, TxCommit):
                seen.append(item.gtid)
                if len(seen) == 10:
                    proxy.cut()
    stream.close()
    proxy.restore()
    assert len(seen) >= 10
    for i in range(20, 30):
        mariadb_server.execute(f"INSERT INTO {db}.t VALUES (%s, 'a')", (i,))
    resumed = BinlogStream(_via(proxy, mariadb_server), replica_server_id=4242,
                           start=stream.state)
    deadline = time.monotonic() + 30
    for item in resumed.items():
        assert time.monotonic() < deadline, f"only {len(seen)} transactions"
        if isinstance(item, TxCommit):
            seen.append(item.gtid)
            if len(seen) == 30:
                break
    resumed.close()
    assert len(seen) == len(set(seen)) == 30, "every transaction once"


def test_the_library_alone_re_reads_after_a_lost_connection(
        mariadb_server: MariaDBServer, db: str, tcp_proxy: Callable[..., TcpProxy]) -> None:
    """The fault worked around above: its silent reconnect starts over from its first position."""
    proxy = tcp_proxy(mariadb_server.port)
    start = str(_start(mariadb_server))
    for i in range(10):
        mariadb_server.execute(f"INSERT INTO {db}.t VALUES (%s, 'b')", (i,))
    reader = BinLogStreamReader(connection_settings=_via(proxy, mariadb_server),
                                server_id=4343, blocking=True, is_mariadb=True,
                                auto_position=start, only_events=[MariadbGtidEvent],
                                enable_logging=False)
    gtids: list[str] = []
    for event in reader:
        gtids.append(event.gtid)
        if len(gtids) == 5:
            proxy.cut()
            proxy.restore()
        if len(gtids) >= 15:
            break
    reader.close()
    assert len(set(gtids)) < len(gtids), f"expected duplicates from the library: {gtids}"


def test_column_names_come_from_each_table_map(mariadb_server: MariaDBServer, db: str) -> None:
    start = _start(mariadb_server)
    mariadb_server.execute(f"INSERT INTO {db}.t VALUES (1, 'x')")
    mariadb_server.execute(f"ALTER TABLE {db}.t RENAME COLUMN v TO w")
    mariadb_server.execute(f"INSERT INTO {db}.t VALUES (2, 'y')")
    stream = BinlogStream(mariadb_server.connect_kwargs(), replica_server_id=4444, start=start)
    names = []
    for item in stream.items():
        if isinstance(item, RowChange):
            names.append(list(item.event.rows[0]["values"]))
            if len(names) == 2:
                break
    stream.close()
    assert names == [["id", "v"], ["id", "w"]]


def test_binlog_header_gives_creation_time_and_gtid_list(mariadb_server: MariaDBServer,
                                                         db: str) -> None:
    mariadb_server.execute("FLUSH BINARY LOGS")
    newest = mariadb_server.execute("SHOW BINARY LOGS")[-1][0]
    header = read_binlog_header(mariadb_server.connect_kwargs(), 4545, newest)
    assert abs(header.created_unix - time.time()) < 120
    assert header.gtid_list == _start(mariadb_server)
