"""`SqlLeases`: renewing session leases, cancel requests across members, and the member
directory (store/leases.py) on one `Database`."""

from __future__ import annotations

from collections.abc import Collection, Mapping

from sqlalchemy import (
    Connection,
    select,
    tuple_,
    update,
)

from agio_grpc.domain import (
    RunStatus,
    StopReason,
    StopSignal,
    utc_now,
)
from agio_grpc.store.database import (
    insert_ignoring_conflicts,
)
from agio_grpc.store.errors import (
    NotFoundError,
)
from agio_grpc.store.records import (
    Member,
)
from agio_grpc.store.rows import (
    stop_signal_from_json,
    stop_signal_json,
)
from agio_grpc.store.sql.takes import SqlRole
from agio_grpc.store.tables import members as member_table
from agio_grpc.store.tables import runs as run_table
from agio_grpc.store.tables import sessions as session_table


class SqlLeases(SqlRole):
    """`SessionLeases` and `MemberDirectory` on one `Database`."""

    @property
    def session_lease_s(self) -> float:
        return self._lease.term.total_seconds()

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
