"""A malformed DSN is a configuration error naming the field, found without a server; the
password never appears in the message."""

from __future__ import annotations

import pytest

from tailrace.config import parse_pipeline
from tailrace.config._dsn import check_mysql_dsn, check_postgres_dsn, config_error_of
from tailrace.errors import ConfigError, RetryableError

SPEC = """
apiVersion: tailrace/v1
kind: Pipeline
metadata: {{name: p}}
spec:
  source: {{type: {type}, id: s, dsn: "{dsn}", tables: [db.t]}}
  sinks:
    - {{id: r, type: redis, url: "redis://127.0.0.1:1/0"}}
  bus: {{brokers: "127.0.0.1:1"}}
"""


@pytest.mark.parametrize(("kind", "dsn", "message"), [
    ("postgres", "host=db port=notaport password=hunter2",
     "spec.source.dsn: port 'notaport' is not a port number; use 1..65535"),
    ("postgres", "postgresql://app:hunter2@db/shop?sslmode=bogus",
     "spec.source.dsn: sslmode 'bogus' is not one of disable, allow, prefer, require"),
    ("postgres", "postgresql://app:hunter2@db:99999/shop",
     "spec.source.dsn: port '99999' is not a port number"),
    ("postgres", "host=db connect_timeout=soon password=hunter2",
     "spec.source.dsn: connect_timeout 'soon' is not a whole number"),
    ("postgres", "postgresql://app:hunter2@db/shop?nonsense=1",
     'spec.source.dsn: not a valid PostgreSQL DSN: invalid URI query parameter: "…"'),
    ("mysql", "mysql://app:hunter2@db:notaport/shop",
     "spec.source.dsn: not a valid MySQL URL: the port is not a number in 1..65535"),
    ("mysql", "postgresql://app:hunter2@db/shop",
     "spec.source.dsn: not a MySQL URL (scheme 'postgresql'); use mysql://"),
    ("mysql", "mysql:///shop", "spec.source.dsn: the URL has no host"),
])
def test_a_malformed_dsn_is_refused_at_load_naming_the_field(kind: str, dsn: str,
                                                              message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_pipeline(SPEC.format(type=kind, dsn=dsn), source="p.yaml")
    assert str(caught.value).startswith(f"p.yaml: {message}")
    assert "hunter2" not in str(caught.value)


@pytest.mark.parametrize("dsn", ["postgresql://app:pw@db:5432/shop?sslmode=verify-full",
                                 "host=a,b port=5432,5433 dbname=shop target_session_attrs=primary",
                                 "dbname=shop"])
def test_valid_postgres_dsns_pass(dsn: str) -> None:
    check_postgres_dsn(dsn)


def test_valid_mysql_urls_pass() -> None:
    check_mysql_dsn("mysql://app:pw@db:3306/shop?ssl_ca=/ca.pem")
    check_mysql_dsn("mariadb://root@127.0.0.1/")


def test_a_sink_dsn_is_checked_too() -> None:
    spec = SPEC.format(type="postgres", dsn="dbname=shop").replace(
        '{id: r, type: redis, url: "redis://127.0.0.1:1/0"}',
        '{id: pg, type: postgres, dsn: "host=db sslmode=maybe password=hunter2"}')
    with pytest.raises(ConfigError, match=r"spec\.sinks\[0\]\.dsn: sslmode 'maybe'"):
        parse_pipeline(spec)


@pytest.mark.parametrize("text", [
    'connection is bad: invalid integer value "notaport" for connection option "port"',
    'cannot connect to PostgreSQL for replication: invalid sslmode value: "bogus"',
    'invalid connection option "sslmod"',
])
def test_libpq_refusing_the_dsn_is_a_config_error(text: str) -> None:
    error = config_error_of(RetryableError(text))
    assert error is not None
    assert str(error).startswith("spec.source.dsn: invalid ") and "fix the DSN" in str(error)


@pytest.mark.parametrize("text", [
    'connection failed: FATAL:  password authentication failed for user "app"',
    "connection refused", 'invalid input syntax for type integer: "x"'])
def test_server_answers_are_not_config_errors(text: str) -> None:
    assert config_error_of(RetryableError(text)) is None
