"""`SqlSessionLog`: sessions and their step logs (store/log.py) on one `Database`."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import (
    Connection,
    case,
    delete,
    func,
    insert,
    select,
)

from agio_grpc.domain import (
    ContextSummary,
    Role,
    Session,
    Step,
    new_id,
    utc_now,
)
from agio_grpc.store.errors import (
    InvalidRangeError,
    NotFoundError,
)
from agio_grpc.store.records import (
    HistoryMark,
    HistoryRead,
    Journal,
)
from agio_grpc.store.rows import (
    session_from_row,
)
from agio_grpc.store.sql import single
from agio_grpc.store.sql.steps import (
    SELECT_STEP,
    append,
    check_last_step,
    check_limit,
    delete_steps,
    older_than,
    read_history,
    read_start,
    read_steps,
    require_session,
    select_steps,
    session_is,
    write_journal,
)
from agio_grpc.store.sql.takes import RELEASE_SESSION, SqlRole, insert_session, take_for_edit
from agio_grpc.store.tables import sessions as session_table
from agio_grpc.store.tables import steps as step_table


class SqlSessionLog(SqlRole):
    """A `SessionLog` on one `Database`."""

    async def get_session(self, session_id: str, *, tenant: str | None = None) -> Session:
        def work(conn: Connection) -> Any:
            return conn.execute(select(session_table).where(session_is(session_id, tenant))).first()

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
        check_limit(limit)
        created, session_id = session_table.c.create_time, session_table.c.id
        query = select(session_table).order_by(created.desc(), session_id.desc()).limit(limit)
        if tenant is not None:
            query = query.where(session_table.c.tenant == tenant)
        if after is not None:
            query = query.where(older_than(created, session_id, after))
        rows = await self._read(lambda conn: conn.execute(query).all())
        return [session_from_row(row) for row in rows]

    async def delete_session(self, session_id: str, *, tenant: str | None = None) -> int:
        def work(conn: Connection) -> Any:
            if tenant is not None:  # before the take: another's busy session is missing too
                require_session(conn, session_id, tenant=tenant)
            take_for_edit(conn, session_id, self._lease)
            # Steps and runs go with the session by ON DELETE CASCADE.
            return conn.execute(
                delete(session_table)
                .where(session_is(session_id, tenant))
                .returning(session_table.c.last_sequence)
            ).scalar_one_or_none()

        deleted_steps = await self._write(work)
        if deleted_steps is None:
            raise NotFoundError("session", session_id)
        return int(deleted_steps)

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
        if held_by and self._one_statement:
            stored = await self._database.run_statement(
                lambda conn: single.append_held(conn, held_by, steps, journal)
            )
            if stored is not None:
                return stored

        def work(conn: Connection) -> list[Step]:
            stored = append(conn, session_id, steps, held_by)
            if journal is not None:
                write_journal(conn, held_by, journal(None, stored))
            return stored

        return await self._write(work, brief=True)

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
            check_limit(limit)
            params["limit"] = limit
        query = select_steps(bounded=end is not None, limited=limit is not None)

        def work(conn: Connection) -> list[Step]:
            if tenant is not None:
                require_session(conn, session_id, tenant=tenant)
            steps = read_steps(conn, session_id, query, params)
            if not steps and tenant is None:
                require_session(conn, session_id)
            return steps

        return await self._read(work)

    async def get_history(
        self, session_id: str, start: int = 1, end: int | None = None
    ) -> list[Step]:
        return await self._read(lambda conn: read_history(conn, session_id, start, end))

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
                require_session(conn, session_id, tenant=tenant)
            start = read_start(conn, session_id, since, end)
            # A mark that held proved the session is there (so did the tenant's check).
            known = start > 1 or tenant is not None
            steps = read_history(conn, session_id, start, end, known_session=known)
            return HistoryRead(steps, start)

        return await self._read(work)

    async def get_step(self, session_id: str, sequence: int, *, tenant: str | None = None) -> Step:
        def work(conn: Connection) -> Step:
            if tenant is not None:
                require_session(conn, session_id, tenant=tenant)
            steps = read_steps(
                conn, session_id, SELECT_STEP, {"session_id": session_id, "sequence": sequence}
            )
            if not steps:
                require_session(conn, session_id)
                raise NotFoundError("step", f"{session_id}#{sequence}")
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

    async def append_to_idle_session(
        self, step: Step, *, after: HistoryMark | None, tenant: str | None = None
    ) -> Step:
        session_id = step.session_id

        def work(conn: Connection) -> Step:
            if tenant is not None:  # before the take: another's busy session is missing too
                require_session(conn, session_id, tenant=tenant)
            holder = take_for_edit(conn, session_id, self._lease)
            check_last_step(conn, session_id, after)
            (stored,) = append(conn, session_id, [step], holder)
            RELEASE_SESSION.execute(conn, {"session_id": session_id, "run_id": holder})
            return stored

        return await self._write(work, brief=True)

    async def delete_steps_from(
        self, session_id: str, start_sequence: int, *, tenant: str | None = None
    ) -> int:
        def work(conn: Connection) -> int:
            if tenant is not None:  # before the take: another's busy session is missing too
                require_session(conn, session_id, tenant=tenant)
            holder = take_for_edit(conn, session_id, self._lease)
            # The row lock keeps appends and forks out until the counter is reset.
            last = require_session(conn, session_id, lock=True)
            if start_sequence < 1:
                raise InvalidRangeError(
                    f"start_sequence must be at least 1, got {start_sequence}",
                    field="start_sequence",
                    last_sequence=last,
                )
            deleted = (
                delete_steps(conn, session_id, start_sequence) if start_sequence <= last else 0
            )
            RELEASE_SESSION.execute(conn, {"session_id": session_id, "run_id": holder})
            return deleted

        return await self._write(work)

    async def fork_session(
        self, session_id: str, up_to_sequence: int, *, tenant: str | None = None
    ) -> Session:
        def work(conn: Connection) -> Session:
            # A shared lock: other forks may read along, deletes and appends wait.
            parent = conn.execute(
                select(session_table.c.last_sequence, session_table.c.tenant)
                .where(session_is(session_id, tenant))
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
            insert_session(conn, fork, last_sequence=up_to_sequence, lease=self._lease)
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
                require_session(conn, session_id, tenant=tenant)
            row = conn.execute(query).one()
            if row[0] == 0 and tenant is None:
                require_session(conn, session_id)
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
