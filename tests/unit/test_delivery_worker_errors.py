"""What the driver makes of a Python worker's error: Spark hands back only its text."""

from __future__ import annotations

from tailrace.errors import FatalError
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
