"""A run's usual writes as one statement each on PostgreSQL: its start (on a new session, or
on one whose history the caller holds), a step the run stores while it holds its session,
and the run's end. (A start on a session whose history the caller does not hold reads
that history first, in a statement of its own: `steps.free_history`.)

Elsewhere each is a transaction of three to nine statements (sql/runs.py, sql/log.py). On
PostgreSQL every statement is a round trip, and BEGIN and COMMIT are two more: a short run
made twelve, a tool run twenty-two, each ~0.16 ms of this process's CPU through
SQLAlchemy, asyncpg and TLS (docs/benchmarks/NOTES.md, change 33). Here each write is one
data-modifying `WITH`, sent without BEGIN and COMMIT: one statement is atomic by itself.

A statement is written before it runs, so it only covers the usual outcome: the steps go at
the sequences the run numbered them with (the journal names them), under a session the run
still holds, with the run still RUNNING; a start takes a free session of its tenant whose
last step is the one the caller's history ends with, and nothing else in its way. Every
part of it is conditional on the session's row, so when any of that is not so it writes
nothing (or aborts, `agio_abort`) and returns None, and the caller runs its transaction,
which decides and raises as it always has. These are that transaction's usual case, never
rules of their own. Data errors (class 22: a value PostgreSQL refuses, reported as the
transaction reports it) go the same way; any other error is the transaction's error too and
is raised as it is.

Rows travel as JSON (`json_populate_recordset` over the table's own row type), one
parameter per table, so the SQL is the same whatever the number of rows.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any, Final

from sqlalchemy import Connection, Table, TextClause, text
from sqlalchemy import exc as sa_exc
from sqlalchemy.dialects import postgresql

from agio_grpc import json_codec
from agio_grpc.domain import Run, RunStatus, Session, Step, utc_now
from agio_grpc.store.records import HistoryMark, Journal, JournalRecord, RunEnd, RunStart
from agio_grpc.store.rows import (
    RUN_MUTABLE_COLUMNS,
    journal_row,
    step_row,
    stored_copies,
    stored_run,
)
from agio_grpc.store.sql.takes import Lease, run_update, run_values, session_values
from agio_grpc.store.tables import run_events as event_table
from agio_grpc.store.tables import runs as run_table
from agio_grpc.store.tables import sessions as session_table
from agio_grpc.store.tables import steps as step_table

__all__ = ["append_held", "end_run", "start_fresh", "start_on"]

# What `agio_abort` raises (revision 0015): the statement wrote nothing; run the transaction.
ABORTED: Final = "AG001"
_DATA_EXCEPTION: Final = "22"

_PREPARER: Final = postgresql.dialect().identifier_preparer  # type: ignore[no-untyped-call]


def _quote(name: str) -> str:
    return str(_PREPARER.quote(name))


def _insert_rows(table: Table, parameter: str, when: str = "") -> str:
    """INSERT into `table` the rows of the JSON array `:parameter`, when `when` holds."""
    columns = ", ".join(_quote(column.name) for column in table.c)
    rows = f"json_populate_recordset(NULL::{table.name}, CAST(:{parameter} AS json))"
    where = f" WHERE {when}" if when else ""
    return f"INSERT INTO {table.name} ({columns}) SELECT {columns} FROM {rows}{where}"


_HELD: Final = "EXISTS (SELECT FROM held)"

# The session's sequences taken while the run holds it, when its last one is the one the
# run numbered its steps after; `release` lets go of it in the same UPDATE.
_TAKE_SEQUENCES: Final = """
    UPDATE sessions
    SET last_sequence = last_sequence + CAST(:count AS bigint),
        update_time = CASE WHEN CAST(:count AS bigint) > 0
            THEN CAST(:now AS timestamptz) ELSE update_time END{release}
    WHERE id = :session_id AND active_run_id = :run_id
        AND (CAST(:count AS bigint) = 0 OR last_sequence = CAST(:last AS bigint))
    RETURNING id
"""

_RUN_SET: Final = ", ".join(
    f"{_quote(name)} = ended_run.{_quote(name)}"
    for name in (*RUN_MUTABLE_COLUMNS, "cancel_request")
)

START_FRESH: Final = text(
    f"""
    WITH created AS ({_insert_rows(session_table, "session")}),
    stored AS ({_insert_rows(step_table, "steps")}),
    started AS ({_insert_rows(run_table, "run")}),
    journaled AS ({_insert_rows(event_table, "events")})
    SELECT true
    """
)

# A free session of the run's tenant taken for the run, its input's sequences with it, when
# its last step is the one the caller's history ends with; after that lock,
# `agio_start_blocked` (revision 0015) says whether the start's transaction would refuse or
# queue the run, and the statement aborts if so.
START_ON: Final = text(
    f"""
    WITH held AS (
        UPDATE sessions
        SET active_run_id = :run_id,
            lease_expires_at = CAST(:expires AS timestamptz),
            lease_owner = :owner,
            last_sequence = last_sequence + CAST(:count AS bigint),
            update_time = CAST(:now AS timestamptz)
        WHERE id = :session_id AND tenant = :tenant
            AND (active_run_id IS NULL OR active_run_id = '')
            AND last_sequence = CAST(:last AS bigint)
        RETURNING id
    ),
    stored AS ({_insert_rows(step_table, "steps", _HELD)}),
    started AS ({_insert_rows(run_table, "run", _HELD)}),
    journaled AS ({_insert_rows(event_table, "events", _HELD)})
    SELECT CASE
        WHEN NOT {_HELD} THEN false
        WHEN agio_start_blocked(:session_id, :run_id, :request_id, :last, :last_step)
            THEN agio_abort('the run does not start as written')
        ELSE true END
    """
)

APPEND_HELD: Final = text(
    f"""
    WITH held AS ({_TAKE_SEQUENCES.format(release="")}),
    stored AS ({_insert_rows(step_table, "steps", _HELD)}),
    journaled AS ({_insert_rows(event_table, "events", _HELD)})
    SELECT {_HELD}
    """
)

# The sequences of the run's last steps, and its session let go of.
_TAKE_LAST_SEQUENCES: Final = _TAKE_SEQUENCES.format(
    release=", active_run_id = NULL, lease_expires_at = NULL, lease_owner = NULL"
)

# The run's UPDATE locks its row after the session's (the lock order of every take) and,
# in its RETURNING, asks whether a run waits QUEUED on the session with a snapshot taken
# after that lock (`agio_session_has_queued_run`, revision 0015): the statement's own was
# taken before any wait for it. A session held by the run whose run is not RUNNING is no
# end the run makes: the statement aborts and the transaction says what happened.
END_RUN: Final = text(
    f"""
    WITH held AS ({_TAKE_LAST_SEQUENCES}),
    stored AS ({_insert_rows(step_table, "steps", _HELD)}),
    ended AS (
        UPDATE runs SET {_RUN_SET}
        FROM json_populate_record(NULL::runs, CAST(:run AS json)) AS ended_run
        WHERE runs.id = :run_id AND runs.status IN (:running) AND {_HELD}
        RETURNING agio_session_has_queued_run(runs.session_id) AS queued
    ),
    journaled AS ({_insert_rows(event_table, "events", "EXISTS (SELECT FROM ended)")})
    SELECT (SELECT queued FROM ended),
        CASE WHEN {_HELD} AND NOT EXISTS (SELECT FROM ended)
            THEN agio_abort('the run does not end as written') END
    """
)


def start_fresh(
    conn: Connection,
    session: Session,
    lease: Lease,
    run: Run,
    steps: Sequence[Step],
    journal: Journal | None,
) -> RunStart | None:
    """`store_start` of a run creating its session (`session`, as `stored_session` made
    it), when no tenant quota counts its runs: its steps at 1, 2..."""
    stored = stored_copies(steps, 1, utc_now())
    started = stored_run(
        replace(run, first_sequence=1, last_sequence=len(stored), step_count=len(stored))
    )
    params = {
        "session": _json([session_values(session, len(stored), lease, run.id)]),
        "steps": _json([step_row(step) for step in stored]),
        "run": _json([run_values(started)]),
        "events": _events(run.id, journal(started, stored) if journal is not None else ()),
    }
    if _execute(conn, START_FRESH, params) is None:
        return None
    return RunStart(run=started, steps=stored, history=list(stored), history_start=1)


def start_on(
    conn: Connection,
    run: Run,
    steps: Sequence[Step],
    since: HistoryMark,
    lease: Lease,
    journal: Journal | None,
) -> RunStart | None:
    """`store_start` of a run on a session that has steps, free and of the run's tenant, with
    nothing in its way, the caller's history ending at `since`, and no tenant quota counting
    the run: its input after `since`."""
    first = since.sequence + 1
    now = utc_now()
    stored = stored_copies(steps, first, now)
    started = stored_run(
        replace(
            run,
            first_sequence=first,
            last_sequence=stored[-1].sequence,
            step_count=len(stored),
        )
    )
    params = {
        **_taking(run.session_id, run.id, stored, now),
        "tenant": run.tenant,
        "expires": now + lease.term,
        "owner": lease.owner,
        "request_id": run.request_id,
        "last_step": since.step_id,
        "steps": _json([step_row(step) for step in stored]),
        "run": _json([run_values(started)]),
        "events": _events(run.id, journal(started, stored) if journal is not None else ()),
    }
    row = _execute(conn, START_ON, params)
    if row is None or not row[0]:
        return None
    return RunStart(run=started, steps=stored, history=list(stored), history_start=first)


def append_held(
    conn: Connection, run_id: str, steps: Sequence[Step], journal: Journal | None
) -> list[Step] | None:
    """`append` of the steps of run `run_id`, which holds their session, at the sequences
    they are numbered with, and their journal."""
    if (first := _first_sequence(steps)) is None:
        return None
    now = utc_now()
    stored = stored_copies(steps, first, now)
    params = {
        **_taking(stored[0].session_id, run_id, stored, now),
        "steps": _json([step_row(step) for step in stored]),
        "events": _events(run_id, journal(None, stored) if journal is not None else ()),
    }
    row = _execute(conn, APPEND_HELD, params)
    return stored if row is not None and row[0] else None


def end_run(
    conn: Connection, run: Run, steps: Sequence[Step], journal: Journal | None
) -> RunEnd | None:
    """`end_run` of a RUNNING run that holds its session: its last steps (at the sequences
    they are numbered with), the run's row, its journal and the session let go of."""
    first = _first_sequence(steps) if steps else 0
    if first is None:
        return None
    now = utc_now()
    stored = stored_copies(steps, first, now)
    ended = stored_run(run.with_steps(stored))
    params = {
        **_taking(run.session_id, run.id, stored, now),
        "steps": _json([step_row(step) for step in stored]),
        "run": _json(run_update(ended)),
        "running": RunStatus.RUNNING.value,
        "events": _events(run.id, journal(ended, stored) if journal is not None else ()),
    }
    row = _execute(conn, END_RUN, params)
    if row is None or row[0] is None:  # not held (nothing written): the transaction decides
        return None
    return RunEnd(True, queued=bool(row[0]), steps=stored)


def _first_sequence(steps: Sequence[Step]) -> int | None:
    """The sequence the steps are numbered from, when they are numbered one after another."""
    first = steps[0].sequence
    if first < 1 or any(step.sequence != first + offset for offset, step in enumerate(steps)):
        return None
    return first


def _taking(session_id: str, run_id: str, stored: Sequence[Step], now: datetime) -> dict[str, Any]:
    """The parameters of `_TAKE_SEQUENCES` for `stored`, the steps as they will be stored."""
    return {
        "session_id": session_id,
        "run_id": run_id,
        "count": len(stored),
        "last": stored[0].sequence - 1 if stored else 0,
        "now": now,
    }


def _execute(conn: Connection, statement: TextClause, params: Mapping[str, Any]) -> Any:
    """The statement's row, or None when it wrote nothing for the transaction to decide."""
    try:
        return conn.execute(statement, params).one()
    except sa_exc.DBAPIError as error:
        sqlstate = getattr(error.orig, "sqlstate", None) or ""
        if sqlstate == ABORTED or sqlstate.startswith(_DATA_EXCEPTION):
            return None
        raise


def _events(run_id: str, records: Sequence[JournalRecord]) -> str:
    return _json([journal_row(run_id, record) for record in records])


def _json(rows: object) -> str:
    return json_codec.dumps(rows, _utc_text)


def _utc_text(value: object) -> str:
    """A datetime as `timestamptz` reads it back exactly (UTCDateTime's bind, as text)."""
    if not isinstance(value, datetime):
        raise TypeError(f"{type(value).__name__} is not a column value")
    if value.tzinfo is None:
        raise ValueError(f"naive datetime {value!r}: the store takes aware datetimes only")
    return value.astimezone(UTC).isoformat()
