"""The replica switch a shared control client makes when calls fail (pure logic)."""

from __future__ import annotations

from tailrace.control_client import _Replicas, split_addresses


def test_two_threads_leaving_the_same_replica_move_one_step() -> None:
    replicas = _Replicas(split_addresses("a:1,b:2,c:3"), tls=None)
    try:
        assert replicas.advance(0) == 1
        assert replicas.advance(0) == 1, "the second thread finds it already moved"
        assert replicas.advance(1) == 2
        assert replicas.advance(2) == 0, "round the ring"
    finally:
        replicas.close()

