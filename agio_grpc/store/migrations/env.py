"""Alembic's environment script: runs the revisions on the connection the caller passes.

Loaded by Alembic, never imported. At run time `upgrade_to_head` hands over an open
connection in `config.attributes["connection"]`; this script never creates an engine or reads
an ini file. Offline mode (SQL output) works from `sqlalchemy.url`.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy.engine import Connection

from agio_grpc.store.migrations import VERSION_TABLE
from agio_grpc.store.tables import metadata


def run_offline() -> None:
    context.configure(
        url=context.config.get_main_option("sqlalchemy.url"),
        target_metadata=metadata,
        version_table=VERSION_TABLE,
        literal_binds=True,
        dialect_opts={"paramstyle": "named"},
    )
    with context.begin_transaction():
        context.run_migrations()


def run_online(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=metadata,
        version_table=VERSION_TABLE,
        # SQLite cannot ALTER most things in place; batch mode rebuilds the table instead.
        render_as_batch=connection.dialect.name == "sqlite",
    )
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    run_offline()
else:
    given = context.config.attributes.get("connection")
    if not isinstance(given, Connection):
        raise RuntimeError(
            "agio-grpc migrations run on a connection passed by upgrade_to_head() "
            "(open_store does this at start-up); there is no engine configured here"
        )
    run_online(given)
