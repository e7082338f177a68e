"""The correctness matrix of docs/guarantees.md, written from the chaos tests themselves.

Every test in tests/chaos names its row, `@pytest.mark.matrix(scenario=..., guarantee=...)`
(collection fails without it), and reports what it counted through the `counted` fixture:
changes in and out, duplicates and order violations, or the outcome of a scenario whose
answer is a loud stop. At the end of a run the counts are merged into
`.tailrace/matrix.json` (a partial run keeps the other rows' last counts);
`tools/gen_matrix.py` writes the table into docs/guarantees.md, and
tests/unit/test_matrix_doc.py fails when the table and the tests disagree.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

RESULTS = Path(__file__).resolve().parents[1] / ".tailrace" / "matrix.json"
MATRIX_PROPERTY = "tailrace_matrix"
_counted: dict[str, dict[str, Any]] = {}


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "matrix(scenario, guarantee): a chaos test's row in "
                                       "docs/guarantees.md's correctness matrix")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    unnamed = [item.nodeid for item in items if "/chaos/" in item.nodeid.replace("\\", "/")
               and item.get_closest_marker("matrix") is None]
    if unnamed:
        raise pytest.UsageError("chaos tests without @pytest.mark.matrix(scenario=..., "
                                f"guarantee=...): {', '.join(unnamed)}")


@pytest.fixture
def counted(request: pytest.FixtureRequest) -> Iterator[Callable[..., None]]:
    """`counted(changes_in=, changes_out=, duplicates=, order_violations=)`, or
    `counted(outcome="...")`: what this test's run counted, for its matrix row."""
    def record(*, changes_in: int | None = None, changes_out: int | None = None,
               duplicates: int = 0, order_violations: int = 0, outcome: str = "") -> None:
        if (changes_in is None) != (changes_out is None) or \
                (changes_in is None and not outcome):
            raise TypeError("counted() takes changes_in and changes_out, an outcome, or both")
        # carried by the test's report: under pytest-xdist it runs in a worker and the
        # controller, which writes the results, sees only reports
        request.node.user_properties.append((MATRIX_PROPERTY, {
            "changes_in": changes_in, "changes_out": changes_out, "duplicates": duplicates,
            "order_violations": order_violations, "outcome": outcome,
            "date": time.strftime("%Y-%m-%d")}))

    yield record


def count_values(values: dict[int, list[int]], expected: dict[int, list[int]]
                 ) -> dict[str, int]:
    """Counts of a per-key workload (`values_per_key`): changes expected and found, the
    repeats and the keys whose values are not in source order."""
    out = sum(len(v) for v in values.values())
    repeats = sum(len(v) - len(set(v)) for v in values.values())
    disorder = sum(1 for v in values.values() if v != sorted(v))
    return {"changes_in": sum(len(v) for v in expected.values()), "changes_out": out,
            "duplicates": repeats, "order_violations": disorder}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.failed:  # only what a passing test counted
        _counted.pop(report.nodeid, None)
    elif report.when == "call":
        for name, value in report.user_properties:
            if name == MATRIX_PROPERTY:
                _counted[report.nodeid] = value


def pytest_sessionfinish(session: pytest.Session) -> None:
    if not _counted or hasattr(session.config, "workerinput"):  # an xdist worker
        return
    RESULTS.parent.mkdir(exist_ok=True)
    merged: dict[str, Any] = {}
    if RESULTS.exists():
        try:
            merged = json.loads(RESULTS.read_text())
        except ValueError:
            merged = {}
    merged.update(_counted)
    RESULTS.write_text(json.dumps(merged, indent=1, sort_keys=True) + "\n")
