"""Queued runs' callers: which server's caller owns a queued run, and its deadline.

A run queued for a `Run` call whose stream owns it (its end cancels the run) names the
server instance that holds the stream (`caller_instance`, as in `sessions.lease_owner`) and
the caller's deadline (`caller_deadline`): a server that restarts under the same instance id
ends the queued runs its callers had (their streams died with it) as their disconnect policy
says, and a queued run whose caller's deadline passed ends TIMEOUT instead of starting,
wherever it comes up.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-27
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | Sequence[str] | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(
            sa.Column("caller_instance", sa.String(), nullable=False, server_default="")
        )
        batch.add_column(sa.Column("caller_deadline", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("caller_deadline")
        batch.drop_column("caller_instance")
