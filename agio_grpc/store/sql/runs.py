"""`SqlRunLedger`: the run transitions (store/ledger.py), each one transaction (the usual
ones one statement on PostgreSQL, single.py), built on the reads of runs (run_records.py)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any, Final

from sqlalchemy import (
    Connection,
    bindparam,
    exists,
    func,
    select,
    update,
)

from agio_grpc.domain import (
    ABANDONED_MESSAGE,
    LEASE_EXPIRED_MESSAGE,
    RESTARTED_MESSAGE,
    Run,
    RunStatus,
    Session,
    Step,
    utc_now,
)
from agio_grpc.store.database import Database
from agio_grpc.store.errors import (
    NotFoundError,
    RunRequiresActionError,
    RunStateConflictError,
    SessionBusyError,
)
from agio_grpc.store.prepared import Prepared
from agio_grpc.store.records import (
    HistoryMark,
    IdleEnd,
    Journal,
    QueueRequest,
    RunContinuation,
    RunEnd,
    RunStart,
)
from agio_grpc.store.rows import (
    run_from_row,
    stored_run,
    stored_session,
)
from agio_grpc.store.sql import single
from agio_grpc.store.sql.run_records import SqlRunRecords
from agio_grpc.store.sql.starts import (
    CONTINUE_RUN,
    IDLE_STATUSES,
    QUEUED_RUN,
    Quotas,
    blockers,
    enqueue,
    live_holder,
    refuse_duplicate,
    store_start,
)
from agio_grpc.store.sql.steps import (
    append,
    check_last_step,
    delete_steps,
    free_history,
    require_session,
    write_journal,
)
from agio_grpc.store.sql.takes import (
    HELD,
    RELEASE_SESSION,
    UPDATE_RUN,
    Lease,
    acquire,
    insert_run,
    insert_session,
    interrupt_run,
    lease_expired,
    lease_live,
    run_update,
)
from agio_grpc.store.tables import runs as run_table
from agio_grpc.store.tables import sessions as session_table

_QUEUED: Final = run_table.alias("queued")

# A run's end, unless another server ended it first (a take-over after its lease ran out),
# returning whether a run waits QUEUED on its session. A run is only ever queued under its
# session's row lock (`enqueue`), which the end holds from its session `UPDATE`, the
# statement before this one, until it commits: this statement's snapshot (PostgreSQL's
# READ COMMITTED takes one per statement; SQLite has one writer) sees every run queued
# until then. As a subquery of that `UPDATE` it would not: one that waited for the lock
# keeps the snapshot from before the wait.
END_RUNNING_RUN: Final = Prepared(
    UPDATE_RUN.where(run_table.c.status == RunStatus.RUNNING.value).returning(
        exists()
        .where(
            _QUEUED.c.session_id == bindparam("queued_session_id"),
            _QUEUED.c.status == RunStatus.QUEUED.value,
        )
        .label("queued")
    )
)


def _check_start(run: Run, steps: Sequence[Step], new_session: Session | None) -> None:
    """ValueError for a `start_run` no caller may make."""
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


class SqlRunLedger(SqlRunRecords):
    """A `RunLedger` on one `Database`: each transition one transaction (store/ledger.py),
    or, on PostgreSQL, a run's usual start and end one statement (sql/single.py)."""

    def __init__(self, database: Database, lease: Lease, quotas: Quotas) -> None:
        super().__init__(database, lease)
        self._quotas = quotas

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
        _check_start(run, steps, new_session)
        read: list[Step] = []
        if new_session is None and (since is None or since.sequence < 1) and not run.rollback_from:
            # The history the caller does not hold, read first: the start then writes
            # after it briefly (one statement on PostgreSQL) rather than holding the write
            # lock through the read, reading only what a write in between added (or all
            # of it again, when that write cut the log).
            read = await self._database.read_statement(
                lambda conn: free_history(conn, run.session_id, run.tenant)
            )
            since = HistoryMark(read[-1].sequence, read[-1].id) if read else since
        started = await self._start(run, steps, new_session, since, journal, queue)
        if read and since is not None and started.history_start == since.sequence + 1:
            return replace(started, history=[*read, *started.history], history_start=1)
        return started

    async def _start(
        self,
        run: Run,
        steps: Sequence[Step],
        new_session: Session | None,
        since: HistoryMark | None,
        journal: Journal | None,
        queue: QueueRequest | None,
    ) -> RunStart:
        """`start_run` once its history is read: one statement where that can be, else its
        transaction."""
        fresh = stored_session(new_session) if new_session is not None else None
        session_id = run.session_id
        quotas, owner = self._quotas, self._lease.owner

        def work(conn: Connection) -> RunStart:
            if fresh is not None:  # created holding the sequences of its first steps
                insert_session(
                    conn, fresh, last_sequence=len(steps), lease=self._lease, active_run_id=run.id
                )
                quotas.check_running(conn, run.tenant)
                return store_start(conn, run, steps, since, journal, insert=True, fresh=True)
            # The session row first (the lock order of every take): what is read below, the
            # runs in the way and a reused request_id, stays true until this commits. Only
            # the run's tenant's: another's is missing, busy or not.
            require_session(conn, session_id, lock=True, tenant=run.tenant)
            if run.request_id:
                refuse_duplicate(conn, session_id, run.request_id)
            waiting, queued = blockers(conn, session_id)
            if waiting is None and not queued:
                try:
                    acquire(conn, session_id, run.id, self._lease)
                except SessionBusyError as busy:
                    if queue is None:
                        raise
                    quotas.check_queued(conn, run.tenant)
                    return enqueue(
                        conn, run, steps, queued, busy.active_run_id, queue, journal, owner
                    )
                quotas.check_running(conn, run.tenant)
                return store_start(conn, run, steps, since, journal, insert=True)
            if queue is None or (queue.ahead and waiting is not None):
                if waiting is not None:
                    raise RunRequiresActionError(session_id, waiting)
                raise SessionBusyError(session_id, queued[0][0])
            holder = live_holder(conn, session_id)
            quotas.check_queued(conn, run.tenant)
            return enqueue(conn, run, steps, queued, holder, queue, journal, owner)

        if (started := await self._start_in_one(fresh, run, steps, since, journal)) is not None:
            return started
        # Brief unless it reads a whole history (none was read before: the session is
        # held, empty, missing, or a rolled back run's) or deletes a rolled back run's steps.
        brief = new_session is not None or (since is not None and not run.rollback_from)
        return await self._write(work, brief=brief)

    async def _start_in_one(
        self,
        fresh: Session | None,
        run: Run,
        steps: Sequence[Step],
        since: HistoryMark | None,
        journal: Journal | None,
    ) -> RunStart | None:
        """A run's start as one statement where that can be (sql/single.py): on a new
        session, or on one whose history the caller holds up to `since`. None: it is for
        `start_run`'s transaction."""
        if not self._one_statement or self._quotas.counts_running or run.rollback_from:
            return None
        lease = self._lease
        if fresh is not None:
            return await self._database.run_statement(
                lambda conn: single.start_fresh(conn, fresh, lease, run, steps, journal)
            )
        if since is None or since.sequence < 1:
            return None
        return await self._database.run_statement(
            lambda conn: single.start_on(conn, run, steps, since, lease, journal)
        )

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
            acquire(conn, session_id, run.id, self._lease)
            waiting, queued = blockers(conn, session_id)
            if waiting is not None:
                raise RunRequiresActionError(session_id, waiting)
            if not queued:  # cancelled since it was read
                raise RunStateConflictError(run.id, "ended", RunStatus.QUEUED.value)
            if queued[0][0] != run.id:
                raise SessionBusyError(session_id, queued[0][0])  # another is ahead of it
            return store_start(conn, run.resumed(), steps, since, journal, insert=False)

        return await self._write(work, brief=since is not None)

    async def continue_run(
        self,
        run: Run,
        steps: Sequence[Step],
        *,
        expect: HistoryMark | None = None,
        journal: Journal | None = None,
    ) -> RunContinuation:
        # No steps: every call it waited for was approved, and runs in the continued segment.
        if any(step.session_id != run.session_id for step in steps):
            raise ValueError("continue_run takes steps of the run's session")

        def work(conn: Connection) -> RunContinuation:
            acquire(conn, run.session_id, run.id, self._lease)
            check_last_step(conn, run.session_id, expect)
            status = conn.execute(
                select(run_table.c.status).where(run_table.c.id == run.id)
            ).scalar()
            if status is None:
                raise NotFoundError("run", run.id)
            if status != RunStatus.REQUIRES_ACTION.value:
                raise RunStateConflictError(run.id, str(status))
            self._quotas.check_running(conn, run.tenant)
            stored = append(conn, run.session_id, steps, held_by=run.id) if steps else []
            continued = stored_run(
                replace(
                    run.resumed(),
                    step_count=run.step_count + len(stored),
                    last_sequence=stored[-1].sequence if stored else run.last_sequence,
                )
            )
            if CONTINUE_RUN.execute(conn, run_update(continued)) != 1:
                raise NotFoundError("run", run.id)
            if journal is not None:
                write_journal(conn, run.id, journal(continued, stored))
            return RunContinuation(continued, stored)

        return await self._write(work, brief=True)

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
            require_session(conn, run.session_id, tenant=run.tenant)
            acquire(conn, run.session_id, run.id, self._lease)
            waiting, queued = blockers(conn, run.session_id)
            if waiting is not None:
                raise RunRequiresActionError(run.session_id, waiting)
            if queued:  # the queue goes first
                raise SessionBusyError(run.session_id, queued[0][0])
            last = check_last_step(conn, run.session_id, expect)
            self._quotas.check_running(conn, run.tenant)
            if delete_from <= last:
                delete_steps(conn, run.session_id, delete_from)
            started = stored_run(run)
            insert_run(conn, started)
            if journal is not None:
                write_journal(conn, run.id, journal(started, ()))
            return started

        if delete_from < 1:
            raise ValueError(f"delete_from must be at least 1, got {delete_from}")
        return await self._write(work)

    async def end_run(
        self, run: Run, *, steps: Sequence[Step] = (), journal: Journal | None = None
    ) -> RunEnd:
        if any(step.session_id != run.session_id for step in steps):
            raise ValueError("end_run takes steps of the run's session")
        if self._one_statement:
            end = await self._database.run_statement(
                lambda conn: single.end_run(conn, run, steps, journal)
            )
            if end is not None:
                return end
        released = {"session_id": run.session_id, "run_id": run.id}

        def work(conn: Connection) -> RunEnd:
            # The session row first, as every take does (then the run's): one lock order,
            # so an end and a take over of an expired lease cannot deadlock on PostgreSQL.
            # Steps are appended while the run still holds it (LeaseLostError if not), the
            # session released by the same statement.
            if steps:
                stored = append(conn, run.session_id, steps, held_by=run.id, release=True)
                release = True
            else:
                stored, release = [], RELEASE_SESSION.execute(conn, released) == 1
            ended = stored_run(run.with_steps(stored))
            params = {**run_update(ended), "queued_session_id": run.session_id}
            if (returned := END_RUNNING_RUN.first(conn, params)) is not None:
                if journal is not None:
                    write_journal(conn, run.id, journal(ended, stored))
                return RunEnd(release, queued=release and bool(returned[0]), steps=stored)
            if stored:  # held its session, yet not RUNNING: no end of the run does that
                raise RunStateConflictError(run.id, "not RUNNING", "RUNNING with its session held")
            row = conn.execute(select(run_table).where(run_table.c.id == run.id)).first()
            if row is None:
                raise NotFoundError("run", run.id)
            return RunEnd(release, run_from_row(row))  # ended first by a take-over

        return await self._write(work, brief=True)

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
            if status not in IDLE_STATUSES:
                return None
            if steps and holder.active_run_id:  # a SubmitToolOutputs is continuing it now
                raise SessionBusyError(run.session_id, str(holder.active_run_id))
            if steps:  # the results answer the calls of the log the caller read
                check_last_step(conn, run.session_id, expect)
            stored = append(conn, run.session_id, steps) if steps else []
            ended = stored_run(run.with_steps(stored))
            conn.execute(UPDATE_RUN, run_update(ended))
            if journal is not None:
                write_journal(conn, run.id, journal(ended, stored))
            queued = QUEUED_RUN.first(conn, {"session_id": run.session_id}) is not None
            return IdleEnd(ended, stored, queued=queued)

        return await self._write(work, brief=True)

    async def release_session(self, session_id: str, run_id: str) -> bool:
        def work(conn: Connection) -> bool:
            held = {"session_id": session_id, "run_id": run_id}
            return RELEASE_SESSION.execute(conn, held) == 1

        return await self._write(work, brief=True)

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
                if lease_live(holder.lease_expires_at, now):
                    return False  # its server renews it: alive
                RELEASE_SESSION.execute(conn, {"session_id": run.session_id, "run_id": run_id})
                message = LEASE_EXPIRED_MESSAGE
            last_sequence = int(holder.last_sequence)
            return interrupt_run(conn, run.session_id, run_id, last_sequence, now, message)

        return await self._write(work)

    async def recover_expired_runs(self) -> list[str]:
        return await self._recover(lambda now: lease_expired(now), LEASE_EXPIRED_MESSAGE)

    async def recover_own_runs(self) -> list[str]:
        """End INTERRUPTED the runs this server's instance left RUNNING when it stopped, live
        lease or not (it runs none yet), and release their sessions; their run ids. Call it
        at start, before serving: nothing when the store has no instance id."""
        owner = self._lease.owner
        if owner is None:
            return []
        return await self._recover(
            lambda _: session_table.c.lease_owner == owner, RESTARTED_MESSAGE
        )

    async def _recover(self, which: Callable[[datetime], Any], message: str) -> list[str]:
        def work(conn: Connection) -> list[str]:
            now = utc_now()
            # SKIP LOCKED: a session another transaction is taking over is its business.
            expired = conn.execute(
                select(
                    session_table.c.id,
                    session_table.c.active_run_id,
                    session_table.c.last_sequence,
                )
                .where(HELD, which(now))
                .with_for_update(skip_locked=True)
            ).all()
            interrupted = [
                row.active_run_id
                for row in expired
                if interrupt_run(conn, row.id, row.active_run_id, row.last_sequence, now, message)
            ]
            if expired:
                conn.execute(
                    update(session_table)
                    .where(session_table.c.id.in_([row.id for row in expired]))
                    .values(active_run_id=None, lease_expires_at=None, lease_owner=None)
                )
            return interrupted

        return await self._write(work)

    async def runs_past_approval_deadline(self, now: datetime, limit: int = 100) -> list[Run]:
        query = (
            select(run_table)
            .where(
                run_table.c.approval_deadline <= now,
                run_table.c.status == RunStatus.REQUIRES_ACTION.value,
            )
            .order_by(run_table.c.approval_deadline, run_table.c.id)
            .limit(limit)
        )
        rows = await self._read(lambda conn: conn.execute(query).all())
        return [run_from_row(row) for row in rows]

    async def next_approval_deadline(self) -> datetime | None:
        query = select(func.min(run_table.c.approval_deadline)).where(
            run_table.c.status == RunStatus.REQUIRES_ACTION.value
        )
        deadline: datetime | None = await self._read(lambda conn: conn.execute(query).scalar())
        return deadline

    async def queued_runs_called_here(self) -> list[Run]:
        owner = self._lease.owner
        if owner is None:
            return []
        query = (
            select(run_table)
            .where(
                run_table.c.status == RunStatus.QUEUED.value,
                run_table.c.caller_instance == owner,
            )
            .order_by(run_table.c.create_time, run_table.c.id)
        )
        rows = await self._read(lambda conn: conn.execute(query).all())
        return [run_from_row(row) for row in rows]
