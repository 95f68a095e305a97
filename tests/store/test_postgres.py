"""What only the PostgreSQL backend has to survive: a database that drops and refuses clients.

The behaviour both backends share lives in test_conformance.py.
"""

from __future__ import annotations

import asyncpg
import pytest
from sqlalchemy import Connection, make_url

from agio_grpc.store import StoreUnavailableError
from tests.postgres import asyncpg_dsn
from tests.roles import StoreRoles

pytestmark = pytest.mark.postgres

ONLY_POSTGRES = pytest.mark.parametrize("backend", ["postgres"])


async def admin_execute(admin_url: str, statement: str) -> None:
    connection = await asyncpg.connect(asyncpg_dsn(admin_url), timeout=10)
    try:
        await connection.execute(statement)
    finally:
        await connection.close()


def kick_everyone_out(database: str) -> str:
    return (
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
        f"WHERE datname = '{database}' AND pid <> pg_backend_pid()"
    )


@ONLY_POSTGRES
async def test_store_reconnects_after_the_server_drops_its_connections(
    store: StoreRoles, store_url: str, postgres_admin_url: str
) -> None:
    session = await store.new_session()
    database = make_url(store_url).database or ""

    await admin_execute(postgres_admin_url, kick_everyone_out(database))

    assert (await store.get_session(session.id)).id == session.id


@ONLY_POSTGRES
async def test_store_is_unavailable_while_the_database_refuses_connections_then_recovers(
    store: StoreRoles, store_url: str, postgres_admin_url: str
) -> None:
    session = await store.new_session()
    database = make_url(store_url).database or ""

    await admin_execute(postgres_admin_url, f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS false')
    try:
        await admin_execute(postgres_admin_url, kick_everyone_out(database))
        with pytest.raises(StoreUnavailableError):
            await store.get_session(session.id)
    finally:
        await admin_execute(
            postgres_admin_url, f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS true'
        )

    assert await store.step_count(session.id) == 0


@ONLY_POSTGRES
async def test_a_read_sees_one_snapshot_and_a_write_the_default_isolation(
    store: StoreRoles,
) -> None:
    # `get_history_since` checks a held step and reads after it in one read: both must see
    # the same log, so reads run at REPEATABLE READ; writes keep READ COMMITTED (their
    # row locks order them).
    def isolation(conn: Connection) -> str:
        return str(conn.exec_driver_sql("SHOW transaction_isolation").scalar())

    assert await store._database.run(isolation, write=False) == "repeatable read"
    assert await store._database.run(isolation, write=True) == "read committed"
    assert await store._database.run(isolation, write=False) == "repeatable read"
