"""A2A push notification configs: where a run's (an A2A task's) state changes are POSTed.

`PushConfigs` runs on the store's `Database` (`SqlStore.push_configs()`), one transaction
per operation, and raises only `StoreError` subclasses. Every read and change but
`for_run` (the sender's) is filtered by tenant: another tenant's config is not there. At
most `MAX_PER_RUN` configs per run. Never imports grpc or the engine.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final

from sqlalchemy import Connection, delete, func, insert, select

from agio_grpc.domain import RunStatus, utc_now
from agio_grpc.store.database import Database
from agio_grpc.store.errors import StoreError
from agio_grpc.store.tables import push_configs as table
from agio_grpc.store.tables import runs

MAX_PER_RUN: Final = 10


class TooManyConfigsError(StoreError):
    """A run has `MAX_PER_RUN` configs already."""

    def __init__(self, run_id: str) -> None:
        super().__init__(f"task {run_id!r} has {MAX_PER_RUN} push notification configs already")
        self.run_id = run_id


@dataclass(frozen=True, slots=True)
class PushConfig:
    """Where to POST a run's state changes, and what to send with them."""

    run_id: str
    id: str
    tenant: str
    url: str
    token: str = ""
    """Sent back as `X-A2A-Notification-Token`, for the receiver to check."""
    auth_scheme: str = ""
    auth_credentials: str = ""
    """Sent as `Authorization: <scheme> <credentials>` when both are set."""
    create_time: datetime = field(default_factory=utc_now)


def _config(row: Any) -> PushConfig:
    return PushConfig(
        run_id=row.run_id,
        id=row.id,
        tenant=row.tenant,
        url=row.url,
        token=row.token,
        auth_scheme=row.auth_scheme,
        auth_credentials=row.auth_credentials,
        create_time=row.create_time,
    )


class PushConfigs:
    """The `push_configs` table."""

    def __init__(self, database: Database) -> None:
        self._database = database

    async def put(self, config: PushConfig) -> PushConfig:
        """Store `config`, replacing the run's config of the same id (the tenant's); raises
        TooManyConfigsError for a new one past `MAX_PER_RUN`."""

        def work(conn: Connection) -> None:
            replaced = conn.execute(
                delete(table).where(
                    table.c.run_id == config.run_id,
                    table.c.id == config.id,
                    table.c.tenant == config.tenant,
                )
            ).rowcount
            if not replaced:
                count = conn.execute(
                    select(func.count()).where(table.c.run_id == config.run_id)
                ).scalar_one()
                if count >= MAX_PER_RUN:
                    raise TooManyConfigsError(config.run_id)
            conn.execute(
                insert(table),
                {
                    "run_id": config.run_id,
                    "id": config.id,
                    "tenant": config.tenant,
                    "url": config.url,
                    "token": config.token,
                    "auth_scheme": config.auth_scheme,
                    "auth_credentials": config.auth_credentials,
                    "create_time": config.create_time,
                },
            )

        await self._database.run(work, write=True)
        return config

    async def get(self, run_id: str, config_id: str, *, tenant: str) -> PushConfig | None:
        query = select(table).where(
            table.c.run_id == run_id, table.c.id == config_id, table.c.tenant == tenant
        )
        row = await self._database.run(lambda conn: conn.execute(query).first(), write=False)
        return None if row is None else _config(row)

    async def list_configs(self, run_id: str, *, tenant: str) -> list[PushConfig]:
        """The run's configs (the tenant's), oldest first."""
        query = (
            select(table)
            .where(table.c.run_id == run_id, table.c.tenant == tenant)
            .order_by(table.c.create_time, table.c.id)
        )
        rows = await self._database.run(lambda conn: conn.execute(query).all(), write=False)
        return [_config(row) for row in rows]

    async def delete(self, run_id: str, config_id: str, *, tenant: str) -> bool:
        """Whether there was such a config to delete."""
        statement = delete(table).where(
            table.c.run_id == run_id, table.c.id == config_id, table.c.tenant == tenant
        )
        deleted = await self._database.run(
            lambda conn: conn.execute(statement).rowcount, write=True
        )
        return bool(deleted)

    async def unfinished_runs(self, limit: int = 10_000) -> list[str]:
        """The runs with configs that have not ended (queued, running or waiting), oldest
        config first: the watches a server starting takes up."""
        unfinished = [s.value for s in RunStatus if not s.is_terminal]
        query = (
            select(table.c.run_id, func.min(table.c.create_time).label("first"))
            .join(runs, runs.c.id == table.c.run_id)
            .where(runs.c.status.in_(unfinished))
            .group_by(table.c.run_id)
            .order_by("first")
            .limit(limit)
        )
        rows = await self._database.run(lambda conn: conn.execute(query).all(), write=False)
        return [row.run_id for row in rows]

    async def for_run(self, run_id: str) -> list[PushConfig]:
        """Every config of the run, for the sender (a run is one tenant's)."""
        query = select(table).where(table.c.run_id == run_id).order_by(table.c.create_time)
        rows = await self._database.run(lambda conn: conn.execute(query).all(), write=False)
        return [_config(row) for row in rows]
