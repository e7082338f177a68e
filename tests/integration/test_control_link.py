"""The control client names its link in `tailrace.links` while its calls fail (`/ready`
then says which), and clears it with the first call that goes through."""

from __future__ import annotations

import pytest

from tailrace.control_client import ControlClient, ControlUnavailable
from tailrace.devservers import free_port
from tailrace.links import LINKS
from tailrace_services.control.server import serve
from tailrace_services.control.storage import MemoryStorage

pytestmark = pytest.mark.integration


def test_the_control_client_names_its_link_until_a_call_goes_through(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(LINKS, "grace_s", 0.0)
    port = free_port()
    client = ControlClient(f"127.0.0.1:{port}", timeout=1.0, retry_for=2.0)
    try:
        with pytest.raises(ControlUnavailable):
            client.latest_epoch("s1")  # nothing listens yet
        [broken] = LINKS.broken()
        assert broken.link == f"control service at 127.0.0.1:{port}"
        assert broken.error.startswith("latest epoch: UNAVAILABLE: ")
        server = serve(MemoryStorage(), f"127.0.0.1:{port}")
        try:
            client.latest_epoch("s1")
            assert LINKS.broken() == []
        finally:
            server.stop(0)
    finally:
        client.close()


def test_a_client_of_two_replicas_goes_to_the_other_when_one_is_down(tmp_path) -> None:
    """Two control services on one storage (SQLite here; PostgreSQL in the chaos test): the
    client starts on the first, goes to the second at once when the first stops answering,
    stays there, and comes back only when the second stops answering in turn."""
    from tailrace_services.control.storage import SqliteStorage

    first, second = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    servers = {a: serve(SqliteStorage(str(tmp_path / "state.db")), a) for a in (first, second)}
    client = ControlClient(f"{first},{second}", timeout=1.0, retry_for=5.0)
    try:
        assert client.current_address == first
        client.register_pipeline("p", source_id="pg", sinks=[("s", "redis", True)])
        servers.pop(first).stop(0)
        assert client.pipeline_state("p")[0] == "running", "answered by the second"
        assert client.current_address == second
        servers[first] = serve(SqliteStorage(str(tmp_path / "state.db")), first)
        client.pause("p")
        assert client.current_address == second, "it stays with the one that answers"
        servers.pop(second).stop(0)
        assert client.pipeline_state("p")[0] == "paused", "the first saw the second's write"
        assert client.current_address == first
    finally:
        client.close()
        for server in servers.values():
            server.stop(0)


def test_a_cli_call_tries_the_other_replica_even_with_no_time_to_retry(tmp_path) -> None:
    """The CLI retries for 2 s with a 10 s timeout: its deadline has passed by the time the
    first replica's call fails, and it must still try the second before giving up."""
    from tailrace_services.control.storage import SqliteStorage

    down, up = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    server = serve(SqliteStorage(str(tmp_path / "state.db")), up)
    client = ControlClient(f"{down},{up}", timeout=1.0, retry_for=0.0)
    try:
        client.register_pipeline("p", source_id="pg", sinks=[("s", "redis", True)])
        assert client.current_address == up
    finally:
        client.close()
        server.stop(0)


def test_threads_that_see_one_replica_fail_together_move_on_once(tmp_path) -> None:
    """Eight threads share a client whose first replica is down: each call lands on the
    second at once, none bounces back to the first, and the client stays on the second."""
    from concurrent.futures import ThreadPoolExecutor

    from tailrace_services.control.storage import SqliteStorage

    down, up = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    server = serve(SqliteStorage(str(tmp_path / "state.db")), up)
    client = ControlClient(f"{down},{up}", timeout=1.0, retry_for=0.0)
    try:
        client.register_pipeline("p", source_id="pg", sinks=[("s", "redis", True)])
        client._replicas.index = 0  # back on the dead one, as after a restart of the client
        with ThreadPoolExecutor(8) as pool:
            states = list(pool.map(lambda _: client.pipeline_state("p")[0], range(32)))
        assert states == ["running"] * 32
        assert client.current_address == up
    finally:
        client.close()
        server.stop(0)
