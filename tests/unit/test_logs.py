"""One log format per run: `--log-format` / $TAILRACE_LOG_FORMAT, for our own lines, the
standard `logging` module's and librdkafka's alike."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import pytest

from tailrace.logs import add_log_options

SCRIPT = """
import logging, time
from confluent_kafka import Producer
from tailrace.bus import producer_config
from tailrace.logs import get_logger, setup_logging
setup_logging("test", fmt={fmt!r})
get_logger().error("sink did not acknowledge the batch", sink="redis1",
                   error="redis://u:hunter2@h:1 refused")
logging.getLogger("py4j.clientserver").error("boom")
producer = Producer(producer_config("127.0.0.1:1", "log-test"))
deadline = time.monotonic() + 30
while time.monotonic() < deadline and not getattr(logging.getLogger("librdkafka"), "seen", 0):
    producer.poll(0.2)
"""


def run(fmt: str) -> list[str]:
    # the script marks the librdkafka logger once a line went through it
    script = SCRIPT.format(fmt=fmt).replace(
        "setup_logging(", "_h = logging.Handler(); _h.emit = lambda r: setattr("
        "logging.getLogger('librdkafka'), 'seen', 1); logging.getLogger('librdkafka')"
        ".addHandler(_h)\nsetup_logging(")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "TAILRACE_LOG_FORMAT": ""})
    assert done.returncode == 0, done.stderr
    return done.stderr.splitlines()


def test_json_lines_from_every_logger() -> None:
    lines = [json.loads(line) for line in run("json")]
    ours = next(e for e in lines if e["event"] == "sink did not acknowledge the batch")
    assert ours["sink"] == "redis1" and ours["level"] == "error" and "hunter2" not in str(ours)
    assert any(e.get("logger") == "py4j.clientserver" and e["event"] == "boom" for e in lines)
    kafka = [e for e in lines if e.get("logger") == "librdkafka"]
    assert kafka and all(e["level"] in ("warning", "error", "critical") for e in kafka)


def test_console_lines_from_every_logger() -> None:
    lines = run("console")
    assert not any(line.startswith("{") for line in lines)
    assert any("[error" in line and "sink=redis1" in line for line in lines)
    assert any("[librdkafka]" in line for line in lines)


def test_a_bad_format_is_a_usage_error(monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("TAILRACE_LOG_FORMAT", "xml")
    parser = argparse.ArgumentParser(prog="tailrace-capture")
    add_log_options(parser)
    with pytest.raises(SystemExit) as caught:
        parser.parse_args([])
    assert caught.value.code == 2
    assert "'xml' is not a log format; use json or console" in capsys.readouterr().err
    monkeypatch.setenv("TAILRACE_LOG_FORMAT", "console")
    parser = argparse.ArgumentParser(prog="tailrace-capture")
    add_log_options(parser)
    assert parser.parse_args([]).log_format == "console"
    assert parser.parse_args(["--log-format", "json"]).log_format == "json"
