"""Connecting to MySQL/MariaDB: the DSN, the settings CDC needs, and the facts about the server.

`check_settings` refuses a server whose binlog cannot be captured faithfully,
naming the setting and how to change it:

- `log_bin` ON: there is no binlog to read otherwise;
- `binlog_format=ROW`: statements cannot be turned into row changes;
- `binlog_row_image=FULL`: before-images and unchanged columns must be whole;
- `binlog_row_metadata=FULL`: column names (and signedness, enum values,
  key columns) come from the table-map metadata of each row event; without
  them names would have to be looked up *now*, which gives rows written
  before a DDL the names of after it.

`read_facts` gathers what identity and reachability need in one place, so the
decisions made from them (`identity.py`, `position.py`) are plain functions.

TLS comes from the DSN's query options, as PyMySQL's `ssl` argument (`ssl_settings`):

    mysql://user:password@db:3306/?ssl_ca=/ca.pem&ssl_cert=/client.pem&ssl_key=/client.key

- `ssl_ca` / `ssl_capath`: trust; with one of them the server's certificate and host name
  are verified (`ssl_verify_cert=false`, `ssl_verify_identity=false` relax that);
- `ssl_cert`, `ssl_key` (and `ssl_key_password` for an encrypted key): a client certificate;
- `ssl_cipher`: the cipher list.

Any of them turns TLS on. An unknown `ssl_…` option is refused, never ignored.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import pymysql

from tailrace.errors import ConfigError, SourceConfigurationError
from tailrace.logs import get_logger, redact
from tailrace_services.capture_mysql.errors import connect_error
from tailrace_services.capture_mysql.gtid import (
    Flavor,
    MariadbBinlogState,
    MariadbGtidPosition,
    MysqlGtidSet,
)
from tailrace_services.capture_mysql.reader import BinlogHeader, read_binlog_header

__all__ = ["REQUIRED_SETTINGS", "SSL_OPTIONS", "ConnectionSettings", "ServerFacts",
           "check_settings", "connect", "one_row", "read_facts", "ssl_settings"]

log = get_logger(__name__)

REQUIRED_SETTINGS = {
    "binlog_format": "ROW",
    "binlog_row_image": "FULL",
    "binlog_row_metadata": "FULL",
}
_FILES = {"ssl_ca": "ca", "ssl_capath": "capath", "ssl_cert": "cert", "ssl_key": "key",
          "ssl_key_password": "password", "ssl_cipher": "cipher"}
_FLAGS = {"ssl_verify_cert": "verify_mode", "ssl_verify_identity": "check_hostname"}
SSL_OPTIONS = (*_FILES, *_FLAGS)
_TRUE, _FALSE = ("true", "1", "yes", "on"), ("false", "0", "no", "off")


@dataclass(frozen=True)
class ConnectionSettings:
    """`mysql://user:password@host:port/db` (also `mariadb://`); the password is never shown."""

    host: str
    port: int = 3306
    user: str = "root"
    password: str = field(default="", repr=False)
    database: str | None = None
    options: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_dsn(cls, dsn: str) -> ConnectionSettings:
        try:
            url = urlsplit(dsn)
            port = url.port or 3306
        except ValueError as e:
            raise ConfigError(redact(f"spec.source.dsn: invalid MySQL DSN {dsn!r}: {e}")) from None
        if url.scheme not in ("mysql", "mariadb") or not url.hostname:
            raise ConfigError(redact(f"spec.source.dsn: {dsn!r} is not a MySQL DSN; use "
                                     "mysql://user:password@host:3306/"))
        options = {k: v[-1] for k, v in parse_qs(url.query).items()}
        return cls(host=url.hostname, port=port, user=unquote(url.username or "root"),
                   password=unquote(url.password or ""),
                   database=url.path.lstrip("/") or None, options=options)

    def kwargs(self) -> dict[str, Any]:
        """pymysql.connect / BinLogStreamReader connection settings (holds the password)."""
        out: dict[str, Any] = {"host": self.host, "port": self.port, "user": self.user,
                               "password": self.password}
        ssl = ssl_settings(self.options)  # ssl_ca, ssl_cert, ssl_key, ssl_verify_cert, ...
        if ssl is not None:
            out["ssl"] = ssl
        return out

    def describe(self) -> str:
        return f"{self.user}@{self.host}:{self.port}"


def ssl_settings(options: Mapping[str, str]) -> dict[str, Any] | None:
    """PyMySQL's `ssl` dict from the DSN options; None when the DSN asks for no TLS."""
    unknown = sorted(k for k in options if k.startswith("ssl") and k not in SSL_OPTIONS)
    if unknown:
        raise ConfigError(f"spec.source.dsn: unknown option(s) {', '.join(unknown)}; the TLS "
                          f"options are {', '.join(SSL_OPTIONS)}")
    ssl: dict[str, Any] = {key: options[name] for name, key in _FILES.items() if options.get(name)}
    for name, key in _FLAGS.items():
        value = options.get(name)
        if value is None:
            continue
        if value.lower() not in (*_TRUE, *_FALSE):
            raise ConfigError(f"spec.source.dsn: {name}={value!r} is not true or false")
        ssl[key] = value.lower() in _TRUE
    if not ssl:
        return None
    if "key" in ssl and "cert" not in ssl:
        raise ConfigError("spec.source.dsn: ssl_key needs ssl_cert (the client certificate)")
    return ssl


def connect(settings: ConnectionSettings, timeout: float = 10.0) -> pymysql.connections.Connection:
    """An autocommit connection; errors say whether retrying helps."""
    try:
        return pymysql.connect(**settings.kwargs(), autocommit=True, connect_timeout=timeout,
                               read_timeout=30, write_timeout=30, charset="utf8mb4")
    except pymysql.err.MySQLError as e:
        raise connect_error(e, settings.describe()) from None


def _variables(conn: pymysql.connections.Connection, names: list[str]) -> dict[str, str]:
    with conn.cursor() as cur:
        cur.execute("SHOW GLOBAL VARIABLES WHERE Variable_name IN ("
                    + ",".join(["%s"] * len(names)) + ")", names)
        return {str(k).lower(): str(v) for k, v in cur.fetchall()}


def check_settings(variables: dict[str, str], source_id: str) -> None:
    """Raise SourceConfigurationError naming every binlog setting that must change."""
    problems = []
    if variables.get("log_bin", "OFF").upper() not in ("ON", "1"):
        problems.append(f"source {source_id}: binary logging is off (log_bin=OFF); start the "
                        "server with log_bin enabled (--log-bin=mysql-bin, or log_bin in the "
                        "[mysqld] section of its config file)")
    for name, wanted in REQUIRED_SETTINGS.items():
        have = variables.get(name)
        if have is None:
            problems.append(f"source {source_id}: the server has no {name} setting (too old): "
                            f"MySQL 8.0.14+ or MariaDB 10.5+ with {name}={wanted} is required")
        elif have.upper() != wanted:
            problems.append(
                f"source {source_id}: {name} is {have!r}; set {name}={wanted} "
                f"(SET GLOBAL {name} = '{wanted}' and add {name}={wanted} to the [mysqld] "
                "section of the server's config file so it survives a restart)")
    if problems:
        raise SourceConfigurationError(problems)


@dataclass(frozen=True)
class ServerFacts:
    """What one (re)connect learns about the server; see identity.py and position.py."""

    flavor: Flavor
    version: str
    server_id: int
    binlogs: list[str]
    server_uuid: str = ""  # MySQL
    gtid_mode: str = "ON"  # MySQL; MariaDB always has GTIDs
    gtid_executed: MysqlGtidSet = field(default_factory=MysqlGtidSet)  # MySQL
    gtid_purged: MysqlGtidSet = field(default_factory=MysqlGtidSet)  # MySQL
    gtid_binlog_pos: MariadbGtidPosition = field(default_factory=MariadbGtidPosition)
    gtid_binlog_state: MariadbBinlogState = field(default_factory=MariadbBinlogState)
    first_binlog: BinlogHeader | None = None  # MariaDB: creation time and Gtid_list
    datadir_created: int = 0  # MariaDB: when mariadb-install-db made the data directory

    @property
    def oldest_binlog(self) -> str:
        return self.binlogs[0] if self.binlogs else ""

    @property
    def newest_binlog(self) -> str:
        return self.binlogs[-1] if self.binlogs else ""


def one_row(cur: pymysql.cursors.Cursor) -> tuple[Any, ...]:
    """The row of a query that always returns one (functions, server variables)."""
    row = cur.fetchone()
    if row is None:
        raise pymysql.err.DataError("the server returned no row")
    return row


def read_facts(conn: pymysql.connections.Connection, settings: ConnectionSettings,
               replica_server_id: int, source_id: str) -> ServerFacts:
    """Check the settings, then read version, ids, GTID state and the binlog list."""
    with conn.cursor() as cur:
        cur.execute("SELECT VERSION(), @@server_id")
        version, server_id = one_row(cur)
    flavor: Flavor = "mariadb" if "mariadb" in str(version).lower() else "mysql"
    names = ["log_bin", *REQUIRED_SETTINGS]
    names += (["gtid_binlog_pos", "gtid_binlog_state"] if flavor == "mariadb"
              else ["gtid_mode", "gtid_executed", "gtid_purged", "server_uuid"])
    variables = _variables(conn, names)
    check_settings(variables, source_id)
    with conn.cursor() as cur:
        cur.execute("SHOW BINARY LOGS")
        binlogs = [str(row[0]) for row in cur.fetchall()]
    if flavor == "mysql":
        return ServerFacts(
            flavor=flavor, version=str(version), server_id=int(server_id), binlogs=binlogs,
            server_uuid=variables.get("server_uuid", ""),
            gtid_mode=variables.get("gtid_mode", "OFF").upper(),
            gtid_executed=MysqlGtidSet.parse(variables.get("gtid_executed", "")),
            gtid_purged=MysqlGtidSet.parse(variables.get("gtid_purged", "")))
    first = read_binlog_header(settings.kwargs(), replica_server_id, binlogs[0]) \
        if binlogs else None
    with conn.cursor() as cur:  # a system table's creation time: made with the data directory
        cur.execute("SELECT UNIX_TIMESTAMP(CREATE_TIME) FROM information_schema.TABLES "
                    "WHERE TABLE_SCHEMA = 'mysql' AND TABLE_NAME = 'global_priv'")
        row = cur.fetchone()
    return ServerFacts(
        flavor=flavor, version=str(version), server_id=int(server_id), binlogs=binlogs,
        gtid_binlog_pos=MariadbGtidPosition.parse(variables.get("gtid_binlog_pos", "")),
        gtid_binlog_state=MariadbBinlogState.parse(variables.get("gtid_binlog_state", "")),
        first_binlog=first, datadir_created=int(row[0]) if row and row[0] else 0)


def binlog_bytes_from(settings: ConnectionSettings, file: str, offset: int
                      ) -> tuple[int, str] | None:
    """The binlog bytes the server keeps from `file`:`offset` to the end of its last binlog
    (`retained.RetainedLog`); None when it no longer has `file`."""
    conn = connect(settings)
    try:
        with conn.cursor() as cur:
            cur.execute("SHOW BINARY LOGS")
            logs = [(str(row[0]), int(row[1])) for row in cur.fetchall()]
    finally:
        conn.close()
    names = [name for name, _ in logs]
    if file not in names:
        return None
    at = names.index(file)
    kept = max(logs[at][1] - offset, 0) + sum(size for _, size in logs[at + 1:])
    return kept, f"binlogs from {file}:{offset} ({len(logs) - at} of {len(logs)} files)"
