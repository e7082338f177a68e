"""Server identities, reconcile records and health over gRPC, persisted across restarts of a
real `tailrace-control` process (SQLite and PostgreSQL storage)."""

from __future__ import annotations

import pytest

from tailrace.control_client import ControlRefused, identity
from tests.fix_control import ControlProcess

pytestmark = pytest.mark.integration

PRIMARY = {"system_identifier": "7301", "timeline": "1"}
PROMOTED = {"system_identifier": "7301", "timeline": "2"}


@pytest.fixture(params=["sqlite", "postgres"])
def storage_url(request, tmp_path):
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'state.db'}"
    return request.getfixturevalue("pg_db")


def test_first_seen_same_changed_survive_restarts(tmp_path, storage_url):
    control = ControlProcess(tmp_path, storage_url).start()
    try:
        with control.client("service", retry_for=10) as c:
            assert c.compare_identity("pg-main", "postgres", PRIMARY, "fp-1") == ("first_seen", None)
        control.restart()
        with control.client("service", retry_for=10) as c:
            verdict, previous = c.compare_identity("pg-main", "postgres", PRIMARY, "fp-1")
            assert verdict == "same" and dict(previous.attributes) == PRIMARY
        control.kill()
        control.start()
        with control.client("service", retry_for=10) as c:
            verdict, previous = c.compare_identity("pg-main", "postgres", PROMOTED, "fp-2")
            assert verdict == "changed" and previous.fingerprint == "fp-1"
            # Changed does not store: asked again, it is still changed
            assert c.compare_identity("pg-main", "postgres", PROMOTED, "fp-2")[0] == "changed"
            seq = c.add_reconcile_record(
                "pg-main", previous, identity("postgres", PROMOTED, "fp-2"),
                ["shop.orders: column note added"], "adapt")
            assert seq == 1
            replaced = c.store_identity("pg-main", "postgres", PROMOTED, "fp-2")
            assert replaced is not None and replaced.fingerprint == "fp-1"
            c.report_health("pg-main", "running")
        control.restart()
        with control.client("service", retry_for=10) as c:
            assert c.compare_identity("pg-main", "postgres", PROMOTED, "fp-2")[0] == "same"
            (record,) = c.list_reconcile_records("pg-main")
            assert (record.decision, list(record.drift)) == ("adapt",
                                                             ["shop.orders: column note added"])
            assert record.old_identity.fingerprint == "fp-1"
            assert record.new_identity.fingerprint == "fp-2" and record.ts_unix_ms > 0
            assert c.get_health("pg-main").state == 1  # HEALTH_RUNNING
    finally:
        control.stop()


def test_without_fingerprints_attributes_decide(tmp_path):
    with ControlProcess(tmp_path, "memory://") as control, control.client("service") as c:
        assert c.compare_identity("m", "mariadb", {"server_id": "1"}, "")[0] == "first_seen"
        assert c.compare_identity("m", "mariadb", {"server_id": "1"}, "")[0] == "same"
        assert c.compare_identity("m", "mariadb", {"server_id": "2"}, "")[0] == "changed"
        with pytest.raises(ControlRefused, match="neither a fingerprint nor attributes"):
            c.compare_identity("m", "mariadb", {}, "")
        c.add_reconcile_record("other", None, None, ["x"], "halt")
        assert [r.source_id for r in c.list_reconcile_records()] == ["other"]
        with pytest.raises(ValueError, match="running, position_lost"):
            c.report_health("m", "sleeping")
