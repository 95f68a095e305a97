"""Steps and journal records as every transaction reads and writes them: allocating a
session's sequences, appending, reading steps and the conversation, deleting a log's end,
checking a log is the one a caller read, the session lookups that scope them to a tenant.

Plain functions of a sync `Connection`, run inside the roles' transactions (log.py,
runs.py); the statements every run runs are `Prepared` (store/prepared.py). A session's
sequences are allocated by bumping its `sessions.last_sequence` counter in the same
transaction that inserts the steps, so they stay gapless across tasks, processes and
replicas.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, Final

from sqlalchemy import (
    Connection,
    and_,
    bindparam,
    delete,
    exists,
    insert,
    or_,
    select,
    update,
)

from agio_grpc.domain import (
    Step,
    utc_now,
)
from agio_grpc.store.database import WouldWaitError, loop_read_limit
from agio_grpc.store.errors import (
    HistoryChangedError,
    LeaseLostError,
    NotFoundError,
)
from agio_grpc.store.prepared import Prepared
from agio_grpc.store.records import (
    HistoryMark,
    JournalRecord,
)
from agio_grpc.store.rows import (
    HISTORY_READ_COLUMNS,
    STEP_READ_COLUMNS,
    aware_utc,
    history_from_rows,
    journal_row,
    step_row,
    steps_from_rows,
    stored_copies,
)
from agio_grpc.store.tables import run_events as event_table
from agio_grpc.store.tables import sessions as session_table
from agio_grpc.store.tables import steps as step_table

INSERT_STEPS: Final = Prepared(insert(step_table))

ALLOCATE: Final = (
    update(session_table)
    .where(session_table.c.id == bindparam("session_id"))
    .values(
        last_sequence=session_table.c.last_sequence + bindparam("count"),
        update_time=bindparam("now"),
    )
    .returning(session_table.c.last_sequence)
)

ALLOCATE_SEQUENCES: Final = Prepared(ALLOCATE)

ALLOCATE_HELD_SEQUENCES: Final = Prepared(
    ALLOCATE.where(session_table.c.active_run_id == bindparam("run_id"))
)

# The last steps of a run that ends: their sequences and the session's release, one statement.
ALLOCATE_HELD_AND_RELEASE: Final = Prepared(
    ALLOCATE.where(session_table.c.active_run_id == bindparam("run_id")).values(
        active_run_id=None, lease_expires_at=None, lease_owner=None
    )
)

# A session's steps as `steps_from_rows` reads them.
SELECT_SESSION_STEPS: Final = select(*STEP_READ_COLUMNS).where(
    step_table.c.session_id == bindparam("session_id")
)

# Its conversation only, as `history_from_rows` reads it.
SELECT_SESSION_HISTORY: Final = select(*HISTORY_READ_COLUMNS).where(
    step_table.c.session_id == bindparam("session_id")
)

SELECT_STEP: Final = Prepared(
    SELECT_SESSION_STEPS.where(step_table.c.sequence == bindparam("sequence"))
)

SELECT_STEP_ID: Final = Prepared(
    select(step_table.c.id).where(
        step_table.c.session_id == bindparam("session_id"),
        step_table.c.sequence == bindparam("sequence"),
    )
)


READ_BATCH: Final = 256
"""Rows `read_steps` fetches and decodes at a time."""


@functools.cache
def select_steps(*, bounded: bool, limited: bool, history: bool = False) -> Prepared:
    """Steps from `:start`, up to `:end` when `bounded`, at most `:limit` when `limited`;
    with `history`, only the columns `history_from_rows` reads. One `Prepared` per variant,
    so each is compiled once (compiling a read cost more than SQLite's running it)."""
    base = SELECT_SESSION_HISTORY if history else SELECT_SESSION_STEPS
    query = base.where(step_table.c.sequence >= bindparam("start"))
    if bounded:
        query = query.where(step_table.c.sequence <= bindparam("end"))
    query = query.order_by(step_table.c.sequence)
    return Prepared(query.limit(bindparam("limit")) if limited else query)


def read_steps(
    conn: Connection,
    session_id: str,
    query: Prepared,
    params: Mapping[str, Any],
    decode: Callable[[str, Iterable[Sequence[Any]]], list[Step]] = steps_from_rows,
) -> list[Step]:
    """The steps `query` selects, decoded from the driver's rows.

    The rows come straight off the DBAPI cursor, not as SQLAlchemy `Row`s: its result
    processing (a regex per datetime, an object per row) was most of the cost of reading a
    long session. Fetched READ_BATCH rows at a time: the driver's loop in C, cheaper than a
    Python iteration per row, and never more than a batch of row tuples alive at once for
    the garbage collector to walk. A read on the event loop's thread that may select more
    than `loop_read_limit` steps raises WouldWaitError before it reads one: it is run again
    on a thread.
    """
    if _may_select_more(conn, session_id, params, loop_read_limit(conn)):
        raise WouldWaitError
    steps: list[Step] = []
    with query.cursor(conn, params) as cursor:
        while rows := cursor.fetchmany(READ_BATCH):
            steps += decode(session_id, rows)
    return steps


SESSION_LAST_SEQUENCE: Final = Prepared(
    select(session_table.c.last_sequence).where(session_table.c.id == bindparam("session_id"))
)


def _may_select_more(
    conn: Connection, session_id: str, params: Mapping[str, Any], most: int | None
) -> bool:
    """Whether the steps `params` select (from `:start` to `:end`, at most `:limit`, or the
    one at `:sequence`) may be more than `most` (None: no limit). Bounded by the session's
    last sequence, one row read by its key: its sequences are gapless and none is above it."""
    if most is None or "sequence" in params or params.get("limit", most + 1) <= most:
        return False
    row = SESSION_LAST_SEQUENCE.first(conn, {"session_id": session_id})
    last = int(row[0]) if row is not None else 0
    end: int = min(last, params.get("end", last))
    start: int = params.get("start", 1)
    return end - start + 1 > most


def read_history(
    conn: Connection,
    session_id: str,
    start: int,
    end: int | None,
    *,
    known_session: bool = False,
) -> list[Step]:
    """The conversation from `start` to `end` (None: the last step), as `get_history` reads
    it; NotFoundError when nothing was read and the session is not `known_session`."""
    params: dict[str, Any] = {"session_id": session_id, "start": start}
    if end is not None:
        params["end"] = end
    query = select_steps(bounded=end is not None, limited=False, history=True)
    steps = read_steps(conn, session_id, query, params, history_from_rows)
    if not steps and not known_session:
        require_session(conn, session_id)
    return steps


# The conversation of a free session of the tenant's, as `get_history` reads it; nothing
# when the session is another tenant's, missing or held. The session's check is a
# subquery of its own, run once before the steps are (PostgreSQL's one-time filter, SQLite's
# constant term), not a join the planner may run once a step.
FREE_HISTORY: Final = Prepared(
    SELECT_SESSION_HISTORY.where(
        exists().where(
            session_table.c.id == bindparam("session_id"),
            session_table.c.tenant == bindparam("tenant"),
            or_(session_table.c.active_run_id.is_(None), session_table.c.active_run_id == ""),
        )
    ).order_by(step_table.c.sequence)
)


def free_history(conn: Connection, session_id: str, tenant: str) -> list[Step]:
    """The history of session `session_id` for a run's start to start after, read before
    the start and outside its transaction: empty unless the session is free, `tenant`'s
    and has steps. Given the mark of its last step, the start reads only what came after
    it while that step is still at its sequence (`read_start`; on PostgreSQL the one
    statement of `single.start_on` goes ahead only while it is still the last), else the
    whole history again. Steps are never changed, only appended or cut from some sequence
    on, so while the step is there so is every step read before it."""
    params = {"session_id": session_id, "tenant": tenant}
    return read_steps(conn, session_id, FREE_HISTORY, params, history_from_rows)


def read_start(
    conn: Connection, session_id: str, since: HistoryMark | None, end: int | None
) -> int:
    """Where a history read after `since` starts: just after it when the mark holds (the
    step at its sequence, at most `end`, is still the one it names), else at 1."""
    if since is None or since.sequence < 1 or (end is not None and since.sequence > end):
        return 1
    held = {"session_id": session_id, "sequence": since.sequence}
    row = SELECT_STEP_ID.first(conn, held)
    if row is not None and row[0] == since.step_id:
        return since.sequence + 1
    return 1


def append(
    conn: Connection,
    session_id: str,
    steps: Sequence[Step],
    held_by: str = "",
    *,
    release: bool = False,
) -> list[Step]:
    """Store `steps` at the session's next sequences (while run `held_by` holds it, when
    given, and letting go of it with `release`); the steps as stored."""
    last = allocate_sequences(conn, session_id, len(steps), held_by, release=release)
    return insert_steps(conn, steps, last - len(steps) + 1)


def insert_steps(conn: Connection, steps: Sequence[Step], first: int) -> list[Step]:
    """Store `steps` at sequences `first`, `first + 1`... which the caller holds (allocated,
    or in a session it just created with them); the steps as stored."""
    # Read the clock only once the sequences are ours, so create_time follows sequence
    # order even when writers queued for the session.
    stored = stored_copies(steps, first, utc_now())
    INSERT_STEPS.execute_many(conn, [step_row(step) for step in stored])
    return stored


def allocate_sequences(
    conn: Connection, session_id: str, count: int, held_by: str = "", *, release: bool = False
) -> int:
    """Reserve `count` sequences in the session (only while run `held_by` holds it, when
    given, and then releasing it with `release`); returns the last one reserved.

    The UPDATE row-locks the session on PostgreSQL until commit, so concurrent appends
    queue here and each sees the counter the previous one committed; a take-over of the
    session queues there too, so a held write and a take-over never interleave.
    """
    params = {"session_id": session_id, "count": count, "now": utc_now()}
    if held_by:
        params["run_id"] = held_by
        statement = ALLOCATE_HELD_AND_RELEASE if release else ALLOCATE_HELD_SEQUENCES
    else:
        statement = ALLOCATE_SEQUENCES
    row = statement.first(conn, params)
    if row is None:
        if held_by:
            require_session(conn, session_id)
            raise LeaseLostError(session_id, held_by)
        raise NotFoundError("session", session_id)
    return int(row[0])


def delete_steps(conn: Connection, session_id: str, start_sequence: int) -> int:
    """Delete the session's steps from `start_sequence` on (the session row locked by the
    caller) and move its counter back; returns how many were deleted."""
    result = conn.execute(
        delete(step_table).where(
            step_table.c.session_id == session_id, step_table.c.sequence >= start_sequence
        )
    )
    conn.execute(
        update(session_table)
        .where(session_table.c.id == session_id)
        .values(last_sequence=start_sequence - 1, update_time=utc_now())
    )
    return int(result.rowcount)


def check_last_step(conn: Connection, session_id: str, expect: HistoryMark | None) -> int:
    """The session's last sequence, when its last step is still `expect` (None: the session
    has no step); else HistoryChangedError. Step ids are never reused, so the same last
    step means the same log."""
    last = require_session(conn, session_id)
    expected = expect.sequence if expect is not None else 0
    if last != expected:
        raise HistoryChangedError(session_id)
    if expect is not None:
        row = SELECT_STEP_ID.first(conn, {"session_id": session_id, "sequence": last})
        if row is None or row[0] != expect.step_id:
            raise HistoryChangedError(session_id)
    return last


INSERT_EVENTS: Final = Prepared(insert(event_table))

SELECT_JOURNAL: Final = Prepared(
    select(event_table.c.seq, event_table.c.time, event_table.c.kind, event_table.c.payload)
    .where(event_table.c.run_id == bindparam("run_id"), event_table.c.seq > bindparam("after"))
    .order_by(event_table.c.seq)
)


def write_journal(conn: Connection, run_id: str, records: Sequence[JournalRecord]) -> None:
    if records:
        INSERT_EVENTS.execute_many(conn, [journal_row(run_id, record) for record in records])


def session_is(session_id: str, tenant: str | None) -> Any:
    """The session's row, when it is `tenant`'s (any tenant's: None). Another tenant's
    session is not found, exactly as a missing one: same error, same message."""
    if tenant is None:
        return session_table.c.id == session_id
    return and_(session_table.c.id == session_id, session_table.c.tenant == tenant)


def require_session(
    conn: Connection,
    session_id: str,
    *,
    lock: bool = False,
    shared: bool = False,
    tenant: str | None = None,
) -> int:
    """The session's last sequence; raises NotFoundError, also for a session that is not
    `tenant`'s (when given). `lock` row-locks it (PostgreSQL)."""
    query = select(session_table.c.last_sequence).where(session_is(session_id, tenant))
    if lock:
        query = query.with_for_update(read=shared)
    last = conn.execute(query).scalar_one_or_none()
    if last is None:
        raise NotFoundError("session", session_id)
    return int(last)


def older_than(create_time: Any, id_column: Any, after: tuple[datetime, str]) -> Any:
    """`(create_time, id) < after`, spelled out so both backends use the index."""
    after_time, after_id = aware_utc(after[0], "after"), after[1]
    return or_(create_time < after_time, and_(create_time == after_time, id_column < after_id))


def check_limit(limit: int) -> None:
    if limit < 0:
        raise ValueError(f"limit must not be negative, got {limit}")
