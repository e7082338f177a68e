"""What the driver makes of a Python worker's error (Spark hands back only its text), and
what a worker's task leaves as it found it."""

from __future__ import annotations

import gc

import pytest

from tailrace.errors import FatalError
from tailrace_services.delivery.executor import collector_paused
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
