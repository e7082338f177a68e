"""What the driver makes of a Python worker's error (Spark hands back only its text), what a
worker's task leaves as it found it, and the checkpoints the driver hands to a batch's tasks."""

from __future__ import annotations

import gc

import pytest

from tailrace.errors import FatalError
from tailrace.proto.control_pb2 import Checkpoint
from tailrace_services.delivery.executor import (
    collector_paused,
    hand_checkpoints,
    handed_checkpoints,
    take_back_checkpoints,
)
from tailrace_services.delivery.job import _raised

TRACEBACK = """org.apache.spark.api.python.PythonException: Traceback (most recent call last):
  File "/work/services/delivery/executor.py", line 102, in deliver_range
    result = deliver_slice(
tailrace_services.delivery.sinks.exactly_once.SinkLostWrites: sink r lost writes it had \
acknowledged: on bus partition 0 its stored checkpoint holds nothing
\tat org.apache.spark.api.python.BasePythonRunner$ReaderIterator.handlePythonException
"""


def test_a_fatal_error_is_known_by_its_subclass_in_the_traceback() -> None:
    assert _raised(TRACEBACK, FatalError) == (
        "sink r lost writes it had acknowledged: on bus partition 0 its stored checkpoint "
        "holds nothing")


def test_other_errors_and_unknown_classes_are_not_fatal() -> None:
    assert _raised("tailrace_services.delivery.runtime.BusChanged: moved", FatalError) is None
    assert _raised("tailrace_services.nowhere.Nope: x", FatalError) is None
    assert _raised("ValueError: tailrace_services.x.Y: z", FatalError) is None


def test_a_task_runs_without_the_cyclic_collector_and_gives_it_back_even_if_it_fails() -> None:
    assert gc.isenabled()
    with collector_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(RuntimeError), collector_paused():
        raise RuntimeError("a sink failed")
    assert gc.isenabled()
    gc.disable()  # a caller that had it off keeps it off
    try:
        with collector_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


class _Driver:
    """The driver thread's local properties, as Spark keeps them."""

    def __init__(self) -> None:
        self.properties: dict[str, str] = {}

    def setLocalProperty(self, key: str, value: str | None) -> None:  # noqa: N802 - Spark's
        if value is None:
            self.properties.pop(key, None)
        else:
            self.properties[key] = value


class _Task:
    def __init__(self, properties: dict[str, str]) -> None:
        self.properties = properties

    def getLocalProperty(self, key: str) -> str | None:  # noqa: N802 - Spark's name
        return self.properties.get(key)


def _in_task(monkeypatch: pytest.MonkeyPatch, properties: dict[str, str]) -> None:
    import pyspark

    monkeypatch.setattr(pyspark.TaskContext, "get", staticmethod(lambda: _Task(properties)))


def test_a_task_delivers_against_the_checkpoints_the_driver_handed_to_its_batch(
        monkeypatch: pytest.MonkeyPatch) -> None:
    driver = _Driver()
    stored = Checkpoint(sink_id="r", version=7, rewind=2)
    stored.bus_offsets[0] = 1234
    hand_checkpoints(driver, 41, {"r": stored, "new": None})
    _in_task(monkeypatch, {**driver.properties, "streaming.sql.batchId": "41"})
    assert handed_checkpoints() == {"r": stored, "new": None}


def test_a_task_without_its_batchs_checkpoints_delivers_nothing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    driver = _Driver()
    hand_checkpoints(driver, 41, {"r": Checkpoint(sink_id="r", version=7)})
    _in_task(monkeypatch, {**driver.properties, "streaming.sql.batchId": "42"})
    with pytest.raises(RuntimeError, match="batch 42 got the checkpoints of batch 41"):
        handed_checkpoints()
    take_back_checkpoints(driver)
    _in_task(monkeypatch, {**driver.properties, "streaming.sql.batchId": "42"})
    with pytest.raises(RuntimeError, match="got no checkpoints"):
        handed_checkpoints()
