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
