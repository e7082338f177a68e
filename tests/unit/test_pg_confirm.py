"""How far capture-postgres confirms its slot: never past what it published or the WAL end."""

from __future__ import annotations

import pytest

from tailrace.errors import PositionLostError
from tailrace_services.capture_postgres.position import confirmable_lsn


def test_the_slot_follows_the_checkpoint_up_to_what_was_published() -> None:
    assert confirmable_lsn(0x100, 0x400, published=0x500, server_wal_end=0x900) == 0x400
    assert confirmable_lsn(0x100, 0x800, published=0x500, server_wal_end=0x900) == 0x500
    assert confirmable_lsn(0x600, 0x400, published=0x700, server_wal_end=0x900) == 0x600, \
        "never backwards"
    assert confirmable_lsn(0x100, 0x400, published=0x500, server_wal_end=0) == 0x400, \
        "no WAL end known yet: the published bound alone"


def test_a_checkpoint_past_the_wal_end_is_a_lost_position() -> None:
    with pytest.raises(PositionLostError, match=r"checkpoint 0/3D341330 is past the server's "
                                                r"WAL end 0/1994F60"):
        confirmable_lsn(0x100, 0x3D341330, published=0x1994F60, server_wal_end=0x1994F60)
