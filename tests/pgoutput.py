"""pgoutput message parts built by hand, for the decoder's unit tests."""

from __future__ import annotations

import struct


def tuple_data(*values: str | bytes | None) -> bytes:
    """A TupleData: str = text value, None = NULL ('n'), b'u' = unchanged TOAST."""
    out = struct.pack(">H", len(values))
    for value in values:
        if value is None:
            out += b"n"
        elif value == b"u":
            out += b"u"
        else:
            raw = value.encode() if isinstance(value, str) else value
            out += b"t" + struct.pack(">I", len(raw)) + raw
    return out
