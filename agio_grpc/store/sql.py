"""The StepStore on SQLAlchemy 2: a SQLite file or PostgreSQL (asyncpg).

`open_store` creates the engine, migrates the schema to head and returns a `SqlStepStore`.
A session's sequences are allocated by bumping its `sessions.last_sequence` counter in the
same transaction that inserts the steps, so they stay gapless across tasks, processes and
replicas.

Every operation is one transaction written as a plain function of a sync `Connection`
(`_work_*` below) and run in one go: on SQLite in a thread of the store's own (stdlib
sqlite3: one thread hop per transaction instead of several per statement, which cost ~2 ms
of CPU per transaction through aiosqlite), on PostgreSQL through asyncpg with
`AsyncConnection.run_sync`. SQLite writes are funnelled through one writer thread per
process and take the database lock up front (`BEGIN IMMEDIATE`) against other processes.
The statements every run runs (taking a session, storing steps and runs, ending a run,
reading steps) are `Prepared` (prepared.py): compiled by SQLAlchemy once and, on SQLite,
run on the DBAPI cursor without SQLAlchemy's per-execution layer.

The one active run per session is held under a lease (`sessions.lease_expires_at`, see the
protocol's docstring): taking a free session is one compare-and-set UPDATE; only when that
fails is the holder read (row-locked) to see whether its lease expired, and then taken over
with its run finalised in the same transaction.

A transaction that has started runs to its end even if the awaiting task is cancelled (the
task sees the cancellation; the database sees a whole transaction or none of it).

Every public method raises only `StoreError` subclasses, or `ValueError` for a caller's
mistake; a driver exception never escapes. Never imports grpc or the engine.
"""

from __future__ import annotations

import contextlib
import functools
import secrets
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Final, TypeVar, cast

from sqlalchemy import (
    Connection,
    and_,
    bindparam,
    case,
    delete,
    func,
    insert,
    or_,
    select,
    text,
    tuple_,
    update,
)

from agio_grpc.domain import (
    ContextSummary,
    Role,
    Run,
    RunStatus,
    Session,
    Step,
    StopReason,
    StopSignal,
    abandoned_run_signal,
    clean_text,
    new_id,
    unanswered_call_result,
    unfinished_reason,
    utc_now,
)
from agio_grpc.store.database import (
    DRIVER_ERRORS,
    Database,
    insert_ignoring_conflicts,
    open_database,
    parse_url,
    prepare_sqlite_file,
)
from agio_grpc.store.errors import (
    DuplicateRequestError,
    HistoryChangedError,
    InvalidRangeError,
    LeaseLostError,
    NotFoundError,
    QueueFullError,
    RunRequiresActionError,
    RunStateConflictError,
    SessionBusyError,
    TenantQuotaError,
)
from agio_grpc.store.keys import KeyStore
from agio_grpc.store.migrations import upgrade_to_head
from agio_grpc.store.prepared import Prepared
from agio_grpc.store.protocol import (
    TAKEOVER_SEQ_GAP,
    HistoryMark,
    HistoryRead,
    IdleEnd,
    Journal,
    JournalRecord,
    Member,
    QueueRequest,
    RunContinuation,
    RunEnd,
    RunStart,
    SessionLeases,
    StepStore,
    TenantQuotas,
    terminal_kind,
)
from agio_grpc.store.rows import (
    HISTORY_READ_COLUMNS,
    RUN_MUTABLE_COLUMNS,
    STEP_READ_COLUMNS,
    aware_utc,
    history_from_rows,
    journal_from_row,
    journal_row,
    run_from_row,
    run_mutable_values,
    session_from_row,
    step_row,
    steps_from_rows,
    stop_signal_from_json,
    stop_signal_json,
    stored_copy,
    stored_run,
    stored_session,
)
from agio_grpc.store.tables import members as member_table
from agio_grpc.store.tables import run_events as event_table
from agio_grpc.store.tables import runs as run_table
from agio_grpc.store.tables import server_secrets as secret_table
from agio_grpc.store.tables import sessions as session_table
from agio_grpc.store.tables import steps as step_table

__all__ = ["SqlStepStore", "open_store"]

T = TypeVar("T")

# Key of the PostgreSQL advisory lock that lets one replica at a time run migrations.
_MIGRATION_LOCK_KEY: Final = 0x6167696F  # "agio"
# First key of the advisory locks (one per tenant) under which a tenant's runs start when a
# quota bounds them.
_QUOTA_LOCK_SPACE: Final = 0x71756F74  # "quot"

DEFAULT_SESSION_LEASE_S: Final = 30.0
LEASE_EXPIRED_MESSAGE: Final = "the server running this run stopped (its lease expired)"
ABANDONED_MESSAGE: Final = "the server running this run stopped before it stored the run's end"


async def open_store(
    url: str,
    *,
    sqlite_synchronous: str = "NORMAL",
    session_lease_s: float = DEFAULT_SESSION_LEASE_S,
    instance_id: str = "",
    quotas: TenantQuotas | None = None,
) -> SqlStepStore:
    """Connect to `url`, migrate the schema to head and return the store.

    `url` is `sqlite+aiosqlite:///path` or `postgresql+asyncpg://user@host/db` (the plain
    `sqlite://` and `postgresql://` forms work too). `sqlite_synchronous` is SQLite's
    `PRAGMA synchronous`: NORMAL survives an application crash, FULL also a power loss, at
    several times the cost per commit. `session_lease_s` is how long a take or renewal holds
    a session (see the protocol); `instance_id` names this server on the sessions it takes,
    stable across its restarts, so that a restarted server can end the runs it left
    (`recover_own_runs`); `quotas` bounds each tenant's running and queued runs (none by
    default). Raises StoreUnavailableError when the database cannot be reached, ValueError
    for an unsupported URL or a lease that is not positive.
    """
    if not session_lease_s > 0:
        raise ValueError(f"session_lease_s must be positive, got {session_lease_s}")
    parsed = parse_url(url)
    prepare_sqlite_file(parsed)
    database = open_database(parsed, sqlite_synchronous)
    store = SqlStepStore(
        database, session_lease_s=session_lease_s, instance_id=instance_id, quotas=quotas
    )
    try:
        await store._migrate()
    except BaseException:
        await database.dispose()
        raise
    return store


class SqlStepStore:
    """A StepStore (and SessionLeases) on one `Database`. Build it with `open_store`."""

    def __init__(
        self,
        database: Database,
        *,
        session_lease_s: float = DEFAULT_SESSION_LEASE_S,
        instance_id: str = "",
        quotas: TenantQuotas | None = None,
    ) -> None:
        self._database = database
        self._lease = _Lease(timedelta(seconds=session_lease_s), instance_id or None)
        self._quotas = _Quotas(quotas or TenantQuotas(), database.backend)

    @property
    def session_lease_s(self) -> float:
        return self._lease.term.total_seconds()

    @property
    def backend(self) -> str:
        """The database dialect name: `sqlite` or `postgresql`."""
        return self._database.backend

    async def _read(self, work: Callable[[Connection], T]) -> T:
        return await self._database.run(work, write=False)

    async def _write(self, work: Callable[[Connection], T]) -> T:
        return await self._database.run(work, write=True)

    # -- sessions ------------------------------------------------------------------------

    async def create_session(self, session: Session | None = None) -> Session:
        stored = stored_session(session or Session())

        def work(conn: Connection) -> None:
            _insert_session(conn, stored, last_sequence=0, lease=self._lease)

        await self._write(work)
        return stored

    async def get_session(self, session_id: str, *, tenant: str | None = None) -> Session:
        def work(conn: Connection) -> Any:
            return conn.execute(
                select(session_table).where(_session_is(session_id, tenant))
            ).first()

        row = await self._read(work)
        if row is None:
            raise NotFoundError("session", session_id)
        return session_from_row(row)

    async def list_sessions(
        self,
        limit: int,
        after: tuple[datetime, str] | None = None,
        *,
        tenant: str | None = None,
    ) -> list[Session]:
        _check_limit(limit)
        created, session_id = session_table.c.create_time, session_table.c.id
        query = select(session_table).order_by(created.desc(), session_id.desc()).limit(limit)
        if tenant is not None:
            query = query.where(session_table.c.tenant == tenant)
        if after is not None:
            query = query.where(_older_than(created, session_id, after))
        rows = await self._read(lambda conn: conn.execute(query).all())
        return [session_from_row(row) for row in rows]

    async def delete_session(self, session_id: str, *, tenant: str | None = None) -> int:
        def work(conn: Connection) -> Any:
            if tenant is not None:  # before the take: another's busy session is missing too
                _require_session(conn, session_id, tenant=tenant)
            _take_for_edit(conn, session_id, self._lease)
            # Steps and runs go with the session by ON DELETE CASCADE.
            return conn.execute(
                delete(session_table)
                .where(_session_is(session_id, tenant))
                .returning(session_table.c.last_sequence)
            ).scalar_one_or_none()

        deleted_steps = await self._write(work)
        if deleted_steps is None:
            raise NotFoundError("session", session_id)
        return int(deleted_steps)

    # -- steps ---------------------------------------------------------------------------

    async def append_steps(
        self, steps: Sequence[Step], *, held_by: str = "", journal: Journal | None = None
    ) -> list[Step]:
        if not steps:
            return []
        session_id = steps[0].session_id
        if any(step.session_id != session_id for step in steps):
            raise ValueError("append_steps takes steps of one session per call")
        if journal is not None and not held_by:
            raise ValueError("append_steps journals only the writes of a run holding its session")

        def work(conn: Connection) -> list[Step]:
            stored = _append(conn, session_id, steps, held_by)
            if journal is not None:
                _write_journal(conn, held_by, journal(None, stored))
            return stored

        return await self._write(work)

    async def append_step(self, step: Step) -> Step:
        return (await self.append_steps([step]))[0]

    async def get_steps(
        self,
        session_id: str,
        start: int = 1,
        end: int | None = None,
        limit: int | None = None,
        *,
        tenant: str | None = None,
    ) -> list[Step]:
        params: dict[str, Any] = {"session_id": session_id, "start": start}
        if end is not None:
            params["end"] = end
        if limit is not None:
            _check_limit(limit)
            params["limit"] = limit
        query = _select_steps(bounded=end is not None, limited=limit is not None)

        def work(conn: Connection) -> list[Step]:
            if tenant is not None:
                _require_session(conn, session_id, tenant=tenant)
            steps = _read_steps(conn, session_id, query, params)
            if not steps and tenant is None:
                _require_session(conn, session_id)
            return steps

        return await self._read(work)

    async def get_history(
        self, session_id: str, start: int = 1, end: int | None = None
    ) -> list[Step]:
        return await self._read(lambda conn: _read_history(conn, session_id, start, end))

    async def get_history_since(
        self,
        session_id: str,
        since: HistoryMark | None,
        end: int | None = None,
        *,
        tenant: str | None = None,
    ) -> HistoryRead:
        def work(conn: Connection) -> HistoryRead:
            if tenant is not None:
                _require_session(conn, session_id, tenant=tenant)
            start = _read_start(conn, session_id, since, end)
            # A mark that held proved the session is there (so did the tenant's check).
            known = start > 1 or tenant is not None
            steps = _read_history(conn, session_id, start, end, known_session=known)
            return HistoryRead(steps, start)

        return await self._read(work)

    async def get_step(self, session_id: str, sequence: int, *, tenant: str | None = None) -> Step:
        def work(conn: Connection) -> Step:
            if tenant is not None:
                _require_session(conn, session_id, tenant=tenant)
            steps = _read_steps(
                conn, session_id, _SELECT_STEP, {"session_id": session_id, "sequence": sequence}
            )
            if not steps:
                _require_session(conn, session_id)
                raise NotFoundError("step", f"{session_id}#{sequence}")
            return steps[0]

        return await self._read(work)

    async def get_last_step(self, session_id: str) -> Step | None:
        def work(conn: Connection) -> Step | None:
            steps = _read_steps(conn, session_id, _SELECT_LAST_STEP, {"session_id": session_id})
            if not steps:
                _require_session(conn, session_id)
                return None
            return steps[0]

        return await self._read(work)

    async def first_user_messages(self, session_ids: Sequence[str], chars: int) -> dict[str, str]:
        if not session_ids:
            return {}
        query = select(step_table.c.session_id, func.substr(step_table.c.content, 1, chars)).where(
            step_table.c.session_id.in_(session_ids),
            step_table.c.sequence == 1,
            step_table.c.role == Role.USER.value,
        )
        rows = await self._read(lambda conn: conn.execute(query).all())
        return {session_id: first for session_id, first in rows}

    async def count_steps(self, session_id: str) -> int:
        # Sequences are exactly 1..N, so the counter is the count.
        return await self._read(lambda conn: _require_session(conn, session_id))

    async def append_to_idle_session(
        self, step: Step, *, after: HistoryMark | None, tenant: str | None = None
    ) -> Step:
        session_id = step.session_id

        def work(conn: Connection) -> Step:
            if tenant is not None:  # before the take: another's busy session is missing too
                _require_session(conn, session_id, tenant=tenant)
            holder = _take_for_edit(conn, session_id, self._lease)
            _check_last_step(conn, session_id, after)
            (stored,) = _append(conn, session_id, [step], holder)
            _RELEASE_SESSION.execute(conn, {"session_id": session_id, "run_id": holder})
            return stored

        return await self._write(work)

    async def delete_steps_from(
        self, session_id: str, start_sequence: int, *, tenant: str | None = None
    ) -> int:
        def work(conn: Connection) -> int:
            if tenant is not None:  # before the take: another's busy session is missing too
                _require_session(conn, session_id, tenant=tenant)
            holder = _take_for_edit(conn, session_id, self._lease)
            # The row lock keeps appends and forks out until the counter is reset.
            last = _require_session(conn, session_id, lock=True)
            if start_sequence < 1:
                raise InvalidRangeError(
                    f"start_sequence must be at least 1, got {start_sequence}",
                    field="start_sequence",
                    last_sequence=last,
                )
            deleted = (
                _delete_steps(conn, session_id, start_sequence) if start_sequence <= last else 0
            )
            _RELEASE_SESSION.execute(conn, {"session_id": session_id, "run_id": holder})
            return deleted

        return await self._write(work)

    async def fork_session(
        self, session_id: str, up_to_sequence: int, *, tenant: str | None = None
    ) -> Session:
        def work(conn: Connection) -> Session:
            # A shared lock: other forks may read along, deletes and appends wait.
            parent = conn.execute(
                select(session_table.c.last_sequence, session_table.c.tenant)
                .where(_session_is(session_id, tenant))
                .with_for_update(read=True)
            ).first()
            if parent is None:
                raise NotFoundError("session", session_id)
            last = int(parent.last_sequence)
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
                tenant=str(parent.tenant),  # the parent's, which is the caller's
            )
            _insert_session(conn, fork, last_sequence=up_to_sequence, lease=self._lease)
            parent_rows = conn.execute(
                select(step_table)
                .where(
                    step_table.c.session_id == session_id,
                    step_table.c.sequence <= up_to_sequence,
                )
                .order_by(step_table.c.sequence)
            ).all()
            if parent_rows:
                # The copies keep run ids, create times and trace ids: a fork copies history.
                copies = [
                    {**row._mapping, "id": new_id("step"), "session_id": fork.id}
                    for row in parent_rows
                ]
                conn.execute(insert(step_table), copies)
            return fork

        return await self._write(work)

    async def context_summary(
        self, session_id: str, *, tenant: str | None = None
    ) -> ContextSummary:
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

        def work(conn: Connection) -> Any:
            if tenant is not None:
                _require_session(conn, session_id, tenant=tenant)
            row = conn.execute(query).one()
            if row[0] == 0 and tenant is None:
                _require_session(conn, session_id)
            return row

        row = await self._read(work)
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

        def work(conn: Connection) -> None:
            _require_session(conn, run.session_id, tenant=run.tenant)
            _insert_run(conn, stored)

        await self._write(work)
        return stored

    async def start_run(
        self,
        run: Run,
        steps: Sequence[Step],
        *,
        new_session: Session | None = None,
        since: HistoryMark | None = None,
        journal: Journal | None = None,
        queue: QueueRequest | None = None,
    ) -> RunStart:
        if not steps:
            raise ValueError("start_run needs the run's first steps")
        if new_session is not None and new_session.id != run.session_id:
            raise ValueError("start_run: the new session must be the run's session")
        if new_session is not None and new_session.tenant != run.tenant:
            raise ValueError("start_run: the new session must be the run's tenant's")
        if any(step.session_id != run.session_id for step in steps):
            raise ValueError("start_run takes steps of the run's session")
        if not run.id:
            raise ValueError("start_run needs a run id")
        fresh = stored_session(new_session) if new_session is not None else None
        session_id = run.session_id
        quotas = self._quotas

        def work(conn: Connection) -> RunStart:
            if fresh is not None:
                _insert_session(
                    conn, fresh, last_sequence=0, lease=self._lease, active_run_id=run.id
                )
                quotas.check_running(conn, run.tenant)
                return _store_start(conn, run, steps, since, journal, insert=True)
            # The session row first (the lock order of every take): what is read below, the
            # runs in the way and a reused request_id, stays true until this commits. Only
            # the run's tenant's: another's is missing, busy or not.
            _require_session(conn, session_id, lock=True, tenant=run.tenant)
            if run.request_id:
                _refuse_duplicate(conn, session_id, run.request_id)
            waiting, queued = _blockers(conn, session_id)
            if waiting is None and not queued:
                try:
                    _acquire(conn, session_id, run.id, self._lease)
                except SessionBusyError as busy:
                    if queue is None:
                        raise
                    quotas.check_queued(conn, run.tenant)
                    return _enqueue(conn, run, steps, queued, busy.active_run_id, queue, journal)
                quotas.check_running(conn, run.tenant)
                return _store_start(conn, run, steps, since, journal, insert=True)
            if queue is None or (queue.ahead and waiting is not None):
                if waiting is not None:
                    raise RunRequiresActionError(session_id, waiting)
                raise SessionBusyError(session_id, queued[0][0])
            holder = _live_holder(conn, session_id)
            quotas.check_queued(conn, run.tenant)
            return _enqueue(conn, run, steps, queued, holder, queue, journal)

        return await self._write(work)

    async def start_queued_run(
        self,
        run: Run,
        steps: Sequence[Step],
        *,
        since: HistoryMark | None = None,
        journal: Journal | None = None,
    ) -> RunStart:
        if not steps or any(step.session_id != run.session_id for step in steps):
            raise ValueError("start_queued_run needs the run's first steps, of its session")
        session_id = run.session_id

        def work(conn: Connection) -> RunStart:
            status = conn.execute(
                select(run_table.c.status).where(run_table.c.id == run.id)
            ).scalar()
            if status is None:
                raise NotFoundError("run", run.id)
            if status != RunStatus.QUEUED.value:
                raise RunStateConflictError(run.id, str(status), RunStatus.QUEUED.value)
            _acquire(conn, session_id, run.id, self._lease)
            waiting, queued = _blockers(conn, session_id)
            if waiting is not None:
                raise RunRequiresActionError(session_id, waiting)
            if not queued:  # cancelled since it was read
                raise RunStateConflictError(run.id, "ended", RunStatus.QUEUED.value)
            if queued[0][0] != run.id:
                raise SessionBusyError(session_id, queued[0][0])  # another is ahead of it
            return _store_start(conn, run.resumed(), steps, since, journal, insert=False)

        return await self._write(work)

    async def next_queued_run(self, session_id: str) -> Run | None:
        def work(conn: Connection) -> Any:
            return conn.execute(
                select(run_table)
                .where(
                    run_table.c.session_id == session_id,
                    run_table.c.status == RunStatus.QUEUED.value,
                )
                .order_by(run_table.c.queue_position, run_table.c.create_time, run_table.c.id)
                .limit(1)
            ).first()

        row = await self._read(work)
        return run_from_row(row) if row is not None else None

    async def ready_queues(self, limit: int = 100) -> list[str]:
        _check_limit(limit)

        def work(conn: Connection) -> list[str]:
            now = utc_now()
            other = run_table.alias("waiting")
            waiting = (
                select(other.c.id)
                .where(
                    other.c.session_id == session_table.c.id,
                    other.c.status == RunStatus.REQUIRES_ACTION.value,
                )
                .exists()
            )
            rows = conn.execute(
                select(run_table.c.session_id)
                .distinct()
                .join(session_table, session_table.c.id == run_table.c.session_id)
                .where(
                    run_table.c.status == RunStatus.QUEUED.value,
                    or_(~_HELD, _lease_expired(now)),
                    ~waiting,
                )
                .limit(limit)
            ).scalars()
            return [str(session_id) for session_id in rows]

        return await self._read(work)

    async def update_run(self, run: Run) -> Run:
        values = _run_update(run)
        row = await self._write(lambda conn: conn.execute(_UPDATE_RUN_RETURNING, values).first())
        if row is None:
            raise NotFoundError("run", run.id)
        return run_from_row(row)

    async def continue_run(
        self,
        run: Run,
        steps: Sequence[Step],
        *,
        expect: HistoryMark | None = None,
        journal: Journal | None = None,
    ) -> RunContinuation:
        if not steps:
            raise ValueError("continue_run needs the steps that continue the run")
        if any(step.session_id != run.session_id for step in steps):
            raise ValueError("continue_run takes steps of the run's session")

        def work(conn: Connection) -> RunContinuation:
            _acquire(conn, run.session_id, run.id, self._lease)
            _check_last_step(conn, run.session_id, expect)
            status = conn.execute(
                select(run_table.c.status).where(run_table.c.id == run.id)
            ).scalar()
            if status is None:
                raise NotFoundError("run", run.id)
            if status != RunStatus.REQUIRES_ACTION.value:
                raise RunStateConflictError(run.id, str(status))
            self._quotas.check_running(conn, run.tenant)
            stored = _append(conn, run.session_id, steps, held_by=run.id)
            continued = stored_run(
                replace(
                    run.resumed(),
                    step_count=run.step_count + len(stored),
                    last_sequence=stored[-1].sequence,
                )
            )
            if _CONTINUE_RUN.execute(conn, _run_update(continued)) != 1:
                raise NotFoundError("run", run.id)
            if journal is not None:
                _write_journal(conn, run.id, journal(continued, stored))
            return RunContinuation(continued, stored)

        return await self._write(work)

    async def end_run(self, run: Run, *, journal: Journal | None = None) -> RunEnd:
        values = _run_update(run)
        ended = stored_run(run)
        released = {"session_id": run.session_id, "run_id": run.id}

        def work(conn: Connection) -> RunEnd:
            # The session row first, as every take does (then the run's): one lock order,
            # so an end and a take over of an expired lease cannot deadlock on PostgreSQL.
            release = _RELEASE_SESSION.execute(conn, released) == 1
            if _END_RUNNING_RUN.execute(conn, values) == 1:
                if journal is not None:
                    _write_journal(conn, run.id, journal(ended, ()))
                session = {"session_id": run.session_id}
                queued = release and _QUEUED_RUN.first(conn, session) is not None
                return RunEnd(release, queued=queued)
            row = conn.execute(select(run_table).where(run_table.c.id == run.id)).first()
            if row is None:
                raise NotFoundError("run", run.id)
            return RunEnd(release, run_from_row(row))  # ended first by a take-over

        return await self._write(work)

    async def restart_run(
        self,
        run: Run,
        delete_from: int,
        *,
        expect: HistoryMark | None = None,
        journal: Journal | None = None,
    ) -> Run:
        def work(conn: Connection) -> Run:
            # Only a session of the run's tenant (another's is missing, even when busy).
            _require_session(conn, run.session_id, tenant=run.tenant)
            _acquire(conn, run.session_id, run.id, self._lease)
            waiting, queued = _blockers(conn, run.session_id)
            if waiting is not None:
                raise RunRequiresActionError(run.session_id, waiting)
            if queued:  # the queue goes first
                raise SessionBusyError(run.session_id, queued[0][0])
            last = _check_last_step(conn, run.session_id, expect)
            self._quotas.check_running(conn, run.tenant)
            if delete_from <= last:
                _delete_steps(conn, run.session_id, delete_from)
            started = stored_run(run)
            _insert_run(conn, started)
            if journal is not None:
                _write_journal(conn, run.id, journal(started, ()))
            return started

        if delete_from < 1:
            raise ValueError(f"delete_from must be at least 1, got {delete_from}")
        return await self._write(work)

    async def end_idle_run(
        self,
        run: Run,
        steps: Sequence[Step],
        *,
        expect: HistoryMark | None = None,
        journal: Journal | None = None,
    ) -> IdleEnd | None:
        if any(step.session_id != run.session_id for step in steps):
            raise ValueError("end_idle_run takes steps of the run's session")

        def work(conn: Connection) -> IdleEnd | None:
            # The session row first (the lock order of every take), then the run's.
            holder = conn.execute(
                select(session_table.c.active_run_id)
                .where(session_table.c.id == run.session_id)
                .with_for_update()
            ).first()
            if holder is None:
                raise NotFoundError("session", run.session_id)
            status = conn.execute(
                select(run_table.c.status).where(run_table.c.id == run.id).with_for_update()
            ).scalar()
            if status is None:
                raise NotFoundError("run", run.id)
            if status not in _IDLE_STATUSES:
                return None
            if steps and holder.active_run_id:  # a SubmitToolOutputs is continuing it now
                raise SessionBusyError(run.session_id, str(holder.active_run_id))
            if steps:  # the results answer the calls of the log the caller read
                _check_last_step(conn, run.session_id, expect)
            stored = _append(conn, run.session_id, steps) if steps else []
            ended = stored_run(
                replace(
                    run,
                    step_count=run.step_count + len(stored),
                    last_sequence=stored[-1].sequence if stored else run.last_sequence,
                )
            )
            conn.execute(_UPDATE_RUN, _run_update(ended))
            if journal is not None:
                _write_journal(conn, run.id, journal(ended, stored))
            queued = _QUEUED_RUN.first(conn, {"session_id": run.session_id}) is not None
            return IdleEnd(ended, stored, queued=queued)

        return await self._write(work)

    async def read_journal(self, run_id: str, after_seq: int = 0) -> list[JournalRecord]:
        params = {"run_id": run_id, "after": after_seq}

        def work(conn: Connection) -> list[JournalRecord]:
            with _SELECT_JOURNAL.cursor(conn, params) as cursor:
                rows = cast("Iterable[Sequence[Any]]", cursor)
                return [journal_from_row(*row) for row in rows]

        return await self._read(work)

    async def get_run(self, run_id: str, *, tenant: str | None = None) -> Run:
        query = select(run_table).where(run_table.c.id == run_id)
        if tenant is not None:
            query = query.where(run_table.c.tenant == tenant)

        def work(conn: Connection) -> Any:
            return conn.execute(query).first()

        row = await self._read(work)
        if row is None:
            raise NotFoundError("run", run_id)
        return run_from_row(row)

    async def list_runs(
        self,
        session_id: str,
        limit: int,
        after: tuple[datetime, str] | None = None,
        *,
        tenant: str | None = None,
    ) -> list[Run]:
        _check_limit(limit)
        created, run_id = run_table.c.create_time, run_table.c.id
        query = (
            select(run_table)
            .where(run_table.c.session_id == session_id)
            .order_by(created.desc(), run_id.desc())
            .limit(limit)
        )
        if tenant is not None:
            query = query.where(run_table.c.tenant == tenant)
        if after is not None:
            query = query.where(_older_than(created, run_id, after))

        def work(conn: Connection) -> list[Run]:
            rows = conn.execute(query).all()
            if not rows:
                _require_session(conn, session_id, tenant=tenant)
            return [run_from_row(row) for row in rows]

        return await self._read(work)

    # -- the one active run per session --------------------------------------------------

    async def acquire_session(self, session_id: str, run_id: str) -> None:
        if not run_id:
            raise ValueError("acquire_session needs a run id")
        await self._write(lambda conn: _acquire(conn, session_id, run_id, self._lease))

    async def release_session(self, session_id: str, run_id: str) -> bool:
        def work(conn: Connection) -> bool:
            held = {"session_id": session_id, "run_id": run_id}
            return _RELEASE_SESSION.execute(conn, held) == 1

        return await self._write(work)

    async def renew_leases(self, holders: Mapping[str, str]) -> set[str]:
        if not holders:
            return set()
        pairs = list(holders.items())

        def work(conn: Connection) -> set[str]:
            expires = utc_now() + self._lease.term
            renewed = conn.execute(
                update(session_table)
                .where(tuple_(session_table.c.id, session_table.c.active_run_id).in_(pairs))
                .values(lease_expires_at=expires)
                .returning(session_table.c.id)
            ).scalars()
            return {str(session_id) for session_id in renewed}

        return await self._write(work)

    async def request_cancel(self, run_id: str, signal: StopSignal) -> bool:
        request = stop_signal_json(signal)
        running = RunStatus.RUNNING.value

        def work(conn: Connection) -> bool:
            recorded = conn.execute(
                update(run_table)
                .where(
                    run_table.c.id == run_id,
                    run_table.c.status == running,
                    run_table.c.cancel_request.is_(None),
                )
                .values(cancel_request=request)
            )
            if recorded.rowcount == 1:
                return True
            status = conn.execute(select(run_table.c.status).where(run_table.c.id == run_id))
            found = status.scalar()
            if found is None:
                raise NotFoundError("run", run_id)
            return bool(found == running)  # RUNNING here: an earlier request stands

        return await self._write(work)

    async def cancel_requests(self, run_ids: Collection[str]) -> dict[str, StopSignal]:
        ids = list(run_ids)
        if not ids:
            return {}
        query = select(run_table.c.id, run_table.c.cancel_request).where(
            run_table.c.id.in_(ids),
            run_table.c.status == RunStatus.RUNNING.value,
            run_table.c.cancel_request.is_not(None),
        )

        def work(conn: Connection) -> dict[str, StopSignal]:
            requests: dict[str, StopSignal] = {}
            for run_id, request in conn.execute(query):
                try:
                    signal = stop_signal_from_json(request)
                except (ValueError, KeyError, TypeError):
                    # Not one this store wrote: cancel with the defaults rather than never.
                    signal = StopSignal(StopReason.CANCELLED, "cancelled", "client")
                if signal is not None:
                    requests[str(run_id)] = signal
            return requests

        return await self._read(work)

    async def recover_expired_runs(self) -> list[str]:
        return await self._recover(lambda now: _lease_expired(now))

    async def recover_own_runs(self) -> list[str]:
        """End INTERRUPTED the runs this server's instance left RUNNING when it stopped, live
        lease or not (it runs none yet), and release their sessions; their run ids. Call it
        at start, before serving: nothing when the store has no instance id."""
        owner = self._lease.owner
        if owner is None:
            return []
        return await self._recover(lambda _: session_table.c.lease_owner == owner)

    async def _recover(self, which: Callable[[datetime], Any]) -> list[str]:
        def work(conn: Connection) -> list[str]:
            now = utc_now()
            # SKIP LOCKED: a session another transaction is taking over is its business.
            expired = conn.execute(
                select(
                    session_table.c.id,
                    session_table.c.active_run_id,
                    session_table.c.last_sequence,
                )
                .where(_HELD, which(now))
                .with_for_update(skip_locked=True)
            ).all()
            interrupted = [
                row.active_run_id
                for row in expired
                if _interrupt_run(conn, row.id, row.active_run_id, row.last_sequence, now)
            ]
            if expired:
                conn.execute(
                    update(session_table)
                    .where(session_table.c.id.in_([row.id for row in expired]))
                    .values(active_run_id=None, lease_expires_at=None, lease_owner=None)
                )
            return interrupted

        return await self._write(work)

    async def interrupt_abandoned_run(self, run_id: str) -> bool:
        def work(conn: Connection) -> bool:
            now = utc_now()
            run = conn.execute(
                select(run_table.c.session_id, run_table.c.status).where(run_table.c.id == run_id)
            ).first()
            if run is None:
                raise NotFoundError("run", run_id)
            if run.status != RunStatus.RUNNING.value:
                return False
            # The session row first (the lock order of every take), then the run's.
            holder = conn.execute(
                select(
                    session_table.c.active_run_id,
                    session_table.c.lease_expires_at,
                    session_table.c.last_sequence,
                )
                .where(session_table.c.id == run.session_id)
                .with_for_update()
            ).one()
            message = ABANDONED_MESSAGE
            if holder.active_run_id == run_id:
                if _lease_live(holder.lease_expires_at, now):
                    return False  # its server renews it: alive
                _RELEASE_SESSION.execute(conn, {"session_id": run.session_id, "run_id": run_id})
                message = LEASE_EXPIRED_MESSAGE
            last_sequence = int(holder.last_sequence)
            return _interrupt_run(conn, run.session_id, run_id, last_sequence, now, message)

        return await self._write(work)

    async def server_secret(self, name: str, size: int = 32) -> bytes:
        """The named secret every replica shares: `size` random bytes made by the first to
        ask (the others find it); the same bytes ever after."""
        if not name or size < 16:
            raise ValueError("server_secret needs a name and at least 16 bytes")
        query = select(secret_table.c.value).where(secret_table.c.name == name)
        made = secrets.token_hex(size)

        def work(conn: Connection) -> str:
            found = conn.execute(query).scalar()
            if found is not None:
                return str(found)
            # Two replicas making it at once: the second insert waits for the first, then
            # conflicts and writes nothing; both read the first one's.
            conn.execute(
                insert_ignoring_conflicts(self.backend, secret_table),
                {"name": name, "value": made, "create_time": utc_now()},
            )
            return str(conn.execute(query).scalar_one())

        return bytes.fromhex(await self._write(work))

    async def register_member(self, address: str) -> None:
        """See MemberDirectory.register_member."""
        owner = self._lease.owner
        if owner is None:
            raise ValueError("a member needs an instance id")
        row = {"instance_id": owner, "address": address, "update_time": utc_now()}

        def work(conn: Connection) -> None:
            updated = conn.execute(
                update(member_table)
                .where(member_table.c.instance_id == owner)
                .values(address=address, update_time=row["update_time"])
            )
            if not updated.rowcount:
                conn.execute(insert_ignoring_conflicts(self.backend, member_table), row)

        await self._write(work)

    async def member_running(self, run_id: str) -> Member | None:
        """See MemberDirectory.member_running."""
        query = (
            select(member_table.c.instance_id, member_table.c.address)
            .select_from(run_table)
            .join(session_table, session_table.c.id == run_table.c.session_id)
            .join(member_table, member_table.c.instance_id == session_table.c.lease_owner)
            .where(run_table.c.id == run_id, session_table.c.active_run_id == run_id)
        )
        found = await self._read(lambda conn: conn.execute(query).first())
        return Member(found.instance_id, found.address) if found is not None else None

    def key_store(self) -> KeyStore:
        """The API keys (`auth.mode: api_key`), on this store's database."""
        return KeyStore(self._database)

    async def close(self) -> None:
        with contextlib.suppress(*DRIVER_ERRORS):
            await self._database.dispose()

    # -- plumbing ------------------------------------------------------------------------

    async def _migrate(self) -> None:
        def work(conn: Connection) -> None:
            if self.backend == "postgresql":
                # Replicas starting together take turns; the later ones find head applied.
                conn.execute(
                    text("SELECT pg_advisory_xact_lock(:key)"), {"key": _MIGRATION_LOCK_KEY}
                )
            upgrade_to_head(conn)

        await self._write(work)


# -- the statements the operations share -------------------------------------------------


# The hot statements are built once, values passed as parameters: building a statement
# with `.values(...)` costs more CPU than running it (its cache key is rebuilt each time).
# Those every run runs are `Prepared` (prepared.py): on SQLite, compiled once and run on the
# DBAPI cursor.
_INSERT_SESSION: Final = Prepared(insert(session_table))
_INSERT_RUN: Final = Prepared(insert(run_table))
_INSERT_STEPS: Final = Prepared(insert(step_table))
_ALLOCATE: Final = (
    update(session_table)
    .where(session_table.c.id == bindparam("session_id"))
    .values(
        last_sequence=session_table.c.last_sequence + bindparam("count"),
        update_time=bindparam("now"),
    )
    .returning(session_table.c.last_sequence)
)
_ALLOCATE_SEQUENCES: Final = Prepared(_ALLOCATE)
_ALLOCATE_HELD_SEQUENCES: Final = Prepared(
    _ALLOCATE.where(session_table.c.active_run_id == bindparam("run_id"))
)
# A session's steps as `steps_from_rows` reads them.
_SELECT_SESSION_STEPS: Final = select(*STEP_READ_COLUMNS).where(
    step_table.c.session_id == bindparam("session_id")
)
# Its conversation only, as `history_from_rows` reads it.
_SELECT_SESSION_HISTORY: Final = select(*HISTORY_READ_COLUMNS).where(
    step_table.c.session_id == bindparam("session_id")
)
_SELECT_STEP: Final = Prepared(
    _SELECT_SESSION_STEPS.where(step_table.c.sequence == bindparam("sequence"))
)
_SELECT_STEP_ID: Final = Prepared(
    select(step_table.c.id).where(
        step_table.c.session_id == bindparam("session_id"),
        step_table.c.sequence == bindparam("sequence"),
    )
)
_SELECT_LAST_STEP: Final = Prepared(
    _SELECT_SESSION_STEPS.order_by(step_table.c.sequence.desc()).limit(1)
)


@functools.cache
def _select_steps(*, bounded: bool, limited: bool, history: bool = False) -> Prepared:
    """Steps from `:start`, up to `:end` when `bounded`, at most `:limit` when `limited`;
    with `history`, only the columns `history_from_rows` reads."""
    base = _SELECT_SESSION_HISTORY if history else _SELECT_SESSION_STEPS
    query = base.where(step_table.c.sequence >= bindparam("start"))
    if bounded:
        query = query.where(step_table.c.sequence <= bindparam("end"))
    query = query.order_by(step_table.c.sequence)
    return Prepared(query.limit(bindparam("limit")) if limited else query)


def _read_steps(
    conn: Connection,
    session_id: str,
    query: Prepared,
    params: Mapping[str, Any],
    decode: Callable[[str, Iterable[Sequence[Any]]], list[Step]] = steps_from_rows,
) -> list[Step]:
    """The steps `query` selects, decoded from the driver's rows.

    The rows come straight off the DBAPI cursor, not as SQLAlchemy `Row`s: its result
    processing (a regex per datetime, an object per row) was most of the cost of reading a
    long session. Iterated rather than fetched whole, so each row tuple is freed as soon as
    its step is built instead of all of them piling up for the garbage collector.
    """
    with query.cursor(conn, params) as cursor:
        # Both drivers' cursors iterate (PEP 249's optional extension; asyncpg's adapter
        # has the rows in memory already), which the DBAPI cursor protocol leaves out.
        return decode(session_id, cast("Iterable[Sequence[Any]]", cursor))


_HELD: Final = and_(session_table.c.active_run_id.is_not(None), session_table.c.active_run_id != "")
_TAKE_FREE_SESSION: Final = Prepared(
    update(session_table)
    .where(
        session_table.c.id == bindparam("session_id"),
        or_(session_table.c.active_run_id.is_(None), session_table.c.active_run_id == ""),
    )
    .values(
        active_run_id=bindparam("run_id"),
        lease_expires_at=bindparam("expires"),
        lease_owner=bindparam("owner"),
    )
    .returning(session_table.c.id)
)
# Only after the holder was read under a row lock and found free or expired.
_TAKE_LOCKED_SESSION: Final = (
    update(session_table)
    .where(session_table.c.id == bindparam("session_id"))
    .values(
        active_run_id=bindparam("run_id"),
        lease_expires_at=bindparam("expires"),
        lease_owner=bindparam("owner"),
    )
)
# A run's mutable columns, as `update_run` and `end_run` (on every run) write them.
_UPDATE_RUN: Final = (
    update(run_table)
    .where(run_table.c.id == bindparam("run_id"))
    .values({name: bindparam(name) for name in (*RUN_MUTABLE_COLUMNS, "cancel_request")})
)
_UPDATE_RUN_RETURNING: Final = _UPDATE_RUN.returning(*run_table.c)
_CONTINUE_RUN: Final = Prepared(_UPDATE_RUN)
# A run's end, unless another server ended it first (a take-over after its lease ran out).
_END_RUNNING_RUN: Final = Prepared(_UPDATE_RUN.where(run_table.c.status == RunStatus.RUNNING.value))
_RELEASE_SESSION: Final = Prepared(
    update(session_table)
    .where(
        session_table.c.id == bindparam("session_id"),
        session_table.c.active_run_id == bindparam("run_id"),
    )
    .values(active_run_id=None, lease_expires_at=None, lease_owner=None)
)


def _run_update(run: Run) -> dict[str, Any]:
    """The parameters of `_UPDATE_RUN` for `run`.

    Every write clears a cancel request: a segment's end spends one, and a continuation
    (SubmitToolOutputs, the only other writer of a run row) must not inherit it; the loop
    never writes the row mid-run, so no standing request is dropped.
    """
    return {**run_mutable_values(stored_run(run)), "cancel_request": None, "run_id": run.id}


def _lease_live(expires_at: datetime | None, now: datetime) -> bool:
    """A holder's lease still runs (one with no lease was taken before leases existed,
    revision 0002, and outlived its server: not live; `_lease_expired` in SQL)."""
    return expires_at is not None and expires_at > now


def _read_history(
    conn: Connection,
    session_id: str,
    start: int,
    end: int | None,
    *,
    known_session: bool = False,
) -> list[Step]:
    """The conversation from `start` to `end` (None: the last step), as `get_history` reads
    it; NotFoundError when nothing was read and the session is not `known_session`."""
    params: dict[str, Any] = {"session_id": session_id, "start": start}
    if end is not None:
        params["end"] = end
    query = _select_steps(bounded=end is not None, limited=False, history=True)
    steps = _read_steps(conn, session_id, query, params, history_from_rows)
    if not steps and not known_session:
        _require_session(conn, session_id)
    return steps


def _read_start(
    conn: Connection, session_id: str, since: HistoryMark | None, end: int | None
) -> int:
    """Where a history read after `since` starts: just after it when the mark holds (the
    step at its sequence, at most `end`, is still the one it names), else at 1."""
    if since is None or since.sequence < 1 or (end is not None and since.sequence > end):
        return 1
    held = {"session_id": session_id, "sequence": since.sequence}
    row = _SELECT_STEP_ID.first(conn, held)
    if row is not None and row[0] == since.step_id:
        return since.sequence + 1
    return 1


@dataclass(frozen=True, slots=True)
class _Quotas:
    """`TenantQuotas` as the transactions that start or queue a run check them."""

    limits: TenantQuotas
    backend: str

    def check_running(self, conn: Connection, tenant: str) -> None:
        """TenantQuotaError when the tenant runs as many runs as it may already."""
        self._check(conn, tenant, RunStatus.RUNNING, self.limits.max_running_runs)

    def check_queued(self, conn: Connection, tenant: str) -> None:
        """TenantQuotaError when the tenant has as many queued runs as it may already."""
        self._check(conn, tenant, RunStatus.QUEUED, self.limits.max_queued_runs)

    def _check(self, conn: Connection, tenant: str, status: RunStatus, limit: int) -> None:
        if limit <= 0:
            return
        if self.backend == "postgresql":
            # The tenant's starts take turns (on any session, on any replica), each counting
            # what the one before committed; taken after the session's row lock, and no
            # holder of it takes another session's, so it cannot deadlock.
            conn.execute(_TENANT_LOCK, {"space": _QUOTA_LOCK_SPACE, "tenant": tenant})
        count = conn.execute(
            select(func.count())
            .select_from(run_table)
            .where(run_table.c.tenant == tenant, run_table.c.status == status.value)
        ).scalar_one()
        if count >= limit:
            raise TenantQuotaError(tenant, status.value, limit)


_TENANT_LOCK: Final = text("SELECT pg_advisory_xact_lock(:space, hashtext(:tenant))")


@dataclass(frozen=True, slots=True)
class _Lease:
    """How a take holds a session: for `term` from now, by the instance `owner`."""

    term: timedelta
    owner: str | None


def _lease_expired(now: datetime) -> Any:
    """The holder's lease ran out; a holder with no lease was taken before leases existed
    (revision 0002) and outlived its server, so it counts as expired too."""
    lease = session_table.c.lease_expires_at
    return or_(lease.is_(None), lease <= now)


def _insert_session(
    conn: Connection,
    session: Session,
    *,
    last_sequence: int,
    lease: _Lease,
    active_run_id: str = "",
) -> None:
    holder = active_run_id or session.active_run_id or None
    _INSERT_SESSION.execute(
        conn,
        {
            "id": session.id,
            "parent_session_id": session.parent_session_id or None,
            "fork_sequence": session.fork_sequence,
            "create_time": session.create_time,
            "update_time": session.update_time,
            "last_sequence": last_sequence,
            "active_run_id": holder,
            "lease_expires_at": utc_now() + lease.term if holder else None,
            "lease_owner": lease.owner if holder else None,
            "tenant": session.tenant,
        },
    )


def _insert_run(conn: Connection, run: Run) -> None:
    _INSERT_RUN.execute(
        conn,
        {
            "id": run.id,
            "session_id": run.session_id,
            "agent": run.agent,
            "create_time": run.create_time,
            "request_id": run.request_id,
            "input": clean_text(run.input),
            "queue_position": run.queue_position,
            "supersedes": run.supersedes,
            "rollback_from": run.rollback_from,
            "tenant": run.tenant,
            **run_mutable_values(run),
        },
    )


def _append(
    conn: Connection, session_id: str, steps: Sequence[Step], held_by: str = ""
) -> list[Step]:
    count = len(steps)
    last = _allocate_sequences(conn, session_id, count, held_by)
    first = last - count + 1
    # Read the clock only once the sequences are ours, so create_time follows sequence
    # order even when writers queued for the session.
    now = utc_now()
    stored = [
        stored_copy(step, sequence=first + offset, create_time=now)
        for offset, step in enumerate(steps)
    ]
    _INSERT_STEPS.execute_many(conn, [step_row(step) for step in stored])
    return stored


def _allocate_sequences(conn: Connection, session_id: str, count: int, held_by: str = "") -> int:
    """Reserve `count` sequences in the session (only while run `held_by` holds it, when
    given); returns the last one reserved.

    The UPDATE row-locks the session on PostgreSQL until commit, so concurrent appends
    queue here and each sees the counter the previous one committed; a take-over of the
    session queues there too, so a held write and a take-over never interleave.
    """
    params = {"session_id": session_id, "count": count, "now": utc_now()}
    if held_by:
        statement, params["run_id"] = _ALLOCATE_HELD_SEQUENCES, held_by
    else:
        statement = _ALLOCATE_SEQUENCES
    row = statement.first(conn, params)
    if row is None:
        if held_by:
            _require_session(conn, session_id)
            raise LeaseLostError(session_id, held_by)
        raise NotFoundError("session", session_id)
    return int(row[0])


def _delete_steps(conn: Connection, session_id: str, start_sequence: int) -> int:
    """Delete the session's steps from `start_sequence` on (the session row locked by the
    caller) and move its counter back; returns how many were deleted."""
    result = conn.execute(
        delete(step_table).where(
            step_table.c.session_id == session_id, step_table.c.sequence >= start_sequence
        )
    )
    conn.execute(
        update(session_table)
        .where(session_table.c.id == session_id)
        .values(last_sequence=start_sequence - 1, update_time=utc_now())
    )
    return int(result.rowcount)


def _check_last_step(conn: Connection, session_id: str, expect: HistoryMark | None) -> int:
    """The session's last sequence, when its last step is still `expect` (None: the session
    has no step); else HistoryChangedError. Step ids are never reused, so the same last
    step means the same log."""
    last = _require_session(conn, session_id)
    expected = expect.sequence if expect is not None else 0
    if last != expected:
        raise HistoryChangedError(session_id)
    if expect is not None:
        row = _SELECT_STEP_ID.first(conn, {"session_id": session_id, "sequence": last})
        if row is None or row[0] != expect.step_id:
            raise HistoryChangedError(session_id)
    return last


_SELECT_REQUEST_ID: Final = Prepared(
    select(run_table.c.id)
    .where(
        run_table.c.session_id == bindparam("session_id"),
        run_table.c.request_id == bindparam("request_id"),
    )
    .limit(1)
)


def _refuse_duplicate(conn: Connection, session_id: str, request_id: str) -> None:
    """DuplicateRequestError when a run of the session was started with `request_id`."""
    row = _SELECT_REQUEST_ID.first(conn, {"session_id": session_id, "request_id": request_id})
    if row is not None:
        raise DuplicateRequestError(request_id, str(row[0]))


_IDLE_STATUSES: Final = frozenset({RunStatus.REQUIRES_ACTION.value, RunStatus.QUEUED.value})
_SELECT_BLOCKERS: Final = Prepared(
    select(run_table.c.id, run_table.c.status, run_table.c.queue_position)
    .where(
        run_table.c.session_id == bindparam("session_id"),
        # Not `in_`: its list is rendered per call, which a prepared statement cannot take.
        or_(
            run_table.c.status == RunStatus.REQUIRES_ACTION.value,
            run_table.c.status == RunStatus.QUEUED.value,
        ),
    )
    .order_by(run_table.c.queue_position, run_table.c.create_time, run_table.c.id)
)
_QUEUED_RUN: Final = Prepared(
    select(run_table.c.id)
    .where(
        run_table.c.session_id == bindparam("session_id"),
        run_table.c.status == RunStatus.QUEUED.value,
    )
    .limit(1)
)


def _blockers(conn: Connection, session_id: str) -> tuple[str | None, list[tuple[str, int]]]:
    """The session's run waiting for its client (if any) and its queued runs (id, place),
    head first: what keeps a new run from starting besides the session's holder."""
    waiting: str | None = None
    queued: list[tuple[str, int]] = []
    with _SELECT_BLOCKERS.cursor(conn, {"session_id": session_id}) as cursor:
        for run_id, status, position in cast("Iterable[Sequence[Any]]", cursor):
            if status == RunStatus.REQUIRES_ACTION.value:
                waiting = waiting or str(run_id)
            else:
                queued.append((str(run_id), int(position)))
    return waiting, queued


def _live_holder(conn: Connection, session_id: str) -> str:
    """The run holding the session under a live lease ("" when free or expired)."""
    holder = conn.execute(
        select(session_table.c.active_run_id, session_table.c.lease_expires_at)
        .where(session_table.c.id == session_id)
        .with_for_update()
    ).first()
    if holder is None:
        raise NotFoundError("session", session_id)
    live = holder.active_run_id and _lease_live(holder.lease_expires_at, utc_now())
    return str(holder.active_run_id) if live else ""


def _enqueue(
    conn: Connection,
    run: Run,
    steps: Sequence[Step],
    queued: list[tuple[str, int]],
    holder: str,
    queue: QueueRequest,
    journal: Journal | None,
) -> RunStart:
    """Store `run` QUEUED behind (or, `queue.ahead`, before) the session's queue, its input
    kept on its row; ahead, the holder is asked to stop (`queue.supersede`) and, for a
    ROLLBACK, named with its first sequence so that its steps go when this run starts."""
    if len(queued) >= queue.max_queued:
        raise QueueFullError(run.session_id, queue.max_queued)
    positions = [position for _, position in queued]
    position = min(positions, default=1) - 1 if queue.ahead else max(positions, default=0) + 1
    waiting_run = replace(run, input=steps[0].content, queue_position=position).queued()
    if queue.ahead and holder:
        waiting_run.supersedes = holder
        if queue.supersede is not None:
            conn.execute(
                update(run_table)
                .where(
                    run_table.c.id == holder,
                    run_table.c.status == RunStatus.RUNNING.value,
                    run_table.c.cancel_request.is_(None),
                )
                .values(cancel_request=stop_signal_json(queue.supersede))
            )
        if queue.rollback:
            first = conn.execute(
                select(run_table.c.first_sequence).where(run_table.c.id == holder)
            ).scalar()
            waiting_run.rollback_from = int(first or 0)
    stored = stored_run(waiting_run)
    records = journal(stored, ()) if journal is not None else ()
    # Its queued start's events come before those of its start.
    stored.last_event_seq = max((record.seq for record in records), default=0)
    _insert_run(conn, stored)
    _write_journal(conn, run.id, records)
    return RunStart(stored, [], [], interrupted=holder if queue.ahead else "", holder=holder)


def _store_start(
    conn: Connection,
    run: Run,
    steps: Sequence[Step],
    since: HistoryMark | None,
    journal: Journal | None,
    *,
    insert: bool,
) -> RunStart:
    """A run starting on the session it holds: the steps of the run it rolls back deleted,
    its first steps appended, the run inserted (or, queued before, updated), its journal,
    and the history read back after `since`."""
    if run.rollback_from:
        _roll_back(conn, run.session_id, run.supersedes, run.rollback_from)
    stored_steps = _append(conn, run.session_id, steps)
    started = stored_run(
        replace(
            run,
            first_sequence=stored_steps[0].sequence,
            last_sequence=stored_steps[-1].sequence,
            step_count=len(stored_steps),
        )
    )
    if insert:
        _insert_run(conn, started)
    elif _CONTINUE_RUN.execute(conn, _run_update(started)) != 1:
        raise NotFoundError("run", run.id)
    if journal is not None:
        _write_journal(conn, run.id, journal(started, stored_steps))
    first = stored_steps[0].sequence
    start = _read_start(conn, run.session_id, since, first - 1)
    if start == first:
        history = list(stored_steps)
    else:
        before = _read_history(conn, run.session_id, start, first - 1, known_session=True)
        history = before + stored_steps
    return RunStart(run=started, steps=stored_steps, history=history, history_start=start)


def _roll_back(conn: Connection, session_id: str, run_id: str, start: int) -> None:
    """Delete the session's steps from `start` on, when every one of them is the rolled
    back run's. When another run wrote after it (a later INTERRUPT went first), its steps
    are no longer the log's end and nothing is deleted: the ROLLBACK starts as an INTERRUPT
    would, rather than delete another run's work or never start."""
    last = _require_session(conn, session_id, lock=True)
    if start > last:
        return
    others = conn.execute(
        select(func.count()).where(
            step_table.c.session_id == session_id,
            step_table.c.sequence >= start,
            step_table.c.run_id != run_id,
        )
    ).scalar()
    if not others:
        _delete_steps(conn, session_id, start)


_INSERT_EVENTS: Final = Prepared(insert(event_table))
_SELECT_JOURNAL: Final = Prepared(
    select(event_table.c.seq, event_table.c.time, event_table.c.kind, event_table.c.payload)
    .where(event_table.c.run_id == bindparam("run_id"), event_table.c.seq > bindparam("after"))
    .order_by(event_table.c.seq)
)


def _write_journal(conn: Connection, run_id: str, records: Sequence[JournalRecord]) -> None:
    if records:
        _INSERT_EVENTS.execute_many(conn, [journal_row(run_id, record) for record in records])


def _acquire(conn: Connection, session_id: str, run_id: str, lease: _Lease) -> None:
    """Make `run_id` the session's active run under a lease of `lease` from now; over an
    expired lease, the previous holder's run is interrupted. Raises NotFoundError,
    SessionBusyError.
    """
    # Compare-and-set in the database, so it holds across processes and replicas. Not
    # re-entrant: two continuations of one run (a submit and a cancel) exclude each other.
    now = utc_now()
    values = {
        "session_id": session_id,
        "run_id": run_id,
        "expires": now + lease.term,
        "owner": lease.owner,
    }
    if _TAKE_FREE_SESSION.first(conn, values) is not None:
        return
    # Held (or unknown): read the holder under a row lock, so a renewal or another take
    # waits for this transaction and then sees its outcome.
    holder = conn.execute(
        select(
            session_table.c.active_run_id,
            session_table.c.lease_expires_at,
            session_table.c.last_sequence,
        )
        .where(session_table.c.id == session_id)
        .with_for_update()
    ).first()
    if holder is None:
        raise NotFoundError("session", session_id)
    previous = str(holder.active_run_id or "")
    if previous and _lease_live(holder.lease_expires_at, now):
        raise SessionBusyError(session_id, previous)
    conn.execute(_TAKE_LOCKED_SESSION, values)
    if previous and previous != run_id:
        _interrupt_run(conn, session_id, previous, int(holder.last_sequence), now)


def _take_for_edit(conn: Connection, session_id: str, lease: _Lease) -> str:
    """Take the session for an edit made in the same transaction (the caller lets it go
    there too, or deletes it): refused while a run holds it, as a run's take is, and over an
    expired lease the run that held it is interrupted. Nothing stays held whatever happens
    to the transaction. Returns the edit's holder id. Raises NotFoundError, SessionBusyError.
    """
    holder = new_id("edit")
    _acquire(conn, session_id, holder, lease)
    return holder


def _interrupt_run(
    conn: Connection,
    session_id: str,
    run_id: str,
    last_sequence: int,
    now: datetime,
    message: str = LEASE_EXPIRED_MESSAGE,
) -> bool:
    """Finalise a run whose server is gone, if it is still RUNNING: INTERRUPTED, retryable
    from the session's next sequence, its terminal event journaled after the last one its
    server stored. Returns whether it was RUNNING."""
    row = conn.execute(
        select(run_table)
        .where(run_table.c.id == run_id, run_table.c.status == RunStatus.RUNNING.value)
        .with_for_update()
    ).first()
    if row is None:
        return False
    run = run_from_row(row)
    # The run row was last written when its segment started; its steps tell how far it got.
    count, last = conn.execute(
        select(func.count(), func.max(step_table.c.sequence)).where(
            step_table.c.session_id == session_id, step_table.c.run_id == run_id
        )
    ).one()
    if count:
        run.step_count, run.last_sequence = int(count), int(last)
    journaled = conn.execute(
        select(func.max(event_table.c.seq)).where(event_table.c.run_id == run_id)
    ).scalar()
    seq = max(int(journaled or 0), run.last_event_seq) + TAKEOVER_SEQ_GAP
    signal = abandoned_run_signal(message, last_sequence + 1)
    # Its calls left without a result get an error result, as a stop's would: the log stays
    # valid history, and a Retry from the first of them runs those calls again.
    results = _answer_open_calls(conn, session_id, run_id, unfinished_reason(signal))
    records = []
    for offset, step in enumerate(results):
        records.append(JournalRecord(seq + offset, now, "step_completed", step=step))
    if results:
        run.step_count += len(results)
        run.last_sequence = results[-1].sequence
        signal.resume_from_sequence = results[0].sequence
    run.last_event_seq = seq + len(results)
    ended = stored_run(run.ended(signal, now))
    conn.execute(_UPDATE_RUN, _run_update(ended))
    records.append(JournalRecord(ended.last_event_seq, now, terminal_kind(ended), run=ended))
    _write_journal(conn, run_id, records)
    return True


def _answer_open_calls(conn: Connection, session_id: str, run_id: str, why: str) -> list[Step]:
    """Store an error result for each call of the session's last assistant step, when it
    is the run's, that has none; the results as stored."""
    last_reply = conn.execute(
        select(func.max(step_table.c.sequence)).where(
            step_table.c.session_id == session_id, step_table.c.role == Role.ASSISTANT.value
        )
    ).scalar()
    if last_reply is None:
        return []
    reply, *after = _read_history(conn, session_id, int(last_reply), None, known_session=True)
    if reply.run_id != run_id or not reply.tool_calls:
        return []
    answered = {step.tool_call_id for step in after if step.role is Role.TOOL}
    open_calls = [call for call in reply.tool_calls if call.id not in answered]
    if not open_calls:
        return []
    results = [unanswered_call_result(session_id, run_id, call, why) for call in open_calls]
    return _append(conn, session_id, results)


def _session_is(session_id: str, tenant: str | None) -> Any:
    """The session's row, when it is `tenant`'s (any tenant's: None). Another tenant's
    session is not found, exactly as a missing one: same error, same message."""
    if tenant is None:
        return session_table.c.id == session_id
    return and_(session_table.c.id == session_id, session_table.c.tenant == tenant)


def _require_session(
    conn: Connection,
    session_id: str,
    *,
    lock: bool = False,
    shared: bool = False,
    tenant: str | None = None,
) -> int:
    """The session's last sequence; raises NotFoundError, also for a session that is not
    `tenant`'s (when given). `lock` row-locks it (PostgreSQL)."""
    query = select(session_table.c.last_sequence).where(_session_is(session_id, tenant))
    if lock:
        query = query.with_for_update(read=shared)
    last = conn.execute(query).scalar_one_or_none()
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
    _implements_leases: type[SessionLeases] = SqlStepStore
