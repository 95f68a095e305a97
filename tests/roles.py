"""Every role of the SQL store in one object, for tests that read and write across roles.

The service hands each consumer one role (agio_grpc/service/app.py), and only the engine's
lifecycle holds the ledger. A test sets the scene through any of them, so `StoreRoles` is
the log, the ledger (with the reads of runs) and the leases at once, all on one database
and one lease, exactly the SQL code the service runs. The few writes a test needs that no
role offers (a session with no run, a run row in a given state, a session held for a run
that is not stored) are `seed_*`, `take_session` and `set_run_row`: plain SQL on the
store's tables through the statements the roles use, never a path the service has.
"""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import Connection

from agio_grpc.domain import Run, Session, Step
from agio_grpc.store.keys import KeyStore
from agio_grpc.store.push import PushConfigs
from agio_grpc.store.records import TenantQuotas
from agio_grpc.store.rows import stored_run, stored_session
from agio_grpc.store.sql import DEFAULT_SESSION_LEASE_S, SqlStore, open_store
from agio_grpc.store.sql.leases import SqlLeases
from agio_grpc.store.sql.log import SqlSessionLog
from agio_grpc.store.sql.runs import SqlRunLedger
from agio_grpc.store.sql.starts import Quotas
from agio_grpc.store.sql.steps import require_session
from agio_grpc.store.sql.takes import (
    UPDATE_RUN,
    Lease,
    acquire,
    insert_run,
    insert_session,
    run_update,
)


class StoreRoles(SqlSessionLog, SqlRunLedger, SqlLeases):
    """The SQL store's roles as one object (module docstring). Open it with `open_roles`."""

    def __init__(self, front: SqlStore, lease: Lease, quotas: TenantQuotas) -> None:
        database = front._database  # the front's own: one database for every role
        SqlRunLedger.__init__(self, database, lease, Quotas(quotas, database.backend))
        self.front = front

    @property
    def log(self) -> StoreRoles:
        return self

    @property
    def runs(self) -> StoreRoles:
        return self

    @property
    def ledger(self) -> StoreRoles:
        return self

    @property
    def leases(self) -> StoreRoles:
        return self

    def keys(self) -> KeyStore:
        return self.front.keys()

    def push_configs(self) -> PushConfigs:
        return self.front.push_configs()

    async def server_secret(self, name: str, size: int = 32) -> bytes:
        return await self.front.server_secret(name, size)

    async def close(self) -> None:
        await self.front.close()

    # -- what a test sets up that no role offers --------------------------------------------

    async def new_session(self, session: Session | None = None) -> Session:
        """A session with no step and no run (the service makes one with its first run)."""
        stored = stored_session(session or Session())

        def work(conn: Connection) -> None:
            insert_session(conn, stored, last_sequence=0, lease=self._lease)

        await self._write(work)
        return stored

    async def append_one(self, step: Step) -> Step:
        """`append_steps` of one step, with no run holding its session."""
        return (await self.append_steps([step]))[0]

    async def last_step(self, session_id: str) -> Step | None:
        steps = await self.get_steps(session_id)
        return steps[-1] if steps else None

    async def step_count(self, session_id: str) -> int:
        return (await self.get_session(session_id)).step_count

    async def seed_run(self, run: Run) -> Run:
        """A run row as given, with no step and no session taken (NotFoundError for an
        unknown session or one of another tenant)."""
        stored = stored_run(run)

        def work(conn: Connection) -> None:
            require_session(conn, run.session_id, tenant=run.tenant)
            insert_run(conn, stored)

        await self._write(work)
        return stored

    async def set_run_row(self, run: Run) -> None:
        """Overwrite a run row's state (a crash's leftovers, an old server's row)."""
        await self._write(lambda conn: conn.execute(UPDATE_RUN, run_update(run)))

    async def take_session(self, session_id: str, run_id: str) -> None:
        """Take the session for `run_id` as every transition takes one (takes.py `acquire`):
        over a free session or an expired lease, else SessionBusyError."""
        await self._write(lambda conn: acquire(conn, session_id, run_id, self._lease))


async def open_roles(
    url: str,
    *,
    sqlite_synchronous: str = "NORMAL",
    session_lease_s: float = DEFAULT_SESSION_LEASE_S,
    instance_id: str = "",
    quotas: TenantQuotas | None = None,
) -> StoreRoles:
    """`open_store`'s store, as `StoreRoles`."""
    front = await open_store(
        url,
        sqlite_synchronous=sqlite_synchronous,
        session_lease_s=session_lease_s,
        instance_id=instance_id,
        quotas=quotas,
    )
    lease = Lease(timedelta(seconds=session_lease_s), instance_id or None)
    return StoreRoles(front, lease, quotas or TenantQuotas())
