"""The SQL schema of the store as SQLAlchemy Core tables, for building queries.

The migrations under `agio_grpc/store/migrations/versions/` create this schema; these tables
only describe it to the query builder, and a test checks that both agree. Never call
`metadata.create_all`: the schema changes only through a migration.
"""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    DateTime,
    Dialect,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    Text,
    UniqueConstraint,
    false,
)
from sqlalchemy.types import TypeDecorator

from agio_grpc.domain import DEFAULT_TENANT

# Constraint names appear in driver error messages; `sql.py` matches on this one.
STEP_SEQUENCE_CONSTRAINT = "uq_steps_session_sequence"


class UTCDateTime(TypeDecorator[datetime]):
    """An aware UTC datetime on every backend.

    PostgreSQL stores `timestamptz`; SQLite has no time zones, so the value is stored as naive
    UTC text (fixed width, so text order is time order) and made aware again when read.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"naive datetime {value!r}: the store takes aware datetimes only")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)


INT64 = BigInteger().with_variant(Integer(), "sqlite")
"""Counts and sequences: 64-bit on every backend (SQLite's INTEGER is 64-bit already, and
revision 0005 widened PostgreSQL's `integer` columns)."""

metadata = MetaData()

sessions = Table(
    "sessions",
    metadata,
    Column("id", String, primary_key=True),
    Column("parent_session_id", String, nullable=True),
    Column("fork_sequence", INT64, nullable=False, server_default="0"),
    Column("create_time", UTCDateTime, nullable=False),
    Column("update_time", UTCDateTime, nullable=False),
    # The highest sequence allocated; equals the step count because sequences are gapless.
    Column("last_sequence", INT64, nullable=False, server_default="0"),
    # The one running run holding the session (NULL when idle); compare-and-set only.
    Column("active_run_id", String, nullable=True),
    # When the holder's lease runs out unless renewed (app clock, UTC); NULL when idle.
    # A holder whose lease expired may be displaced: its process is presumed dead.
    Column("lease_expires_at", UTCDateTime, nullable=True),
    # The server instance holding it (revision 0005; NULL when idle): a restarted server
    # ends the runs it left at once instead of after their lease.
    Column("lease_owner", String, nullable=True),
    # The tenant it belongs to (revision 0006): the caller's when it was made.
    Column("tenant", String, nullable=False, server_default=DEFAULT_TENANT),
    Index("ix_sessions_create_time_id", "create_time", "id"),
    Index("ix_sessions_tenant_create_time_id", "tenant", "create_time", "id"),
)

steps = Table(
    "steps",
    metadata,
    Column("id", String, primary_key=True),
    Column(
        "session_id",
        String,
        ForeignKey("sessions.id", ondelete="CASCADE", name="fk_steps_session_id"),
        nullable=False,
    ),
    # No foreign key: a fork keeps the parent's run ids, and runs may be written after steps.
    Column("run_id", String, nullable=False, server_default=""),
    Column("sequence", INT64, nullable=False),
    Column("role", String, nullable=False),
    Column("content", Text, nullable=False, server_default=""),
    Column("reasoning_content", Text, nullable=False, server_default=""),
    Column("tool_calls", Text, nullable=False, server_default="[]"),
    Column("tool_call_count", INT64, nullable=False, server_default="0"),
    Column("tool_call_id", String, nullable=False, server_default=""),
    Column("name", String, nullable=False, server_default=""),
    Column("is_error", Boolean, nullable=False, server_default=false()),
    Column("duration_ms", INT64, nullable=False, server_default="0"),
    Column("first_token_latency_ms", INT64, nullable=False, server_default="0"),
    Column("input_tokens", INT64, nullable=False, server_default="0"),
    Column("output_tokens", INT64, nullable=False, server_default="0"),
    Column("total_tokens", INT64, nullable=False, server_default="0"),
    Column("cached_input_tokens", INT64, nullable=False, server_default="0"),
    Column("reasoning_tokens", INT64, nullable=False, server_default="0"),
    Column("model_name", String, nullable=False, server_default=""),
    Column("provider", String, nullable=False, server_default=""),
    Column("tool_exec_time_ms", INT64, nullable=False, server_default="0"),
    Column("retries", INT64, nullable=False, server_default="0"),
    Column("create_time", UTCDateTime, nullable=False),
    Column("trace_id", String, nullable=False, server_default=""),
    Column("span_id", String, nullable=False, server_default=""),
    # A summary step's range (revision 0008; 0 on every other step).
    Column("summary_first_sequence", INT64, nullable=False, server_default="0"),
    Column("summary_last_sequence", INT64, nullable=False, server_default="0"),
    # A tool step of a call that waited for approval: the decision as JSON (rows.py).
    Column("approval", Text, nullable=True),
    UniqueConstraint("session_id", "sequence", name=STEP_SEQUENCE_CONSTRAINT),
    CheckConstraint("sequence >= 1", name="ck_steps_sequence_positive"),
)

runs = Table(
    "runs",
    metadata,
    Column("id", String, primary_key=True),
    Column(
        "session_id",
        String,
        ForeignKey("sessions.id", ondelete="CASCADE", name="fk_runs_session_id"),
        nullable=False,
    ),
    Column("agent", String, nullable=False),
    Column("status", String, nullable=False),
    Column("stop_signal", Text, nullable=True),
    Column("input_tokens", INT64, nullable=False, server_default="0"),
    Column("output_tokens", INT64, nullable=False, server_default="0"),
    Column("total_tokens", INT64, nullable=False, server_default="0"),
    Column("step_count", INT64, nullable=False, server_default="0"),
    Column("tool_call_count", INT64, nullable=False, server_default="0"),
    Column("first_sequence", INT64, nullable=False, server_default="0"),
    Column("last_sequence", INT64, nullable=False, server_default="0"),
    Column("create_time", UTCDateTime, nullable=False),
    Column("end_time", UTCDateTime, nullable=True),
    Column("trace_id", String, nullable=False, server_default=""),
    Column("request_id", String, nullable=False, server_default=""),
    Column("metadata", Text, nullable=False, server_default="{}"),
    Column("options", Text, nullable=False, server_default="{}"),
    Column("last_event_seq", INT64, nullable=False, server_default="0"),
    # A CancelRun for a run another replica runs: its stop signal as JSON (NULL: none).
    Column("cancel_request", Text, nullable=True),
    # A QUEUED run (revision 0004): its input, its place in the session's queue, and the run
    # a ROLLBACK interrupted with that run's first sequence.
    Column("input", Text, nullable=False, server_default=""),
    Column("queue_position", BigInteger, nullable=False, server_default="0"),
    Column("supersedes", String, nullable=False, server_default=""),
    Column("rollback_from", BigInteger, nullable=False, server_default="0"),
    # Its session's tenant (revision 0006), so a lookup by run id filters by tenant too.
    Column("tenant", String, nullable=False, server_default=DEFAULT_TENANT),
    # A QUEUED run whose caller's stream owns it (revision 0010): the server instance that
    # holds the stream, and the caller's deadline.
    Column("caller_instance", String, nullable=False, server_default=""),
    Column("caller_deadline", UTCDateTime, nullable=True),
    # A run with an output schema that completed (revision 0011): its answer as JSON text.
    Column("output_json", Text, nullable=False, server_default=""),
    # A REQUIRES_ACTION run holding calls for approval with a timeout: when the server
    # rejects them (revision 0012; the stop signal's `approval_deadline`, rows.py).
    Column("approval_deadline", UTCDateTime, nullable=True),
    Index("ix_runs_session_id_create_time_id", "session_id", "create_time", "id"),
    # A2A's ListTasks (revision 0014): a tenant's tasks of one agent, newest first.
    Index("ix_runs_tenant_agent_create_time_id", "tenant", "agent", "create_time", "id"),
    Index("ix_runs_session_id_status", "session_id", "status"),
    Index("ix_runs_session_id_request_id", "session_id", "request_id"),
    # A tenant's running or queued runs, counted against its quotas (revision 0007).
    Index("ix_runs_tenant_status", "tenant", "status"),
    Index("ix_runs_approval_deadline", "approval_deadline"),
)

# The run event journal (revision 0004): the events a replay needs, under their live seq.
run_events = Table(
    "run_events",
    metadata,
    Column(
        "run_id",
        String,
        ForeignKey("runs.id", ondelete="CASCADE", name="fk_run_events_run_id"),
        nullable=False,
    ),
    Column("seq", BigInteger, nullable=False),
    Column("time", UTCDateTime, nullable=False),
    # The event's kind, as the StepEvent oneof field it becomes (`run_started`, ...).
    Column("kind", String, nullable=False),
    # The event's content as JSON (store/journal.py).
    Column("payload", Text, nullable=False),
    PrimaryKeyConstraint("run_id", "seq", name="pk_run_events"),
    CheckConstraint("seq >= 1", name="ck_run_events_seq_positive"),
    sqlite_with_rowid=False,
)

# Secrets every replica shares (revision 0005), made on first use: e.g. the key that signs
# page tokens. A value is hex text.
server_secrets = Table(
    "server_secrets",
    metadata,
    Column("name", String, primary_key=True),
    Column("value", String, nullable=False),
    Column("create_time", UTCDateTime, nullable=False),
)

# Where each server instance takes calls from the other members (revision 0009): the
# address of its member listener, written as it starts.
members = Table(
    "members",
    metadata,
    Column("instance_id", String, primary_key=True),
    Column("address", String, nullable=False),
    Column("update_time", UTCDateTime, nullable=False),
)

# The keys of `auth.mode: api_key` (revision 0006): the SHA-256 of each secret (hex), never the
# secret itself.
api_keys = Table(
    "api_keys",
    metadata,
    Column("id", String, primary_key=True),
    Column("tenant", String, nullable=False),
    Column("name", String, nullable=False, server_default=""),
    Column("secret_hash", String, nullable=False),
    Column("create_time", UTCDateTime, nullable=False),
    Column("last_used_time", UTCDateTime, nullable=True),
    Column("revoke_time", UTCDateTime, nullable=True),
    UniqueConstraint("secret_hash", name="uq_api_keys_secret_hash"),
    Index("ix_api_keys_tenant_create_time", "tenant", "create_time"),
)

push_configs = Table(
    # A2A push notification configs (revision 0013): where a task's state changes are
    # POSTed. Deleted with their run (and so with its session).
    "push_configs",
    metadata,
    Column(
        "run_id",
        String,
        ForeignKey("runs.id", ondelete="CASCADE", name="fk_push_configs_run_id"),
        primary_key=True,
    ),
    Column("id", String, primary_key=True),
    Column("tenant", String, nullable=False),
    Column("url", Text, nullable=False),
    Column("token", Text, nullable=False, server_default=""),
    Column("auth_scheme", String, nullable=False, server_default=""),
    Column("auth_credentials", Text, nullable=False, server_default=""),
    Column("create_time", UTCDateTime, nullable=False),
)
