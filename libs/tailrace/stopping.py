"""Stop on SIGTERM and SIGINT without the deadlock of setting an Event in a signal handler.

Python runs a signal handler in the main thread between two bytecodes, possibly while that
thread holds the lock inside a `threading.Event` (between entering `wait()` and sleeping on
it). `Event.set()` called from the handler then waits for that lock forever, and the process
ignores every later SIGTERM: seen as a control service that would not stop. The handler here
hands the action to a short thread, which takes the lock once the main thread lets go.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterable

__all__ = ["call_on_stop_signals"]

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def call_on_stop_signals(action: Callable[[], object],
                         signals: Iterable[signal.Signals] = STOP_SIGNALS) -> None:
    """On each of `signals`, run `action` on its own thread (call from the main thread)."""

    def handler(signum: int, _frame: object) -> None:
        name = f"on-{signal.Signals(signum).name}"
        threading.Thread(target=action, name=name, daemon=True).start()

    for sig in signals:
        signal.signal(sig, handler)
