"""How the CLI prints: aligned tables for people, JSON for scripts."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence
from typing import Any

from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message


def to_json(value: Any) -> Any:
    if isinstance(value, Message):
        return MessageToDict(value, preserving_proto_field_name=True,
                             always_print_fields_with_no_presence=True)
    if isinstance(value, list | tuple):
        return [to_json(v) for v in value]
    if isinstance(value, dict):
        return {k: to_json(v) for k, v in value.items()}
    return value


def print_json(value: Any) -> None:
    json.dump(to_json(value), sys.stdout, indent=2, sort_keys=True)
    sys.stdout.write("\n")


def print_table(headers: Sequence[str], rows: Sequence[Sequence[object]], empty: str) -> None:
    if not rows:
        print(empty)
        return
    cells = [[str(c) for c in headers], *[[_cell(c) for c in row] for row in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    for row in cells:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())


def _cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.1f}"
    return str(value).replace("\n", " ")


def when(unix_ms: int) -> str:
    if not unix_ms:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(unix_ms / 1000))


def short(text: str, width: int = 60) -> str:
    return text if len(text) <= width else text[:width - 1] + "…"
