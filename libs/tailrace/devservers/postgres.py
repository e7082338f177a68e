"""A throwaway PostgreSQL with logical replication on, for tests and `make run`.

initdb + postgres on a free loopback port in a short temp dir (the unix socket lives
there too). PostgreSQL refuses to run as root, so as root it runs as the OS user
`postgres`. `synchronous_commit` stays on: with it off, fresh commits stay invisible to
logical decoding for up to 200 ms, which makes CDC tests flaky.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import psycopg

from tailrace.devservers._base import DevServer
from tailrace.devservers._process import DevServerError, run_checked, wait_until

__all__ = ["PostgresServer"]

PACKAGE = "postgresql"

_SETTINGS: dict[str, str | int] = {
    "listen_addresses": "127.0.0.1",
    "wal_level": "logical",
    "max_replication_slots": 20,
    "max_wal_senders": 20,
    "fsync": "off",  # survives SIGKILL of the server (the OS keeps the writes), not a host crash
    "shared_buffers": "64MB",
    "max_connections": 100,
}

_HBA = """\
local   all             all                     trust
host    all             all     127.0.0.1/32    trust
host    all             all     ::1/128         trust
local   replication     all                     trust
host    replication     all     127.0.0.1/32    trust
host    replication     all     ::1/128         trust
"""


def postgres_bindir() -> Path:
    """Directory with initdb and postgres: the highest /usr/lib/postgresql/N/bin, else PATH."""
    candidates = sorted(
        (p for p in Path("/usr/lib/postgresql").glob("*/bin") if p.parent.name.isdigit()),
        key=lambda p: int(p.parent.name),
        reverse=True,
    )
    pg_config = shutil.which("pg_config")
    if pg_config:
        out = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, check=False)
        if out.returncode == 0 and out.stdout.strip():
            candidates.append(Path(out.stdout.strip()))
    for directory in candidates:
        if (directory / "initdb").is_file() and (directory / "postgres").is_file():
            return directory
    on_path = shutil.which("initdb")
    if on_path:
        for directory in (Path(on_path).parent, Path(on_path).resolve().parent):
            if (directory / "postgres").is_file():
                return directory
    raise DevServerError(
        "initdb and postgres not found (searched /usr/lib/postgresql/*/bin, pg_config --bindir"
        f" and PATH): run `make setup`, which installs the Debian package {PACKAGE}"
    )


class PostgresServer(DevServer):
    """PostgreSQL with `wal_level=logical` on 127.0.0.1:`port`, trust auth, in a temp dir."""

    name: ClassVar[str] = "postgres"
    stop_signal: ClassVar[int] = signal.SIGINT  # "fast" shutdown: does not wait for clients

    def __init__(
        self,
        *,
        port: int | None = None,
        settings: Mapping[str, str | int] | None = None,
        startup_timeout: float = 60.0,
    ) -> None:
        super().__init__(port=port, startup_timeout=startup_timeout)
        self.bindir = postgres_bindir()
        self.settings = {**_SETTINGS, **(settings or {})}
        self._user = _os_user()

    @property
    def datadir(self) -> Path:
        if self.dir is None:
            raise RuntimeError("postgres has no data dir yet: call start() first")
        return self.dir / "data"

    def _run_as(self) -> str | None:
        return self._user

    def _prepare(self, directory: Path) -> None:
        if self._user is not None:
            import pwd

            entry = pwd.getpwnam(self._user)
            os.chown(directory, entry.pw_uid, entry.pw_gid)
        run_checked(
            [
                str(self.bindir / "initdb"),
                "--pgdata", str(self.datadir),
                "--username", "postgres",
                "--auth", "trust",
                "--encoding", "UTF8",
                "--locale", "C",
                "--no-sync",
                "--no-instructions",
            ],
            log_path=self.log_path,
            what="initdb",
            cwd=directory,
            user=self._user,
        )  # fmt: skip
        settings = {**self.settings, "port": self.port, "unix_socket_directories": str(directory)}
        lines = [f"{key} = {_quote(value)}" for key, value in settings.items()]
        with open(self.datadir / "postgresql.conf", "a") as conf:
            conf.write("\n# tailrace devserver\n" + "\n".join(lines) + "\n")
        (self.datadir / "pg_hba.conf").write_text(_HBA)

    def _command(self) -> list[str]:
        return [str(self.bindir / "postgres"), "-D", str(self.datadir)]

    def _wait_ready(self, proc: subprocess.Popen[bytes]) -> None:
        # The port opens before recovery ends ("the database system is starting up").
        def query() -> None:
            with psycopg.connect(self.dsn(), connect_timeout=2, autocommit=True) as conn:
                conn.execute("SELECT 1")

        wait_until(
            query, proc=proc, log_path=self.log_path, what="postgres", timeout=self.startup_timeout
        )

    # -- conveniences ------------------------------------------------------------------

    def dsn(self, dbname: str = "postgres", user: str = "postgres") -> str:
        """libpq URI, e.g. postgresql://postgres@127.0.0.1:54321/postgres."""
        return f"postgresql://{user}@{self.host}:{self.port}/{dbname}"

    def connect(self, dbname: str = "postgres", **kwargs: Any) -> psycopg.Connection[Any]:
        """An autocommit psycopg connection (pass autocommit=False to change that)."""
        kwargs.setdefault("autocommit", True)
        return psycopg.connect(self.dsn(dbname), **kwargs)

    def execute(
        self, sql: str, params: Sequence[Any] | None = None, *, dbname: str = "postgres"
    ) -> list[tuple[Any, ...]]:
        """Run one statement in autocommit mode; return its rows ([] when it has none)."""
        with self.connect(dbname) as conn, conn.cursor() as cur:
            cur.execute(sql, params)  # without params, % is sent as it is
            return cur.fetchall() if cur.description is not None else []

    def create_database(self, name: str) -> str:
        """Create database `name` and return its DSN."""
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise ValueError(f"invalid database name {name!r}: use letters, digits and _")
        self.execute(f'CREATE DATABASE "{name}"')
        return self.dsn(name)

    def drop_database(self, name: str) -> None:
        """Drop database `name`, its replication slots and its sessions (walsenders too)."""
        self.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = %s AND pid <> pg_backend_pid()",
            [name],
        )
        wait_until(
            lambda: self._drop_slots(name),
            proc=self._require_proc(),
            log_path=self.log_path,
            what=f"dropping the replication slots of {name}",
            timeout=10,
        )
        self.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def _drop_slots(self, dbname: str) -> None:
        self.execute(
            "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots"
            " WHERE database = %s",
            [dbname],
        )

    def _require_proc(self) -> subprocess.Popen[bytes]:
        if self._proc is None:
            raise RuntimeError("postgres is not running: call start() first")
        return self._proc


def _os_user() -> str | None:
    """`postgres` when we are root (initdb and postgres refuse root), else None."""
    if os.geteuid() != 0:
        return None
    import pwd

    try:
        pwd.getpwnam("postgres")
    except KeyError:
        raise DevServerError(
            "running as root needs the OS user postgres to run the server: "
            f"run `make setup`, which installs the Debian package {PACKAGE} (it creates the user)"
        ) from None
    return "postgres"


def _quote(value: str | int) -> str:
    if isinstance(value, int):
        return str(value)
    return "'" + value.replace("'", "''") + "'"
