"""Prepared statements write and read exactly what `Connection.execute` does, and fail the way
it fails.

Each test runs transactions through the store's own `Database` on a migrated database
(the `store` fixture migrates it) and compares a prepared statement with the same Core
statement run through SQLAlchemy's execution layer. On SQLite they run on the DBAPI
cursor; on PostgreSQL through `Connection.execute` (`database.executes_directly`), and the
same tests hold that nothing changes for the store there.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import asyncpg
import pytest
from sqlalchemy import Connection, bindparam, insert, select, update
from sqlalchemy import exc as sa_exc

from agio_grpc.domain import Role, Step
from agio_grpc.store import SequenceConflictError, StoreError, StoreUnavailableError
from agio_grpc.store import prepared as prepared_module
from agio_grpc.store.database import Database, executes_directly, open_database, parse_url
from agio_grpc.store.prepared import Prepared
from agio_grpc.store.tables import runs, sessions, steps
from tests.postgres import asyncpg_dsn
from tests.roles import StoreRoles

T = TypeVar("T")

NOW = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)


@pytest.fixture
async def database(store: StoreRoles, store_url: str) -> AsyncIterator[Database]:
    """A second `Database` on the store's (migrated) database."""
    opened = open_database(parse_url(store_url), "NORMAL")
    try:
        yield opened
    finally:
        await opened.dispose()


async def write(database: Database, work: Callable[[Connection], T]) -> T:
    return await database.run(work, write=True)


def session_row(session_id: str) -> dict[str, Any]:
    return {
        "id": session_id,
        "parent_session_id": None,
        "fork_sequence": 0,
        "create_time": NOW,
        "update_time": NOW + timedelta(microseconds=1),
        "last_sequence": 0,
        "active_run_id": None,
        "lease_expires_at": None,
    }


def step_row(step_id: str, session_id: str, sequence: int) -> dict[str, Any]:
    return {
        "id": step_id,
        "session_id": session_id,
        "run_id": "run_1",
        "sequence": sequence,
        "role": "assistant",
        "content": "héllo ✓",
        "tool_calls": '[{"id": "c", "name": "n", "arguments": "{}"}]',
        "tool_call_count": 1,
        "is_error": True,
        "input_tokens": 7,
        "create_time": NOW,
    }


def stored(conn: Connection, table: Any, row_id: str, *leave_out: str) -> dict[str, Any]:
    """The row `row_id` as the driver returns it, without its id and `leave_out` columns."""
    row = conn.execute(select(table).where(table.c.id == row_id)).one()._asdict()
    return {name: value for name, value in row.items() if name not in ("id", *leave_out)}


async def test_prepared_inserts_store_the_rows_connection_execute_stores(
    database: Database,
) -> None:
    def work(conn: Connection) -> None:
        conn.execute(insert(sessions), session_row("sess_a"))
        Prepared(insert(sessions)).execute(conn, session_row("sess_b"))
        # A step in each session, so both get sequence 1.
        conn.execute(insert(steps), [step_row("step_a", "sess_a", 1)])
        Prepared(insert(steps)).execute_many(conn, [step_row("step_b", "sess_b", 1)])

    await write(database, work)

    def read(conn: Connection) -> None:
        assert stored(conn, sessions, "sess_a") == stored(conn, sessions, "sess_b")
        assert stored(conn, steps, "step_a", "session_id") == stored(
            conn, steps, "step_b", "session_id"
        )
        assert stored(conn, steps, "step_b")["create_time"] == NOW
        assert stored(conn, steps, "step_b")["is_error"] is True

    await database.run(read, write=False)


async def test_a_statement_keeps_its_own_literals_and_takes_the_callers_parameters(
    database: Database,
) -> None:
    insert_run = Prepared(insert(runs))
    end_running = Prepared(
        update(runs)
        .where(runs.c.id == bindparam("run_id"), runs.c.status == "RUNNING")
        .values(status=bindparam("status"))
    )
    latest = Prepared(select(runs.c.id).order_by(runs.c.create_time.desc()).limit(1))
    # One parameter in two places.
    named_twice = Prepared(
        select(runs.c.id).where(
            runs.c.agent == bindparam("name"), runs.c.trace_id != bindparam("name")
        )
    )

    def work(conn: Connection) -> tuple[int, int, Any, Any]:
        Prepared(insert(sessions)).execute(conn, session_row("sess_a"))
        for index, status in enumerate(["RUNNING", "COMPLETED"]):
            row = {
                "id": f"run_{index}",
                "session_id": "sess_a",
                "agent": "a",
                "status": status,
                "create_time": NOW + timedelta(seconds=index),
            }
            insert_run.execute(conn, row)
        ended = end_running.execute(conn, {"run_id": "run_0", "status": "FAILED"})
        # Only a RUNNING row matches the statement's literal.
        not_running = end_running.execute(conn, {"run_id": "run_1", "status": "FAILED"})
        return ended, not_running, latest.first(conn, {}), named_twice.first(conn, {"name": "a"})

    ended, not_running, newest, named = await write(database, work)

    assert (ended, not_running) == (1, 0)
    assert newest is not None
    assert newest[0] == "run_1"
    assert named is not None
    assert named[0] in ("run_0", "run_1")


async def test_a_driver_error_is_raised_as_sqlalchemy_raises_it(database: Database) -> None:
    def work(conn: Connection) -> None:
        Prepared(insert(sessions)).execute(conn, session_row("sess_a"))
        Prepared(insert(sessions)).execute(conn, session_row("sess_a"))

    with pytest.raises(StoreError, match="constraint violated") as raised:
        await write(database, work)
    assert isinstance(raised.value.__cause__, sa_exc.IntegrityError)
    # The whole transaction was rolled back.
    assert (
        await database.run(lambda conn: conn.execute(select(sessions.c.id)).all(), write=False)
        == []
    )


async def test_a_sequence_collision_through_a_prepared_insert_is_a_conflict(
    database: Database,
) -> None:
    def work(conn: Connection) -> None:
        Prepared(insert(sessions)).execute(conn, session_row("sess_a"))
        Prepared(insert(steps)).execute_many(
            conn, [step_row("step_a", "sess_a", 1), step_row("step_b", "sess_a", 1)]
        )

    with pytest.raises(SequenceConflictError):
        await write(database, work)


async def test_a_value_its_column_type_refuses_is_a_store_error(database: Database) -> None:
    naive = session_row("sess_a") | {"create_time": datetime(2026, 1, 1)}

    with pytest.raises(StoreError, match="naive datetime"):
        await write(database, lambda conn: Prepared(insert(sessions)).execute(conn, naive))


@pytest.mark.parametrize("backend", ["sqlite"])
@pytest.mark.parametrize(
    "parameter",
    [
        bindparam("ids", expanding=True),
        bindparam("ids", callable_=lambda: ["run_1"]),
        bindparam("ids", ["run_1"], literal_execute=True, expanding=True),
    ],
    ids=["expanding", "callable", "literal_execute"],
)
async def test_a_parameter_rendered_or_computed_per_call_is_refused(
    database: Database, parameter: Any
) -> None:
    per_call = Prepared(select(runs.c.id).where(runs.c.id.in_(parameter)))

    with pytest.raises(ValueError, match="prepared statement cannot take"):
        await database.run(lambda conn: per_call.first(conn, {"ids": ["run_1"]}), write=False)


def test_only_sqlite_statements_skip_sqlalchemys_execution_layer() -> None:
    sqlite_dialect = parse_url("sqlite:///agio.db").get_dialect()()
    postgres_dialect = parse_url("postgresql://localhost/agio").get_dialect()()

    assert executes_directly(sqlite_dialect)
    assert not executes_directly(postgres_dialect)


async def test_reading_steps_again_compiles_nothing(
    store: StoreRoles, monkeypatch: pytest.MonkeyPatch
) -> None:
    session = await store.new_session()
    step = Step(session_id=session.id, run_id="run_1", role=Role.USER, content="hi")
    await store.append_steps([step])

    async def read_every_way() -> None:
        await store.get_steps(session.id)
        await store.get_steps(session.id, 1, 1, limit=1)
        await store.get_history(session.id)
        await store.get_history(session.id, 1, 1)

    await read_every_way()
    compiled: list[Any] = []
    real_compile = prepared_module._compile

    def counted(*args: Any) -> Any:
        compiled.append(args[0])
        return real_compile(*args)

    monkeypatch.setattr(prepared_module, "_compile", counted)
    await read_every_way()

    assert compiled == []


async def test_a_connection_closed_under_a_transaction_is_invalidated_and_replaced(
    database: Database,
) -> None:
    seen: list[bool] = []

    def work(conn: Connection) -> None:
        dbapi = conn.connection.dbapi_connection
        assert dbapi is not None
        dbapi.close()  # as a driver whose connection went away
        try:
            Prepared(insert(sessions)).execute(conn, session_row("sess_a"))
        except sa_exc.DBAPIError as error:
            seen.append(error.connection_invalidated)
            assert conn.invalidated
            raise

    with pytest.raises(StoreUnavailableError):
        await write(database, work)

    assert seen == [True]
    await write(database, lambda conn: Prepared(insert(sessions)).execute(conn, session_row("s")))
    assert await database.run(
        lambda conn: conn.execute(select(sessions.c.id)).scalars().all(), write=False
    ) == ["s"]


@pytest.mark.parametrize("backend", ["postgres"])
async def test_a_connection_lost_mid_transaction_is_invalidated_and_replaced(
    database: Database, postgres_admin_url: str
) -> None:
    def terminate(pid: int) -> None:
        # From another connection, as the server would (a restart, an admin, a failover).
        async def kill() -> None:
            admin = await asyncpg.connect(asyncpg_dsn(postgres_admin_url), timeout=10)
            try:
                await admin.execute(f"SELECT pg_terminate_backend({pid})")
            finally:
                await admin.close()

        thread = threading.Thread(target=lambda: asyncio.run(kill()))
        thread.start()
        thread.join()

    seen: list[sa_exc.DBAPIError] = []

    def work(conn: Connection) -> None:
        terminate(int(conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one()))
        try:
            Prepared(insert(sessions)).execute(conn, session_row("sess_a"))
        except sa_exc.DBAPIError as error:
            seen.append(error)
            assert conn.invalidated
            raise

    with pytest.raises(StoreUnavailableError):
        await write(database, work)

    assert [error.connection_invalidated for error in seen] == [True]
    # The next transaction gets a new connection and finds nothing half-written.
    await write(database, lambda conn: Prepared(insert(sessions)).execute(conn, session_row("s")))
    assert await database.run(
        lambda conn: conn.execute(select(sessions.c.id)).scalars().all(), write=False
    ) == ["s"]
