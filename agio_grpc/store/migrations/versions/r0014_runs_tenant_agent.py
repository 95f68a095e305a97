"""A2A's ListTasks: an index on `runs (tenant, agent, create_time, id)`.

An A2A client lists a tenant's tasks of one agent newest first, across its contexts
(sessions); the index serves that page by page without a scan of every run.

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-27
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0014"
down_revision: str | Sequence[str] | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index(
        "ix_runs_tenant_agent_create_time_id", "runs", ["tenant", "agent", "create_time", "id"]
    )


def downgrade() -> None:
    op.drop_index("ix_runs_tenant_agent_create_time_id", table_name="runs")
