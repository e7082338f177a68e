"""The lifecycle both capture sources share: error mapping, reconnects, readiness, reconcile."""

from __future__ import annotations

from typing import Any

import pytest

import tailrace_services.capture.lifecycle as lifecycle
from tailrace.control_client import identity
from tailrace.errors import (
    ConfigError,
    FatalError,
    NonRetryableError,
    PositionLostError,
    RetryableError,
)
from tailrace.retry import Backoff
from tailrace_services.capture.lifecycle import (
    CaptureLifecycle,
    Fail,
    Reconnect,
    Stop,
    reconcile_identity,
)
from tests.fix_capture import unit_pipeline


class FakeControl:
    def __init__(self) -> None:
        self.health: list[tuple[str, str, str]] = []
        self.records: list[tuple[list[str], str]] = []
        self.stored: list[dict[str, str]] = []

    def report_health(self, subject_id: str, state: str, reason: str = "") -> None:
        self.health.append((subject_id, state, reason))

    def add_reconcile_record(self, source_id: str, old: Any, new: Any, drift: list[str],
                             decision: str) -> int:
        self.records.append((drift, decision))
        return len(self.records)

    def store_identity(self, source_id: str, flavor: str, attributes: dict[str, str],
                       fingerprint: str) -> None:
        self.stored.append(attributes)


def make(control: FakeControl, on_error: Any = lambda e: None) -> CaptureLifecycle:
    return CaptureLifecycle(unit_pipeline(), control, on_error,  # type: ignore[arg-type]
                            Backoff(0.01, 0.02, jitter=False))


@pytest.fixture(autouse=True)
def no_bus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lifecycle, "ensure_topic", lambda *a, **k: None)


def failing(*errors: BaseException) -> Any:
    pending = list(errors)

    def session() -> None:
        if pending:
            raise pending.pop(0)
    return session


def test_tailrace_errors_map_to_health_states_and_fatal_errors():
    control = FakeControl()
    with pytest.raises(PositionLostError):
        make(control).run(failing(PositionLostError("slot missing")))
    with pytest.raises(FatalError, match="^auth$"):
        make(control).run(failing(NonRetryableError("auth")))
    with pytest.raises(ConfigError):
        make(control).run(failing(ConfigError("source.dsn: wal_level is replica")))
    assert [(s, r) for _, s, r in control.health] == [
        ("position_lost", "position lost: slot missing. Re-snapshot required."),
        ("failed", "auth"), ("failed", "source.dsn: wal_level is replica")]


def test_transient_errors_reconnect_and_reset_readiness():
    life = make(FakeControl(), lambda e: Reconnect("interrupted"))
    seen: list[bool] = []

    def session() -> None:
        seen.append(life.ready)
        if len(seen) < 3:
            life.streaming()
            raise RetryableError("connection lost")
    life.run(session)
    assert seen == [False, False, False]
    assert life.health == (True, "reconnecting: connection lost")


def test_the_source_handler_fails_stops_or_leaves_an_error_alone():
    control = FakeControl()
    refused = ValueError("refused")
    with pytest.raises(FatalError, match="source pg1: refused") as raised:
        make(control, lambda e: Fail(f"source pg1: {e}", FatalError(f"source pg1: {e}"))
             ).run(failing(refused))
    assert raised.value.__cause__ is refused
    make(control, lambda e: Stop("stopped")).run(failing(ValueError("slow bus")))
    with pytest.raises(KeyError):
        make(control).run(failing(KeyError("a bug")))
    assert [s for _, s, _ in control.health] == ["failed"]


def test_backoff_doubles_up_to_its_maximum_and_may_restart_after_streaming():
    fixed = Backoff(0.5, 10.0, jitter=False, reset_on_progress=False)
    assert [fixed.next() for _ in range(7)] == [0.5, 1.0, 2.0, 4.0, 8.0, 10.0, 10.0]
    fixed.reset()
    assert fixed.next() == 10.0
    jittered = Backoff(0.5, 10.0)
    assert all(0.25 <= jittered.next() <= 10.0 for _ in range(2000))
    jittered.reset()
    assert 0.25 <= jittered.next() <= 0.5


@pytest.mark.parametrize(("lost", "drift", "on_drift", "decision"), [
    (False, [], "halt", "adapt"),
    (False, ["db.t: differs"], "adapt", "adapt"),
    (False, ["db.t: differs"], "halt", "halt"),
    (True, ["db.t: differs"], "halt", "resnapshot"),
])
def test_reconcile_records_the_decision_and_stores_only_on_adapt(lost: bool, drift: list[str],
                                                                  on_drift: str, decision: str):
    control = FakeControl()

    def check_position() -> None:
        if lost:
            raise PositionLostError("gone")

    new = identity("postgresql", {"timeline": "2"}, "f2")

    def call() -> list[str]:
        return reconcile_identity(control, "pg1", None, new,  # type: ignore[arg-type]
                                  change="promoted standby", on_schema_drift=on_drift,
                                  check_position=check_position, find_drift=lambda: drift)
    if decision == "adapt":
        assert call() == drift
        assert control.stored == [{"timeline": "2"}]
    else:
        with pytest.raises(PositionLostError if lost else FatalError):
            call()
        assert control.stored == []
    notes = ["promoted standby", *drift] + (["position lost: gone. Re-snapshot required."]
                                            if lost else [])
    assert control.records == [(notes, decision)]
