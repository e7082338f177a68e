"""Fixtures that start real servers on loopback (plugin: `-p tests.fix_servers`).

Session-scoped servers are shared by all tests; a test that kills, restarts or fails over
a server asks a `make_*` factory for its own, which are torn down when the test ends.
A missing binary is an error with the fix in its message, never a skip.
"""

from __future__ import annotations

import uuid
import warnings
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from typing import Any, TypeVar

import pytest

from tailrace.devservers import (
    DevServer,
    KafkaBroker,
    MariaDBServer,
    NatsServer,
    PostgresServer,
    RedisServer,
    TcpProxy,
    free_port,
)

S = TypeVar("S", bound=DevServer)


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PostgresServer]:
    with PostgresServer() as server:
        yield server


@pytest.fixture(scope="session")
def mariadb_server() -> Iterator[MariaDBServer]:
    with MariaDBServer() as server:
        yield server


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


@pytest.fixture(scope="session")
def nats_server() -> Iterator[NatsServer]:
    with NatsServer() as server:
        yield server


@pytest.fixture(scope="session")
def kafka_broker() -> Iterator[KafkaBroker]:
    with KafkaBroker() as broker:
        yield broker


@pytest.fixture
def pg_db(pg_server: PostgresServer) -> Iterator[str]:
    """DSN of a fresh database in the shared server, dropped (with its slots) afterwards."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    dsn = pg_server.create_database(name)
    yield dsn
    if not pg_server.running:  # a test stopped the shared server; the session one is gone
        return
    try:
        pg_server.drop_database(name)
    except Exception as exc:  # a leftover database must not fail the test that used it
        warnings.warn(f"could not drop test database {name}: {exc}", stacklevel=1)


def _factory(cls: type[S]) -> Iterator[Callable[..., S]]:
    """Yield `make(**kwargs)` that starts a `cls`; stop every one made when the test ends."""
    with ExitStack() as stack:

        def make(**kwargs: Any) -> S:
            server = cls(**kwargs)
            stack.enter_context(server)
            return server

        yield make


@pytest.fixture
def make_pg_server() -> Iterator[Callable[..., PostgresServer]]:
    """`make_pg_server(settings={...})` starts an extra PostgreSQL for this test."""
    yield from _factory(PostgresServer)


@pytest.fixture
def make_mariadb_server() -> Iterator[Callable[..., MariaDBServer]]:
    """`make_mariadb_server(server_id=2)` starts an extra MariaDB for this test."""
    yield from _factory(MariaDBServer)


@pytest.fixture
def make_redis_server() -> Iterator[Callable[..., RedisServer]]:
    yield from _factory(RedisServer)


@pytest.fixture
def tcp_proxy() -> Iterator[Callable[..., TcpProxy]]:
    """`tcp_proxy(target_port)` starts a cuttable proxy in front of a server."""
    with ExitStack() as stack:

        def make(target_port: int, target_host: str = "127.0.0.1") -> TcpProxy:
            return stack.enter_context(TcpProxy(target_port, target_host))

        yield make


class ProxiedKafka(KafkaBroker):
    """A broker that advertises a proxy's port, so every client connection goes through it."""

    def __init__(self, advertised_port: int) -> None:
        super().__init__()
        self.advertised_port = advertised_port

    def _command(self) -> list[str]:
        command = super()._command()
        command[command.index("--advertised-listener-url") + 1] = \
            f"tcp://{self.host}:{self.advertised_port}"
        return command


@pytest.fixture
def proxied_broker() -> Iterator[tuple[ProxiedKafka, TcpProxy]]:
    """A broker of its own whose every client connection goes through a `TcpProxy`."""
    port = free_port()
    broker = ProxiedKafka(port)
    with TcpProxy(broker.port, port=port) as proxy, broker:
        yield broker, proxy
