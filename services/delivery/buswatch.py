"""The driver's own look at the bus, for `/ready`.

Spark's Python workers read the bus; what they find reaches the driver only when a batch
gives up (a read waits up to 60 s), so a cut bus would not show in delivery's `/ready`
for that long. Every few seconds the driver asks the broker for the topic's metadata: no
answer within the timeout, and `tailrace.links` has the bus failing (named after GRACE_S,
as capture names it); an answer clears it.
"""

from __future__ import annotations

import contextlib
import threading

from tailrace.bus import BusReader
from tailrace.config import PipelineSpec
from tailrace.links import LINKS

__all__ = ["BusWatch"]

EVERY_S = 2.0
ANSWER_S = 3.0


class BusWatch:
    """A daemon thread asking the bus every EVERY_S; `stop()` ends it."""

    def __init__(self, pipeline: PipelineSpec) -> None:
        bus = pipeline.spec.bus
        self.link = f"bus at {bus.brokers}"  # as capture names it
        self._reader = BusReader(bus.brokers, pipeline.bus_topic, client_config=bus.client_config,
                                 client_id=f"tailrace-delivery-watch-{pipeline.name}")
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bus-watch", daemon=True)

    def start(self) -> BusWatch:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stopped.wait(EVERY_S):
            self.check()

    def check(self) -> None:
        why = self._reader.unanswered(ANSWER_S)
        if why:
            LINKS.failed(self.link, f"no answer within {ANSWER_S:.0f} s: {why}")
        else:
            LINKS.ok(self.link)

    def stop(self) -> None:
        self._stopped.set()
        if self._thread.ident is not None:  # started
            self._thread.join(ANSWER_S + 1)
        with contextlib.suppress(Exception):
            self._reader.close()
