"""Sizes (`4MiB`) and durations (`7d`) as the spec writes them."""

from __future__ import annotations

import re
from datetime import timedelta

__all__ = ["parse_duration", "parse_size"]

_SIZE = re.compile(r"\s*(\d+)\s*([KMG]i?B|B)?\s*")
_SIZE_UNITS = {"B": 1, "KB": 1024, "MB": 1024**2, "GB": 1024**3}
_DURATION = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)?\s*")
_DURATION_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_size(value: object) -> object:
    """Bytes from `512KiB`, `4MiB`, `1GB` (powers of 1024) or a number; anything else is left
    for the field's own validation."""
    if not isinstance(value, str):
        return value
    found = _SIZE.fullmatch(value)
    if not found:
        raise ValueError(f"{value!r} is not a size; use bytes or e.g. 512KiB, 4MiB")
    unit = (found.group(2) or "B").replace("i", "")
    return int(found.group(1)) * _SIZE_UNITS[unit]


def parse_duration(value: object) -> timedelta:
    """A duration from `30s`, `15m`, `12h`, `7d`, `2w` (`ms` too), or a number of seconds."""
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    else:
        found = _DURATION.fullmatch(value) if isinstance(value, str) else None
        if not found:
            raise ValueError(f"{value!r} is not a duration; use a number and a unit: 30m, 12h, "
                             "7d (ms, s, m, h, d, w)")
        seconds = float(found.group(1)) * _DURATION_UNITS[found.group(2) or "s"]
    if seconds <= 0:
        raise ValueError(f"{value!r} is not a positive duration; use e.g. 12h or 7d")
    return timedelta(seconds=seconds)
