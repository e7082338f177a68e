"""Write docs/guarantees.md's chaos matrix from the chaos tests' markers and their counts.

    .venv/bin/python -m pytest tests/chaos        # each passing test records its counts
    .venv/bin/python tools/gen_matrix.py          # the table, between its two markers

A row per test in tests/chaos: its `@pytest.mark.matrix(scenario=..., guarantee=...)`, the
test, and the last result counted (`tests/fix_matrix.py`: .tailrace/matrix.json). A test
with no count in that file keeps the result the table showed before. `--check` exits 1
when the table's scenarios, guarantees or tests differ from the markers (the unit test
tests/unit/test_matrix_doc.py runs the same check).
"""

from __future__ import annotations

import ast
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CHAOS = ROOT / "tests" / "chaos"
DOC = ROOT / "docs" / "guarantees.md"
RESULTS = ROOT / ".tailrace" / "matrix.json"
BEGIN = ("<!-- chaos-matrix: written by tools/gen_matrix.py from the chaos tests' markers and "
         "their last counts; do not edit -->")
END = "<!-- /chaos-matrix -->"
HEAD = ("| scenario | guarantee | test | last counted result |\n"
        "|---|---|---|---|")


@dataclass(frozen=True)
class Row:
    scenario: str
    guarantee: str
    test: str  # tests/chaos/file.py::function

    def cells(self, result: str) -> str:
        return f"| {self.scenario} | {self.guarantee} | `{self.test}` | {result} |"


def rows() -> list[Row]:
    """The matrix markers of tests/chaos, in file and line order."""
    out = []
    for path in sorted(CHAOS.glob("test_*.py")):
        for node in ast.parse(path.read_text()).body:
            if not isinstance(node, ast.FunctionDef) or not node.name.startswith("test_"):
                continue
            for decorator in node.decorator_list:
                if isinstance(decorator, ast.Call) and \
                        ast.unparse(decorator.func) == "pytest.mark.matrix":
                    args = {k.arg: ast.literal_eval(k.value) for k in decorator.keywords}
                    if any("|" in str(v) for v in args.values()):
                        raise ValueError(f"{path.name}::{node.name}: no | in matrix text")
                    out.append(Row(args["scenario"], args["guarantee"],
                                   f"tests/chaos/{path.name}::{node.name}"))
    return out


def result_text(counts: dict[str, Any]) -> str:
    parts = []
    if counts.get("changes_in") is not None:
        parts.append(f"in {counts['changes_in']:,}, out {counts['changes_out']:,}, "
                     f"{counts['duplicates']} duplicates, {counts['order_violations']} out of "
                     "order")
    if counts.get("outcome"):
        parts.append(str(counts["outcome"]))
    return f"{'; '.join(parts)} ({counts['date']})"


def results_by_test(results: dict[str, dict[str, Any]]) -> dict[str, str]:
    """Per test: its cases' results (a parametrized test: one per case, named)."""
    cases: dict[str, list[str]] = {}
    for nodeid, counts in sorted(results.items()):
        test, _, case = nodeid.partition("[")
        text = result_text(counts)
        cases.setdefault(test, []).append(f"[{case.rstrip(']')}] {text}" if case else text)
    return {test: "<br>".join(texts) for test, texts in cases.items()}


def table_in(doc: str) -> dict[str, tuple[str, str, str]]:
    """The table now in the doc: test -> (scenario, guarantee, result)."""
    if BEGIN not in doc or END not in doc:
        return {}
    body = doc[doc.index(BEGIN) + len(BEGIN):doc.index(END)]
    out = {}
    for line in body.splitlines()[3:]:
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        if len(cells) == 4:
            out[cells[2].strip("`")] = (cells[0], cells[1], cells[3])
    return out


def render(doc: str, results: dict[str, dict[str, Any]]) -> str:
    before = table_in(doc)
    counted = results_by_test(results)
    lines = [BEGIN, HEAD]
    for row in rows():
        result = counted.get(row.test) or (before.get(row.test) or ("", "", ""))[2] or \
            "not counted yet"
        lines.append(row.cells(result))
    lines.append(END)
    table = "\n".join(lines)
    if BEGIN in doc:
        return doc[:doc.index(BEGIN)] + table + doc[doc.index(END) + len(END):]
    return doc.rstrip("\n") + "\n\n" + table + "\n"


def differences(doc: str) -> list[str]:
    """What the doc's table says differently from the markers (results aside)."""
    table = table_in(doc)
    marked = {row.test: row for row in rows()}
    out = [f"{test}: in the table, not a marked chaos test" for test in table
           if test not in marked]
    for test, row in marked.items():
        if test not in table:
            out.append(f"{test}: marked, not in the table")
        elif table[test][:2] != (row.scenario, row.guarantee):
            out.append(f"{test}: scenario or guarantee differs from its marker")
        elif not table[test][2] or table[test][2] == "not counted yet":
            out.append(f"{test}: no counted result")
    return out


def main(argv: list[str]) -> int:
    doc = DOC.read_text()
    if "--check" in argv:
        found = differences(doc)
        for line in found:
            print(line, file=sys.stderr)
        return 1 if found else 0
    results = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    DOC.write_text(render(doc, results))
    print(f"wrote {len(rows())} rows into {DOC.relative_to(ROOT)} "
          f"({len(results)} counted cases in {RESULTS.relative_to(ROOT)})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
