"""Runs' structured output: the valid final answer of a run with an output schema.

`output_json` is the answer as compact JSON text, "" for a run without one (every run made
before this revision). The schema itself travels with the run's settings (`options`), so a
retry or a continuation of the run validates against the same one.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-27
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | Sequence[str] | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("output_json", sa.Text(), nullable=False, server_default=""))


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("output_json")
