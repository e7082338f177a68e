"""Retry with exponential backoff and full jitter, driven by an error classifier."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def backoff_delays(base_s: float, max_s: float, attempts: int, rng: random.Random | None = None
                   ) -> list[float]:
    """Sleeps between `attempts` tries: uniform(0, min(max, base * 2^n)) ("full jitter")."""
    rng = rng or random.Random()
    return [rng.uniform(0, min(max_s, base_s * 2**n)) for n in range(max(attempts - 1, 0))]


def call_with_retry(fn: Callable[[], T], *, base_s: float, max_s: float, attempts: int,
                    retryable: Callable[[BaseException], bool],
                    on_retry: Callable[[int, BaseException, float], None] | None = None,
                    sleep: Callable[[float], None] = time.sleep,
                    rng: random.Random | None = None) -> T:
    """Run `fn`; retry errors `retryable` accepts, up to `attempts` tries; re-raise the last one."""
    delays = backoff_delays(base_s, max_s, attempts, rng)
    for attempt in range(attempts):
        try:
            return fn()
        except BaseException as e:
            if attempt == attempts - 1 or not retryable(e):
                raise
            delay = delays[attempt]
            if on_retry is not None:
                on_retry(attempt + 1, e, delay)
            sleep(delay)
    raise AssertionError("unreachable")
