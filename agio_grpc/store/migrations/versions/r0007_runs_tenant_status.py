"""Tenant quotas: an index on `runs (tenant, status)`.

A server with a quota per tenant (`quotas` in the config) counts a tenant's RUNNING or
QUEUED runs in every transaction that would start or queue one; the index keeps that count
to the tenant's runs in that state instead of a scan of every run.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-27
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0007"
down_revision: str | Sequence[str] | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index("ix_runs_tenant_status", "runs", ["tenant", "status"])


def downgrade() -> None:
    op.drop_index("ix_runs_tenant_status", table_name="runs")
