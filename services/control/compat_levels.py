"""Confluent's compatibility levels over one schema type's "can this read that" check.

`BACKWARD`: the new schema reads data written with the latest (consumers upgrade first);
`FORWARD`: the latest reads data written with the new; `FULL`: both; `_TRANSITIVE`: against
every version, not only the latest; `NONE`: no check.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

LEVELS = ("NONE", "BACKWARD", "BACKWARD_TRANSITIVE", "FORWARD", "FORWARD_TRANSITIVE",
          "FULL", "FULL_TRANSITIVE")
DEFAULT_LEVEL = "BACKWARD"

Reads = Callable[[Any, Any, str], list[str]]  # (reader, writer, path) -> what keeps it from it


class InvalidSchema(ValueError):
    """Not a schema of its type; the message says where."""


def problems(level: str, new: Any, existing: list[Any], reads: Reads) -> list[str]:
    """Why `new` may not follow `existing` (oldest first) under `level`; [] when it may."""
    if level == "NONE" or not existing:
        return []
    against = existing if level.endswith("_TRANSITIVE") else existing[-1:]
    found: list[str] = []
    for old in against:
        if level.startswith(("BACKWARD", "FULL")):
            found += [f"the new schema cannot read old data: {p}"
                      for p in reads(new, old, "")]
        if level.startswith(("FORWARD", "FULL")):
            found += [f"old readers cannot read new data: {p}" for p in reads(old, new, "")]
    return found
