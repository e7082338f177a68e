"""In-memory storage for tests of what surrounds the control service; gone with the process."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

from tailrace_services.control.storage._base import (
    CasConflict,
    QueueEntry,
    QueuePush,
    QueueStats,
    SlotLease,
    Storage,
    plan_push,
)


@dataclass
class _Queue:
    entries: list[QueueEntry] = field(default_factory=list)
    last_seq: int = 0
    dropped: int = 0
    expired: int = 0
    rejected: int = 0


class MemoryStorage(Storage):
    def __init__(self) -> None:
        self._kv: dict[str, tuple[bytes, int]] = {}
        self._logs: dict[str, list[tuple[int, bytes]]] = {}
        self._log_seq: dict[str, int] = {}
        self._slots: dict[str, SlotLease] = {}
        self._queues: dict[str, _Queue] = {}
        self._lock = threading.RLock()

    # KV
    def kv_get(self, key: str) -> tuple[bytes, int] | None:
        with self._lock:
            return self._kv.get(key)

    def kv_cas(self, items: list[tuple[str, bytes, int]]) -> list[int]:
        if len({k for k, _, _ in items}) != len(items):
            raise ValueError("kv_cas: each key may appear once")
        with self._lock:
            for key, _, expected in items:
                actual = self._kv.get(key, (b"", 0))[1]
                if actual != expected:
                    raise CasConflict(key, expected, actual)
            for key, value, expected in items:
                self._kv[key] = (value, expected + 1)
            return [expected + 1 for _, _, expected in items]

    def kv_put(self, key: str, value: bytes) -> int:
        with self._lock:
            version = self._kv.get(key, (b"", 0))[1] + 1
            self._kv[key] = (value, version)
            return version

    def kv_scan(self, prefix: str) -> Iterator[tuple[str, bytes, int]]:
        with self._lock:
            rows = sorted((k, v, ver) for k, (v, ver) in self._kv.items() if k.startswith(prefix))
        yield from rows

    # Log
    def log_append(self, name: str, value: bytes) -> int:
        with self._lock:
            seq = self._log_seq.get(name, 0) + 1
            self._log_seq[name] = seq
            self._logs.setdefault(name, []).append((seq, value))
            return seq

    def log_read(self, name: str, after: int = 0, limit: int = 1000) -> list[tuple[int, bytes]]:
        with self._lock:
            return [e for e in self._logs.get(name, []) if e[0] > after][:limit]

    def log_truncate(self, name: str, up_to: int) -> int:
        with self._lock:
            entries = self._logs.get(name, [])
            kept = [e for e in entries if e[0] > up_to]
            self._logs[name] = kept
            return len(entries) - len(kept)

    # Slot
    def slot_acquire(self, name: str, owner: str, ttl_s: float) -> SlotLease:
        with self._lock:
            now = self.now_ms()
            held = self._slots.get(name)
            expires = now + int(ttl_s * 1000)
            if held is not None and held.owner == owner:
                lease = SlotLease(name, owner, held.generation, expires, acquired=True)
            elif held is None or held.expires_ms <= now:
                generation = (held.generation if held else 0) + 1
                lease = SlotLease(name, owner, generation, expires, acquired=True)
            else:
                return held
            self._slots[name] = SlotLease(name, owner, lease.generation, expires)
            return lease

    def slot_release(self, name: str, owner: str) -> bool:
        with self._lock:
            held = self._slots.get(name)
            if held is None or held.owner != owner or not held.owner:
                return False
            self._slots[name] = SlotLease(name, "", held.generation, 0)
            return True

    def slot_get(self, name: str) -> SlotLease | None:
        with self._lock:
            held = self._slots.get(name)
            if held is None or not held.owner or held.expires_ms <= self.now_ms():
                return None
            return held

    # Queue
    def queue_push(self, name: str, values: list[bytes], max_entries: int, overflow: str,
                   ttl_s: float = 0) -> QueuePush:
        with self._lock:
            expired = self.queue_expire(name)
            q = self._queues.setdefault(name, _Queue())
            plan = plan_push(len(q.entries), max_entries, len(values), overflow)
            now = self.now_ms()
            first = q.last_seq + 1 if plan.append else 0
            for value in values[:plan.append]:
                q.last_seq += 1
                q.entries.append(QueueEntry(q.last_seq, value, now,
                                            now + int(ttl_s * 1000) if ttl_s > 0 else 0))
            del q.entries[:plan.drop]
            q.dropped += plan.drop
            q.rejected += plan.rejected
            return QueuePush(appended=plan.append, dropped=plan.drop, rejected=plan.rejected,
                             blocked=plan.blocked, expired=expired, first_seq=first)

    def queue_list(self, name: str, after: int = 0, limit: int = 100) -> list[QueueEntry]:
        with self._lock:
            self.queue_expire(name)
            q = self._queues.get(name, _Queue())
            return [e for e in q.entries if e.seq > after][:limit]

    def queue_ack(self, name: str, up_to: int) -> int:
        with self._lock:
            q = self._queues.get(name, _Queue())
            before = len(q.entries)
            q.entries = [e for e in q.entries if e.seq > up_to]
            return before - len(q.entries)

    def queue_purge(self, name: str) -> int:
        with self._lock:
            q = self._queues.get(name, _Queue())
            n = len(q.entries)
            q.entries = []
            return n

    def queue_expire(self, name: str) -> int:
        with self._lock:
            q = self._queues.get(name)
            if q is None:
                return 0
            now = self.now_ms()
            kept = [e for e in q.entries if not (0 < e.expires_ms <= now)]
            n = len(q.entries) - len(kept)
            q.entries = kept
            q.expired += n
            return n

    def queue_stats(self, name: str) -> QueueStats:
        with self._lock:
            self.queue_expire(name)
            q = self._queues.get(name, _Queue())
            return QueueStats(count=len(q.entries), last_seq=q.last_seq, dropped=q.dropped,
                              expired=q.expired, rejected=q.rejected)
