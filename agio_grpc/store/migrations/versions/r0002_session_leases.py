"""Session leases: `sessions.lease_expires_at`.

The run holding a session (`active_run_id`) now holds it for a lease that its process
renews; a holder whose lease expired (its process died) may be displaced. Sessions held when
this revision is applied get no lease (NULL), which the store treats as expired: they were
taken by a server without leases, and a held session outlives only a crashed one.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-26
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | Sequence[str] | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("sessions") as batch:
        batch.add_column(sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("sessions") as batch:
        batch.drop_column("lease_expires_at")
