"""Tool approvals: the decision kept with a call's result, and the deadline of a wait.

A tool step answering a call that needed approval keeps who decided it (the credential's
id, or `server` for a timeout), how (approved or rejected, and the reason) and when, as JSON
in `approval` (store/rows.py); NULL on every other step. A run waiting for decisions under
an `approval_timeout_s` stores when the server rejects them (`runs.approval_deadline`,
indexed: every member's sweep looks for the runs past it).

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-27
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | Sequence[str] | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("steps") as batch:
        batch.add_column(sa.Column("approval", sa.Text(), nullable=True))
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("approval_deadline", sa.DateTime(timezone=True), nullable=True))
    op.create_index("ix_runs_approval_deadline", "runs", ["approval_deadline"])


def downgrade() -> None:
    op.drop_index("ix_runs_approval_deadline", table_name="runs")
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("approval_deadline")
    with op.batch_alter_table("steps") as batch:
        batch.drop_column("approval")
