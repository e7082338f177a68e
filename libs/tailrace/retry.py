"""One backoff for every retry loop: doubling waits, capped, with jitter, reset on progress.

Three loops use it, with their own numbers: a sink call retried a few times
(`call_with_retry`, DESIGN guarantee 6: Kafka 100 ms .. 10 s), a capture session
started again after a transient failure (`tailrace_services.capture.lifecycle`,
0.5 .. 10 s, reset once a session streams) and the delivery query restarted
(`tailrace_services.delivery.health`, 1 .. 30 s, reset when a checkpoint advances).

The wait after n failures is `base_s * 2^(n-1)`, at most `max_s`. With `jitter` it is
drawn from [base_s / 2, that], so that clients failing together do not retry in step,
and the first retry still waits at least half the base.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

__all__ = ["Backoff", "backoff_delays", "call_with_retry"]

T = TypeVar("T")


@dataclass
class Backoff:
    """Counts failures; `next()` is the wait before the next try, `reset()` starts over
    (call it on progress). `reset_on_progress=False` keeps the count (a fixed doubling)."""

    base_s: float = 0.5
    max_s: float = 10.0
    jitter: bool = True
    reset_on_progress: bool = True
    failures: int = 0
    rng: random.Random = field(default_factory=random.Random, repr=False, compare=False)

    def delay(self, failures: int) -> float:
        """The wait after `failures` failures in a row, before jitter (0 after none)."""
        if failures <= 0:
            return 0.0
        return min(self.max_s, self.base_s * float(2 ** min(failures - 1, 32)))

    def next(self) -> float:
        """Count one more failure; the wait before the next try."""
        self.failures += 1
        delay = self.delay(self.failures)
        if not self.jitter:
            return delay
        return self.rng.uniform(min(self.base_s / 2, delay), delay)

    def reset(self) -> None:
        """Progress was made: the next failure waits `base_s` again."""
        if self.reset_on_progress:
            self.failures = 0


def backoff_delays(base_s: float, max_s: float, attempts: int, rng: random.Random | None = None
                   ) -> list[float]:
    """The jittered waits between `attempts` tries."""
    backoff = Backoff(base_s, max_s, rng=rng or random.Random())
    return [backoff.next() for _ in range(max(attempts - 1, 0))]


def call_with_retry(fn: Callable[[], T], *, base_s: float, max_s: float, attempts: int,
                    retryable: Callable[[BaseException], bool],
                    on_retry: Callable[[int, BaseException, float], None] | None = None,
                    sleep: Callable[[float], None] = time.sleep,
                    rng: random.Random | None = None) -> T:
    """Run `fn`; retry errors `retryable` accepts, up to `attempts` tries; re-raise the last one."""
    backoff = Backoff(base_s, max_s, rng=rng or random.Random())
    for attempt in range(attempts):
        try:
            return fn()
        except BaseException as e:
            if attempt == attempts - 1 or not retryable(e):
                raise
            delay = backoff.next()
            if on_retry is not None:
                on_retry(attempt + 1, e, delay)
            sleep(delay)
    raise AssertionError("unreachable")
