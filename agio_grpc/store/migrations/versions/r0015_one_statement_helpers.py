"""Two PostgreSQL functions for a run's transitions written as one statement
(store/sql/single.py); nothing on SQLite.

`agio_session_has_queued_run(session_id)`: whether a run waits QUEUED on the session. It is
VOLATILE, so its query takes a snapshot of its own when it runs, after the statement that
calls it has locked the session's row; the calling statement's snapshot, taken before any
wait for that lock, would miss a run queued by the transaction it waited for.

`agio_abort(reason)`: raises SQLSTATE AG001 with `reason`, which rolls back the statement
that calls it; the store then runs the same transition as a transaction of its own.

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-28
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0015"
down_revision: str | Sequence[str] | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    if op.get_context().dialect.name != "postgresql":
        return
    op.execute(
        """
        CREATE FUNCTION agio_session_has_queued_run(session text) RETURNS boolean
        LANGUAGE plpgsql VOLATILE AS $$
        BEGIN
            RETURN EXISTS (
                SELECT 1 FROM runs WHERE session_id = session AND status = 'QUEUED'
            );
        END
        $$
        """
    )
    op.execute(
        """
        CREATE FUNCTION agio_abort(reason text) RETURNS boolean
        LANGUAGE plpgsql VOLATILE AS $$
        BEGIN
            RAISE EXCEPTION USING ERRCODE = 'AG001', MESSAGE = reason;
        END
        $$
        """
    )


def downgrade() -> None:
    if op.get_context().dialect.name != "postgresql":
        return
    op.execute("DROP FUNCTION agio_abort(text)")
    op.execute("DROP FUNCTION agio_session_has_queued_run(text)")
