"""The capture publisher's pure rules."""

from __future__ import annotations

from tailrace_services.capture.publisher import (
    IN_FLIGHT_S,
    MIN_IDLE_REPORT_S,
    epochs_in_flight,
    idle_report_s,
)


def test_epochs_in_flight_cover_the_same_time_whatever_the_epoch_interval() -> None:
    assert epochs_in_flight(200) == 3 and epochs_in_flight(100) == 6  # 600 ms either way
    assert epochs_in_flight(50) * 50 / 1000 == IN_FLIGHT_S
    assert epochs_in_flight(0) == epochs_in_flight(1000) == 3  # never fewer than three


def test_a_quiet_source_is_reported_idle_a_few_times_an_epoch() -> None:
    # PostgreSQL's read timeout (200 ms) and MariaDB's heartbeat (500 ms) were each source's
    # IDLE: an epoch acknowledged or pending waited for it
    assert idle_report_s(100, 0.2) == idle_report_s(100, 0.5) == 0.025
    assert idle_report_s(2000, 0.2) == 0.2  # never less often than the source's own
    assert idle_report_s(0, 0.5) == 0.5  # epochs close at every commit: nothing waits
    assert idle_report_s(1, 0.2) == MIN_IDLE_REPORT_S
