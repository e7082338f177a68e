"""A throwaway MariaDB with a full row binlog and GTIDs, for tests and `make run`.

`--no-defaults` everywhere so the machine's /etc/mysql config (and the packaged service
on port 3306) play no part. Grant tables are real, not skipped: binlog readers log in as
a user with REPLICATION grants. root has an empty password and may log in over TCP.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import pymysql

from tailrace.devservers._base import DevServer
from tailrace.devservers._process import find_binary, run_checked, wait_until

__all__ = ["MariaDBServer"]

PACKAGE = "mariadb-server"

# Options both for install-db (it passes unknown ones on to mariadbd) and the server.
_STORAGE = [
    "--innodb-buffer-pool-size=32M",
    "--innodb-log-file-size=16M",
    "--character-set-server=utf8mb4",
    "--collation-server=utf8mb4_unicode_ci",
]


class MariaDBServer(DevServer):
    """MariaDB on 127.0.0.1:`port`: binlog ROW/FULL/FULL metadata, GTID strict mode."""

    name: ClassVar[str] = "mariadb"
    stop_timeout: ClassVar[float] = 30.0

    def __init__(
        self,
        *,
        port: int | None = None,
        server_id: int = 1,
        extra_args: Sequence[str] = (),
        startup_timeout: float = 60.0,
    ) -> None:
        super().__init__(port=port, startup_timeout=startup_timeout)
        self.server_id = server_id
        self.extra_args = list(extra_args)
        sbin = [Path("/usr/sbin"), Path("/usr/bin")]
        self.mariadbd = find_binary("mariadbd", package=PACKAGE, search_dirs=sbin)
        self.install_db = find_binary("mariadb-install-db", package=PACKAGE, search_dirs=sbin)
        # mariadbd refuses to run as root unless told to; elsewhere it runs as us.
        self._user_args = ["--user=root"] if os.geteuid() == 0 else []

    @property
    def datadir(self) -> Path:
        if self.dir is None:
            raise RuntimeError("mariadb has no data dir yet: call start() first")
        return self.dir / "data"

    @property
    def socket_path(self) -> Path:
        if self.dir is None:
            raise RuntimeError("mariadb has no socket yet: call start() first")
        return self.dir / "my.sock"

    def _prepare(self, directory: Path) -> None:
        run_checked(
            [
                self.install_db,
                "--no-defaults",
                "--auth-root-authentication-method=normal",
                f"--datadir={self.datadir}",
                # The bootstrap server deletes every #sql* file in its tmpdir when it
                # starts; in a shared /tmp it deletes a parallel install's temp tables.
                f"--tmpdir={directory}",
                "--skip-test-db",
                "--skip-name-resolve",
                *self._user_args,
                *_STORAGE,
            ],
            log_path=self.log_path,
            what="mariadb-install-db",
            cwd=directory,
        )

    def _command(self) -> list[str]:
        assert self.dir is not None
        return [
            self.mariadbd,
            "--no-defaults",
            *self._user_args,
            f"--datadir={self.datadir}",
            f"--port={self.port}",
            "--bind-address=127.0.0.1",
            f"--socket={self.socket_path}",
            f"--pid-file={self.dir / 'mariadb.pid'}",
            f"--tmpdir={self.dir}",
            "--skip-name-resolve",
            f"--server-id={self.server_id}",
            "--log-bin=mysql-bin",
            "--relay-log=relay-bin",  # default names embed the hostname
            "--binlog-format=ROW",
            "--binlog-row-image=FULL",
            "--binlog-row-metadata=FULL",
            "--log-slave-updates",
            "--gtid-strict-mode=1",
            "--innodb-flush-log-at-trx-commit=2",  # survives SIGKILL, not a host crash
            *_STORAGE,
            *self.extra_args,
        ]

    def _wait_ready(self, proc: subprocess.Popen[bytes]) -> None:
        def query() -> None:
            self.execute("SELECT 1")

        wait_until(
            query, proc=proc, log_path=self.log_path, what="mariadb", timeout=self.startup_timeout
        )

    # -- conveniences ------------------------------------------------------------------

    def dsn(self, db: str | None = None) -> str:
        """URI such as mysql://root@127.0.0.1:33061/shop (no path without `db`)."""
        base = f"mysql://root@{self.host}:{self.port}"
        return f"{base}/{db}" if db else base

    def connect_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for pymysql.connect (and pymysqlreplication's connection settings)."""
        return {"host": self.host, "port": self.port, "user": "root", "password": ""}

    def connect(self, db: str | None = None, **kwargs: Any) -> pymysql.connections.Connection:
        """An autocommit pymysql connection as root."""
        options = {**self.connect_kwargs(), "autocommit": True, "connect_timeout": 5, **kwargs}
        return pymysql.connect(database=db, **options)

    def execute(
        self, sql: str, params: Sequence[Any] | None = None, *, db: str | None = None
    ) -> list[tuple[Any, ...]]:
        """Run one statement in autocommit mode; return its rows ([] when it has none)."""
        conn = self.connect(db)
        try:
            with conn.cursor() as cur:
                cur.execute(sql, params)
                return list(cur.fetchall()) if cur.description is not None else []
        finally:
            conn.close()

    def create_database(self, name: str) -> str:
        """Create database `name` (utf8mb4) and return its DSN."""
        self.execute(f"CREATE DATABASE `{name.replace('`', '``')}`")
        return self.dsn(name)
