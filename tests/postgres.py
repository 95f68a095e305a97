"""A PostgreSQL for tests: a throwaway cluster, or the server named by AGIO_TEST_POSTGRES_URL.

`start_postgres` gives an admin URL: the server in `AGIO_TEST_POSTGRES_URL` when set (its
user needs CREATEDB), otherwise a cluster it starts with the local PostgreSQL binaries in a
temporary folder (as the `postgres` OS user when run as root, since initdb refuses root),
listening on 127.0.0.1 only, with fsync off. `TestDatabases` then hands out one empty
database per test, at the head revision (cloned from a migrated template, or emptied after
an earlier test).

Never touches a database it did not create, and never reaches beyond 127.0.0.1 on its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import asyncpg
from sqlalchemy import make_url

from agio_grpc.store.migrations import VERSION_TABLE, head_revision
from tests.roles import open_roles

ENV_URL = "AGIO_TEST_POSTGRES_URL"
ENV_REQUIRE = "AGIO_REQUIRE_POSTGRES"
ENV_BIN_DIR = "AGIO_TEST_POSTGRES_BIN"

T = TypeVar("T")


class PostgresUnavailableError(Exception):
    """No PostgreSQL could be had for the tests; the message says why."""


def postgres_required() -> bool:
    """Whether a missing PostgreSQL fails the tests instead of skipping them (CI sets it)."""
    return os.environ.get(ENV_REQUIRE, "") not in ("", "0")


def run_in_thread(make: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run a coroutine to completion on its own loop in a worker thread.

    Session-scoped set-up is synchronous, and must not disturb the event loop pytest-asyncio
    keeps for the tests, so it gets a loop of its own.
    """
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(lambda: asyncio.run(make())).result()


def free_local_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def find_postgres_bin_dir() -> Path | None:
    """The directory holding initdb and pg_ctl: AGIO_TEST_POSTGRES_BIN, else Debian's or PATH's."""
    override = os.environ.get(ENV_BIN_DIR)
    candidates = [override] if override else _default_bin_dirs()
    for candidate in candidates:
        directory = Path(candidate)
        if (directory / "initdb").is_file() and (directory / "pg_ctl").is_file():
            return directory
    return None


def _default_bin_dirs() -> list[str]:
    """Debian's versioned directories, newest first, then whatever PATH has."""
    candidates: list[str] = []
    debian = sorted(
        glob.glob("/usr/lib/postgresql/*/bin"),
        key=lambda path: int(Path(path).parent.name) if Path(path).parent.name.isdigit() else 0,
        reverse=True,
    )
    candidates.extend(debian)
    if initdb := shutil.which("initdb"):
        candidates.append(str(Path(initdb).resolve().parent))
    return candidates


@dataclass
class ThrowawayCluster:
    """A PostgreSQL cluster in a temporary folder, alive for one test session."""

    bin_dir: Path
    root: Path
    port: int
    run_as: list[str]

    @property
    def data_dir(self) -> Path:
        return self.root / "data"

    @property
    def admin_url(self) -> str:
        return f"postgresql+asyncpg://postgres@127.0.0.1:{self.port}/postgres"

    @classmethod
    def start(cls, *, tls: bool = False) -> ThrowawayCluster:
        bin_dir = find_postgres_bin_dir()
        if bin_dir is None:
            raise PostgresUnavailableError(
                f"no PostgreSQL binaries (initdb, pg_ctl) found; install PostgreSQL, set "
                f"{ENV_BIN_DIR}, or point {ENV_URL} at a server"
            )
        as_root = os.geteuid() == 0
        # As root the server runs as `postgres`, which must reach the folder: /tmp, not a
        # TMPDIR that may sit under root's home.
        root = Path(tempfile.mkdtemp(prefix="agio-pg-", dir="/tmp" if as_root else None))
        try:
            run_as = _as_postgres_user(root) if as_root else []
        except BaseException:
            shutil.rmtree(root, ignore_errors=True)
            raise
        cluster = cls(bin_dir=bin_dir, root=root, port=0, run_as=run_as)
        try:
            cluster._initdb()
            if tls:
                cluster._serve_tls()
            cluster._start_listening()
        except BaseException:
            cluster.stop()
            raise
        return cluster

    def stop(self) -> None:
        """Stop the server if it runs, and remove its folder."""
        if (self.data_dir / "postmaster.pid").exists():
            with contextlib.suppress(PostgresUnavailableError):
                self._run("pg_ctl", "-D", str(self.data_dir), "-m", "immediate", "-w", "stop")
        shutil.rmtree(self.root, ignore_errors=True)

    def _initdb(self) -> None:
        self._run(
            "initdb",
            "-D",
            str(self.data_dir),
            "-U",
            "postgres",
            "-A",
            "trust",
            "-E",
            "UTF8",
            "--no-sync",
            "--no-instructions",
        )
        settings = [
            "listen_addresses = '127.0.0.1'",
            f"unix_socket_directories = '{self.root}'",
            "fsync = off",
            "synchronous_commit = off",
            "full_page_writes = off",
            "max_connections = 200",
        ]
        with (self.data_dir / "postgresql.conf").open("a") as conf:
            conf.write("\n# agio-grpc tests\n" + "\n".join(settings) + "\n")

    def _serve_tls(self) -> None:
        """`ssl = on` with a certificate for 127.0.0.1 from a throwaway CA (the benchmarks
        measure the database connection over TLS, as managed PostgreSQL serves it)."""
        from agio_grpc.testing.certificates import CertificateAuthority

        cert_file, key_file = CertificateAuthority().issue_server().write(self.data_dir, "server")
        if self.run_as:
            user = pwd.getpwnam("postgres")
            for path in (cert_file, key_file):
                os.chown(path, user.pw_uid, user.pw_gid)
        with (self.data_dir / "postgresql.conf").open("a") as conf:
            conf.write(f"ssl = on\nssl_cert_file = '{cert_file}'\nssl_key_file = '{key_file}'\n")

    def _start_listening(self) -> None:
        # The port is free when picked but could be taken before the server binds it.
        last_error = ""
        for _attempt in range(3):
            self.port = free_local_port()
            try:
                self._run(
                    "pg_ctl",
                    "-D",
                    str(self.data_dir),
                    "-l",
                    str(self.root / "server.log"),
                    "-o",
                    f"-p {self.port}",
                    "-w",
                    "-t",
                    "30",
                    "start",
                )
                return
            except PostgresUnavailableError as error:
                last_error = str(error)
        log = self.root / "server.log"
        tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
        raise PostgresUnavailableError(f"pg_ctl start failed: {last_error}\n{tail}")

    def _run(self, program: str, *args: str) -> None:
        command = [*self.run_as, str(self.bin_dir / program), *args]
        try:
            subprocess.run(command, check=True, capture_output=True, text=True, timeout=60)
        except subprocess.CalledProcessError as error:
            raise PostgresUnavailableError(
                f"{program} failed ({error.returncode}): {error.stderr.strip()[-2000:]}"
            ) from error
        except (OSError, subprocess.TimeoutExpired) as error:
            raise PostgresUnavailableError(f"{program} could not run: {error}") from error


def _as_postgres_user(root: Path) -> list[str]:
    """Hand `root` to the `postgres` OS user; the command prefix that runs as it."""
    try:
        user = pwd.getpwnam("postgres")
    except KeyError:
        raise PostgresUnavailableError(
            "running as root, and initdb refuses root, but there is no `postgres` OS user"
        ) from None
    runuser = shutil.which("runuser")
    if runuser is None:
        raise PostgresUnavailableError("running as root and `runuser` is not installed")
    os.chown(root, user.pw_uid, user.pw_gid)
    return [runuser, "-u", "postgres", "--"]


def asyncpg_dsn(url: str) -> str:
    """The SQLAlchemy URL as a DSN asyncpg itself accepts."""
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


class TestDatabases:
    """Empty databases on one server, at the head revision: cloned from a migrated template,
    and emptied for the next test when a test is done with one.

    Cloning costs about half a second (PostgreSQL copies the catalogs), emptying one a few
    milliseconds; so a database a test gave back is kept, emptied, for the next one, unless
    the test left it other than at head with the template's tables (a migration test), or it
    cannot be emptied: then it is dropped.
    """

    __test__ = False  # not a test class, whatever pytest thinks of the name

    def __init__(self, admin_url: str) -> None:
        self.admin_url = admin_url
        self.template = f"agio_template_{uuid.uuid4().hex[:12]}"
        self._tables: frozenset[str] = frozenset()
        self._head = head_revision()
        self._free: list[str] = []

    def prepare(self) -> None:
        """Create the template and migrate it (synchronous: runs on a loop of its own)."""
        run_in_thread(self._prepare)

    def dispose(self) -> None:
        """Drop the template and the databases kept for reuse."""

        async def drop_all() -> None:
            for name in [*self._free, self.template]:
                await self._drop(name)

        run_in_thread(drop_all)

    async def create(self) -> str:
        """An empty database at head, kept or cloned from the template; its SQLAlchemy URL."""
        if self._free:
            return self.url_of(self._free.pop())
        name = f"agio_test_{uuid.uuid4().hex[:16]}"
        await self._admin(f'CREATE DATABASE "{name}" TEMPLATE "{self.template}"')
        return self.url_of(name)

    async def drop(self, url: str) -> None:
        """Done with the database at `url`: emptied and kept for the next test, or dropped."""
        name = make_url(url).database
        if name is None or not name.startswith("agio_test_"):
            raise ValueError(f"refusing to drop a database this helper did not create: {url}")
        if await self._emptied(name):
            self._free.append(name)
        else:
            await self._drop(name)

    async def _emptied(self, name: str) -> bool:
        """End every other connection to `name`, then empty its tables: True when it is at
        head with the template's tables, and now empty."""
        await self._end_connections(name)
        try:
            connection = await asyncpg.connect(asyncpg_dsn(self.url_of(name)), timeout=10)
        except (OSError, asyncpg.PostgresError):
            return False
        try:
            revision = await connection.fetchval(f'SELECT version_num FROM "{VERSION_TABLE}"')
            tables = await _tables_of(connection)
            if revision != self._head or tables != self._tables:
                return False
            quoted = ", ".join(f'"{table}"' for table in sorted(tables))
            await connection.execute(f"TRUNCATE {quoted} RESTART IDENTITY CASCADE")
            return True
        except asyncpg.PostgresError:
            return False
        finally:
            await connection.close()

    def url_of(self, database: str) -> str:
        return make_url(self.admin_url).set(database=database).render_as_string(hide_password=False)

    async def _prepare(self) -> None:
        try:
            connection = await asyncpg.connect(asyncpg_dsn(self.admin_url), timeout=10)
        except (OSError, asyncpg.PostgresError) as error:
            raise PostgresUnavailableError(
                f"cannot connect to {self.admin_url}: {error}"
            ) from error
        try:
            await connection.execute(f'CREATE DATABASE "{self.template}"')
        except asyncpg.InsufficientPrivilegeError as error:
            raise PostgresUnavailableError(f"the test user needs CREATEDB: {error}") from error
        finally:
            await connection.close()
        store = await open_roles(self.url_of(self.template))
        await store.close()
        connection = await asyncpg.connect(asyncpg_dsn(self.url_of(self.template)), timeout=10)
        try:
            self._tables = await _tables_of(connection)
        finally:
            await connection.close()

    async def _drop(self, name: str) -> None:
        # Not WITH (FORCE): that also tries to end an autovacuum worker on the database, which
        # only a superuser may; a plain DROP has the server stop autovacuum itself.
        await self._end_connections(name)
        await self._admin(f'DROP DATABASE IF EXISTS "{name}"')

    async def _end_connections(self, name: str) -> None:
        """End the test user's other connections to `name` (a test's stores, its processes)."""
        await self._admin(
            "SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity "  # waits for each end
            f"WHERE datname = '{name}' AND pid <> pg_backend_pid() "
            "AND backend_type = 'client backend' AND usename = current_user"
        )

    async def _admin(self, statement: str) -> None:
        connection = await asyncpg.connect(asyncpg_dsn(self.admin_url), timeout=10)
        try:
            await connection.execute(statement)
        finally:
            await connection.close()


async def _tables_of(connection: asyncpg.Connection) -> frozenset[str]:
    """The store's tables in a database, without Alembic's version table."""
    rows = await connection.fetch(
        "SELECT tablename FROM pg_tables WHERE schemaname = 'public' AND tablename <> $1",
        VERSION_TABLE,
    )
    return frozenset(row["tablename"] for row in rows)


def start_postgres(*, tls: bool = False) -> tuple[str, ThrowawayCluster | None]:
    """The admin URL to use, and the cluster started for it (None for AGIO_TEST_POSTGRES_URL).
    With `tls`, a cluster started here serves TLS too (the server in AGIO_TEST_POSTGRES_URL
    is taken as it is).

    Raises PostgresUnavailableError with the reason when neither works.
    """
    if url := os.environ.get(ENV_URL):
        return url, None
    cluster = ThrowawayCluster.start(tls=tls)
    return cluster.admin_url, cluster
