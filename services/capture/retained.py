"""How much log the source's server keeps for this pipeline, said where operators look.

Held-back log is what takes a database down: a PostgreSQL slot that does not advance keeps
WAL, binlogs after the checkpoint must stay. Every REPORT_S the source measures it
(`measure`: PostgreSQL, WAL from the slot's confirmed position to the server's WAL end;
MySQL/MariaDB, binlog bytes from the sinks' minimum checkpoint to the end of the last
binlog) and the figure goes to the `tailrace_capture_retained_bytes` metric and to the
control service (`tailrace pipelines`, `tailrace checkpoints`), with `source.max_retained`:
past it the control service detaches the laggiest optional sink, so the next confirmation
releases the log (control/retention.py); capture says what it was told.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from tailrace.control_client import ControlClient
from tailrace.logs import get_logger
from tailrace_services.capture.metrics import CaptureMetrics

__all__ = ["REPORT_S", "Measure", "RetainedLog"]

log = get_logger(__name__)

REPORT_S = 10.0

Measure = Callable[[], "tuple[int, str] | None"]
"""(bytes the server keeps, what holds them), or None when it cannot tell yet."""


class RetainedLog:
    """A daemon thread for one capture session: measure, then report, every REPORT_S."""

    def __init__(self, control: ControlClient, source_id: str, metrics: CaptureMetrics,
                 measure: Measure, max_retained: int | None = None,
                 every_s: float = REPORT_S) -> None:
        self.control = control
        self.max_retained = max_retained
        self.source_id = source_id
        self.metrics = metrics
        self.measure = measure
        self.every_s = every_s
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="retained-log", daemon=True)
        self._failing = False
        self._reported = False

    def start(self) -> RetainedLog:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopped.set()
        if self._thread.ident is not None:
            self._thread.join(5.0)

    def _run(self) -> None:
        while not self._stopped.wait(1.0 if not self._reported else self.every_s):
            self.report()

    def report(self) -> None:
        try:
            found = self.measure()
            if found is None:
                return
            self.metrics.retained_bytes.set(found[0])
            answer = self.control.report_retained(self.source_id, found[0], found[1],
                                                  self.max_retained)
        except Exception as e:  # noqa: BLE001 - best effort: the next round tries again
            if not self._failing:
                log.warning("cannot measure or report the source log kept for this pipeline; "
                            "trying again", error=str(e))
            self._failing = True
            return
        self._reported = True
        self._failing = False
        for sink in answer.detached:
            log.error("the control service detached an optional sink for holding the source "
                      "log back; the log is released at the next confirmation",
                      pipeline=sink.pipeline, sink=sink.sink_id, reason=sink.reason)
        self.metrics.retained_over_limit.set(1 if answer.over_limit else 0)
        if answer.over_limit:
            log.error("source log past source.max_retained", reason=answer.over_limit)
