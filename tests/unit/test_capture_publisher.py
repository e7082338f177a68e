"""The capture publisher's pure rules."""

from __future__ import annotations

from tailrace_services.capture.publisher import IN_FLIGHT_S, epochs_in_flight


def test_epochs_in_flight_cover_the_same_time_whatever_the_epoch_interval() -> None:
    assert epochs_in_flight(200) == 3 and epochs_in_flight(100) == 6  # 600 ms either way
    assert epochs_in_flight(50) * 50 / 1000 == IN_FLIGHT_S
    assert epochs_in_flight(0) == epochs_in_flight(1000) == 3  # never fewer than three
