"""`tailrace.links`: a link failing longer than the grace period is named; a call that
goes through clears it."""

from __future__ import annotations

from tailrace.links import Broken, Links


def test_a_link_is_named_once_it_fails_longer_than_the_grace_period(monkeypatch):
    now = [100.0]
    monkeypatch.setattr("tailrace.links.time.monotonic", lambda: now[0])
    links = Links(grace_s=2.0)
    links.failed("control service at c:1", "UNAVAILABLE: refused")
    assert links.broken() == [] and links.reason() == ""  # a hiccup so far
    now[0] = 101.5
    links.failed("bus at b:9", "epoch 7 not acknowledged for 2 s")
    links.failed("control service at c:1", "DEADLINE_EXCEEDED")  # the first failure counts
    now[0] = 103.6
    assert links.broken() == [Broken("control service at c:1", 100.0, "DEADLINE_EXCEEDED"),
                              Broken("bus at b:9", 101.5, "epoch 7 not acknowledged for 2 s")]
    assert links.reason() == ("control service at c:1 failing for 4 s: DEADLINE_EXCEEDED; "
                              "bus at b:9 failing for 2 s: epoch 7 not acknowledged for 2 s")
    links.ok("control service at c:1")
    links.ok("never failed")
    assert [b.link for b in links.broken()] == ["bus at b:9"]
    links.ok("bus at b:9")
    links.failed("bus at b:9", "again")  # a new run of failures starts its own clock
    assert links.broken() == []


def test_a_caller_may_say_when_the_failing_began(monkeypatch):
    now = [50.0]
    monkeypatch.setattr("tailrace.links.time.monotonic", lambda: now[0])
    links = Links(grace_s=2.0)
    links.failed("bus at b:9", "epoch 3 not acknowledged for 1 s", since=49.0)
    now[0] = 51.0  # 2 s after the epoch was sent: named now, not 2 s after the report
    assert links.reason() == "bus at b:9 failing for 2 s: epoch 3 not acknowledged for 1 s"
    links.clear()
    assert links.broken() == []

