"""The dead-letter queue over real gRPC (DESIGN guarantee 7), on SQLite, PostgreSQL and memory:
each overflow policy, expiry, ack-up-to; nothing leaves it uncounted."""

from __future__ import annotations

import threading
import time

import grpc
import pytest

from tailrace.control_client import ControlClient, ControlUnavailable
from tailrace_services.control.server import serve
from tailrace_services.control.storage import MemoryStorage, SqliteStorage

pytestmark = pytest.mark.integration


class Clock:
    def __init__(self) -> None:
        self.t = time.time()

    def __call__(self) -> float:
        return self.t


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def dlq(request, tmp_path):
    """(client, clock): the server's storage runs on `clock`, so tests move time."""
    if request.param == "memory":
        storage = MemoryStorage()
    elif request.param == "sqlite":
        storage = SqliteStorage(str(tmp_path / "state.db"))
    else:
        from tailrace_services.control.storage._postgres import PostgresStorage

        storage = PostgresStorage(request.getfixturevalue("pg_db"))
    clock = Clock()
    storage.clock = clock
    server = serve(storage, "127.0.0.1:0")
    with ControlClient(f"127.0.0.1:{server.port}", retry_for=5) as c:
        yield c, clock
    server.stop()


def letters(*names: str) -> list[tuple[str, str, bytes]]:
    return [("redis-1", f"too large: {n}", n.encode()) for n in names]


def events(client: ControlClient) -> list[bytes]:
    return [e.event for e in client.dlq_list("p")]


def test_drop_oldest_counts_what_it_dropped(dlq):
    client, _ = dlq
    assert client.dlq_append("p", letters("a", "b", "c"), "drop_oldest", 4, 0) == (3, 0, 0)
    assert client.dlq_append("p", letters("d", "e", "f"), "drop_oldest", 4, 0) == (3, 2, 0)
    assert events(client) == [b"c", b"d", b"e", b"f"]
    stats = client.dlq_stats("p")
    assert (stats.count, stats.dropped_total, stats.last_sequence) == (4, 2, 6)


def test_reject_refuses_what_does_not_fit_and_says_so(dlq):
    client, _ = dlq
    assert client.dlq_append("p", letters("a", "b", "c"), "reject", 4, 0) == (3, 0, 0)
    assert client.dlq_append("p", letters("d", "e", "f"), "reject", 4, 0) == (1, 0, 2)
    assert events(client) == [b"a", b"b", b"c", b"d"]
    assert client.dlq_stats("p").rejected_total == 2


def test_block_waits_until_there_is_room(dlq):
    client, _ = dlq
    client.dlq_append("p", letters("a", "b", "c"), "block", 4, 0)
    threading.Timer(0.5, client.dlq_ack, args=("p", 2)).start()  # an operator replays two
    started = time.monotonic()
    assert client.dlq_append("p", letters("d", "e", "f"), "block", 4, 0) == (3, 0, 0)
    assert time.monotonic() - started >= 0.4, "it waited for room"
    assert events(client) == [b"c", b"d", b"e", b"f"]


def test_block_gives_up_loudly_and_keeps_what_it_stored(dlq):
    client, _ = dlq
    client.dlq_append("p", letters("a", "b", "c"), "block", 4, 0)
    with pytest.raises(ControlUnavailable, match="2 of 3 entries still waiting") as e:
        client.dlq_append("p", letters("d", "e", "f"), "block", 4, 0, block_timeout_s=0.3)
    assert e.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert events(client) == [b"a", b"b", b"c", b"d"]


def test_entries_expire_and_are_counted(dlq):
    client, clock = dlq
    client.dlq_append("p", letters("old1", "old2"), "drop_oldest", 100, ttl_s=3600)
    clock.t += 1800
    client.dlq_append("p", letters("new"), "drop_oldest", 100, ttl_s=3600)
    clock.t += 1801
    assert events(client) == [b"new"]
    stats = client.dlq_stats("p")
    assert (stats.count, stats.expired_total) == (1, 2)
    (entry,) = client.dlq_list("p")
    assert entry.expires_unix_ms - entry.created_unix_ms == 3600 * 1000


def test_list_ack_up_to_purge_and_replay(dlq):
    client, _ = dlq
    client.dlq_append("p", letters(*"abcdef"), "reject", 100, 0)
    page = client.dlq_list("p", limit=2, after=2)
    assert [(e.sequence, e.event, e.sink_id) for e in page] == [(3, b"c", "redis-1"),
                                                                (4, b"d", "redis-1")]
    assert page[0].reason == "too large: c"
    replayed = client.dlq_replay("p", limit=3)
    assert [e.sequence for e in replayed] == [1, 2, 3]
    assert client.dlq_count("p") == 6, "replay removes nothing until acknowledged"
    assert client.dlq_ack("p", replayed[-1].sequence) == 3
    assert [e.sequence for e in client.dlq_list("p")] == [4, 5, 6]
    assert client.dlq_purge("p") == 3
    assert client.dlq_count("p") == 0
    assert client.dlq_count("other") == 0, "queues are per pipeline"


def test_reasons_never_carry_secrets(dlq):
    client, _ = dlq
    client.dlq_append("p", [("pg", "cannot connect to postgresql://app:hunter2@db/x", b"e")],
                      "reject", 10, 0)
    assert "hunter2" not in client.dlq_list("p")[0].reason
