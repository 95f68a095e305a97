"""Members: where each server instance takes calls from the others.

`members` holds one row per server instance (`instance_id`, as in `sessions.lease_owner`):
the internal address its member listener advertises and when it last registered. A server
registers as it starts (a restarted one, or the worker that replaces one, overwrites its
row). Another member finds the server running a run through the run's session: its
`lease_owner` while it holds the session for that run.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-27
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | Sequence[str] | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "members",
        sa.Column("instance_id", sa.String(), primary_key=True),
        sa.Column("address", sa.String(), nullable=False),
        sa.Column("update_time", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("members")
