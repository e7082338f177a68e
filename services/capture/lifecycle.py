"""The capture lifecycle every source shares: sessions, reconnects with backoff, health.

A source supplies one session (connect -> check identity -> stream, returning
when stopped) and an error handler saying what its own exceptions mean;
`CaptureLifecycle.run` runs sessions until one returns or `stop()` is called.
A source's service class extends `CaptureService`, which makes its lifecycle,
metrics and resume rule.
Tailrace errors mean the same for every source: a lost position is reported to
the control service as `position_lost`, any other FatalError or a
NonRetryableError as `failed`, and `run()` raises FatalError; a ConfigError (the
spec or the source's settings) is reported as `failed` and raised — so is a connection
error that is really a malformed DSN (libpq's "invalid sslmode value", "invalid integer
value ... for connection option "port""), as a ConfigError naming `spec.source.dsn`. The handler
answers the rest with `Reconnect` (back off, start a new session), `Fail`
(report and raise) or `Stop` (return); an error it leaves alone (None) is raised
as it is.

`reconcile_identity` is the other shared step: what a source does when the
control service says its server's identity changed (DESIGN guarantee 9).
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar, Generic, Protocol, TypeVar

from tailrace.bus import ensure_topic
from tailrace.config import PipelineSpec, config_error_of
from tailrace.control_client import ControlClient
from tailrace.errors import (
    ConfigError,
    FatalError,
    NonRetryableError,
    PositionLostError,
    RetryableError,
)
from tailrace.lease import Lease
from tailrace.links import LINKS
from tailrace.logs import get_logger
from tailrace.proto import control_pb2 as pb
from tailrace.proto.control_pb2 import ServerIdentity
from tailrace.retry import Backoff
from tailrace_services.capture.metrics import CaptureMetrics
from tailrace_services.capture.resume import ResumeRule
from tailrace_services.capture.snapshot.progress import SnapshotProgress

__all__ = ["CaptureLifecycle", "CaptureService", "ErrorHandler", "Fail", "Reconnect", "Stop",
           "reconcile_identity"]

log = get_logger(__name__)


@dataclass(frozen=True)
class Reconnect:
    """A transient failure: log `message` as a warning, back off, start a new session.
    `link`: the link that failed, when the error says (`/ready` names it)."""

    message: str
    link: str = ""


@dataclass(frozen=True)
class Fail:
    """The source cannot go on: report `reason` as failed, then raise `error`."""

    reason: str
    error: BaseException


@dataclass(frozen=True)
class Stop:
    """Stopping already: log `message` as a warning and return from `run()`."""

    message: str


class ErrorHandler(Protocol):
    def __call__(self, error: Exception) -> Reconnect | Fail | Stop | None: ...


class CaptureLifecycle:
    """Health, readiness and stop of one capture source, and the loop running its sessions.
    Not ready while reconnecting or failed: `/ready` says whether changes flow now."""

    def __init__(self, pipeline: PipelineSpec, control: ControlClient, on_error: ErrorHandler,
                 backoff: Backoff, metrics: CaptureMetrics | None = None) -> None:
        self.pipeline = pipeline
        self.source_id = pipeline.spec.source.id
        self.control = control
        self.on_error = on_error
        self.backoff = backoff
        self.metrics = metrics
        self.health: tuple[bool, str] = (True, "starting")
        self.ready = False
        self.stopping = False
        self.stopped_at = 0.0  # time.monotonic() of the first stop request
        # after a lost position: wait for `tailrace resnapshot` (the process stays up to
        # say why) rather than raise; the entry point sets it when it serves /health
        self.wait_for_resnapshot = False
        self.can_resnapshot = False  # the source takes a server as it is now (`accept`)
        # a failure that only says this instance lost its capture lease (`tailrace.lease`): not the
        # source's health, which the instance holding the lease reports now
        self.fenced: Callable[[str], bool] = lambda reason: False

    def stop(self) -> None:
        if not self.stopping:
            self.stopping, self.stopped_at = True, time.monotonic()

    def run(self, session: Callable[[], None]) -> None:
        """Run sessions until stopped; transient failures reconnect with backoff, fatal ones raise."""
        bus = self.pipeline.spec.bus
        while not self.stopping:
            try:
                ensure_topic(bus.brokers, self.pipeline.bus_topic, bus.partitions,
                             extra=bus.client_config)
                session()
                return
            except PositionLostError as e:
                self.fail("position_lost", str(e))
                if not self._resnapshot_asked(e):
                    raise
            except FatalError as e:
                self.fail("failed", str(e))
                raise
            except NonRetryableError as e:
                self.fail("failed", str(e))
                raise FatalError(str(e)) from e
            except ConfigError as e:  # the spec or the source's settings: the operator's fix
                self.fail("failed", str(e))
                raise
            except Exception as e:
                config = config_error_of(e)  # libpq refused the DSN itself: not transient
                if config is not None:
                    self.fail("failed", str(config))
                    raise config from None
                outcome = self.on_error(e)
                if outcome is None:
                    raise
                if isinstance(outcome, Fail):
                    self.fail("failed", outcome.reason)
                    if outcome.error is e:
                        raise
                    raise outcome.error from e
                if isinstance(outcome, Stop):
                    log.warning(outcome.message)
                    return
                self._reconnect(e, outcome.message, outcome.link)

    def _resnapshot_asked(self, lost: PositionLostError) -> bool:
        """Whether a new session should take the server as it is now: asked for by
        `snapshot.mode: when_needed` at once, or by an operator's `tailrace resnapshot`
        while this process waits (the request is in the snapshot record; the session
        reads it there, so a crash in between loses nothing)."""
        if not self.can_resnapshot:
            return False
        progress = SnapshotProgress(self.control, self.pipeline, self.pipeline.spec.source.type)
        if self.pipeline.spec.source.snapshot.mode == "when_needed":
            reason = f"snapshot.mode when_needed, after {lost}"

            def ask(state: pb.SnapshotState) -> None:
                state.resnapshot_requested, state.resnapshot_reason = True, reason

            while not self.stopping:
                try:
                    progress.change(ask)
                    break
                except (RetryableError, NonRetryableError) as e:
                    self._reconnect(e, "cannot ask for the resnapshot yet")
            log.warning("position lost: reading every table again (snapshot.mode when_needed)",
                        reason=str(lost))
            # not at once: a server that keeps losing the position must not spin through
            # accepts (each one a new era of positions)
            self._reconnect(lost, "taking the server as it is now after a pause")
            return not self.stopping
        if not self.wait_for_resnapshot:
            return False
        log.warning("waiting for an operator: after checking the server, run `tailrace "
                    f"resnapshot {self.pipeline.name} --confirm {self.source_id}` to take it "
                    "as it is now and read every table again")
        while not self.stopping:
            try:
                if progress.read().resnapshot_requested:
                    log.warning("resnapshot requested by an operator; starting again")
                    return True
            except (RetryableError, NonRetryableError) as e:
                log.warning("cannot read the snapshot record", error=str(e))
            for _ in range(20):
                if self.stopping:
                    break
                time.sleep(0.1)
        return False

    def streaming(self) -> None:
        """The session streams from now on: healthy, ready, and the control service told so."""
        self.health = (True, "streaming")
        self.ready = True
        self.backoff.reset()
        self.control.report_health(self.source_id, "running", "")

    def fail(self, state: str, reason: str) -> None:
        """Unhealthy for good: `state` and `reason` go to the control service (best effort)."""
        self.health = (False, reason)
        self.ready = False
        log.error("capture stopped", state=state, reason=reason)
        if self.fenced(reason):
            return
        try:
            self.control.report_health(self.source_id, state, reason)
        except (RetryableError, NonRetryableError) as e:
            log.warning("cannot report health to the control service", error=str(e))

    def standby(self, reason: str) -> None:
        """Another instance captures the source (`tailrace.lease`): healthy, not ready."""
        self.health = (True, reason)
        self.ready = False

    def _reconnect(self, error: Exception, message: str, link: str = "") -> None:
        if self.metrics is not None:
            self.metrics.reconnects.inc()
        delay = self.backoff.next()
        self.ready = False
        self.health = (True, f"reconnecting{f' to the {link}' if link else ''}: {error}")
        log.warning(message, error=str(error), retry_in_s=round(delay, 2))
        deadline = time.monotonic() + delay
        while not self.stopping and time.monotonic() < deadline:
            time.sleep(min(0.1, deadline - time.monotonic()))


S = TypeVar("S")


class CaptureService(ABC, Generic[S]):
    """A source's service: what the capture entry point and its side port use (run, stop,
    health), and what every source has — its spec, control client, metrics, resume rule
    and lifecycle. A source sets the class attributes and supplies `_session`."""

    source_type: ClassVar[str]  # spec.source.type, and the metrics' `source_type` label
    skip_published: ClassVar[bool]  # the resume rule's hook (`resume.py`)
    backoff_s: ClassVar[tuple[float, float]] = (0.5, 10.0)  # reconnects: first wait, cap
    session_errors: ClassVar[staticmethod[[str], ErrorHandler]]  # the source's `errors.py`

    def __init__(self, pipeline: PipelineSpec, control: ControlClient, spec_type: type[S]
                 ) -> None:
        source = pipeline.spec.source
        if not isinstance(source, spec_type):
            raise ConfigError(f"spec.source.type is {source.type!r}; {type(self).__name__} "
                              f"captures {self.source_type}")
        self.pipeline = pipeline
        self.control = control
        self.source: S = source
        self.metrics = CaptureMetrics(pipeline.spec.source.id, self.source_type)
        self.resume = ResumeRule(pipeline, control, skip_published=self.skip_published)
        # Reconnects back off doubling from the first wait to the cap, with jitter, and
        # start from the first wait again once a session streams.
        self.lifecycle = CaptureLifecycle(pipeline, control,
                                          type(self).session_errors(pipeline.spec.source.id),
                                          Backoff(*self.backoff_s), self.metrics)
        self.lease: Lease | None = None  # one active instance per source (`tailrace.lease`)

    @property
    def health(self) -> tuple[bool, str]:
        return self.lifecycle.health

    @property
    def ready(self) -> bool:
        return self.lifecycle.ready

    def readiness(self) -> tuple[bool, str]:
        """For `/ready`: changes flow now, else why not — reconnecting (to what, when the
        error says) or a link its calls find cut (`tailrace.links`)."""
        if not self.lifecycle.ready:
            return False, self.lifecycle.health[1]
        broken = LINKS.reason()
        return not broken, broken

    def stop(self) -> None:
        self.lifecycle.stop()

    def run(self) -> None:
        """Run until stopped; transient failures reconnect with backoff, fatal ones raise.
        With a lease (`lease.py`, set by the entry point): wait as a standby until this
        instance holds it, and go back to waiting if another instance takes it over."""
        while True:
            lease = self.lease
            if lease is not None:
                lease.on_lost = lambda reason: self.lifecycle.stop()
                self.lifecycle.fenced = lease.fenced
                if not lease.wait(lambda: self.lifecycle.stopping, self.lifecycle.standby):
                    return
                self.control.capture_generation = lease.generation  # fences its epochs
            try:
                self.lifecycle.run(self._session)
            except FatalError as e:
                if lease is None or not lease.fenced(str(e)):
                    raise
            finally:
                if lease is not None:
                    lease.release()
            if lease is None or not lease.lost:
                return
            log.warning("this instance lost the capture lease; back to standby",
                        reason=lease.lost)
            self.lifecycle.stopping = False
            self.lease = Lease(self.control, "capture", lease.subject, lease.ttl_s)

    @abstractmethod
    def _session(self) -> None:
        """One connection: connect, check the server's identity, stream until stopped."""


def reconcile_identity(control: ControlClient, source_id: str, previous: ServerIdentity | None,
                       new: ServerIdentity, *, change: str, on_schema_drift: str,
                       check_position: Callable[[], None],
                       find_drift: Callable[[], list[str]]) -> list[str]:
    """Reconcile with a server whose identity changed, before any event flows; return the drift.

    1. `check_position` runs; a PositionLostError it raises decides `resnapshot`;
    2. `find_drift` lists the tables that differ; with `on_schema_drift: halt` any decides `halt`;
    3. the ReconcileRecord (change, drift, loss, decision) is added;
    4. `resnapshot` raises the PositionLostError, `halt` a FatalError; only `adapt` stores
       the new identity.
    """
    lost: PositionLostError | None = None
    try:
        check_position()
    except PositionLostError as e:
        lost = e
    drift = find_drift()
    decision = ("resnapshot" if lost is not None else
                "halt" if drift and on_schema_drift == "halt" else "adapt")
    notes = [change, *drift] + ([str(lost)] if lost is not None else [])
    control.add_reconcile_record(source_id, previous, new, notes, decision)
    if lost is not None:
        raise lost
    if decision == "halt":
        raise FatalError(
            "schema drift found on the changed server and spec.source.on_schema_drift is "
            "halt: " + "; ".join(drift) + "; review it, then set on_schema_drift: adapt")
    control.store_identity(source_id, new.flavor, dict(new.attributes), new.fingerprint)
    return drift
