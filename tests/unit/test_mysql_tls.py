"""TLS options of a MySQL DSN become PyMySQL's `ssl` argument; unknown ones are refused."""

from __future__ import annotations

import pytest

from tailrace.errors import ConfigError
from tailrace_services.capture_mysql.connection import ConnectionSettings, ssl_settings


def test_no_tls_options_no_tls():
    assert ssl_settings({}) is None
    assert "ssl" not in ConnectionSettings.from_dsn("mysql://u:p@db:3306/").kwargs()


def test_client_certificate_and_verification():
    dsn = ("mysql://u:p@db:3306/?ssl_ca=/ca.pem&ssl_cert=/c.pem&ssl_key=/c.key"
           "&ssl_key_password=k3y&ssl_verify_cert=true&ssl_verify_identity=false")
    assert ConnectionSettings.from_dsn(dsn).kwargs()["ssl"] == {
        "ca": "/ca.pem", "cert": "/c.pem", "key": "/c.key", "password": "k3y",
        "verify_mode": True, "check_hostname": False}


def test_unknown_or_malformed_options_are_refused():
    with pytest.raises(ConfigError, match="unknown option\\(s\\) ssl_mode; the TLS options are"):
        ssl_settings({"ssl_mode": "REQUIRED"})
    with pytest.raises(ConfigError, match="ssl_verify_cert='maybe' is not true or false"):
        ssl_settings({"ssl_ca": "/ca.pem", "ssl_verify_cert": "maybe"})
    with pytest.raises(ConfigError, match="ssl_key needs ssl_cert"):
        ssl_settings({"ssl_key": "/c.key"})
