"""A stop signal reaches a process whose main thread is inside `Event.wait` (no deadlock)."""

from __future__ import annotations

import os
import signal
import threading
import time

from tailrace.stopping import call_on_stop_signals


def test_a_signal_while_the_main_thread_holds_the_events_lock_still_sets_it():
    """The window that hung a control service: the main thread has entered `Event.wait` and
    holds its lock when the signal comes. `Event.set()` run in the handler itself would wait
    for that lock forever; the handler's thread takes it once the main thread lets go."""
    stop = threading.Event()
    before = signal.getsignal(signal.SIGUSR1)
    try:
        call_on_stop_signals(stop.set, [signal.SIGUSR1])
        with stop._cond:  # as in Event.wait, before it sleeps and lets go of the lock
            os.kill(os.getpid(), signal.SIGUSR1)
            time.sleep(0.1)  # the handler runs in the main thread, here
            assert not stop.is_set()
        assert stop.wait(5), "the signal was lost"
    finally:
        signal.signal(signal.SIGUSR1, before)
