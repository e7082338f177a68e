"""Schema registry over real gRPC, on SQLite, PostgreSQL and memory (DESIGN guarantee 10)."""

from __future__ import annotations

import hashlib
import json
import threading
import uuid

import pytest

from tailrace.control_client import ControlClient, ControlRefused
from tailrace.proto.event_pb2 import Position
from tailrace_services.control.server import serve
from tailrace_services.control.storage import MemoryStorage, SqliteStorage

pytestmark = pytest.mark.integration


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def client(request, tmp_path):
    if request.param == "memory":
        storage = MemoryStorage()
    elif request.param == "sqlite":
        storage = SqliteStorage(str(tmp_path / "state.db"))
    else:
        from tailrace_services.control.storage._postgres import PostgresStorage

        storage = PostgresStorage(request.getfixturevalue("pg_db"))
    server = serve(storage, "127.0.0.1:0")
    with ControlClient(f"127.0.0.1:{server.port}", retry_for=5) as c:
        yield c
    server.stop()


def shape(*columns: str) -> tuple[str, str]:
    """(fingerprint, schema JSON) of a table with these columns."""
    doc = json.dumps({"columns": [{"name": c, "type": "int"} for c in columns]})
    return hashlib.sha256(doc.encode()).hexdigest(), doc


def test_same_fingerprint_registers_once(client):
    fp, doc = shape("id", "amount")
    first = client.register_schema("acme", "shop", "public.orders", fp, doc, Position(tx_seq=7))
    assert first.created and (first.version, first.sequence) == (1, 1)
    assert first.position.tx_seq == 7
    again = client.register_schema("acme", "shop", "public.orders", fp, doc)
    assert not again.created and (again.version, again.sequence) == (1, 1)
    other = client.register_schema("acme", "shop", "public.items", fp, doc)
    assert other.created and (other.version, other.sequence) == (1, 2), \
        "the same structure in another table is that table's own version"
    fp2, doc2 = shape("id", "amount", "note")
    assert (client.register_schema("acme", "shop", "public.orders", fp2, doc2).version) == 2
    # a table changed back to an earlier structure keeps its earlier version
    back = client.register_schema("acme", "shop", "public.orders", fp, doc)
    assert not back.created and back.version == 1
    assert [r.version for r in client.list_schemas("acme", "shop", "public.orders")] == [1, 2]
    assert client.get_schema("acme", "shop", "public.orders").fingerprint == fp2  # latest
    assert client.get_schema("acme", "shop", "public.orders", 1).fingerprint == fp
    assert client.get_schema("acme", "shop", "public.orders", 3) is None


def test_schema_in_force_at_a_sequence(client):
    """Versions of one table at sequences 1, 15 and 42; other tables fill the gaps."""
    filler = iter(range(1000))

    def other_tables(until: int) -> None:
        while True:
            fp, doc = shape(f"c{next(filler)}")
            if client.register_schema("acme", "shop", "public.other", fp, doc).sequence == until:
                return

    sequences = []
    for i, until in ((0, 0), (1, 14), (2, 41)):
        if until:
            other_tables(until)
        fp, doc = shape(*[f"col{j}" for j in range(i + 1)])
        sequences.append(client.register_schema("acme", "shop", "public.orders", fp, doc).sequence)
    assert sequences == [1, 15, 42]

    def at(seq: int) -> int | None:
        record = client.schema_at("acme", "shop", "public.orders", seq)
        return None if record is None else record.sequence

    assert at(20) == 15
    assert [at(s) for s in (0, 1, 14, 15, 41, 42, 1000)] == [None, 1, 1, 15, 15, 42, 42]
    assert client.schema_at("acme", "shop", "public.orders", 20).version == 2


def test_concurrent_registrations_get_distinct_sequences(client):
    results: list = []

    def register(i: int) -> None:
        for j in range(10):
            fp, doc = shape(f"t{i}c{j}")
            results.append(client.register_schema("acme", "db", f"t{i}", fp, doc))
        fp, doc = shape("shared")
        results.append(client.register_schema("acme", "db", "shared", fp, doc))

    threads = [threading.Thread(target=register, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    created = [r for r in results if r.created]
    assert sorted(r.sequence for r in created) == list(range(1, 32))
    shared = [r for r in results if r.table == "shared"]
    assert sum(r.created for r in shared) == 1 and {r.version for r in shared} == {1}


def test_bad_input_says_what_to_send(client):
    with pytest.raises(ControlRefused, match="64-character hex digest"):
        client.register_schema("acme", "shop", "t", "abc", "{}")
    with pytest.raises(ControlRefused, match="not JSON"):
        client.register_schema("acme", "shop", "t", uuid.uuid4().hex * 2, "{nope")
    with pytest.raises(ControlRefused, match="database is required"):
        client.register_schema("acme", "", "t", uuid.uuid4().hex * 2, "{}")
