"""The links a service depends on (the control service, the bus, a sink), as its own calls
find them: one failing for longer than GRACE_S makes `/ready` answer 503 naming it, so
an operator sees which link is cut while the service waits and retries (docs/guarantees.md,
"Network cuts"). A call that goes through again clears it.

One registry per process (`LINKS`), like Prometheus' default registry: the clients that
find a link failing (`ControlClient`, the bus publisher) are not the code that serves
`/ready`.
"""

from __future__ import annotations

import threading
import time
from typing import NamedTuple

__all__ = ["GRACE_S", "LINKS", "Broken", "Links"]

GRACE_S = 2.0  # a call retried within this is a hiccup, not a cut link


class Broken(NamedTuple):
    link: str
    since: float  # time.monotonic() of the first failure in a row
    error: str


class Links:
    """Thread-safe: the services' threads report, the side port's thread reads."""

    def __init__(self, grace_s: float = GRACE_S) -> None:
        self.grace_s = grace_s
        self._lock = threading.Lock()
        self._failing: dict[str, Broken] = {}

    def failed(self, link: str, error: str, since: float | None = None) -> None:
        """A call over `link` failed with `error`; `since`: when the failing began, if the
        caller knows better than now (kept from the first failure in a row)."""
        with self._lock:
            if link in self._failing:
                since = self._failing[link].since
            self._failing[link] = Broken(link, time.monotonic() if since is None else since,
                                         error)

    def ok(self, link: str) -> None:
        """A call over `link` went through."""
        if link in self._failing:  # the common case, without the lock
            with self._lock:
                self._failing.pop(link, None)

    def broken(self, now: float | None = None) -> list[Broken]:
        """The links failing for longer than the grace period, oldest first."""
        now = time.monotonic() if now is None else now
        with self._lock:
            return sorted((b for b in self._failing.values() if now - b.since >= self.grace_s),
                          key=lambda b: b.since)

    def clear(self) -> None:
        """Forget every link (tests start from a clean process state)."""
        with self._lock:
            self._failing.clear()

    def reason(self, now: float | None = None) -> str:
        """The broken links in one line ("" when none)."""
        now = time.monotonic() if now is None else now
        return "; ".join(f"{b.link} failing for {now - b.since:.0f} s: {b.error}"
                         for b in self.broken(now))


LINKS = Links()
