"""What the delivery process's Spark machinery prints while it stops stays in the run's
log format: PySpark's accumulator server, whose connection the JVM closes first when a stop
signal reaches the whole process group, raised EOFError and printed socketserver's raw
traceback (a `tailrace up --log-format json` log then held non-JSON lines)."""

from __future__ import annotations

import socket
import threading
from types import SimpleNamespace
from typing import Any

import pytest
from pyspark.accumulators import _start_update_server

from tailrace_services.delivery.job import _quiet_accumulator_server

TOKEN = "t" * 16


def _drop_a_connection(server: Any) -> None:
    """Connect, authenticate, hang up before sending updates; return once the server has
    handled the error that follows."""
    handled = threading.Event()
    handle_error = server.handle_error

    def noted(request: Any, client_address: Any) -> None:
        handle_error(request, client_address)
        handled.set()

    server.handle_error = noted
    with socket.create_connection(server.server_address) as conn:
        conn.sendall(TOKEN.encode())
    assert handled.wait(10), "the accumulator server never saw the connection end"


def test_an_accumulator_connection_closed_by_the_jvm_prints_no_raw_traceback(
        capfd: pytest.CaptureFixture[str]) -> None:
    server = _start_update_server(TOKEN, False)
    try:
        _quiet_accumulator_server(SimpleNamespace(_accumulatorServer=server))
        _drop_a_connection(server)
    finally:
        server.shutdown()
    assert "Traceback" not in capfd.readouterr().err


def test_without_it_the_traceback_is_raw(capfd: pytest.CaptureFixture[str]) -> None:
    """The case above is real: PySpark's own handler prints it."""
    server = _start_update_server(TOKEN, False)
    try:
        _drop_a_connection(server)
    finally:
        server.shutdown()
    assert "EOFError" in capfd.readouterr().err
