"""The four storage primitives on every backend: SQLite, PostgreSQL (real server) and memory."""

from __future__ import annotations

import threading

import pytest

from tailrace_services.control.storage import (
    CasConflict,
    MemoryStorage,
    SqliteStorage,
    Storage,
    open_storage,
)
from tailrace_services.control.storage._base import plan_push

BACKENDS = ["memory", "sqlite", "postgres"]


class Clock:
    def __init__(self, t: float = 1_700_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


@pytest.fixture(params=BACKENDS)
def make_storage(request, tmp_path):
    """`make_storage()` opens the backend under test; a second call opens a second handle on
    the same state (another replica or process), except for memory, which shares one."""
    kind = request.param
    opened: list[Storage] = []
    target = {"sqlite": f"sqlite:///{tmp_path / 'state.db'}", "memory": None,
              "postgres": request.getfixturevalue("pg_db") if kind == "postgres" else None}[kind]
    shared = MemoryStorage() if kind == "memory" else None

    def make() -> Storage:
        storage = shared if shared is not None else open_storage(target)  # type: ignore[arg-type]
        opened.append(storage)
        return storage

    yield make
    for storage in {id(s): s for s in opened}.values():
        storage.close()


@pytest.fixture
def storage(make_storage):
    return make_storage()


def test_kv_cas_writes_all_keys_or_none(storage):
    assert storage.kv_cas([("a", b"1", 0), ("b", b"1", 0)]) == [1, 1]
    with pytest.raises(CasConflict) as e:
        storage.kv_cas([("a", b"2", 1), ("b", b"2", 0)])  # b is at version 1
    assert (e.value.key, e.value.expected, e.value.actual) == ("b", 0, 1)
    assert storage.kv_get("a") == (b"1", 1), "the failed multi-key write left nothing behind"
    assert storage.kv_cas([("b", b"3", 1), ("a", b"3", 1)]) == [2, 2]
    assert storage.kv_put("a", b"4") == 3
    assert storage.kv_get("missing") is None
    storage.kv_put("a::x", b"5")
    assert [k for k, _, _ in storage.kv_scan("a")] == ["a", "a::x"]
    assert [k for k, _, _ in storage.kv_scan("")] == ["a", "a::x", "b"]


def test_kv_cas_is_correct_across_replicas(make_storage):
    """Two handles (two control replicas) increment one counter by CAS: no update is lost."""
    handles = [make_storage(), make_storage()]
    handles[0].kv_put("counter", b"0")
    wins = [0, 0]

    def bump(i: int) -> None:
        s = handles[i]
        while wins[i] < 40:
            value, version = s.kv_get("counter")  # type: ignore[misc]
            try:
                s.kv_cas([("counter", str(int(value) + 1).encode(), version)])
                wins[i] += 1
            except CasConflict:
                pass

    threads = [threading.Thread(target=bump, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert handles[0].kv_get("counter") == (b"80", 81)


def test_log_sequences_are_never_reused(storage):
    assert [storage.log_append("l", f"e{i}".encode()) for i in range(1, 6)] == [1, 2, 3, 4, 5]
    assert storage.log_append("other", b"x") == 1
    assert storage.log_read("l", after=3) == [(4, b"e4"), (5, b"e5")]
    assert storage.log_read("l", limit=2) == [(1, b"e1"), (2, b"e2")]
    assert storage.log_truncate("l", 4) == 4
    assert storage.log_read("l") == [(5, b"e5")]
    assert storage.log_append("l", b"e6") == 6


def test_slot_lease_owner_lock(storage):
    clock = Clock()
    storage.clock = clock
    a = storage.slot_acquire("owner", "a", ttl_s=10)
    assert a.acquired and a.owner == "a" and a.generation == 1
    b = storage.slot_acquire("owner", "b", ttl_s=10)
    assert not b.acquired and b.owner == "a", "held by a: b is told who holds it"
    clock.t += 5
    renewed = storage.slot_acquire("owner", "a", ttl_s=10)
    assert renewed.acquired and renewed.generation == 1 and renewed.expires_ms > a.expires_ms
    clock.t += 11  # a's lease ran out
    assert storage.slot_get("owner") is None
    b = storage.slot_acquire("owner", "b", ttl_s=10)
    assert b.acquired and b.generation == 2, "a new owner gets a new generation (fencing)"
    assert not storage.slot_release("owner", "a")
    assert storage.slot_release("owner", "b")
    assert storage.slot_get("owner") is None
    assert storage.slot_acquire("owner", "a", ttl_s=10).generation == 3


@pytest.mark.parametrize(("count", "n", "overflow", "expected"), [
    (8, 5, "drop_oldest", (5, 3, 0, False)),
    (8, 5, "reject", (2, 0, 3, False)),
    (8, 5, "block", (2, 0, 0, True)),
    (0, 15, "drop_oldest", (15, 5, 0, False)),
    (3, 2, "block", (2, 0, 0, False)),
])
def test_plan_push(count, n, overflow, expected):
    plan = plan_push(count, 10, n, overflow)
    assert (plan.append, plan.drop, plan.rejected, plan.blocked) == expected


def test_queue_overflow_policies(storage):
    values = [f"v{i}".encode() for i in range(1, 6)]
    assert storage.queue_push("q", values[:3], 4, "reject").appended == 3
    pushed = storage.queue_push("q", values[3:], 4, "reject")
    assert (pushed.appended, pushed.rejected, pushed.first_seq) == (1, 1, 4)
    pushed = storage.queue_push("q", [b"x"], 4, "block")
    assert (pushed.appended, pushed.blocked) == (0, True)
    pushed = storage.queue_push("q", [b"y", b"z"], 4, "drop_oldest")
    assert (pushed.appended, pushed.dropped, pushed.first_seq) == (2, 2, 5)
    assert [(e.seq, e.value) for e in storage.queue_list("q")] == [
        (3, b"v3"), (4, b"v4"), (5, b"y"), (6, b"z")]
    stats = storage.queue_stats("q")
    assert (stats.count, stats.last_seq, stats.dropped, stats.rejected) == (4, 6, 2, 1)


def test_queue_ack_purge_and_expiry(storage):
    clock = Clock()
    storage.clock = clock
    storage.queue_push("q", [b"a", b"b", b"c"], 100, "drop_oldest", ttl_s=60)
    storage.queue_push("q", [b"d"], 100, "drop_oldest")  # never expires
    assert [e.seq for e in storage.queue_list("q", after=1, limit=2)] == [2, 3]
    assert storage.queue_ack("q", 1) == 1
    clock.t += 61
    stats = storage.queue_stats("q")
    assert (stats.count, stats.expired) == (1, 2)
    assert [e.value for e in storage.queue_list("q")] == [b"d"]
    assert storage.queue_purge("q") == 1
    assert storage.queue_stats("q").count == 0
    assert storage.queue_push("q", [b"e"], 100, "reject").first_seq == 5


def test_queue_bound_holds_with_concurrent_writers(make_storage):
    handles = [make_storage(), make_storage()]
    results = [[], []]

    def push(i: int) -> None:
        for _ in range(20):
            results[i].append(handles[i].queue_push("q", [b"x", b"y"], 25, "reject"))

    threads = [threading.Thread(target=push, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    appended = sum(r.appended for rs in results for r in rs)
    rejected = sum(r.rejected for rs in results for r in rs)
    assert (appended, rejected) == (25, 55), "never past the bound, every entry accounted for"
    assert handles[0].queue_stats("q").count == 25


def test_sqlite_is_in_wal_mode(tmp_path):
    storage = SqliteStorage(str(tmp_path / "s.db"))
    assert storage._db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert storage._db.execute("PRAGMA synchronous").fetchone()[0] == 1  # NORMAL
    storage.close()


def test_unknown_storage_url_says_what_is_allowed():
    with pytest.raises(ValueError, match="postgresql://") as e:
        open_storage("mysql://root:secret@db/x")
    assert "secret" not in str(e.value)
