"""In-memory storage for tests of what surrounds the control service."""

from __future__ import annotations

import threading
from collections.abc import Iterator

from tailrace_services.control.storage._base import CasConflict, Storage


class MemoryStorage(Storage):
    def __init__(self) -> None:
        self._kv: dict[str, tuple[bytes, int]] = {}
        self._lock = threading.Lock()

    def kv_get(self, key: str) -> tuple[bytes, int] | None:
        with self._lock:
            return self._kv.get(key)

    def kv_cas(self, items: list[tuple[str, bytes, int]]) -> list[int]:
        with self._lock:
            for key, _, expected in items:
                actual = self._kv.get(key, (b"", 0))[1]
                if actual != expected:
                    raise CasConflict(key, expected, actual)
            versions = []
            for key, value, expected in items:
                self._kv[key] = (value, expected + 1)
                versions.append(expected + 1)
            return versions

    def kv_put(self, key: str, value: bytes) -> int:
        with self._lock:
            version = self._kv.get(key, (b"", 0))[1] + 1
            self._kv[key] = (value, version)
            return version

    def kv_scan(self, prefix: str) -> Iterator[tuple[str, bytes, int]]:
        with self._lock:
            rows = sorted((k, v, ver) for k, (v, ver) in self._kv.items() if k.startswith(prefix))
        yield from rows
