"""What the delivery process says about its pipeline: running, failed or degraded, and why.

- `failed`: the last batch could not be committed because a sink the commit policy
  needs failed with a non-retryable error (authentication, permission, message too
  large), or the batch hit a non-retryable error of its own (a processor); or a fatal
  error stopped the job (that one is final).
- `degraded`: the query restarted `degraded_after` times in a row without any sink's
  checkpoint advancing (retryable errors that do not clear: a required sink or the
  bus down, an optional sink that never catches up).
- `running`: otherwise.

A batch that moves a checkpoint clears failed (unless fatal) and degraded; a batch that
commits without moving anything, or fails with retryable errors only, clears failed but
not the restart count, so a fixed password followed by an outage reads degraded (once
the count reaches the threshold), not failed.
`/health` is 200 only while running. Every change of state goes to the control service
under the pipeline's name, which `tailrace pipelines` shows. The retry delay grows with
the restarts counted here.

Besides the state, each sink that did not acknowledge its last batch is reported with its
last error, since when and how many batches in a row (`SinkStatus`), whatever the state:
an optional sink that fails keeps a pipeline running, and `tailrace pipelines` and
`tailrace checkpoints` still show which sink fails and why.

Pure logic, no I/O: the job feeds it what happened and sends `current` where needed.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from tailrace.errors import TailraceError
from tailrace.httpside import Health
from tailrace.links import LINKS
from tailrace.logs import get_logger
from tailrace.retry import Backoff

__all__ = ["DEGRADED_AFTER", "PipelineHealth", "SinkStatus", "State"]

log = get_logger(__name__)

DEGRADED_AFTER = 5  # restarts in a row without a checkpoint advancing
RETRY_BASE_S = 1.0
RETRY_MAX_S = 30.0
_RESTART_BACKOFF = Backoff(RETRY_BASE_S, RETRY_MAX_S, jitter=False)


@dataclass(frozen=True)
class SinkStatus:
    """A sink that did not acknowledge its last batch."""

    sink_id: str
    error: str
    since_unix_ms: int  # the first batch of this run of failures
    batches: int = 1    # in a row


@dataclass(frozen=True)
class State:
    state: str  # running | failed | degraded
    reason: str = ""
    sinks: tuple[SinkStatus, ...] = ()  # the failing ones, in sink order


class PipelineHealth:
    """Thread-safe: the job's batch callback and restart loop write, `/health` reads."""

    def __init__(self, degraded_after: int = DEGRADED_AFTER) -> None:
        if degraded_after < 1:
            raise ValueError(f"degraded_after is {degraded_after}; it must be at least 1 "
                             "(restarts in a row without progress before health says degraded)")
        self.degraded_after = degraded_after
        self.restarts = 0  # restarts in a row without a checkpoint advancing
        self._last_error = ""
        self._failure = ""  # why the last batch cannot succeed as things are (non-retryable)
        self._fatal = ""
        self._standby = ""  # who delivers the pipeline while this instance waits
        self._sinks: dict[str, SinkStatus] = {}
        self._sent: State | None = None
        self._lock = threading.Lock()

    def committed(self, *, advanced: bool) -> None:
        """The commit policy held for a batch: nothing blocks it. `advanced`: at least one
        sink's checkpoint moved, so the pipeline moves."""
        with self._lock:
            self._failure = ""
            if advanced:
                self.restarts, self._last_error = 0, ""

    def blocked(self, reason: str, *, non_retryable: bool) -> None:
        """No checkpoint could move: `reason` says why. `non_retryable`: retrying the same
        batch cannot help until someone fixes the cause, so the pipeline is failed now."""
        with self._lock:
            self._last_error = reason
            self._failure = reason if non_retryable else ""

    def sinks_done(self, acked: Mapping[str, bool], errors: Mapping[str, str],
                   now_ms: int | None = None) -> None:
        """A batch's outcome per sink: an acknowledging sink is well again; one that did not
        keeps (or starts) its run of failures with `errors[sink]` as its last error."""
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        with self._lock:
            for sink, ok in acked.items():
                before = self._sinks.pop(sink, None)
                if ok:
                    continue
                self._sinks[sink] = SinkStatus(
                    sink, errors.get(sink) or "did not acknowledge the batch",
                    before.since_unix_ms if before else now_ms,
                    before.batches + 1 if before else 1)

    def restarted(self, error: str) -> None:
        """The query stopped (`error`) and starts again from the checkpoints."""
        with self._lock:
            self.restarts += 1
            self._last_error = error or self._last_error

    def fatal(self, reason: str) -> None:
        """The job stops for good; health stays failed with `reason`."""
        with self._lock:
            self._fatal = reason

    def retry_delay(self) -> float:
        """Seconds to wait before the next restart: doubling from 1 s up to 30 s with the
        restarts counted here (`tailrace.retry.Backoff`; no jitter: one delivery instance
        per pipeline has no peers to fall out of step with)."""
        with self._lock:
            return _RESTART_BACKOFF.delay(max(self.restarts, 1))

    @property
    def current(self) -> State:
        with self._lock:
            sinks = tuple(self._sinks.values())
            if self._fatal or self._failure:
                return State("failed", self._fatal or self._failure, sinks)
            if self.restarts >= self.degraded_after:
                return State("degraded", f"{self.restarts} restarts in a row without a "
                                         f"checkpoint advancing: {self._last_error}", sinks)
            return State("running", "", sinks)

    def http(self) -> Health:
        """For `/health`: 200 only while running."""
        now = self.current
        if now.state == "running":
            return Health(True, "ok")
        return Health(False, now.reason, "degraded" if now.state == "degraded" else "unhealthy")

    def standby(self, reason: str) -> None:
        """Another instance delivers the pipeline (`tailrace.lease`): not ready, saying who;
        "" once this one holds the lease."""
        self._standby = reason

    def readiness(self) -> tuple[bool, str]:
        """For `/ready`: not while a standby, a sink fails its batches or a link the driver's
        own calls find cut (`tailrace.links`: the control service, the bus: `buswatch.py`),
        naming them."""
        if self._standby:
            return False, self._standby
        why = [f"sink {s.sink_id} failed {s.batches} batch{'es' if s.batches > 1 else ''} "
               f"in a row: {s.error}" for s in self.current.sinks]
        if broken := LINKS.reason():
            why.append(broken)
        return not why, "; ".join(why)

    def publish(self, send: Callable[[State], None]) -> State:
        """Send the current state (with the failing sinks) when it differs from the last one
        sent; a failed send is logged and tried again on the next call. Returns it."""
        now = self.current
        before = self._sent
        if now == before:
            return now
        try:
            send(now)
        except TailraceError as e:
            log.warning("cannot report pipeline health to the control service; trying again "
                        "at the next batch or restart", state=now.state, error=str(e))
            return now
        self._sent = now
        if before is not None and (now.state, now.reason) == (before.state, before.reason):
            return now  # only the sinks' run of failures moved on
        if now.state != "running":
            log.error("pipeline health changed", state=now.state, reason=now.reason)
        elif before is not None:
            log.info("pipeline healthy again")
        return now
