"""Three PostgreSQL functions for a run's writes as one statement each
(store/sql/single.py); nothing on SQLite.

`agio_session_has_queued_run(session_id)`: whether a run waits QUEUED on the session, for
a run's end. `agio_start_blocked(...)`: whether a run may not start on the session the
calling statement just took, as the start's transaction decides it (a run waiting for its
client or queued, the run's request id used before, a last step other than the one the
caller's history ends with). Both are VOLATILE, so their queries take a snapshot of their
own when they run, after the statement that calls them has locked the session's row; the
calling statement's snapshot, taken before any wait for that lock, would miss what the
transaction it waited for wrote.

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
        CREATE FUNCTION agio_start_blocked(
            p_session text, p_run text, p_request text, p_last bigint, p_last_step text
        ) RETURNS boolean
        LANGUAGE plpgsql VOLATILE AS $$
        BEGIN
            RETURN EXISTS (
                SELECT 1 FROM runs WHERE session_id = p_session
                    AND status IN ('REQUIRES_ACTION', 'QUEUED')
            ) OR (p_request <> '' AND EXISTS (
                SELECT 1 FROM runs WHERE session_id = p_session
                    AND request_id = p_request AND id <> p_run
            )) OR NOT EXISTS (
                SELECT 1 FROM steps WHERE session_id = p_session
                    AND sequence = p_last AND id = p_last_step
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
    op.execute("DROP FUNCTION agio_start_blocked(text, text, text, bigint, text)")
    op.execute("DROP FUNCTION agio_session_has_queued_run(text)")
