"""Which partial class-data archives `tailrace-spark archive` may remove (pure logic)."""

from __future__ import annotations


def test_only_partial_archives_of_dead_writers_are_removed() -> None:
    import os

    from tailrace_services.delivery.cluster import _alive

    assert _alive(str(os.getpid()))
    assert not _alive("999999999")
    assert not _alive("not-a-pid")
