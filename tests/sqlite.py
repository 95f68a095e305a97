"""New SQLite files at the head revision for tests, without migrating each one.

Migrating a new file costs `open_store` 50-100 ms of CPU (Alembic builds and runs every
revision's DDL), and the suite opens well over a thousand of them: a fifth of its CPU. So a
test process migrates one file with the store's own `open_store` (`SqliteTemplate`), checks
that it holds the schema and nothing else, and `sqlite_at(path)` gives each test that wants
an empty database a copy of it, made as `open_store` makes a new file (its owner's only).
A copy is what `open_store` would have made: the same schema and version row, and WAL mode
in its header; opening it runs the store's check that it is at head, as for any existing
file.

What a new file's start itself does is still tested on new files: the tests of migrations
(tests/store), of `serve` and its workers starting on a new database, and of start-up
errors. The template is made by the migrations on every run of the suite.
"""

from __future__ import annotations

import atexit
import functools
import os
import sqlite3
import tempfile
from pathlib import Path

from agio_grpc.store.database import SQLITE_FILE_MODE
from agio_grpc.store.migrations import VERSION_TABLE, head_revision
from tests.postgres import run_in_thread
from tests.roles import open_roles


def sqlite_at(path: Path) -> str:
    """The SQLAlchemy URL of the SQLite file at `path`, first made there as a copy of this
    process's template when there is none (a test that opens it twice, or starts a second
    server on it, gets the same file)."""
    if not path.exists():
        return process_template().copy_to(path)
    return f"sqlite+aiosqlite:///{path}"


@functools.cache
def process_template() -> SqliteTemplate:
    """This process's template, made on first use and removed when the process exits."""
    folder = tempfile.TemporaryDirectory(prefix="agio-sqlite-template-")
    atexit.register(folder.cleanup)
    return SqliteTemplate.made_in(Path(folder.name))


class SqliteTemplate:
    """One SQLite file migrated to head by `open_store`, copied for each test that asks."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._image = path.read_bytes()

    @classmethod
    def made_in(cls, folder: Path) -> SqliteTemplate:
        """Migrate a new file in `folder` (on a loop of its own: fixtures that need this may
        run inside a test's loop) and check it before anything copies it."""
        path = folder / "template.db"

        async def migrate() -> None:
            store = await open_roles(f"sqlite+aiosqlite:///{path}")
            await store.close()

        run_in_thread(migrate)
        check_template(path)
        return cls(path)

    def copy_to(self, path: Path) -> str:
        """A new file at `path`, a copy of the template; its SQLAlchemy URL. Refuses to
        overwrite a file that is there."""
        descriptor = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, SQLITE_FILE_MODE)
        with os.fdopen(descriptor, "wb") as file:
            file.write(self._image)
        return f"sqlite+aiosqlite:///{path}"


def check_template(path: Path) -> None:
    """Raise unless `path` is a whole database (its WAL checkpointed away) at the head
    revision, with no row outside the version table."""
    for leftover in (path.with_name(path.name + "-wal"), path.with_name(path.name + "-journal")):
        if leftover.exists():
            raise RuntimeError(f"the SQLite template left {leftover.name} behind")
    with sqlite3.connect(path) as connection:
        revision = connection.execute(f'SELECT version_num FROM "{VERSION_TABLE}"').fetchall()
        if revision != [(head_revision(),)]:
            raise RuntimeError(f"the SQLite template is at {revision}, not at head")
        tables = [
            name
            for (name,) in connection.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
            )
        ]
        for table in tables:
            if (
                table != VERSION_TABLE
                and connection.execute(f'SELECT 1 FROM "{table}" LIMIT 1').fetchall()
            ):
                raise RuntimeError(f"the SQLite template has rows in {table}")
    connection.close()
