"""Alembic migrations of the store schema, shipped inside the package and run from code.

`upgrade_to_head` is what `open_store` calls at start-up, on a connection it already holds,
so no alembic.ini is needed at run time. Never imports `agio_grpc.store.sql`; revisions under
`versions/` spell out their DDL and never import the live table definitions.
"""

from __future__ import annotations

import functools
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.engine import Connection

from agio_grpc.store.errors import SchemaTooNewError

MIGRATIONS_DIR = Path(__file__).resolve().parent

# Our own name, so the store can share a database with an application that also uses Alembic.
VERSION_TABLE = "agio_alembic_version"


def alembic_config(url: str | None = None) -> Config:
    """An Alembic config for these migrations; `url` is only needed for offline (`--sql`) use."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.set_main_option("path_separator", "os")
    if url is not None:
        config.set_main_option("sqlalchemy.url", url)
    return config


def upgrade_to_head(connection: Connection) -> None:
    """Apply every pending revision on `connection`, inside the caller's transaction.

    A database at head is told by its version row alone: Alembic's `upgrade` would load
    and run every revision's module and the environment script first, about 6 ms of CPU
    at each start of the service and each CLI command (NOTES.md, change 42). Anything
    else (no version table, an older revision) goes to Alembic, as always. A revision this
    code does not have raises SchemaTooNewError before Alembic touches anything.
    """
    current = current_revisions(connection)
    head = head_revision()
    if current == (head,):
        return
    config = alembic_config()
    known = {script.revision for script in ScriptDirectory.from_config(config).walk_revisions()}
    if unknown := tuple(revision for revision in current if revision not in known):
        raise SchemaTooNewError(unknown, head)
    config.attributes["connection"] = connection
    command.upgrade(config, "head")


def current_revisions(connection: Connection) -> tuple[str, ...]:
    """The revisions the database on `connection` is at: none when it has no version table."""
    context = MigrationContext.configure(connection, opts={"version_table": VERSION_TABLE})
    return context.get_current_heads()


@functools.cache
def head_revision() -> str:
    """The newest revision id (the revisions ship with the package, so read once)."""
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    if head is None:
        raise RuntimeError(f"no migration revisions found in {MIGRATIONS_DIR}")
    return head
