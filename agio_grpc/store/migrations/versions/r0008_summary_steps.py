"""Summary steps: the sequence range a compaction's summary step stands for.

`steps.summary_first_sequence` and `steps.summary_last_sequence` are 0 on every other step
(all the steps stored before this revision). A summary step (role `summary`) stands in the
context for the steps of that range; the steps themselves stay in the log.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-27
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | Sequence[str] | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

COLUMNS = ("summary_first_sequence", "summary_last_sequence")


def upgrade() -> None:
    with op.batch_alter_table("steps") as batch:
        for name in COLUMNS:
            batch.add_column(
                sa.Column(
                    name,
                    sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
                    nullable=False,
                    server_default="0",
                )
            )


def downgrade() -> None:
    with op.batch_alter_table("steps") as batch:
        for name in reversed(COLUMNS):
            batch.drop_column(name)
