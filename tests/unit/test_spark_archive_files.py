"""Which partial class-data archives `tailrace-spark archive` may remove (pure logic)."""

from __future__ import annotations


def test_only_partial_archives_of_dead_writers_are_removed() -> None:
    import os

    from tailrace_services.delivery.cluster import pid_alive

    assert pid_alive(str(os.getpid()))
    assert not pid_alive("999999999")
    assert not pid_alive("not-a-pid")
