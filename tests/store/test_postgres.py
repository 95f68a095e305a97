"""What only the PostgreSQL backend has to survive: a database that drops and refuses clients.

The behaviour both backends share lives in test_conformance.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import asyncpg
import pytest
from sqlalchemy import Connection, make_url
from sqlalchemy.dialects.postgresql.asyncpg import AsyncAdapt_asyncpg_connection
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import QueuePool

from agio_grpc.domain import Role, Run, RunStatus, Step, StopReason, StopSignal
from agio_grpc.store import StoreUnavailableError
from agio_grpc.store import database as database_module
from agio_grpc.store.database import PostgresDatabase, parse_url
from agio_grpc.store.records import QueueRequest
from agio_grpc.store.sql.starts import enqueue
from agio_grpc.store.sql.steps import require_session
from tests.postgres import asyncpg_dsn
from tests.roles import StoreRoles
from tests.store.test_leases import start, user

pytestmark = pytest.mark.postgres

ONLY_POSTGRES = pytest.mark.parametrize("backend", ["postgres"])


async def admin_execute(admin_url: str, statement: str) -> None:
    connection = await asyncpg.connect(asyncpg_dsn(admin_url), timeout=10)
    try:
        await connection.execute(statement)
    finally:
        await connection.close()


def kick_everyone_out(database: str) -> str:
    # With a timeout, each call returns once its backend has exited (its socket closed),
    # not as soon as it is signalled: the connections are dropped when this returns.
    return (
        "SELECT pg_terminate_backend(pid, 10000) FROM pg_stat_activity "
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


@ONLY_POSTGRES
async def test_the_pool_keeps_the_connections_it_is_sized_for(store_url: str) -> None:
    # Each transaction beyond the pool's size would open a connection (a TLS handshake and
    # a login) and close it again: with room for them, concurrent transactions reuse theirs.
    database = PostgresDatabase(parse_url(store_url), pool_size=3)
    try:
        first = {await database.run(backend_pid, write=False) for _ in range(5)}
        at_once = await asyncio.gather(*(database.run(backend_pid, write=False) for _ in range(3)))
        again = await asyncio.gather(*(database.run(backend_pid, write=False) for _ in range(3)))
    finally:
        await database.dispose()
    assert len(first) == 1  # one at a time: one connection, reused
    assert set(again) <= set(at_once) | first  # three at a time: kept, not reopened


def test_a_pool_without_connections_is_refused() -> None:
    with pytest.raises(ValueError, match="at least"):
        PostgresDatabase(parse_url("postgresql://agio@127.0.0.1/agio"), pool_size=0)


class Pings:
    """Counts the pings of pooled connections, and makes them fail on demand (a network
    that silently dropped the connection cannot be made here without hanging the ping)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        self.fail = False
        real: Callable[[AsyncAdapt_asyncpg_connection], None] = AsyncAdapt_asyncpg_connection.ping

        def ping(connection: AsyncAdapt_asyncpg_connection) -> None:
            self.count += 1
            if self.fail:
                raise ConnectionResetError("the network dropped this connection")
            real(connection)

        monkeypatch.setattr(AsyncAdapt_asyncpg_connection, "ping", ping)


@pytest.fixture
async def one_connection(store_url: str) -> AsyncIterator[PostgresDatabase]:
    database = PostgresDatabase(parse_url(store_url), pool_size=1)
    try:
        yield database
    finally:
        await database.dispose()


def backend_pid(conn: Connection) -> int:
    return int(conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one())


@ONLY_POSTGRES
async def test_a_connection_used_just_now_is_not_pinged_and_an_idle_one_is(
    one_connection: PostgresDatabase, monkeypatch: pytest.MonkeyPatch
) -> None:
    # pool_pre_ping's three round trips per checkout were most of a short transaction's.
    pings = Pings(monkeypatch)
    # A window no pause of a busy machine outlasts: "just now" must not depend on its speed.
    monkeypatch.setattr(database_module, "PING_AFTER_IDLE_S", 3600.0)
    pids = {await one_connection.run(backend_pid, write=True) for _ in range(5)}
    assert (pings.count, len(pids)) == (0, 1)

    monkeypatch.setattr(database_module, "PING_AFTER_IDLE_S", 0.0)  # idle long enough
    assert await one_connection.run(backend_pid, write=False) in pids
    assert pings.count == 1


@ONLY_POSTGRES
async def test_an_idle_connection_that_fails_its_ping_is_replaced(
    one_connection: PostgresDatabase, monkeypatch: pytest.MonkeyPatch
) -> None:
    pings = Pings(monkeypatch)
    before = await one_connection.run(backend_pid, write=True)
    monkeypatch.setattr(database_module, "PING_AFTER_IDLE_S", 0.0)
    pings.fail = True

    after = await one_connection.run(backend_pid, write=True)  # a new connection, no error

    assert pings.count == 1  # the new connection was not pinged: it had just connected
    assert after != before


@ONLY_POSTGRES
@pytest.mark.parametrize("answer", [False, True], ids=["no_step", "with_its_answer"])
async def test_an_end_that_waited_for_a_queueing_start_reports_the_run_it_queued(
    store: StoreRoles, store_url: str, postgres_admin_url: str, answer: bool
) -> None:
    # Under READ COMMITTED a statement that waited for a row lock keeps the snapshot it
    # took before the wait: the end's check for queued runs must come after its wait. The
    # end is one statement (store/sql/single.py), with or without a last step.
    holder = await start(store)
    queued = Run(session_id=holder.session_id, agent="a")
    database = make_url(store_url).database or ""

    def queue_under_the_session_lock(conn: Connection) -> None:
        require_session(conn, holder.session_id, lock=True)
        steps = [user(queued.session_id, queued.id)]
        enqueue(conn, queued, steps, [], holder.id, QueueRequest(10), None, None)

    engine = create_async_engine(store_url)
    try:
        async with engine.connect() as conn:
            await conn.run_sync(queue_under_the_session_lock)  # its transaction stays open
            answer_step = Step(
                session_id=holder.session_id, run_id=holder.id, role=Role.ASSISTANT, sequence=2
            )
            ending = asyncio.create_task(
                store.end_run(
                    holder.ended(StopSignal(StopReason.COMPLETED)),
                    steps=[answer_step] if answer else (),
                )
            )
            await until_a_backend_waits_for_a_lock(postgres_admin_url, database)
            await conn.commit()
        ended = await ending
    finally:
        await engine.dispose()

    assert ended.queued
    assert [step.sequence for step in ended.steps] == ([2] if answer else [])
    assert (await store.get_run(queued.id)).status is RunStatus.QUEUED


async def until_a_backend_waits_for_a_lock(admin_url: str, database: str) -> None:
    query = (
        "SELECT count(*) > 0 FROM pg_stat_activity WHERE datname = $1 AND wait_event_type = 'Lock'"
    )
    await until_true(admin_url, query, database, failure="the end never waited for the lock")


async def until_true(admin_url: str, query: str, *args: object, failure: str) -> None:
    """Poll `query` on an admin connection until it answers true: up to 30 s, where what it
    waits for takes milliseconds."""
    connection = await asyncpg.connect(asyncpg_dsn(admin_url), timeout=10)
    try:
        for _ in range(3000):
            if await connection.fetchval(query, *args):
                return
            await asyncio.sleep(0.01)
        raise AssertionError(failure)
    finally:
        await connection.close()


async def until_a_backend_sleeps(admin_url: str, database: str) -> None:
    query = (
        "SELECT count(*) > 0 FROM pg_stat_activity "
        "WHERE datname = $1 AND state = 'active' AND query LIKE 'SELECT pg_sleep%'"
    )
    await until_true(admin_url, query, database, failure="the statement never reached the server")


def sleep_long(conn: Connection) -> None:
    conn.exec_driver_sql("SELECT pg_sleep(60)")


@ONLY_POSTGRES
@pytest.mark.parametrize("how", ["transaction", "statement"])
async def test_a_cancelled_statement_gives_its_connection_back_to_the_pool(
    one_connection: PostgresDatabase, store_url: str, postgres_admin_url: str, how: str
) -> None:
    # A run cancelled (its caller gone, its deadline past) while its statement waits on the
    # server: the task ends at once, and the pool's one connection serves the next one.
    database = make_url(store_url).database or ""
    before = await one_connection.run(backend_pid, write=True)
    if how == "transaction":
        waiting = asyncio.create_task(one_connection.run(sleep_long, write=True))
    else:
        waiting = asyncio.create_task(one_connection.run_statement(sleep_long))
    await until_a_backend_sleeps(postgres_admin_url, database)

    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting

    async with asyncio.timeout(30):  # not the 60 s of the cancelled sleep
        after = await one_connection.run(backend_pid, write=False)
        assert await one_connection.read_statement(backend_pid) == after
    pool = one_connection._engine.sync_engine.pool
    assert isinstance(pool, QueuePool)
    assert pool.checkedout() == 0
    # SQLAlchemy takes a connection whose statement was cancelled as lost: a new one
    # serves the next transaction, and the server's backend of the old one has ended.
    assert after != before
    await until_the_backend_is_gone(postgres_admin_url, before)


async def until_the_backend_is_gone(admin_url: str, pid: int) -> None:
    # Within 30 s: half the cancelled statement's sleep.
    query = "SELECT count(*) = 0 FROM pg_stat_activity WHERE pid = $1"
    await until_true(admin_url, query, pid, failure=f"backend {pid} still runs its statement")
