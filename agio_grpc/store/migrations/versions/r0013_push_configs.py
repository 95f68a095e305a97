"""A2A push notification configs: where a task's state changes are POSTed.

One row per config of a run (an A2A task): its URL, the token sent back as
`X-A2A-Notification-Token`, and the `Authorization` scheme and credentials to send. Read by
run id (the primary key's first column) and filtered by tenant; deleted with the run.

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-27
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | Sequence[str] | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "push_configs",
        sa.Column(
            "run_id",
            sa.String(),
            sa.ForeignKey("runs.id", ondelete="CASCADE", name="fk_push_configs_run_id"),
            primary_key=True,
        ),
        sa.Column("id", sa.String(), primary_key=True),
        sa.Column("tenant", sa.String(), nullable=False),
        sa.Column("url", sa.Text(), nullable=False),
        sa.Column("token", sa.Text(), nullable=False, server_default=""),
        sa.Column("auth_scheme", sa.String(), nullable=False, server_default=""),
        sa.Column("auth_credentials", sa.Text(), nullable=False, server_default=""),
        sa.Column("create_time", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("push_configs")
