"""Tenants: `sessions.tenant` and `runs.tenant`; `api_keys`.

Every session and run belongs to a tenant, the caller's when it was made; rows made before
this revision belong to the default tenant (`default`), which is every caller's when the
server authenticates no one (`auth.mode: none`). A run's tenant is its session's, kept on the
run too so that a lookup by run id filters by tenant in the same statement.

`api_keys` holds the keys of `auth.mode: api_key`, each as the SHA-256 of its secret (the
secret itself is shown once, when the key is made, and never stored), with its tenant, a
name, when it was made, last used and revoked.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-27
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | Sequence[str] | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

DEFAULT_TENANT = "default"


def upgrade() -> None:
    for table in ("sessions", "runs"):
        with op.batch_alter_table(table) as batch:
            batch.add_column(
                sa.Column("tenant", sa.String(), nullable=False, server_default=DEFAULT_TENANT)
            )
    op.create_index(
        "ix_sessions_tenant_create_time_id", "sessions", ["tenant", "create_time", "id"]
    )
    op.create_table(
        "api_keys",
        sa.Column("id", sa.String(), primary_key=True),
        sa.Column("tenant", sa.String(), nullable=False),
        sa.Column("name", sa.String(), nullable=False, server_default=""),
        sa.Column("secret_hash", sa.String(), nullable=False),
        sa.Column("create_time", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_used_time", sa.DateTime(timezone=True), nullable=True),
        sa.Column("revoke_time", sa.DateTime(timezone=True), nullable=True),
        sa.UniqueConstraint("secret_hash", name="uq_api_keys_secret_hash"),
    )
    op.create_index("ix_api_keys_tenant_create_time", "api_keys", ["tenant", "create_time"])


def downgrade() -> None:
    op.drop_index("ix_api_keys_tenant_create_time", table_name="api_keys")
    op.drop_table("api_keys")
    op.drop_index("ix_sessions_tenant_create_time_id", table_name="sessions")
    for table in ("runs", "sessions"):
        with op.batch_alter_table(table) as batch:
            batch.drop_column("tenant")
