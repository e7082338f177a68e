"""PostgreSQL storage on a server that lacks its database (a compose volume made before the
control service stored its state there): the service creates it rather than failing."""

from __future__ import annotations

import uuid

import pytest

from tailrace_services.control.storage._base import StorageUnavailable
from tailrace_services.control.storage._postgres import PostgresStorage

pytestmark = pytest.mark.integration


def test_the_storage_creates_its_database_when_the_server_lacks_it(pg_server) -> None:
    name = f"control_{uuid.uuid4().hex[:8]}"
    storage = PostgresStorage(pg_server.dsn(name))
    try:
        storage.close()
        [[tables]] = pg_server.connect(name).execute(
            "SELECT count(*) FROM information_schema.tables WHERE table_schema = 'public'"
        ).fetchall()
        assert tables > 0, "its tables were made in the new database"
        PostgresStorage(pg_server.dsn(name)).close()  # a second start finds it there
    finally:
        pg_server.drop_database(name)


def test_a_user_who_may_not_create_it_is_told_what_to_do(pg_server) -> None:
    user = f"nocreate_{uuid.uuid4().hex[:6]}"
    pg_server.execute(f'CREATE ROLE "{user}" LOGIN NOCREATEDB')
    try:
        with pytest.raises(StorageUnavailable, match="does not exist and could not be created"
                           ".*CREATEDB"):
            PostgresStorage(pg_server.dsn(f"control_{uuid.uuid4().hex[:8]}", user=user))
    finally:
        pg_server.execute(f'DROP ROLE "{user}"')
