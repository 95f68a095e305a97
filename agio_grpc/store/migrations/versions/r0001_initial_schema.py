"""Initial schema: sessions, steps and runs.

Revision ID: 0001
Revises:
Create Date: 2025-11-26
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _counter(name: str) -> sa.Column[int]:
    return sa.Column(name, sa.Integer(), nullable=False, server_default="0")


def _text(name: str, default: str = "") -> sa.Column[str]:
    return sa.Column(name, sa.String(), nullable=False, server_default=default)


def _time(name: str, *, nullable: bool = False) -> sa.Column[datetime]:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def upgrade() -> None:
    op.create_table(
        "sessions",
        sa.Column("id", sa.String(), primary_key=True),
        sa.Column("parent_session_id", sa.String(), nullable=True),
        _counter("fork_sequence"),
        _time("create_time"),
        _time("update_time"),
        _counter("last_sequence"),
        sa.Column("active_run_id", sa.String(), nullable=True),
    )
    op.create_index("ix_sessions_create_time_id", "sessions", ["create_time", "id"])

    op.create_table(
        "steps",
        sa.Column("id", sa.String(), primary_key=True),
        sa.Column(
            "session_id",
            sa.String(),
            sa.ForeignKey("sessions.id", ondelete="CASCADE", name="fk_steps_session_id"),
            nullable=False,
        ),
        _text("run_id"),
        sa.Column("sequence", sa.Integer(), nullable=False),
        sa.Column("role", sa.String(), nullable=False),
        sa.Column("content", sa.Text(), nullable=False, server_default=""),
        sa.Column("reasoning_content", sa.Text(), nullable=False, server_default=""),
        sa.Column("tool_calls", sa.Text(), nullable=False, server_default="[]"),
        _counter("tool_call_count"),
        _text("tool_call_id"),
        _text("name"),
        sa.Column("is_error", sa.Boolean(), nullable=False, server_default=sa.false()),
        _counter("duration_ms"),
        _counter("first_token_latency_ms"),
        _counter("input_tokens"),
        _counter("output_tokens"),
        _counter("total_tokens"),
        _counter("cached_input_tokens"),
        _counter("reasoning_tokens"),
        _text("model_name"),
        _text("provider"),
        _counter("tool_exec_time_ms"),
        _counter("retries"),
        _time("create_time"),
        _text("trace_id"),
        _text("span_id"),
        sa.UniqueConstraint("session_id", "sequence", name="uq_steps_session_sequence"),
        sa.CheckConstraint("sequence >= 1", name="ck_steps_sequence_positive"),
    )

    op.create_table(
        "runs",
        sa.Column("id", sa.String(), primary_key=True),
        sa.Column(
            "session_id",
            sa.String(),
            sa.ForeignKey("sessions.id", ondelete="CASCADE", name="fk_runs_session_id"),
            nullable=False,
        ),
        sa.Column("agent", sa.String(), nullable=False),
        sa.Column("status", sa.String(), nullable=False),
        sa.Column("stop_signal", sa.Text(), nullable=True),
        _counter("input_tokens"),
        _counter("output_tokens"),
        _counter("total_tokens"),
        _counter("step_count"),
        _counter("tool_call_count"),
        _counter("first_sequence"),
        _counter("last_sequence"),
        _time("create_time"),
        _time("end_time", nullable=True),
        _text("trace_id"),
        _text("request_id"),
        sa.Column("metadata", sa.Text(), nullable=False, server_default="{}"),
        sa.Column("options", sa.Text(), nullable=False, server_default="{}"),
        _counter("last_event_seq"),
    )
    op.create_index(
        "ix_runs_session_id_create_time_id", "runs", ["session_id", "create_time", "id"]
    )


def downgrade() -> None:
    op.drop_table("runs")
    op.drop_table("steps")
    op.drop_table("sessions")
