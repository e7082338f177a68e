"""The throwaway servers start, are configured as CDC needs, and survive kill/restart."""

from __future__ import annotations

import asyncio
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest
import redis
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from redis.backoff import NoBackoff
from redis.retry import Retry

from tailrace.devservers import (
    DevServerError,
    KafkaBroker,
    MariaDBServer,
    NatsServer,
    PostgresServer,
    RedisServer,
    TcpProxy,
)
from tailrace.devservers._process import find_binary

pytestmark = pytest.mark.integration


def test_postgres_is_ready_for_logical_decoding(pg_server: PostgresServer, pg_db: str) -> None:
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id int PRIMARY KEY, name text)")
        conn.execute("INSERT INTO items VALUES (1, 'one')")
        assert conn.execute("SELECT name FROM items").fetchall() == [("one",)]
        assert conn.execute("SHOW wal_level").fetchone() == ("logical",)
        assert conn.execute("SHOW synchronous_commit").fetchone() == ("on",)
        row = conn.execute(
            "SELECT slot_name FROM pg_create_logical_replication_slot('t_slot', 'pgoutput')"
        ).fetchone()
        assert row == ("t_slot",)
    assert pg_server.dsn("x").startswith(f"postgresql://postgres@127.0.0.1:{pg_server.port}/")


def test_postgres_replication_connection_is_allowed(pg_db: str) -> None:
    with psycopg.connect(pg_db, autocommit=True, replication="database") as conn:
        system_id = conn.execute("IDENTIFY_SYSTEM").fetchone()
    assert system_id is not None and system_id[0]


def test_postgres_keeps_committed_data_across_kill(
    make_pg_server: Callable[..., PostgresServer],
) -> None:
    server = make_pg_server()
    server.execute("CREATE TABLE t (id int)")
    server.execute("INSERT INTO t VALUES (1), (2)")
    old_pid = server.pid
    server.kill()
    assert not server.running
    server.start()
    assert server.pid != old_pid
    assert server.execute("SELECT count(*) FROM t") == [(2,)]
    server.restart()
    assert server.execute("SELECT count(*) FROM t") == [(2,)]


def test_postgres_stop_removes_its_dir(make_pg_server: Callable[..., PostgresServer]) -> None:
    server = make_pg_server()
    directory = server.dir
    assert directory is not None and directory.is_dir()
    server.stop()
    assert not directory.exists()


def test_mariadb_writes_a_full_row_binlog_with_gtids(mariadb_server: MariaDBServer) -> None:
    settings = dict(
        mariadb_server.execute(
            "SELECT 'format', @@binlog_format UNION ALL SELECT 'image', @@binlog_row_image"
            " UNION ALL SELECT 'metadata', @@binlog_row_metadata"
            " UNION ALL SELECT 'log_bin', @@log_bin"
            " UNION ALL SELECT 'strict', @@gtid_strict_mode"
        )
    )
    assert settings == {
        "format": "ROW",
        "image": "FULL",
        "metadata": "FULL",
        "log_bin": "1",
        "strict": "1",
    }
    mariadb_server.create_database("devshop")
    mariadb_server.execute("CREATE TABLE devshop.items (id int PRIMARY KEY, name text)")
    mariadb_server.execute("INSERT INTO devshop.items VALUES (1, 'one')")
    [(gtid_pos,)] = mariadb_server.execute("SELECT @@gtid_binlog_pos")
    assert gtid_pos.startswith("0-1-")
    [(server_id,)] = mariadb_server.execute("SELECT @@server_id")
    assert server_id == mariadb_server.server_id


def test_mariadb_root_can_grant_replication_over_tcp(mariadb_server: MariaDBServer) -> None:
    mariadb_server.execute("CREATE USER IF NOT EXISTS 'cdc'@'127.0.0.1' IDENTIFIED BY 'pw'")
    mariadb_server.execute(
        "GRANT REPLICATION SLAVE, REPLICATION CLIENT, SELECT ON *.* TO 'cdc'@'127.0.0.1'"
    )
    import pymysql

    conn = pymysql.connect(host="127.0.0.1", port=mariadb_server.port, user="cdc", password="pw")
    try:
        with conn.cursor() as cur:
            cur.execute("SHOW BINARY LOGS")
            assert cur.fetchall()
    finally:
        conn.close()


def test_mariadb_server_id_and_kill(make_mariadb_server: Callable[..., MariaDBServer]) -> None:
    server = make_mariadb_server(server_id=7)
    server.execute("CREATE DATABASE d")
    server.execute("CREATE TABLE d.t (id int PRIMARY KEY)")
    server.execute("INSERT INTO d.t VALUES (1)")
    server.kill()
    server.start()
    assert server.execute("SELECT count(*) FROM d.t") == [(1,)]
    [(gtid_pos,)] = server.execute("SELECT @@gtid_binlog_pos")
    assert gtid_pos.startswith("0-7-")


def test_redis_stream_round_trip(redis_server: RedisServer) -> None:
    with redis.Redis.from_url(redis_server.url) as client:
        client.xadd("devservers", {"k": "v"})
        client.xadd("devservers", {"k": "w"})
        assert client.xlen("devservers") == 2


def test_redis_restart_starts_empty(make_redis_server: Callable[..., RedisServer]) -> None:
    server = make_redis_server()
    with redis.Redis.from_url(server.url) as client:
        client.set("k", "v")
    server.kill()
    server.start()
    with redis.Redis.from_url(server.url) as client:
        assert client.get("k") is None  # no persistence, by design


def test_nats_jetstream_round_trip(nats_server: NatsServer) -> None:
    import nats

    async def round_trip() -> int:
        nc = await nats.connect(nats_server.url)
        try:
            js = nc.jetstream()
            await js.add_stream(name="DEVSERVERS", subjects=["devservers.>"])
            await js.publish("devservers.a", b"one")
            await js.publish("devservers.b", b"two")
            info = await js.stream_info("DEVSERVERS")
            return int(info.state.messages)
        finally:
            await nc.close()

    assert asyncio.run(round_trip()) == 2


def test_kafka_produce_and_consume(kafka_broker: KafkaBroker) -> None:
    kafka_broker.create_topic("devservers", partitions=1)
    producer = Producer({"bootstrap.servers": kafka_broker.bootstrap})
    for i in range(3):
        producer.produce("devservers", key=b"k", value=f"m{i}".encode())
    assert producer.flush(10) == 0

    consumer = Consumer(
        {
            "bootstrap.servers": kafka_broker.bootstrap,
            "group.id": "devservers",
            "session.timeout.ms": 6000,
            "enable.auto.commit": False,
        }
    )
    try:
        consumer.assign([TopicPartition("devservers", 0, OFFSET_BEGINNING)])
        values: list[bytes] = []
        for _ in range(100):
            msg = consumer.poll(0.2)
            if msg is not None and msg.error() is None:
                values.append(msg.value())
            if len(values) == 3:
                break
    finally:
        consumer.close()
    assert values == [b"m0", b"m1", b"m2"]


@pytest.fixture
def proxied_redis(
    redis_server: RedisServer, tcp_proxy: Callable[..., TcpProxy]
) -> Iterator[tuple[TcpProxy, redis.Redis]]:
    """A proxy in front of the shared Redis, and a client through it that does not retry."""
    proxy = tcp_proxy(redis_server.port)
    client = redis.Redis(port=proxy.port, socket_timeout=5, retry=Retry(NoBackoff(), retries=0))
    yield proxy, client
    client.close()


def test_tcp_proxy_cut_and_restore(proxied_redis: tuple[TcpProxy, redis.Redis]) -> None:
    proxy, client = proxied_redis
    client.set("proxied", "1")
    assert client.get("proxied") == b"1"
    proxy.cut()
    with pytest.raises(redis.ConnectionError):
        client.get("proxied")
    with pytest.raises(redis.ConnectionError):
        client.ping()  # new connections are refused, not hung
    proxy.restore()
    assert client.get("proxied") == b"1"


def test_tcp_proxy_loses_a_reply_and_slows_a_link(
    proxied_redis: tuple[TcpProxy, redis.Redis]
) -> None:
    proxy, client = proxied_redis
    proxy.lose_reply_to(b"proxied-lost")
    with pytest.raises(redis.ConnectionError):
        client.set("proxied-lost", "1")
    assert proxy.replies_lost == 1
    assert client.get("proxied-lost") == b"1", "the request reached the server"
    proxy.slow(delay_s=0.2, bytes_per_s=100_000)
    started = time.monotonic()
    client.set("proxied-big", "x" * 50_000)
    assert time.monotonic() - started >= 0.8  # the rate (0.5 s), then 0.2 s each way
    proxy.slow()
    assert client.get("proxied-big") == b"x" * 50_000


def test_missing_binary_names_the_fix(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(DevServerError, match="make setup.*Debian package redis-server"):
        find_binary("redis-server", package="redis-server", search_dirs=[tmp_path])


def test_tcp_proxy_cuts_one_process_and_not_another(
    proxied_redis: tuple[TcpProxy, redis.Redis], redis_server: RedisServer, tmp_path: Path
) -> None:
    """`cut(clients=...)`: a child process's connections through the proxy are cut and
    refused, this process's go on."""
    import subprocess
    import sys

    proxy, client = proxied_redis
    script = tmp_path / "child.py"
    script.write_text(
        "import sys, time, redis\n"
        "from redis.backoff import NoBackoff\nfrom redis.retry import Retry\n"
        f"c = redis.Redis(port={proxy.port}, socket_timeout=5, retry=Retry(NoBackoff(), 0))\n"
        "c.ping(); print('up', flush=True); sys.stdin.readline()\n"
        "for _ in range(2):\n"
        "    try:\n        c.ping(); print('ok', flush=True)\n"
        "    except redis.ConnectionError:\n        print('cut', flush=True)\n")
    child = subprocess.Popen([sys.executable, str(script)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdin is not None
        assert child.stdout.readline().strip() == "up"
        client.ping()
        proxy.cut(clients=lambda: [child.pid])
        client.set("proxied-other", "1")  # this process is not cut
        child.stdin.write("\n")
        child.stdin.flush()
        assert [child.stdout.readline().strip() for _ in range(2)] == ["cut", "cut"], \
            "the open connection dropped and a new one refused"
        assert client.get("proxied-other") == b"1"
    finally:
        child.kill()
        child.wait()
    proxy.restore()


def test_tcp_proxy_in_front_of_kafka_advertises_itself_and_cuts_before_a_request(
    tcp_proxy: Callable[..., TcpProxy]
) -> None:
    """`kafka=True`: the broker's metadata names the proxy, so every connection of a
    client goes through it; `cut_before(kafka_request(0))` cuts the link at the next
    Produce request, which the broker never sees."""
    from confluent_kafka.admin import AdminClient

    from tailrace.devservers.noida import NoidaKafka
    from tailrace.devservers.proxy import kafka_request

    with NoidaKafka() as broker:
        proxy: TcpProxy = tcp_proxy(broker.port)
        proxy.kafka = True
        bootstrap = f"127.0.0.1:{proxy.port}"
        brokers = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10).brokers
        assert [(b.host, b.port) for b in brokers.values()] == [("127.0.0.1", proxy.port)]
        producer = Producer({"bootstrap.servers": bootstrap, "message.timeout.ms": 60000})
        producer.produce("proxied", b"before")
        assert producer.flush(20) == 0
        proxy.cut_before(kafka_request(0))
        producer.produce("proxied", b"during")
        assert proxy.cuts_made.wait(20), "a Produce request cut the link"
        assert proxy.cut_off
        proxy.restore()
        assert producer.flush(30) == 0, "the producer sends it again once the link is back"
        consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "proxied",
                             "enable.auto.commit": False})
        consumer.assign([TopicPartition("proxied", 0, OFFSET_BEGINNING)])
        values = []
        deadline = time.monotonic() + 20
        while len(values) < 2 and time.monotonic() < deadline:
            message = consumer.poll(1)
            if message is not None and not message.error():
                values.append(message.value())
        consumer.close()
        assert values == [b"before", b"during"]


def test_mariadb_install_leaves_other_temp_tables_alone(
    make_mariadb_server: Callable[..., MariaDBServer],
) -> None:
    # A bootstrapping mariadbd deletes every #sql* file in its tmpdir; in the shared
    # /tmp that was a parallel install's temp table, and that install failed.
    other = Path(tempfile.gettempdir()) / f"#sql-temptable-{uuid.uuid4().hex}.MAD"
    other.write_bytes(b"")
    try:
        make_mariadb_server()
        assert other.exists(), "mariadb-install-db deleted a temp table in the shared tmpdir"
    finally:
        other.unlink(missing_ok=True)
