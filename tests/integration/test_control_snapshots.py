"""The snapshot work queue in the control service and its CLI (docs/snapshots.md).

Bad input starts nothing: an unknown table, a table without a key, a `where` that does not
parse, a resnapshot without confirmation or on a running pipeline. Capture's progress is
merged by compare-and-set, so an operator's request is never overwritten.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from tailrace.control_client import ControlClient, ControlRefused
from tailrace.proto import control_pb2 as pb
from tailrace_services.cli.main import main
from tailrace_services.control.server import serve
from tailrace_services.control.storage import MemoryStorage

pytestmark = pytest.mark.integration


@pytest.fixture
def client() -> Iterator[ControlClient]:
    server = serve(MemoryStorage(), "127.0.0.1:0")
    with ControlClient(f"127.0.0.1:{server.port}", retry_for=5) as c:
        c.register_pipeline("orders", source_id="shop-pg", source_type="postgres",
                            sinks=[("r1", "redis", True)])
        yield c
    server.stop(0)


def captured(client: ControlClient, **tables: list[str]) -> pb.SnapshotState:
    """Capture reports the tables it selected (name with a dot as `public__items`)."""
    state = client.snapshot_state("orders")
    del state.selected[:]
    for name, keys in tables.items():
        state.selected.append(pb.SelectedTable(table=name.replace("__", "."), key_columns=keys))
    answer = client.update_snapshot(state, state.version)
    assert answer.updated
    return answer.state


def refused(client: ControlClient, match: str, **kw: object) -> None:
    with pytest.raises(ControlRefused, match=match):
        client.request_snapshot("orders", **kw)  # type: ignore[arg-type]


def test_a_request_is_checked_against_what_capture_selected(client: ControlClient) -> None:
    refused(client, "has not reported its tables yet")
    captured(client, public__items=["id"], public__log=[])
    refused(client, r"does not capture public\.nope; it captures: public\.items, public\.log",
            tables=["public.nope"])
    refused(client, r"public\.log has no primary key .* spec\.source\.snapshot\.key_columns",
            tables=["public.log"])
    refused(client, "does not parse as a postgres condition", tables=["public.items"],
            where="id >")
    refused(client, "must be one condition", tables=["public.items"], where="true; drop table x")
    assert client.snapshot_state("orders").tables == [], "nothing started"

    state = client.request_snapshot("orders", ["public.items"], "id > 10")
    (t,) = state.tables
    assert (t.table, t.state, t.where, t.request_id) == ("public.items", pb.SNAPSHOT_PENDING,
                                                         "id > 10", 1)
    refused(client, "being snapshotted already", tables=["public.items"])


def test_capture_progress_never_overwrites_an_operator_request(client: ControlClient) -> None:
    read = captured(client, public__items=["id"], public__orders=["id"])
    client.request_snapshot("orders", ["public.items"])
    read.tables.add(table="public.orders", state=pb.SNAPSHOT_RUNNING)  # stale version
    answer = client.update_snapshot(read, read.version)
    assert not answer.updated and [t.table for t in answer.state.tables] == ["public.items"]


def test_cancel_and_status_through_the_cli(client: ControlClient,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    captured(client, public__items=["id"])
    address = ["--control", client.address]
    assert main(["snapshot", "orders", "--table", "public.items", *address]) == 0
    assert "snapshot of public.items queued" in capsys.readouterr().out
    assert main(["snapshot", "status", "orders", "--json", *address]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["tables"][0]["state"] == "pending" and doc["tables"][0]["table"] == "public.items"
    assert main(["snapshot", "cancel", "orders", *address]) == 0
    assert client.snapshot_state("orders").tables[0].state == pb.SNAPSHOT_CANCELLED
    assert main(["snapshot", "cancel", "orders", *address]) == 1
    assert "no snapshot pending or running" in capsys.readouterr().err


def test_resnapshot_needs_confirmation_and_a_paused_pipeline(client: ControlClient) -> None:
    with pytest.raises(ControlRefused, match="--confirm shop-pg"):
        client.resnapshot("orders", "orders")
    with pytest.raises(ControlRefused, match="pause it first"):
        client.resnapshot("orders", "shop-pg")
    client.pause("orders")
    state = client.resnapshot("orders", "shop-pg")
    assert state.resnapshot_requested and state.source_id == "shop-pg"


def test_resnapshot_of_a_mysql_source(client: ControlClient) -> None:
    """MySQL/MariaDB sources take a resnapshot as PostgreSQL ones do (capture_mysql/identity.py)."""
    client.register_pipeline("shop", source_id="shop-my", source_type="mysql",
                             sinks=[("r1", "redis", True)])
    with pytest.raises(ControlRefused, match="pause it first"):
        client.resnapshot("shop", "shop-my")
    client.pause("shop")
    state = client.resnapshot("shop", "shop-my")
    assert state.resnapshot_requested and state.source_id == "shop-my"
    assert state.resnapshot_reason == "accepted by an operator (tailrace resnapshot)"


def test_a_table_a_resnapshot_left_uncleared_keeps_its_reset(client: ControlClient) -> None:
    """A resnapshot's table that failed before its first chunk (its TRUNCATE not on the bus)
    is requested again: the new request still clears the sinks first, and a filtered one
    is refused (it would clear them and read back only part of the table)."""
    state = captured(client, public__items=["id"])
    state.tables.append(pb.SnapshotTable(table="public.items", state=pb.SNAPSHOT_FAILED,
                                         reset=True, request_id=1, reason="resnapshot: x"))
    assert client.update_snapshot(state, state.version).updated
    refused(client, "must first be read whole after the resnapshot", tables=["public.items"],
            where="id > 5")
    again = client.request_snapshot("orders", ["public.items"], "")
    (entry,) = again.tables
    assert entry.state == pb.SNAPSHOT_PENDING and entry.reset
