"""docs/guarantees.md's chaos matrix says what the chaos tests' markers say, and has a
counted result for every row (`tools/gen_matrix.py`, `tests/fix_matrix.py`)."""

from __future__ import annotations

from tools import gen_matrix


def test_the_chaos_matrix_in_the_docs_matches_the_chaos_tests() -> None:
    found = gen_matrix.differences(gen_matrix.DOC.read_text())
    assert not found, ("docs/guarantees.md's chaos matrix is out of date: run the chaos tests "
                       "(`.venv/bin/python -m pytest tests/chaos`), then "
                       "`.venv/bin/python tools/gen_matrix.py`:\n" + "\n".join(found))


def test_a_parametrized_test_shows_each_case_and_a_loud_stop_its_outcome() -> None:
    results = {
        "tests/chaos/t.py::test_a[x]": {"changes_in": 10, "changes_out": 10, "duplicates": 0,
                                        "order_violations": 0, "outcome": "",
                                        "date": "2026-11-27"},
        "tests/chaos/t.py::test_a[y]": {"changes_in": 4, "changes_out": 5, "duplicates": 1,
                                        "order_violations": 0, "outcome": "",
                                        "date": "2026-11-27"},
        "tests/chaos/t.py::test_b": {"outcome": "position lost, 503", "date": "2026-11-26"}}
    texts = gen_matrix.results_by_test(results)
    assert texts["tests/chaos/t.py::test_a"] == (
        "[x] in 10, out 10, 0 duplicates, 0 out of order (2026-11-27)<br>"
        "[y] in 4, out 5, 1 duplicates, 0 out of order (2026-11-27)")
    assert texts["tests/chaos/t.py::test_b"] == "position lost, 503 (2026-11-26)"
