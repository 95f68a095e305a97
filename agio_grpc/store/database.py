"""Databases and driver errors: the only module that knows SQLite and PostgreSQL apart.

Parses the database URL, opens a `Database` that runs one transaction at a time as a plain
function of a sync SQLAlchemy `Connection` (SQLite: stdlib sqlite3, reads and brief writes
on the event loop's thread and the rest in threads of its own, with pragmas and BEGIN
hooks; PostgreSQL: asyncpg in SQLAlchemy's greenlets, with its pool) and
turns driver exceptions into `StoreError` subclasses. Never runs a query of the store's own;
`sql.py` does that.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sqlite3
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Final, Protocol, TypeVar, cast

import asyncpg
from sqlalchemy import Connection, Dialect, Engine, Insert, Table, create_engine, event, make_url
from sqlalchemy import exc as sa_exc
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import ConnectionPoolEntry, Pool, StaticPool
from sqlalchemy.util import greenlet_spawn

from agio_grpc.store.errors import SequenceConflictError, StoreError, StoreUnavailableError
from agio_grpc.store.tables import STEP_SEQUENCE_CONSTRAINT

logger = logging.getLogger(__name__)

SQLITE_SYNCHRONOUS_MODES: Final = frozenset({"OFF", "NORMAL", "FULL", "EXTRA"})
SQLITE_BUSY_TIMEOUT_MS: Final = 5_000

# Connection option read by the SQLite `begin` hook: this transaction will write.
WRITE_OPTION: Final = "agio_write"
# Connection option of the reads run on the event loop's thread (`loop_read_limit`).
ON_LOOP_OPTION: Final = "agio_on_loop"
LOOP_READ_ROWS: Final = 2_000
"""The steps a read on the event loop's thread reads at most (`loop_read_limit`): about 8 ms
of the loop's time here. One that may select more (sql/steps.py `read_steps` bounds it by
the session's last sequence, before reading a step) runs on a reader thread instead, where
it holds the loop only while its rows' decoding holds the GIL (a 10,000-step history:
60-70 ms on the loop's thread)."""
# SQLSTATE classes and codes that mean "try again later": connection exceptions (08),
# insufficient resources (53), operator intervention (57), serialization failure, deadlock.
TRANSIENT_SQLSTATE_PREFIXES: Final = ("08", "53", "57")
TRANSIENT_SQLSTATES: Final = frozenset({"40001", "40P01"})

# Everything a driver may raise; `as_store_error` turns each into a StoreError.
DRIVER_ERRORS: Final[tuple[type[BaseException], ...]] = (
    sa_exc.SQLAlchemyError,
    OSError,
    sqlite3.Error,
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
)


# -- engines -------------------------------------------------------------------------------


def parse_url(url: str) -> URL:
    """The URL with its async driver; ValueError for a scheme or database the store can't use."""
    try:
        parsed = make_url(url)
    except sa_exc.ArgumentError as error:
        raise ValueError(f"not a database URL: {error}") from None
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        database = parsed.database or ""
        if database in ("", ":memory:") or "mode=memory" in database:
            raise ValueError(
                "the store needs a SQLite file (sqlite+aiosqlite:///path/to/agio.db), "
                "not an in-memory database"
            )
        return parsed.set(drivername="sqlite+aiosqlite")
    if backend in ("postgresql", "postgres"):
        return parsed.set(drivername="postgresql+asyncpg")
    raise ValueError(
        f"unsupported database URL scheme {parsed.drivername!r}: "
        "use sqlite+aiosqlite:///path or postgresql+asyncpg://user@host/db"
    )


SQLITE_FILE_MODE: Final = 0o600
"""A new SQLite file is its owner's only (SQLite gives its -wal and -shm files the same)."""


def prepare_sqlite_file(url: URL) -> None:
    """Fail early, and clearly, where SQLite could only say "unable to open database file";
    create a new database file readable by its owner only."""
    if url.get_backend_name() != "sqlite" or url.query.get("uri"):
        return
    if url.database in (None, "", ":memory:"):
        return
    path = Path(url.database).expanduser().resolve()
    if not path.parent.is_dir():
        raise StoreUnavailableError(f"cannot open the SQLite database: no directory {path.parent}")
    with contextlib.suppress(FileExistsError):
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, SQLITE_FILE_MODE))


T = TypeVar("T")


def insert_ignoring_conflicts(backend: str, table: Table) -> Insert:
    """INSERT ... ON CONFLICT DO NOTHING into `table`, in the backend's dialect."""
    if backend == "postgresql":
        return postgresql.insert(table).on_conflict_do_nothing()
    return sqlite.insert(table).on_conflict_do_nothing()


class Database(Protocol):
    """Runs transactions: `work` gets a sync Connection inside BEGIN ... COMMIT."""

    @property
    def backend(self) -> str:
        """The dialect name: `sqlite` or `postgresql`."""
        ...

    async def run(self, work: Callable[[Connection], T], *, write: bool, brief: bool = False) -> T:
        """Run `work` in one transaction; driver errors leave as StoreError subclasses.

        `brief`: a write of a few rows (a run's transitions, a step), which SQLite may run
        on the calling thread when the write lock is free at once: handing it to a thread
        costs more CPU than the transaction itself."""
        ...

    async def run_statement(self, work: Callable[[Connection], T]) -> T:
        """`run` for a `work` that writes with one statement, atomic by itself: PostgreSQL
        runs it without BEGIN and COMMIT, two round trips fewer."""
        ...

    async def read_statement(self, work: Callable[[Connection], T]) -> T:
        """`run` for a `work` that reads with one statement, consistent by itself: without
        BEGIN and COMMIT on PostgreSQL."""
        ...

    async def dispose(self) -> None:
        """Close every connection. A transaction asked for once this began is refused with
        StoreUnavailableError; one already running finishes first. Again: nothing."""
        ...


def executes_directly(dialect: Dialect) -> bool:
    """Whether `prepared.Prepared` may run this dialect's statements on the DBAPI cursor,
    skipping SQLAlchemy's execution layer: SQLite's (pysqlite) does nothing per execution
    that it would skip. asyncpg's does: it keeps the driver's prepared-statement cache in
    step with DDL run elsewhere, and takes a cancelled statement for a lost connection."""
    return dialect.name == "sqlite"


DEFAULT_POOL_SIZE: Final = 20
"""PostgreSQL connections a process keeps open once it has needed them: as many as its
transactions at once under load. A transaction that finds them all busy opens one more
(up to POOL_OVERFLOW), closed again when it ends: a connection, a TLS handshake and a
login per transaction, what a pool too small for the load costs (docs/benchmarks/NOTES.md).
Three processes at 20 + 10 stay under PostgreSQL's default max_connections of 100."""
POOL_OVERFLOW: Final = 10

PING_AFTER_IDLE_S: Final = 0.5
"""A pooled PostgreSQL connection idle this long is pinged before use (HikariCP's default
window); one used more recently is taken as it is, unless its socket has closed."""


def open_database(
    url: URL, sqlite_synchronous: str, pool_size: int = DEFAULT_POOL_SIZE
) -> Database:
    """The database for a URL from `parse_url`, tuned for its backend (`pool_size`:
    PostgreSQL's connections kept open)."""
    if url.get_backend_name() == "sqlite":
        return SqliteDatabase(url, sqlite_synchronous)
    return PostgresDatabase(url, pool_size)


# SQLite readers run beside the one writer (WAL lets them); two keep a slow read from
# queueing the others without piling up connections on a 2-core machine.
SQLITE_READER_THREADS: Final = 2
BRIEF_SYNCHRONOUS_MODES: Final = frozenset({"OFF", "NORMAL"})
"""The modes in which a commit never waits for the disk (WAL), so a brief write may run on
the event loop's thread; FULL and EXTRA sync every commit, which belongs on a thread."""
CHECKPOINT_EVERY: Final = 200
"""Brief commits between two checkpoints of the WAL (run on the writer thread): the brief
writes' connection checkpoints nothing itself, so no commit on the event loop's thread ever
copies the log into the database."""
CHECKPOINT_HOLD_S: Final = 0.05
"""How long a brief write waits for the end of a checkpoint (`_checkpoint_wal`) at most: a
few milliseconds usually, its syncs; a disk that stalls them does not stall the writes too
(the log then starts over at a later checkpoint). Once one write waited this long, the
writes after it do not wait for that checkpoint."""
WAL_SIZE_LIMIT_BYTES: Final = 64 * 1024 * 1024
"""What a WAL file is cut back to when its log starts over (`journal_size_limit`): a log a
stall let grow gives its disk back. Above the log of CHECKPOINT_EVERY runs' commits (about
10 MiB), so a log that starts over at each checkpoint is written in place, never cut."""


class WouldWaitError(Exception):
    """A transaction on the event loop's thread found a lock it would have to wait for (a
    brief write the write lock held by this process's writer thread or another process, a
    read the log's read locks in the middle of a change: WAL recovery or restart), or more
    steps to read than the loop may wait for (`loop_read_limit`). It runs on a thread
    instead, where waiting stops nothing else."""


class _LoopConnection:
    """A connection kept open for transactions run on the event loop's thread (brief
    writes, or reads), never waiting for a lock (busy_timeout 0: `WouldWaitError`) and
    never checkpointing. Its checkout, options and close cost as much as a short statement,
    so it stays open between transactions; after any error it is closed (its transaction
    rolled back) and the next one opens it again, as `_transact` opens every one."""

    def __init__(self, url: URL, synchronous: str, *, write: bool) -> None:
        self._engine: Engine = create_engine(
            url.set(drivername="sqlite+pysqlite"),
            connect_args={"check_same_thread": False},
            poolclass=StaticPool,  # one connection, only ever used by the event loop
            hide_parameters=True,
        )
        _install_sqlite_hooks(self._engine, synchronous, busy_timeout_ms=0, autocheckpoint=False)
        self._write = write
        self._conn: Connection | None = None
        self.opened = False

    def open(self) -> None:
        """Open the connection, on a thread: its pragmas may wait for a lock (a new file's
        WAL switch)."""
        if not self.opened:
            _connected(self._engine, write=False).close()  # kept open by its StaticPool
            self.opened = True

    def transaction(self, work: Callable[[Connection], T]) -> T:
        """`work` in one transaction on this thread; WouldWaitError, having changed nothing,
        when it would wait for a lock or (a read) read more than `loop_read_limit` steps."""
        conn = self._conn
        try:
            if conn is None:
                conn = self._conn = _connected(self._engine, write=self._write)
                if not self._write:  # a write's work may have changed what it was given
                    conn.execution_options(**{ON_LOOP_OPTION: True})
            with conn.begin():
                return work(conn)
        except BaseException as error:
            self._conn = None
            if conn is not None:
                with contextlib.suppress(*DRIVER_ERRORS):
                    conn.close()
            if not self._write and _sqlite_busy(getattr(error, "orig", error)):
                raise WouldWaitError from error  # a read: nothing to undo
            if isinstance(error, DRIVER_ERRORS) and not isinstance(error, StoreError):
                raise as_store_error(error) from error
            raise

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        self._engine.dispose()


class SqliteDatabase:
    """A SQLite file through stdlib sqlite3: reads and brief writes on the event loop's
    thread, other writes on a thread of their own.

    One writer thread: this process's writers queue there rather than contend for the file
    lock; BEGIN IMMEDIATE covers other processes. A brief write (`run(brief=True)`: a run's
    transitions and steps, every run's path) runs at once on the event loop's thread when
    the write lock is free, on a connection that never waits for it and never checkpoints;
    a held lock sends it to the writer thread. Per run this saves the thread hops and the
    GIL hand-offs around each statement, which cost several times the statements
    themselves (docs/benchmarks/NOTES.md).

    Reads run on the event loop's thread too, on a connection of their own (readers wait
    for no writer in WAL mode). On a thread, a read hands the GIL back and takes it again
    around each row SQLite steps to, and while the event loop is busy each take waits for
    it: a 1,000-step history read took 0.2-0.9 s there, 6-7 ms on the loop's thread
    (NOTES.md, change 46). A read holds the loop while it runs, as its rows' decoding held
    the GIL on a thread; the rare read that would wait for a lock, and one of more than
    LOOP_READ_ROWS steps, runs on a reader thread.
    """

    def __init__(self, url: URL, synchronous: str) -> None:
        mode = synchronous.upper()
        if mode not in SQLITE_SYNCHRONOUS_MODES:
            raise ValueError(
                f"sqlite_synchronous must be one of {sorted(SQLITE_SYNCHRONOUS_MODES)}, "
                f"got {synchronous!r}"
            )
        self._engine: Engine = create_engine(
            url.set(drivername="sqlite+pysqlite"),
            connect_args={"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000, "check_same_thread": False},
            pool_size=SQLITE_READER_THREADS + 1,
            max_overflow=0,
            hide_parameters=True,  # a statement's error never carries user content
        )
        _install_sqlite_hooks(self._engine, mode)
        self._brief = (
            _LoopConnection(url, mode, write=True) if mode in BRIEF_SYNCHRONOUS_MODES else None
        )
        self._reads = _LoopConnection(url, mode, write=False)
        self._closed = False  # `dispose` began: no transaction starts after it
        self._brief_commits = 0
        self._checkpoint: asyncio.Future[None] | None = None
        self._held: asyncio.Future[None] | None = None  # brief writes wait for it
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="agio-sqlite-writer")
        self._readers = ThreadPoolExecutor(
            SQLITE_READER_THREADS, thread_name_prefix="agio-sqlite-reader"
        )

    @property
    def backend(self) -> str:
        return "sqlite"

    async def run(self, work: Callable[[Connection], T], *, write: bool, brief: bool = False) -> T:
        _refuse_if(self._closed)
        loop = asyncio.get_running_loop()
        executor = self._writer if write else self._readers
        on_loop: _LoopConnection | None = self._reads
        if write:
            on_loop = self._brief if brief else None
        if on_loop is not None:
            if write and (held := self._held) is not None:  # a checkpoint's end (`_checkpoint_wal`)
                ended, _ = await asyncio.wait((held,), timeout=CHECKPOINT_HOLD_S)
                if not ended and self._held is held:
                    # Stalled (a slow disk, or queued behind the writer thread's work): the
                    # writes that follow go on beside it, not CHECKPOINT_HOLD_S late each.
                    self._held = None
            if not on_loop.opened:
                await loop.run_in_executor(executor, on_loop.open)
            _refuse_if(self._closed)  # closed while this one waited
            try:
                done = on_loop.transaction(work)
            except WouldWaitError:
                pass  # it waits for the lock on a thread instead
            else:
                if write:
                    self._brief_committed()
                return done
        return await loop.run_in_executor(executor, _transact, self._engine, work, write)

    async def run_statement(self, work: Callable[[Connection], T]) -> T:
        return await self.run(work, write=True, brief=True)

    async def read_statement(self, work: Callable[[Connection], T]) -> T:
        return await self.run(work, write=False)

    def _brief_committed(self) -> None:
        """Checkpoint the WAL on the writer thread every CHECKPOINT_EVERY brief commits."""
        self._brief_commits += 1
        if self._brief_commits % CHECKPOINT_EVERY or self._checkpoint is not None:
            return
        loop = asyncio.get_running_loop()
        # The first on its way at once, whether or not the loop turns before the next write.
        first = loop.run_in_executor(self._writer, self._checkpoint_passive)
        # `_checkpoint_wal` logs its failure; one disposed of before it ran drops it.
        first.add_done_callback(_retrieved)
        self._checkpoint = asyncio.ensure_future(self._checkpoint_wal(first))

    async def _checkpoint_wal(self, first: asyncio.Future[None]) -> None:
        """Copy the log into the database so that the next commit starts it over.

        The log starts over only once all of it was copied. A checkpoint copies what was
        committed when it began, so under a steady stream of commits it never was, and the
        log grew without end (by 18 MB a second at 150 short runs a second: NOTES.md,
        change 37). So a second checkpoint follows the first, with the brief writes held
        until it is done (`run`, CHECKPOINT_HOLD_S at most, once): it copies only what was
        committed during the first, in a few milliseconds. Held, not sent to the
        writer thread, where each would find the lock of the one before it taken and send
        the next one there too. Both PASSIVE: they copy what no reader still reads, waiting
        for no one; a reader that holds the log back lets it start over at the next one.
        """
        loop = asyncio.get_running_loop()
        try:
            await first
            self._held = loop.run_in_executor(self._writer, self._checkpoint_passive)
            await self._held
        except Exception as error:
            # Harmless: the next one copies what this one did not.
            logger.warning("SQLite WAL checkpoint failed: %s", _describe(error))
        finally:
            self._held = None
            self._checkpoint = None

    def _checkpoint_passive(self) -> None:
        with self._engine.connect() as conn:
            conn.exec_driver_sql("PRAGMA wal_checkpoint(PASSIVE)")

    async def dispose(self) -> None:
        if self._closed:
            return
        self._closed = True
        loop = asyncio.get_running_loop()
        if self._checkpoint is not None:  # its statement, if running, ends before dispose's
            self._checkpoint.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._checkpoint
        self._reads.close()
        if self._brief is not None:
            self._brief.close()
        await loop.run_in_executor(self._writer, self._engine.dispose)
        self._writer.shutdown(wait=False)
        self._readers.shutdown(wait=False)


def _refuse_if(closed: bool) -> None:
    """A transaction asked of a database whose `dispose` began: refused, as a database that
    is gone, rather than run on connections opened again behind the closed ones."""
    if closed:
        raise StoreUnavailableError("the store is closed")


def _retrieved(future: asyncio.Future[None]) -> None:
    """Mark `future`'s outcome as seen, so asyncio does not log it as never retrieved."""
    if not future.cancelled():
        future.exception()


def _connected(engine: Engine, write: bool) -> Connection:
    """A connection of `engine`, marked for writing if `write`; failing to connect raises
    StoreError."""
    try:
        conn = engine.connect()
    except DRIVER_ERRORS as error:
        raise as_store_error(error, connecting=True) from error
    if write:
        conn.execution_options(**{WRITE_OPTION: True})
    return conn


def loop_read_limit(conn: Connection) -> int | None:
    """How many steps a transaction on `conn` may read: LOOP_READ_ROWS for a read on the
    event loop's thread (a read of more raises WouldWaitError), else None: no limit."""
    return LOOP_READ_ROWS if conn.get_execution_options().get(ON_LOOP_OPTION) else None


def _transact(engine: Engine, work: Callable[[Connection], T], write: bool) -> T:
    """`work` in one transaction on a connection of `engine`, driver errors as StoreError
    (WouldWaitError passes: nothing was done)."""
    try:
        with _connected(engine, write) as conn, conn.begin():
            return work(conn)
    except StoreError:
        raise
    except DRIVER_ERRORS as error:
        raise as_store_error(error) from error


class PostgresDatabase:
    """PostgreSQL through asyncpg: a transaction's checkout, statements and checkin run in
    one greenlet, as `AsyncConnection.run_sync` runs its function.

    Not through `AsyncConnection` itself: its checkout, isolation level, `run_sync` and
    close are a greenlet each, and its close on leaving `async with` is a task of its own
    that a cancellation cannot interrupt. Those cost 0.12-0.15 ms of CPU a statement, a
    fifth of one over TLS (NOTES.md, change 47). Here a cancellation reaches the statement
    the greenlet waits on, as before, and the checkin that follows runs in the same task:
    a second cancellation during it costs the pool that connection (SQLAlchemy invalidates
    and checks in a connection whose reset was cancelled), never leaves one checked out.
    """

    def __init__(self, url: URL, pool_size: int = DEFAULT_POOL_SIZE) -> None:
        if pool_size < 1:
            raise ValueError(f"the PostgreSQL pool needs a connection at least, got {pool_size}")
        self._engine: AsyncEngine = create_async_engine(
            url,
            pool_size=pool_size,
            max_overflow=POOL_OVERFLOW,
            pool_timeout=30,
            pool_recycle=1800,
            connect_args={"timeout": 10},
            hide_parameters=True,  # a statement's error never carries user content
        )
        _install_postgres_checkout(self._engine.sync_engine.pool)
        engine = self._engine.sync_engine
        # One pool; each isolation level set on checkout and reset on checkin.
        self._isolated: dict[str | None, Engine] = {
            level: engine if level is None else engine.execution_options(isolation_level=level)
            for level in (None, "REPEATABLE READ", "AUTOCOMMIT")
        }
        self._closed = False  # `dispose` began: no transaction starts after it

    @property
    def backend(self) -> str:
        return "postgresql"

    async def run(self, work: Callable[[Connection], T], *, write: bool, brief: bool = False) -> T:
        # A read takes one snapshot for all its statements (the default, READ COMMITTED,
        # takes one per statement), so a check and the read it decides see the same log.
        isolation = None if write else "REPEATABLE READ"
        return await self._on_connection(lambda conn: _in_transaction(conn, work), isolation)

    async def run_statement(self, work: Callable[[Connection], T]) -> T:
        return await self._on_connection(work, "AUTOCOMMIT")

    async def read_statement(self, work: Callable[[Connection], T]) -> T:
        return await self._on_connection(work, "AUTOCOMMIT")

    async def _on_connection(self, work: Callable[[Connection], T], isolation: str | None) -> T:
        _refuse_if(self._closed)
        try:
            return await greenlet_spawn(_on_pooled, self._isolated[isolation], work)
        except StoreError:
            raise
        except DRIVER_ERRORS as error:
            raise as_store_error(error) from error

    async def dispose(self) -> None:
        self._closed = True
        await self._engine.dispose()


def _on_pooled(engine: Engine, work: Callable[[Connection], T]) -> T:
    """`work` on a connection checked out of `engine`'s pool, checked in after it (in a
    greenlet of `greenlet_spawn`: the driver's waits are the event loop's)."""
    try:
        conn = engine.connect()
    except DRIVER_ERRORS as error:
        raise as_store_error(error, connecting=True) from error
    with conn:
        return work(conn)


def _in_transaction(conn: Connection, work: Callable[[Connection], T]) -> T:
    with conn.begin():
        return work(conn)


# Where a pooled connection's record keeps when it was last checked in.
_LAST_USED: Final = "agio_last_used"


def _install_postgres_checkout(pool: Pool) -> None:
    """Connections a server dropped are replaced before use, not failed, at less than
    `pool_pre_ping`'s cost: its ping is three round trips (BEGIN, a statement, ROLLBACK)
    on every checkout, most of a short transaction's. A connection whose socket closed (a
    restart, `pg_terminate_backend`: the server's goodbye reached the event loop) is
    replaced without a round trip; one idle for `PING_AFTER_IDLE_S` or longer, which a
    silent network may have cut, is pinged first; one used within that window is taken as
    it is: under load, every checkout. Raising DisconnectionError makes the pool discard the
    connection and check out another (a fresh one when the pool is empty)."""

    @event.listens_for(pool, "checkin")
    def on_checkin(_dbapi_connection: Any, record: ConnectionPoolEntry) -> None:
        record.info[_LAST_USED] = time.monotonic()  # `info` empties when it reconnects

    @event.listens_for(pool, "checkout")
    def on_checkout(dbapi_connection: Any, record: ConnectionPoolEntry, _proxy: Any) -> None:
        if dbapi_connection.driver_connection.is_closed():
            raise sa_exc.DisconnectionError("the server closed this connection")
        last_used = record.info.get(_LAST_USED)
        if last_used is None or time.monotonic() - last_used < PING_AFTER_IDLE_S:
            return  # just connected, or used just now
        try:
            dbapi_connection.ping()
        except Exception as error:  # whatever failed, this connection is not to be used
            raise sa_exc.DisconnectionError("a pooled connection failed its ping") from error


def _install_sqlite_hooks(
    engine: Engine,
    synchronous: str,
    *,
    busy_timeout_ms: int = SQLITE_BUSY_TIMEOUT_MS,
    autocheckpoint: bool = True,
) -> None:
    """Per-connection pragmas, and BEGIN chosen by us (the SQLAlchemy docs' recipe).

    `busy_timeout_ms=0`: a BEGIN IMMEDIATE that finds the write lock held raises
    WouldWaitError at once. `autocheckpoint=False`: commits never checkpoint the WAL."""

    @event.listens_for(engine, "connect")
    def on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Take BEGIN away from the driver so `on_begin` can choose DEFERRED or IMMEDIATE.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        try:
            # Waiting for the lock the pragmas may need (a new file's WAL switch) is fine:
            # a connection opens on a thread of its own. Its transactions then wait as long
            # as `busy_timeout_ms` says.
            cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute(f"PRAGMA synchronous={synchronous}")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.execute(f"PRAGMA journal_size_limit={WAL_SIZE_LIMIT_BYTES}")
            if not autocheckpoint:
                cursor.execute("PRAGMA wal_autocheckpoint=0")
            cursor.execute(f"PRAGMA busy_timeout={busy_timeout_ms}")
        finally:
            cursor.close()

    @event.listens_for(engine, "begin")
    def on_begin(connection: Connection) -> None:
        # A writer takes the write lock at BEGIN, so it waits (busy_timeout) for another
        # process's writer instead of failing mid-transaction on a lock upgrade.
        # On the driver's connection: SQLAlchemy's execution path around a BEGIN cost
        # several times the BEGIN (its errors are the driver's then, which `_transact`
        # and `as_store_error` take as they are).
        writes = connection.get_execution_options().get(WRITE_OPTION, False)
        driver = cast(sqlite3.Connection, connection.connection.driver_connection)
        try:
            driver.execute("BEGIN IMMEDIATE" if writes else "BEGIN DEFERRED")
        except sqlite3.OperationalError as error:
            if busy_timeout_ms == 0 and _sqlite_busy(error):
                raise WouldWaitError from error
            raise


def _sqlite_busy(error: BaseException | None) -> bool:
    # The primary code: SQLITE_BUSY_RECOVERY, _SNAPSHOT and _TIMEOUT are busy too.
    return isinstance(error, sqlite3.Error) and error.sqlite_errorcode & 0xFF == sqlite3.SQLITE_BUSY


# -- errors --------------------------------------------------------------------------------


def as_store_error(error: BaseException, *, connecting: bool = False) -> StoreError:
    """The StoreError a driver exception means; the message carries no SQL or parameters.

    `connecting`: the error came while getting a connection, so whatever its kind (refused,
    unknown database, bad credentials, a database not accepting connections) the store
    cannot be reached.
    """
    cause: BaseException = error
    if isinstance(error, sa_exc.DBAPIError) and error.orig is not None:
        cause = error.orig
    detail = _describe(cause)
    if connecting:
        return StoreUnavailableError(f"cannot connect to the database: {detail}")
    if isinstance(error, sa_exc.IntegrityError):
        if STEP_SEQUENCE_CONSTRAINT in detail or "steps.session_id, steps.sequence" in detail:
            return SequenceConflictError(f"sequence already taken; nothing was written: {detail}")
        return StoreError(f"constraint violated: {detail}")
    if _is_transient(error, cause):
        return StoreUnavailableError(f"database unavailable: {detail}")
    return StoreError(f"database error: {detail}")


def _is_transient(error: BaseException, cause: BaseException) -> bool:
    if isinstance(error, sa_exc.DBAPIError) and error.connection_invalidated:
        return True
    sqlstate = _sqlstate(cause)
    if sqlstate.startswith(TRANSIENT_SQLSTATE_PREFIXES) or sqlstate in TRANSIENT_SQLSTATES:
        return True
    return isinstance(
        error,
        (
            OSError,
            sa_exc.OperationalError,
            sa_exc.InterfaceError,
            sa_exc.DisconnectionError,
            sa_exc.TimeoutError,
            sqlite3.OperationalError,
            asyncpg.PostgresConnectionError,
            asyncpg.InterfaceError,
        ),
    )


def _sqlstate(cause: BaseException) -> str:
    code = getattr(cause, "sqlstate", None) or getattr(cause, "pgcode", None)
    return code if isinstance(code, str) else ""


def _describe(cause: BaseException) -> str:
    """The driver's first message line, with the SQLSTATE where there is one."""
    lines = str(cause).strip().splitlines()
    message = lines[0] if lines else type(cause).__name__
    sqlstate = _sqlstate(cause)
    return f"{message} [{sqlstate}]" if sqlstate else message
