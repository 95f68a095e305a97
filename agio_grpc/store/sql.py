"""The StepStore on SQLAlchemy 2 async: a SQLite file (aiosqlite) or PostgreSQL (asyncpg).

`open_store` creates the engine, migrates the schema to head and returns a `SqlStepStore`.
A session's sequences are allocated by bumping its `sessions.last_sequence` counter in the
same transaction that inserts the steps, so they stay gapless across tasks, processes and
replicas. SQLite writes are funnelled through one writer per process (an asyncio lock) and
take the database lock up front (`BEGIN IMMEDIATE`) against other processes.

Every public method raises only `StoreError` subclasses, or `ValueError` for a caller's
mistake; a driver exception never escapes. Never imports grpc or the engine.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, Final

from sqlalchemy import and_, case, delete, func, insert, or_, select, text, update
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from agio_grpc.domain import ContextSummary, Role, Run, Session, Step, new_id, utc_now
from agio_grpc.store.database import (
    DRIVER_ERRORS,
    WRITE_OPTION,
    as_store_error,
    check_sqlite_directory,
    create_store_engine,
    parse_url,
)
from agio_grpc.store.errors import (
    InvalidRangeError,
    NotFoundError,
    SessionBusyError,
    StoreError,
)
from agio_grpc.store.migrations import upgrade_to_head
from agio_grpc.store.protocol import StepStore
from agio_grpc.store.rows import (
    aware_utc,
    run_from_row,
    run_mutable_values,
    session_from_row,
    step_from_row,
    step_row,
    stored_copy,
    stored_run,
    stored_session,
)
from agio_grpc.store.tables import runs as run_table
from agio_grpc.store.tables import sessions as session_table
from agio_grpc.store.tables import steps as step_table

__all__ = ["SqlStepStore", "open_store"]

# Key of the PostgreSQL advisory lock that lets one replica at a time run migrations.
_MIGRATION_LOCK_KEY: Final = 0x6167696F  # "agio"


async def open_store(url: str, *, sqlite_synchronous: str = "NORMAL") -> SqlStepStore:
    """Connect to `url`, migrate the schema to head and return the store.

    `url` is `sqlite+aiosqlite:///path` or `postgresql+asyncpg://user@host/db` (the plain
    `sqlite://` and `postgresql://` forms pick those drivers). `sqlite_synchronous` is
    SQLite's `PRAGMA synchronous`: NORMAL survives an application crash, FULL also a power
    loss, at several times the cost per commit. Raises StoreUnavailableError when the
    database cannot be reached, ValueError for an unsupported URL.
    """
    parsed = parse_url(url)
    check_sqlite_directory(parsed)
    engine = create_store_engine(parsed, sqlite_synchronous)
    store = SqlStepStore(engine)
    try:
        await store._migrate()
    except BaseException:
        await engine.dispose()
        raise
    return store


class SqlStepStore:
    """A StepStore on one SQLAlchemy async engine. Build it with `open_store`."""

    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine
        self._is_sqlite = engine.dialect.name == "sqlite"
        # SQLite has one writer at a time: queue this process's writers here rather than
        # have them contend for the file lock; BEGIN IMMEDIATE covers other processes.
        self._write_lock = asyncio.Lock() if self._is_sqlite else None

    @property
    def backend(self) -> str:
        """The database dialect name: `sqlite` or `postgresql`."""
        return self._engine.dialect.name

    # -- sessions ------------------------------------------------------------------------

    async def create_session(self, session: Session | None = None) -> Session:
        stored = stored_session(session or Session())
        async with self._transaction(write=True) as conn:
            await conn.execute(
                insert(session_table).values(
                    id=stored.id,
                    parent_session_id=stored.parent_session_id or None,
                    fork_sequence=stored.fork_sequence,
                    create_time=stored.create_time,
                    update_time=stored.update_time,
                    last_sequence=0,
                    active_run_id=stored.active_run_id or None,
                )
            )
        return stored

    async def get_session(self, session_id: str) -> Session:
        async with self._transaction(write=False) as conn:
            row = (
                await conn.execute(select(session_table).where(session_table.c.id == session_id))
            ).first()
        if row is None:
            raise NotFoundError("session", session_id)
        return session_from_row(row)

    async def list_sessions(
        self, limit: int, after: tuple[datetime, str] | None = None
    ) -> list[Session]:
        _check_limit(limit)
        created, session_id = session_table.c.create_time, session_table.c.id
        query = select(session_table).order_by(created.desc(), session_id.desc()).limit(limit)
        if after is not None:
            query = query.where(_older_than(created, session_id, after))
        async with self._transaction(write=False) as conn:
            rows = (await conn.execute(query)).all()
        return [session_from_row(row) for row in rows]

    async def delete_session(self, session_id: str) -> int:
        async with self._transaction(write=True) as conn:
            # Steps and runs go with the session by ON DELETE CASCADE.
            deleted_steps = (
                await conn.execute(
                    delete(session_table)
                    .where(session_table.c.id == session_id)
                    .returning(session_table.c.last_sequence)
                )
            ).scalar_one_or_none()
        if deleted_steps is None:
            raise NotFoundError("session", session_id)
        return int(deleted_steps)

    # -- steps ---------------------------------------------------------------------------

    async def append_steps(self, steps: Sequence[Step]) -> list[Step]:
        if not steps:
            return []
        session_id = steps[0].session_id
        if any(step.session_id != session_id for step in steps):
            raise ValueError("append_steps takes steps of one session per call")
        count = len(steps)
        async with self._transaction(write=True) as conn:
            last = await self._allocate_sequences(conn, session_id, count)
            first = last - count + 1
            # Read the clock only once the sequences are ours, so create_time follows
            # sequence order even when writers queued for the session.
            now = utc_now()
            stored = [
                stored_copy(step, sequence=first + offset, create_time=now)
                for offset, step in enumerate(steps)
            ]
            await conn.execute(insert(step_table), [step_row(step) for step in stored])
        return stored

    async def append_step(self, step: Step) -> Step:
        return (await self.append_steps([step]))[0]

    async def get_steps(
        self, session_id: str, start: int = 1, end: int | None = None, limit: int | None = None
    ) -> list[Step]:
        query = (
            select(step_table)
            .where(step_table.c.session_id == session_id, step_table.c.sequence >= start)
            .order_by(step_table.c.sequence)
        )
        if end is not None:
            query = query.where(step_table.c.sequence <= end)
        if limit is not None:
            _check_limit(limit)
            query = query.limit(limit)
        async with self._transaction(write=False) as conn:
            rows = (await conn.execute(query)).all()
            if not rows:
                await _require_session(conn, session_id)
        return [step_from_row(row) for row in rows]

    async def get_step(self, session_id: str, sequence: int) -> Step:
        async with self._transaction(write=False) as conn:
            row = (
                await conn.execute(
                    select(step_table).where(
                        step_table.c.session_id == session_id, step_table.c.sequence == sequence
                    )
                )
            ).first()
            if row is None:
                await _require_session(conn, session_id)
                raise NotFoundError("step", f"{session_id}#{sequence}")
        return step_from_row(row)

    async def get_last_step(self, session_id: str) -> Step | None:
        async with self._transaction(write=False) as conn:
            row = (
                await conn.execute(
                    select(step_table)
                    .where(step_table.c.session_id == session_id)
                    .order_by(step_table.c.sequence.desc())
                    .limit(1)
                )
            ).first()
            if row is None:
                await _require_session(conn, session_id)
                return None
        return step_from_row(row)

    async def count_steps(self, session_id: str) -> int:
        # Sequences are exactly 1..N, so the counter is the count.
        async with self._transaction(write=False) as conn:
            return await _require_session(conn, session_id)

    async def delete_steps_from(self, session_id: str, start_sequence: int) -> int:
        async with self._transaction(write=True) as conn:
            # The row lock keeps appends and forks out until the counter is reset.
            last = await _require_session(conn, session_id, lock=True)
            if start_sequence < 1:
                raise InvalidRangeError(
                    f"start_sequence must be at least 1, got {start_sequence}",
                    field="start_sequence",
                    last_sequence=last,
                )
            if start_sequence > last:
                return 0
            result = await conn.execute(
                delete(step_table).where(
                    step_table.c.session_id == session_id, step_table.c.sequence >= start_sequence
                )
            )
            await conn.execute(
                update(session_table)
                .where(session_table.c.id == session_id)
                .values(last_sequence=start_sequence - 1, update_time=utc_now())
            )
            return int(result.rowcount)

    async def fork_session(self, session_id: str, up_to_sequence: int) -> Session:
        async with self._transaction(write=True) as conn:
            # A shared lock: other forks may read along, deletes and appends wait.
            last = await _require_session(conn, session_id, lock=True, shared=True)
            if not 0 <= up_to_sequence <= last:
                raise InvalidRangeError(
                    f"cannot fork session {session_id!r} at sequence {up_to_sequence}: "
                    f"its steps are 1..{last}",
                    field="sequence",
                    last_sequence=last,
                )
            now = utc_now()
            fork = Session(
                parent_session_id=session_id,
                fork_sequence=up_to_sequence,
                create_time=now,
                update_time=now,
                step_count=up_to_sequence,
            )
            await conn.execute(
                insert(session_table).values(
                    id=fork.id,
                    parent_session_id=session_id,
                    fork_sequence=up_to_sequence,
                    create_time=now,
                    update_time=now,
                    last_sequence=up_to_sequence,
                    active_run_id=None,
                )
            )
            parent_rows = (
                await conn.execute(
                    select(step_table)
                    .where(
                        step_table.c.session_id == session_id,
                        step_table.c.sequence <= up_to_sequence,
                    )
                    .order_by(step_table.c.sequence)
                )
            ).all()
            if parent_rows:
                # The copies keep run ids, create times and trace ids: a fork copies history.
                copies = [
                    {**row._mapping, "id": new_id("step"), "session_id": fork.id}
                    for row in parent_rows
                ]
                await conn.execute(insert(step_table), copies)
        return fork

    async def context_summary(self, session_id: str) -> ContextSummary:
        def count_role(role: Role) -> Any:
            return func.coalesce(func.sum(case((step_table.c.role == role.value, 1), else_=0)), 0)

        query = select(
            func.count(),
            count_role(Role.USER),
            count_role(Role.ASSISTANT),
            count_role(Role.TOOL),
            func.coalesce(
                func.sum(
                    case(
                        (step_table.c.role == Role.ASSISTANT.value, step_table.c.tool_call_count),
                        else_=0,
                    )
                ),
                0,
            ),
            func.coalesce(func.min(step_table.c.sequence), 0),
            func.coalesce(func.max(step_table.c.sequence), 0),
            func.coalesce(func.sum(step_table.c.total_tokens), 0),
        ).where(step_table.c.session_id == session_id)
        async with self._transaction(write=False) as conn:
            row = (await conn.execute(query)).one()
            if row[0] == 0:
                await _require_session(conn, session_id)
        total, user, assistant, tool, tool_calls, min_seq, max_seq, tokens = (int(v) for v in row)
        return ContextSummary(
            total_steps=total,
            user_steps=user,
            assistant_steps=assistant,
            tool_steps=tool,
            tool_calls=tool_calls,
            min_sequence=min_seq,
            max_sequence=max_seq,
            total_tokens=tokens,
        )

    # -- runs ----------------------------------------------------------------------------

    async def create_run(self, run: Run) -> Run:
        stored = stored_run(run)
        async with self._transaction(write=True) as conn:
            await _require_session(conn, run.session_id)
            await conn.execute(
                insert(run_table).values(
                    id=stored.id,
                    session_id=stored.session_id,
                    agent=stored.agent,
                    create_time=stored.create_time,
                    request_id=stored.request_id,
                    **run_mutable_values(stored),
                )
            )
        return stored

    async def update_run(self, run: Run) -> Run:
        stored = stored_run(run)
        async with self._transaction(write=True) as conn:
            row = (
                await conn.execute(
                    update(run_table)
                    .where(run_table.c.id == run.id)
                    .values(**run_mutable_values(stored))
                    .returning(*run_table.c)
                )
            ).first()
        if row is None:
            raise NotFoundError("run", run.id)
        return run_from_row(row)

    async def get_run(self, run_id: str) -> Run:
        async with self._transaction(write=False) as conn:
            row = (await conn.execute(select(run_table).where(run_table.c.id == run_id))).first()
        if row is None:
            raise NotFoundError("run", run_id)
        return run_from_row(row)

    async def list_runs(
        self, session_id: str, limit: int, after: tuple[datetime, str] | None = None
    ) -> list[Run]:
        _check_limit(limit)
        created, run_id = run_table.c.create_time, run_table.c.id
        query = (
            select(run_table)
            .where(run_table.c.session_id == session_id)
            .order_by(created.desc(), run_id.desc())
            .limit(limit)
        )
        if after is not None:
            query = query.where(_older_than(created, run_id, after))
        async with self._transaction(write=False) as conn:
            rows = (await conn.execute(query)).all()
            if not rows:
                await _require_session(conn, session_id)
        return [run_from_row(row) for row in rows]

    # -- the one active run per session --------------------------------------------------

    async def acquire_session(self, session_id: str, run_id: str) -> None:
        if not run_id:
            raise ValueError("acquire_session needs a run id")
        async with self._transaction(write=True) as conn:
            # Compare-and-set in the database, so it holds across processes and replicas.
            # Not re-entrant: two continuations of one run (a submit and a cancel) exclude
            # each other too.
            taken = (
                await conn.execute(
                    update(session_table)
                    .where(
                        session_table.c.id == session_id,
                        or_(
                            session_table.c.active_run_id.is_(None),
                            session_table.c.active_run_id == "",
                        ),
                    )
                    .values(active_run_id=run_id)
                    .returning(session_table.c.id)
                )
            ).first()
            if taken is not None:
                return
            holder = (
                await conn.execute(
                    select(session_table.c.active_run_id).where(session_table.c.id == session_id)
                )
            ).first()
        if holder is None:
            raise NotFoundError("session", session_id)
        raise SessionBusyError(session_id, str(holder.active_run_id or ""))

    async def release_session(self, session_id: str, run_id: str) -> None:
        async with self._transaction(write=True) as conn:
            await conn.execute(
                update(session_table)
                .where(session_table.c.id == session_id, session_table.c.active_run_id == run_id)
                .values(active_run_id=None)
            )

    async def close(self) -> None:
        with contextlib.suppress(*DRIVER_ERRORS):
            await self._engine.dispose()

    # -- plumbing ------------------------------------------------------------------------

    async def _migrate(self) -> None:
        async with self._transaction(write=True) as conn:
            if self._engine.dialect.name == "postgresql":
                # Replicas starting together take turns; the later ones find head applied.
                await conn.execute(
                    text("SELECT pg_advisory_xact_lock(:key)"), {"key": _MIGRATION_LOCK_KEY}
                )
            await conn.run_sync(upgrade_to_head)

    async def _allocate_sequences(self, conn: AsyncConnection, session_id: str, count: int) -> int:
        """Reserve `count` sequences in the session; returns the last one reserved.

        The UPDATE row-locks the session on PostgreSQL until commit, so concurrent appends
        queue here and each sees the counter the previous one committed.
        """
        last = (
            await conn.execute(
                update(session_table)
                .where(session_table.c.id == session_id)
                .values(last_sequence=session_table.c.last_sequence + count, update_time=utc_now())
                .returning(session_table.c.last_sequence)
            )
        ).scalar_one_or_none()
        if last is None:
            raise NotFoundError("session", session_id)
        return int(last)

    @contextlib.asynccontextmanager
    async def _transaction(self, *, write: bool) -> AsyncIterator[AsyncConnection]:
        """One transaction; driver errors leave it as StoreError subclasses."""
        try:
            async with contextlib.AsyncExitStack() as stack:
                if write and self._write_lock is not None:
                    await stack.enter_async_context(self._write_lock)
                try:
                    conn = await stack.enter_async_context(self._engine.connect())
                except DRIVER_ERRORS as error:
                    raise as_store_error(error, connecting=True) from error
                if write and self._is_sqlite:
                    await conn.execution_options(**{WRITE_OPTION: True})
                await stack.enter_async_context(conn.begin())
                yield conn
        except StoreError:
            raise
        except DRIVER_ERRORS as error:
            raise as_store_error(error) from error


# -- queries shared by the methods ------------------------------------------------


async def _require_session(
    conn: AsyncConnection, session_id: str, *, lock: bool = False, shared: bool = False
) -> int:
    """The session's last sequence; raises NotFoundError. `lock` row-locks it (PostgreSQL)."""
    query = select(session_table.c.last_sequence).where(session_table.c.id == session_id)
    if lock:
        query = query.with_for_update(read=shared)
    last = (await conn.execute(query)).scalar_one_or_none()
    if last is None:
        raise NotFoundError("session", session_id)
    return int(last)


def _older_than(create_time: Any, id_column: Any, after: tuple[datetime, str]) -> Any:
    """`(create_time, id) < after`, spelled out so both backends use the index."""
    after_time, after_id = aware_utc(after[0], "after"), after[1]
    return or_(create_time < after_time, and_(create_time == after_time, id_column < after_id))


def _check_limit(limit: int) -> None:
    if limit < 0:
        raise ValueError(f"limit must not be negative, got {limit}")


if TYPE_CHECKING:
    # The type checker proves the class implements every StepStore method, signature and all.
    _implements_protocol: type[StepStore] = SqlStepStore
