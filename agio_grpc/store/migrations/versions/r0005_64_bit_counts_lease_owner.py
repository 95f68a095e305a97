"""64-bit counts and sequences on PostgreSQL; `sessions.lease_owner`; `server_secrets`.

Token counts, durations, step counts, sequences and event seqs were `integer` (32-bit) on
PostgreSQL: a model reporting 2^31 tokens, or a sequence past 2^31, failed the write there
while SQLite (whose INTEGER is 64-bit) took it. They become `bigint`; SQLite is unchanged.

`sessions.lease_owner` names the server instance holding the session (NULL when idle), so a
restarted server ends the runs it left at once rather than after their lease.

`server_secrets` holds what every replica must share, made on first use (the key that signs
page tokens, so that a token one replica issued is accepted by all).

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-26
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | Sequence[str] | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

WIDENED = {
    "sessions": ("fork_sequence", "last_sequence"),
    "steps": (
        "sequence",
        "tool_call_count",
        "duration_ms",
        "first_token_latency_ms",
        "input_tokens",
        "output_tokens",
        "total_tokens",
        "cached_input_tokens",
        "reasoning_tokens",
        "tool_exec_time_ms",
        "retries",
    ),
    "runs": (
        "input_tokens",
        "output_tokens",
        "total_tokens",
        "step_count",
        "tool_call_count",
        "first_sequence",
        "last_sequence",
        "last_event_seq",
    ),
}


def _alter(to: sa.types.TypeEngine[int], was: sa.types.TypeEngine[int]) -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for table, columns in WIDENED.items():
        for column in columns:
            op.alter_column(table, column, type_=to, existing_type=was, existing_nullable=False)


def upgrade() -> None:
    _alter(sa.BigInteger(), sa.Integer())
    with op.batch_alter_table("sessions") as batch:
        batch.add_column(sa.Column("lease_owner", sa.String(), nullable=True))
    op.create_table(
        "server_secrets",
        sa.Column("name", sa.String(), primary_key=True),
        sa.Column("value", sa.String(), nullable=False),
        sa.Column("create_time", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("server_secrets")
    with op.batch_alter_table("sessions") as batch:
        batch.drop_column("lease_owner")
    _alter(sa.Integer(), sa.BigInteger())
