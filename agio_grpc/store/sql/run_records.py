"""`SqlRunRecords`: the reads of runs and of their journal (store/runs.py) on one
`Database`, which the ledger's transitions (runs.py) are built on."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from datetime import datetime
from typing import Any, cast

from sqlalchemy import Connection, func, or_, select

from agio_grpc.domain import Run, RunStatus, utc_now
from agio_grpc.store.errors import NotFoundError
from agio_grpc.store.records import JournalRecord
from agio_grpc.store.rows import aware_utc, journal_from_row, run_from_row
from agio_grpc.store.sql.steps import SELECT_JOURNAL, check_limit, older_than, require_session
from agio_grpc.store.sql.takes import HELD, SqlRole, lease_expired
from agio_grpc.store.tables import runs as run_table
from agio_grpc.store.tables import sessions as session_table


class SqlRunRecords(SqlRole):
    """Runs as stored, and their journals."""

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
        check_limit(limit)
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
            query = query.where(older_than(created, run_id, after))

        def work(conn: Connection) -> list[Run]:
            rows = conn.execute(query).all()
            if not rows:
                require_session(conn, session_id, tenant=tenant)
            return [run_from_row(row) for row in rows]

        return await self._read(work)

    async def list_agent_runs(
        self,
        agent: str,
        limit: int,
        after: tuple[datetime, str] | None = None,
        *,
        tenant: str,
        session_id: str | None = None,
        statuses: Collection[RunStatus] = (),
        changed_since: datetime | None = None,
    ) -> list[Run]:
        check_limit(limit)
        created, run_id = run_table.c.create_time, run_table.c.id
        query = (
            select(run_table)
            .where(run_table.c.tenant == tenant, run_table.c.agent == agent)
            .order_by(created.desc(), run_id.desc())
            .limit(limit)
        )
        if session_id is not None:
            query = query.where(run_table.c.session_id == session_id)
        if statuses:
            query = query.where(run_table.c.status.in_(sorted(statuses)))
        if changed_since is not None:
            since = aware_utc(changed_since, "changed_since")
            query = query.where(func.coalesce(run_table.c.end_time, created) >= since)
        if after is not None:
            query = query.where(older_than(created, run_id, after))

        def work(conn: Connection) -> list[Run]:
            return [run_from_row(row) for row in conn.execute(query).all()]

        return await self._read(work)

    async def read_journal(self, run_id: str, after_seq: int = 0) -> list[JournalRecord]:
        params = {"run_id": run_id, "after": after_seq}

        def work(conn: Connection) -> list[JournalRecord]:
            with SELECT_JOURNAL.cursor(conn, params) as cursor:
                rows = cast("Iterable[Sequence[Any]]", cursor)
                return [journal_from_row(*row) for row in rows]

        return await self._read(work)

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
        check_limit(limit)

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
                    or_(~HELD, lease_expired(now)),
                    ~waiting,
                )
                .limit(limit)
            ).scalars()
            return [str(session_id) for session_id in rows]

        return await self._read(work)
