"""DSN parsing, the binlog settings check and server identity (MySQL `server_uuid`, MariaDB's mix)."""

from __future__ import annotations

import pytest

from tailrace.errors import ConfigError, SourceConfigurationError
from tailrace.proto.control_pb2 import ServerIdentity
from tailrace_services.capture_mysql.connection import (
    ConnectionSettings,
    ServerFacts,
    check_settings,
)
from tailrace_services.capture_mysql.gtid import MariadbBinlogState, MariadbGtidPosition
from tailrace_services.capture_mysql.identity import (
    describe_change,
    identity_attributes,
    identity_fingerprint,
)
from tailrace_services.capture_mysql.reader import BinlogHeader

GOOD = {"log_bin": "ON", "binlog_format": "ROW", "binlog_row_image": "FULL",
        "binlog_row_metadata": "FULL"}


def test_dsn() -> None:
    s = ConnectionSettings.from_dsn("mysql://cdc:s%40cret@db.example:3307/shop?ssl_ca=/ca.pem")
    assert (s.host, s.port, s.user, s.password, s.database) == (
        "db.example", 3307, "cdc", "s@cret", "shop")
    assert s.kwargs()["ssl"] == {"ca": "/ca.pem"}
    assert "s@cret" not in repr(s) and "s@cret" not in s.describe()
    with pytest.raises(ConfigError, match="not a MySQL DSN") as info:
        ConnectionSettings.from_dsn("postgresql://u:topsecret@h/db")
    assert "topsecret" not in str(info.value)


def test_settings_accepted() -> None:
    check_settings(GOOD, "src")
    check_settings({**GOOD, "binlog_format": "row", "log_bin": "1"}, "src")


@pytest.mark.parametrize(("name", "value", "fix"), [
    ("binlog_format", "MIXED", "set binlog_format=ROW"),
    ("binlog_row_image", "MINIMAL", "set binlog_row_image=FULL"),
    ("binlog_row_metadata", "MINIMAL", "set binlog_row_metadata=FULL"),
    ("log_bin", "OFF", "binary logging is off"),
])
def test_settings_refused_naming_the_setting(name: str, value: str, fix: str) -> None:
    with pytest.raises(SourceConfigurationError) as info:
        check_settings({**GOOD, name: value}, "src")
    assert fix in str(info.value) and "src" in str(info.value)


def test_every_bad_setting_is_named_at_once() -> None:
    with pytest.raises(SourceConfigurationError) as info:
        check_settings({"log_bin": "ON", "binlog_format": "STATEMENT"}, "src")
    assert len(info.value.problems) == 3 and "too old" in str(info.value)


def maria(server_id: int = 1, state: str = "0-1-10", first: str = "mysql-bin.000001",
          created: int = 1_700_000_000, datadir: int = 1_600_000_000) -> ServerFacts:
    return ServerFacts(flavor="mariadb", version="10.11", server_id=server_id, binlogs=[first],
                       gtid_binlog_pos=MariadbGtidPosition.parse(state),
                       gtid_binlog_state=MariadbBinlogState.parse(state),
                       first_binlog=BinlogHeader(first, created, MariadbGtidPosition()),
                       datadir_created=datadir)


def test_mysql_identity_is_the_server_uuid() -> None:
    a = ServerFacts(flavor="mysql", version="8.4", server_id=1, binlogs=[],
                    server_uuid="3e11fa47-71ca-11e1-9e33-c80aa9429562")
    b = ServerFacts(flavor="mysql", version="8.4", server_id=9, binlogs=["x"],
                    server_uuid="3e11fa47-71ca-11e1-9e33-c80aa9429562")
    c = ServerFacts(flavor="mysql", version="8.4", server_id=1, binlogs=[],
                    server_uuid="19d69c1e-ae97-4b8c-a1ef-9e12ba966457")
    fp = [identity_fingerprint("mysql", identity_attributes(f)) for f in (a, b, c)]
    assert fp[0] == fp[1] != fp[2]


def test_mariadb_identity_combines_server_id_domains_and_data_directory() -> None:
    base = identity_fingerprint("mariadb", identity_attributes(maria()))
    # purged or reset binlogs are the same server
    for same in (maria(state="0-1-99"), maria(created=1_700_000_001),
                 maria(first="mysql-bin.000004")):
        assert identity_fingerprint("mariadb", identity_attributes(same)) == base
    for other in (maria(server_id=2), maria(state="0-1-10,1-1-3"), maria(datadir=1_600_000_001)):
        assert identity_fingerprint("mariadb", identity_attributes(other)) != base
    with_schema = {**identity_attributes(maria()), "schema:shop.t": "abc"}
    assert identity_fingerprint("mariadb", with_schema) == base  # schemas are not identity


def test_change_description() -> None:
    # an identity stored by an older version carries schema digests: they are not identity
    old = ServerIdentity(flavor="mariadb", attributes={
        **identity_attributes(maria()), "schema:shop.a": "1", "schema:shop.b": "2"})
    new = identity_attributes(maria(server_id=2))
    assert describe_change(old, new) == "server identity changed: server_id 1 -> 2"
