"""The store on SQLAlchemy 2: a SQLite file or PostgreSQL (asyncpg), one module per role.

`open_store` creates the `Database`, migrates the schema to head and returns a `SqlStore`,
the small front that hands out the roles, all over that one database:

    store.log      SqlSessionLog  (log.py)     sessions and their step logs
    store.ledger   SqlRunLedger   (runs.py)    the run transitions; only the lifecycle's
    store.runs     the same object, typed as `RunRecords`: reads of runs and the journal
                   (SqlRunRecords, run_records.py, which the ledger is built on)
    store.leases   SqlLeases      (leases.py)  lease renewals, cancel requests, members
    store.keys()   KeyStore       (store/keys.py)  API keys

Beside them: steps.py (steps and journal rows every transaction shares), takes.py (taking
a session under a lease, and taking one over), starts.py (what decides a run's start),
single.py (a run's usual writes as one statement each on PostgreSQL).

Every operation is one transaction written as a plain function of a sync `Connection` and
run in one go: on SQLite through stdlib sqlite3, on the event loop's thread or a thread of
the store's own (one hop per transaction at most, instead of several per statement, which
cost ~2 ms of CPU per transaction through aiosqlite), on PostgreSQL through asyncpg in one
of SQLAlchemy's greenlets, checkout to checkin (as `AsyncConnection.run_sync` runs its
function). SQLite reads run on the event loop's thread; writes are funnelled through one
writer thread per process and take the database lock up front (`BEGIN IMMEDIATE`) against
other processes; a brief write (a run's transitions and steps:
`SqlRole._write(brief=True)`) runs on the event loop's thread instead when the lock is free
at once (store/database.py). The statements every run runs (taking a
session, storing steps and runs, ending a run, reading steps) are `Prepared`
(store/prepared.py): compiled by SQLAlchemy once and, on SQLite, run on the DBAPI cursor
without SQLAlchemy's per-execution layer. On PostgreSQL a run's usual writes (its start, a
step of a run that holds its session, its end) are one statement each, sent without BEGIN
and COMMIT, whenever their outcome is the usual one (single.py).

A transaction that has started runs to its end even if the awaiting task is cancelled (the
task sees the cancellation; the database sees a whole transaction or none of it).

Every public method raises only `StoreError` subclasses, or `ValueError` for a caller's
mistake; a driver exception never escapes. Never imports grpc or the engine.
"""

from __future__ import annotations

import contextlib
import secrets
from datetime import timedelta
from typing import TYPE_CHECKING, Final

from sqlalchemy import Connection, select, text

from agio_grpc.domain import utc_now
from agio_grpc.store.database import (
    DEFAULT_POOL_SIZE,
    DRIVER_ERRORS,
    Database,
    insert_ignoring_conflicts,
    open_database,
    parse_url,
    prepare_sqlite_file,
)
from agio_grpc.store.keys import KeyStore
from agio_grpc.store.migrations import upgrade_to_head
from agio_grpc.store.push import PushConfigs
from agio_grpc.store.records import TenantQuotas
from agio_grpc.store.sql.leases import SqlLeases
from agio_grpc.store.sql.log import SqlSessionLog
from agio_grpc.store.sql.runs import SqlRunLedger
from agio_grpc.store.sql.starts import Quotas
from agio_grpc.store.sql.takes import Lease
from agio_grpc.store.tables import server_secrets as secret_table

if TYPE_CHECKING:
    from agio_grpc.store.leases import MemberDirectory, SessionLeases
    from agio_grpc.store.ledger import RunLedger
    from agio_grpc.store.log import SessionLog
    from agio_grpc.store.runs import RunRecords

__all__ = ["DEFAULT_SESSION_LEASE_S", "SqlStore", "open_store"]

DEFAULT_SESSION_LEASE_S: Final = 30.0
# Key of the PostgreSQL advisory lock that lets one replica at a time run migrations.
_MIGRATION_LOCK_KEY: Final = 0x6167696F  # "agio"


async def open_store(
    url: str,
    *,
    sqlite_synchronous: str = "NORMAL",
    pool_size: int = DEFAULT_POOL_SIZE,
    session_lease_s: float = DEFAULT_SESSION_LEASE_S,
    instance_id: str = "",
    quotas: TenantQuotas | None = None,
) -> SqlStore:
    """Connect to `url`, migrate the schema to head and return the store.

    `url` is `sqlite+aiosqlite:///path` or `postgresql+asyncpg://user@host/db` (the plain
    `sqlite://` and `postgresql://` forms work too). `sqlite_synchronous` is SQLite's
    `PRAGMA synchronous`: NORMAL survives an application crash, FULL also a power loss, at
    several times the cost per commit. `pool_size` is how many PostgreSQL connections stay
    open (store/database.py). `session_lease_s` is how long a take or renewal holds
    a session (store/leases.py); `instance_id` names this server on the sessions it takes,
    stable across its restarts, so that a restarted server can end the runs it left
    (`RunLedger.recover_own_runs`); `quotas` bounds each tenant's running and queued runs
    (none by default). Raises StoreUnavailableError when the database cannot be reached,
    ValueError for an unsupported URL or a lease that is not positive.
    """
    if not session_lease_s > 0:
        raise ValueError(f"session_lease_s must be positive, got {session_lease_s}")
    parsed = parse_url(url)
    prepare_sqlite_file(parsed)
    database = open_database(parsed, sqlite_synchronous, pool_size)
    store = SqlStore(
        database, session_lease_s=session_lease_s, instance_id=instance_id, quotas=quotas
    )
    try:
        await database.run(_migrate, write=True)
    except BaseException:
        await database.dispose()
        raise
    return store


class SqlStore:
    """The roles of one database (module docstring). Build it with `open_store`."""

    def __init__(
        self,
        database: Database,
        *,
        session_lease_s: float = DEFAULT_SESSION_LEASE_S,
        instance_id: str = "",
        quotas: TenantQuotas | None = None,
    ) -> None:
        self._database = database
        lease = Lease(timedelta(seconds=session_lease_s), instance_id or None)
        self._log = SqlSessionLog(database, lease)
        self._ledger = SqlRunLedger(
            database, lease, Quotas(quotas or TenantQuotas(), database.backend)
        )
        self._leases = SqlLeases(database, lease)

    @property
    def backend(self) -> str:
        """The database dialect name: `sqlite` or `postgresql`."""
        return self._database.backend

    @property
    def log(self) -> SessionLog:
        return self._log

    @property
    def ledger(self) -> RunLedger:
        """The run transitions: for the engine's `Lifecycle` only (store/ledger.py)."""
        return self._ledger

    @property
    def runs(self) -> RunRecords:
        return self._ledger

    @property
    def leases(self) -> SessionLeases:
        return self._leases

    @property
    def members(self) -> MemberDirectory:
        return self._leases

    def keys(self) -> KeyStore:
        """The API keys (`auth.mode: api_key`), on this store's database."""
        return KeyStore(self._database)

    def push_configs(self) -> PushConfigs:
        """The A2A push notification configs, on this store's database."""
        return PushConfigs(self._database)

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

        return bytes.fromhex(await self._database.run(work, write=True))

    async def close(self) -> None:
        with contextlib.suppress(*DRIVER_ERRORS):
            await self._database.dispose()


def _migrate(conn: Connection) -> None:
    if conn.dialect.name == "postgresql":
        # Replicas starting together take turns; the later ones find head applied.
        conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _MIGRATION_LOCK_KEY})
    upgrade_to_head(conn)
