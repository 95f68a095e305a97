"""The run event journal (`run_events`) and run queues (`runs.input`, `queue_position`,
`supersedes`, `rollback_from`).

Every event a replay needs (run_started, step_started, step_completed, run_completed,
run_failed, error) is stored with the `seq` it was streamed under, in the same transaction
as the change it announces, so `WatchRun(after_seq)` is exact across restarts and
replicas. Deltas are not stored. The rows go with their run (ON DELETE CASCADE).

Two indexes serve the transaction that starts a run on a session: `runs (session_id,
status)` finds a run waiting in REQUIRES_ACTION, `runs (session_id, request_id)` a reused
idempotency key.

A run queued behind its session's busy run (BUSY_POLICY_ENQUEUE, INTERRUPT, ROLLBACK) keeps
its input on its row until it starts, its place in the queue, and for a ROLLBACK the run it
interrupted and that run's first sequence.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-26
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | Sequence[str] | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "run_events",
        sa.Column(
            "run_id",
            sa.String(),
            sa.ForeignKey("runs.id", ondelete="CASCADE", name="fk_run_events_run_id"),
            nullable=False,
        ),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.Column("time", sa.DateTime(timezone=True), nullable=False),
        sa.Column("kind", sa.String(), nullable=False),
        sa.Column("payload", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("run_id", "seq", name="pk_run_events"),
        sa.CheckConstraint("seq >= 1", name="ck_run_events_seq_positive"),
        # SQLite: the rows live in the primary key's b-tree, one insert each instead of two.
        sqlite_with_rowid=False,
    )
    op.create_index("ix_runs_session_id_status", "runs", ["session_id", "status"])
    op.create_index("ix_runs_session_id_request_id", "runs", ["session_id", "request_id"])
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("input", sa.Text(), nullable=False, server_default=""))
        batch.add_column(
            sa.Column("queue_position", sa.BigInteger(), nullable=False, server_default="0")
        )
        batch.add_column(sa.Column("supersedes", sa.String(), nullable=False, server_default=""))
        batch.add_column(
            sa.Column("rollback_from", sa.BigInteger(), nullable=False, server_default="0")
        )


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        for column in ("rollback_from", "supersedes", "queue_position", "input"):
            batch.drop_column(column)
    op.drop_index("ix_runs_session_id_request_id", table_name="runs")
    op.drop_index("ix_runs_session_id_status", table_name="runs")
    op.drop_table("run_events")
