"""Alembic migrations of the store schema, shipped inside the package and run from code.

`upgrade_to_head` is what `open_store` calls at start-up, on a connection it already holds,
so no alembic.ini is needed at run time. Never imports `agio_grpc.store.sql`; revisions under
`versions/` spell out their DDL and never import the live table definitions.
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory
from sqlalchemy.engine import Connection

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
    """Apply every pending revision on `connection`, inside the caller's transaction."""
    config = alembic_config()
    config.attributes["connection"] = connection
    command.upgrade(config, "head")


def head_revision() -> str:
    """The newest revision id."""
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    if head is None:
        raise RuntimeError(f"no migration revisions found in {MIGRATIONS_DIR}")
    return head
