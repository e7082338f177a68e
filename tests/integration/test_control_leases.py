"""Capture leases in the control service (issue 17 item 3): one holder per source, the
generation up with each new holder, and the epochs of a holder that lost its lease refused
(fenced). The capture processes that use them: tests/chaos/test_standby_capture.py."""

from __future__ import annotations

import time

import pytest

from tailrace.control_client import ControlRefused
from tailrace.proto import control_pb2 as pb

pytestmark = pytest.mark.integration

NAME = "capture::shop-pg"


def epoch(i: int, generation: int) -> pb.Epoch:
    e = pb.Epoch(source_id="shop-pg", epoch_id=i, capture_generation=generation)
    e.position.tx_seq = i
    e.end_offsets[0] = i
    return e


def test_one_holder_at_a_time_and_an_older_holder_is_fenced_where_epochs_are_recorded(
        control) -> None:
    c = control.client
    a = c.acquire_lease(NAME, "host:1:aa", 0.5)
    assert (a.held, a.generation) == (True, 1)
    b = c.acquire_lease(NAME, "host:2:bb", 0.5)
    assert (b.held, b.owner) == (False, "host:1:aa"), "a standby while A holds it"
    assert c.acquire_lease(NAME, "host:1:aa", 0.5).held, "A renews"
    c.record_epoch(epoch(1, 1))

    time.sleep(0.6)  # A paused past its TTL: B takes over
    b = c.acquire_lease(NAME, "host:2:bb", 0.5)
    assert (b.held, b.generation) == (True, 2)
    with pytest.raises(ControlRefused, match="capture lease generation 1 is fenced; "
                                             "generation 2 \\(host:2:bb\\)"):
        c.record_epoch(epoch(2, 1))
    c.record_epoch(epoch(2, 2))
    assert not c.acquire_lease(NAME, "host:1:aa", 0.5).held, "A's renewal finds B"

    time.sleep(0.6)  # B's lease lapsed too, nobody took it: A's epochs stay fenced
    with pytest.raises(ControlRefused, match="generation 1 is fenced; generation 2"):
        c.record_epoch(epoch(3, 1))
    c.record_epoch(epoch(3, 2))  # B itself goes on, nobody else holds it


def test_a_holder_gone_from_its_host_is_taken_over_at_once_and_a_release_frees_it(
        control) -> None:
    c = control.client
    assert c.acquire_lease(NAME, "host:1:aa", 30).held
    assert not c.acquire_lease(NAME, "host:2:bb", 30, take_over_from="host:9:zz").held, \
        "only the holder named is taken over"
    b = c.acquire_lease(NAME, "host:2:bb", 30, take_over_from="host:1:aa")
    assert (b.held, b.generation) == (True, 2)
    assert c.release_lease(NAME, "host:2:bb")
    assert c.acquire_lease(NAME, "host:3:cc", 30).generation == 3


def test_lease_requests_are_checked(control) -> None:
    with pytest.raises(ControlRefused, match="capture::<source_id>"):
        control.client.acquire_lease("owner::x", "host:1:aa", 1)
    with pytest.raises(ControlRefused, match="ttl_ms"):
        control.client.acquire_lease(NAME, "host:1:aa", 0)
