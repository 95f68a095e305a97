"""Taking a session for a run or an edit, under a lease, and taking over one whose holder's
lease ran out: the one SQL function (`interrupt_run`) that ends a run whose server is gone,
with the signal the engine's lifecycle gives (store/ledger.py). Also the run rows' shared
statements, and `SqlRole`, what every SQL role is built on.

The one active run per session is held under a lease (`sessions.lease_expires_at`, see
store/leases.py): taking a free session is one compare-and-set UPDATE; only when that fails
is the holder read (row-locked) to see whether its lease expired, and then taken over with
its run finalised in the same transaction.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final, TypeVar

from sqlalchemy import (
    Connection,
    and_,
    bindparam,
    func,
    insert,
    or_,
    select,
    update,
)

from agio_grpc.domain import (
    LEASE_EXPIRED_MESSAGE,
    Role,
    Run,
    RunStatus,
    Session,
    Step,
    abandoned_run_signal,
    clean_text,
    new_id,
    unanswered_call_result,
    unfinished_reason,
    utc_now,
)
from agio_grpc.store.database import Database
from agio_grpc.store.errors import (
    NotFoundError,
    SessionBusyError,
)
from agio_grpc.store.prepared import Prepared
from agio_grpc.store.records import (
    TAKEOVER_SEQ_GAP,
    JournalRecord,
    terminal_kind,
)
from agio_grpc.store.rows import (
    RUN_MUTABLE_COLUMNS,
    run_from_row,
    run_mutable_values,
    stored_run,
)
from agio_grpc.store.sql.steps import append, read_history, write_journal
from agio_grpc.store.tables import run_events as event_table
from agio_grpc.store.tables import runs as run_table
from agio_grpc.store.tables import sessions as session_table
from agio_grpc.store.tables import steps as step_table


@dataclass(frozen=True, slots=True)
class Lease:
    """How a take holds a session: for `term` from now, by the instance `owner`."""

    term: timedelta
    owner: str | None


T = TypeVar("T")


class SqlRole:
    """A role of the store (log, ledger, leases) on one `Database`, taking sessions under
    one `Lease`."""

    def __init__(self, database: Database, lease: Lease) -> None:
        self._database = database
        self._lease = lease

    @property
    def backend(self) -> str:
        """The database dialect name: `sqlite` or `postgresql`."""
        return self._database.backend

    @property
    def _one_statement(self) -> bool:
        """Whether a run's usual writes go as one statement each (sql/single.py)."""
        return self._database.backend == "postgresql"

    async def _read(self, work: Callable[[Connection], T]) -> T:
        return await self._database.run(work, write=False)

    async def _write(self, work: Callable[[Connection], T], *, brief: bool = False) -> T:
        """`work` in a write transaction; `brief`: it writes a few rows and reads little
        (Database.run)."""
        return await self._database.run(work, write=True, brief=brief)


HELD: Final = and_(session_table.c.active_run_id.is_not(None), session_table.c.active_run_id != "")

TAKE_FREE_SESSION: Final = Prepared(
    update(session_table)
    .where(
        session_table.c.id == bindparam("session_id"),
        or_(session_table.c.active_run_id.is_(None), session_table.c.active_run_id == ""),
    )
    .values(
        active_run_id=bindparam("run_id"),
        lease_expires_at=bindparam("expires"),
        lease_owner=bindparam("owner"),
    )
    .returning(session_table.c.id)
)

# Only after the holder was read under a row lock and found free or expired.
TAKE_LOCKED_SESSION: Final = (
    update(session_table)
    .where(session_table.c.id == bindparam("session_id"))
    .values(
        active_run_id=bindparam("run_id"),
        lease_expires_at=bindparam("expires"),
        lease_owner=bindparam("owner"),
    )
)

RELEASE_SESSION: Final = Prepared(
    update(session_table)
    .where(
        session_table.c.id == bindparam("session_id"),
        session_table.c.active_run_id == bindparam("run_id"),
    )
    .values(active_run_id=None, lease_expires_at=None, lease_owner=None)
)


def lease_live(expires_at: datetime | None, now: datetime) -> bool:
    """A holder's lease still runs (one with no lease was taken before leases existed,
    revision 0002, and outlived its server: not live; `lease_expired` in SQL)."""
    return expires_at is not None and expires_at > now


def lease_expired(now: datetime) -> Any:
    """The holder's lease ran out; a holder with no lease was taken before leases existed
    (revision 0002) and outlived its server, so it counts as expired too."""
    lease = session_table.c.lease_expires_at
    return or_(lease.is_(None), lease <= now)


# The hot statements are built once, values passed as parameters: building a statement
# with `.values(...)` costs more CPU than running it (its cache key is rebuilt each time).
# Those every run runs are `Prepared` (prepared.py): on SQLite, compiled once and run on the
# DBAPI cursor.
INSERT_SESSION: Final = Prepared(insert(session_table))


def insert_session(
    conn: Connection,
    session: Session,
    *,
    last_sequence: int,
    lease: Lease,
    active_run_id: str = "",
) -> None:
    INSERT_SESSION.execute(conn, session_values(session, last_sequence, lease, active_run_id))


def session_values(
    session: Session, last_sequence: int, lease: Lease, active_run_id: str = ""
) -> dict[str, Any]:
    """The row of a new session holding `last_sequence` sequences, held by `active_run_id`
    (or its own holder) under `lease` from now."""
    holder = active_run_id or session.active_run_id or None
    return {
        "id": session.id,
        "parent_session_id": session.parent_session_id or None,
        "fork_sequence": session.fork_sequence,
        "create_time": session.create_time,
        "update_time": session.update_time,
        "last_sequence": last_sequence,
        "active_run_id": holder,
        "lease_expires_at": utc_now() + lease.term if holder else None,
        "lease_owner": lease.owner if holder else None,
        "tenant": session.tenant,
    }


INSERT_RUN: Final = Prepared(insert(run_table))


def insert_run(conn: Connection, run: Run) -> None:
    INSERT_RUN.execute(conn, run_values(run))


def run_values(run: Run) -> dict[str, Any]:
    """The row of a new run."""
    return {
        "id": run.id,
        "session_id": run.session_id,
        "agent": run.agent,
        "create_time": run.create_time,
        "request_id": run.request_id,
        "input": clean_text(run.input),
        "queue_position": run.queue_position,
        "supersedes": run.supersedes,
        "rollback_from": run.rollback_from,
        "caller_instance": run.caller_instance,
        "caller_deadline": run.caller_deadline,
        "tenant": run.tenant,
        **run_mutable_values(run),
    }


# A run's mutable columns, as the transitions (`end_run` on every run) write them.
UPDATE_RUN: Final = (
    update(run_table)
    .where(run_table.c.id == bindparam("run_id"))
    .values({name: bindparam(name) for name in (*RUN_MUTABLE_COLUMNS, "cancel_request")})
)


def run_update(run: Run) -> dict[str, Any]:
    """The parameters of `UPDATE_RUN` for `run`, as `stored_run` made it.

    Every write clears a cancel request: a segment's end spends one, and a continuation
    (SubmitToolOutputs, the only other writer of a run row) must not inherit it; the loop
    never writes the row mid-run, so no standing request is dropped.
    """
    return {**run_mutable_values(run), "cancel_request": None, "run_id": run.id}


def acquire(conn: Connection, session_id: str, run_id: str, lease: Lease) -> None:
    """Make `run_id` the session's active run under a lease of `lease` from now; over an
    expired lease, the previous holder's run is interrupted. Raises NotFoundError,
    SessionBusyError.
    """
    # Compare-and-set in the database, so it holds across processes and replicas. Not
    # re-entrant: two continuations of one run (a submit and a cancel) exclude each other.
    now = utc_now()
    values = {
        "session_id": session_id,
        "run_id": run_id,
        "expires": now + lease.term,
        "owner": lease.owner,
    }
    if TAKE_FREE_SESSION.first(conn, values) is not None:
        return
    # Held (or unknown): read the holder under a row lock, so a renewal or another take
    # waits for this transaction and then sees its outcome.
    holder = conn.execute(
        select(
            session_table.c.active_run_id,
            session_table.c.lease_expires_at,
            session_table.c.last_sequence,
        )
        .where(session_table.c.id == session_id)
        .with_for_update()
    ).first()
    if holder is None:
        raise NotFoundError("session", session_id)
    previous = str(holder.active_run_id or "")
    if previous and lease_live(holder.lease_expires_at, now):
        raise SessionBusyError(session_id, previous)
    conn.execute(TAKE_LOCKED_SESSION, values)
    if previous and previous != run_id:
        last = int(holder.last_sequence)
        interrupt_run(conn, session_id, previous, last, now, LEASE_EXPIRED_MESSAGE)


def take_for_edit(conn: Connection, session_id: str, lease: Lease) -> str:
    """Take the session for an edit made in the same transaction (the caller lets it go
    there too, or deletes it): refused while a run holds it, as a run's take is, and over an
    expired lease the run that held it is interrupted. Nothing stays held whatever happens
    to the transaction. Returns the edit's holder id. Raises NotFoundError, SessionBusyError.
    """
    holder = new_id("edit")
    acquire(conn, session_id, holder, lease)
    return holder


def interrupt_run(
    conn: Connection,
    session_id: str,
    run_id: str,
    last_sequence: int,
    now: datetime,
    message: str,
) -> bool:
    """Finalise a run whose server is gone, if it is still RUNNING: INTERRUPTED, retryable
    from the session's next sequence, its terminal event journaled after the last one its
    server stored. Returns whether it was RUNNING."""
    row = conn.execute(
        select(run_table)
        .where(run_table.c.id == run_id, run_table.c.status == RunStatus.RUNNING.value)
        .with_for_update()
    ).first()
    if row is None:
        return False
    run = run_from_row(row)
    # The run row was last written when its segment started; its steps tell how far it got.
    count, last = conn.execute(
        select(func.count(), func.max(step_table.c.sequence)).where(
            step_table.c.session_id == session_id, step_table.c.run_id == run_id
        )
    ).one()
    if count:
        run.step_count, run.last_sequence = int(count), int(last)
    journaled = conn.execute(
        select(func.max(event_table.c.seq)).where(event_table.c.run_id == run_id)
    ).scalar()
    seq = max(int(journaled or 0), run.last_event_seq) + TAKEOVER_SEQ_GAP
    signal = abandoned_run_signal(message, last_sequence + 1)
    # Its calls left without a result get an error result, as a stop's would: the log stays
    # valid history, and a Retry from the first of them runs those calls again.
    results = answer_open_calls(conn, session_id, run_id, unfinished_reason(signal))
    records = []
    for offset, step in enumerate(results):
        records.append(JournalRecord(seq + offset, now, "step_completed", step=step))
    if results:
        run.step_count += len(results)
        run.last_sequence = results[-1].sequence
        signal.resume_from_sequence = results[0].sequence
    run.last_event_seq = seq + len(results)
    ended = stored_run(run.ended(signal, now))
    conn.execute(UPDATE_RUN, run_update(ended))
    records.append(JournalRecord(ended.last_event_seq, now, terminal_kind(ended), run=ended))
    write_journal(conn, run_id, records)
    return True


def answer_open_calls(conn: Connection, session_id: str, run_id: str, why: str) -> list[Step]:
    """Store an error result for each call of the session's last assistant step, when it
    is the run's, that has none; the results as stored."""
    last_reply = conn.execute(
        select(func.max(step_table.c.sequence)).where(
            step_table.c.session_id == session_id, step_table.c.role == Role.ASSISTANT.value
        )
    ).scalar()
    if last_reply is None:
        return []
    reply, *after = read_history(conn, session_id, int(last_reply), None, known_session=True)
    if reply.run_id != run_id or not reply.tool_calls:
        return []
    answered = {step.tool_call_id for step in after if step.role is Role.TOOL}
    open_calls = [call for call in reply.tool_calls if call.id not in answered]
    if not open_calls:
        return []
    results = [unanswered_call_result(session_id, run_id, call, why) for call in open_calls]
    return append(conn, session_id, results)
