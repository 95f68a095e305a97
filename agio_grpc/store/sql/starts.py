"""What decides whether a run may start, in the transaction that starts it: the runs in its
way (a holder, a run waiting for its client, a queue), a reused request id, the tenant's
quotas; and how a run starts or queues once that is decided (`store_start`, `enqueue`)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Final, cast

from sqlalchemy import (
    Connection,
    bindparam,
    func,
    or_,
    select,
    text,
    update,
)

from agio_grpc.domain import (
    Run,
    RunStatus,
    Step,
    utc_now,
)
from agio_grpc.store.errors import (
    DuplicateRequestError,
    NotFoundError,
    QueueFullError,
    TenantQuotaError,
)
from agio_grpc.store.prepared import Prepared
from agio_grpc.store.records import (
    HistoryMark,
    Journal,
    QueueRequest,
    RunStart,
    TenantQuotas,
)
from agio_grpc.store.rows import (
    stop_signal_json,
    stored_run,
)
from agio_grpc.store.sql.steps import (
    append,
    delete_steps,
    insert_steps,
    read_history,
    read_start,
    require_session,
    write_journal,
)
from agio_grpc.store.sql.takes import UPDATE_RUN, insert_run, lease_live, run_update
from agio_grpc.store.tables import runs as run_table
from agio_grpc.store.tables import sessions as session_table
from agio_grpc.store.tables import steps as step_table

# First key of the advisory locks (one per tenant) under which a tenant's runs start when a
# quota bounds them.
QUOTA_LOCK_SPACE: Final = 0x71756F74  # "quot"


@dataclass(frozen=True, slots=True)
class Quotas:
    """`TenantQuotas` as the transactions that start or queue a run check them."""

    limits: TenantQuotas
    backend: str

    @property
    def counts_running(self) -> bool:
        """Whether a tenant's running runs are bounded (`check_running` counts them)."""
        return self.limits.max_running_runs > 0

    def check_running(self, conn: Connection, tenant: str) -> None:
        """TenantQuotaError when the tenant runs as many runs as it may already."""
        self._check(conn, tenant, RunStatus.RUNNING, self.limits.max_running_runs)

    def check_queued(self, conn: Connection, tenant: str) -> None:
        """TenantQuotaError when the tenant has as many queued runs as it may already."""
        self._check(conn, tenant, RunStatus.QUEUED, self.limits.max_queued_runs)

    def _check(self, conn: Connection, tenant: str, status: RunStatus, limit: int) -> None:
        if limit <= 0:
            return
        if self.backend == "postgresql":
            # The tenant's starts take turns (on any session, on any replica), each counting
            # what the one before committed; taken after the session's row lock, and no
            # holder of it takes another session's, so it cannot deadlock.
            conn.execute(TENANT_LOCK, {"space": QUOTA_LOCK_SPACE, "tenant": tenant})
        count = conn.execute(
            select(func.count())
            .select_from(run_table)
            .where(run_table.c.tenant == tenant, run_table.c.status == status.value)
        ).scalar_one()
        if count >= limit:
            raise TenantQuotaError(tenant, status.value, limit)


TENANT_LOCK: Final = text("SELECT pg_advisory_xact_lock(:space, hashtext(:tenant))")

SELECT_REQUEST_ID: Final = Prepared(
    select(run_table.c.id)
    .where(
        run_table.c.session_id == bindparam("session_id"),
        run_table.c.request_id == bindparam("request_id"),
    )
    .limit(1)
)


def refuse_duplicate(conn: Connection, session_id: str, request_id: str) -> None:
    """DuplicateRequestError when a run of the session was started with `request_id`."""
    row = SELECT_REQUEST_ID.first(conn, {"session_id": session_id, "request_id": request_id})
    if row is not None:
        raise DuplicateRequestError(request_id, str(row[0]))


IDLE_STATUSES: Final = frozenset({RunStatus.REQUIRES_ACTION.value, RunStatus.QUEUED.value})

SELECT_BLOCKERS: Final = Prepared(
    select(run_table.c.id, run_table.c.status, run_table.c.queue_position)
    .where(
        run_table.c.session_id == bindparam("session_id"),
        # Not `in_`: its list is rendered per call, which a prepared statement cannot take.
        or_(
            run_table.c.status == RunStatus.REQUIRES_ACTION.value,
            run_table.c.status == RunStatus.QUEUED.value,
        ),
    )
    .order_by(run_table.c.queue_position, run_table.c.create_time, run_table.c.id)
)

QUEUED_RUN: Final = Prepared(
    select(run_table.c.id)
    .where(
        run_table.c.session_id == bindparam("session_id"),
        run_table.c.status == RunStatus.QUEUED.value,
    )
    .limit(1)
)


def blockers(conn: Connection, session_id: str) -> tuple[str | None, list[tuple[str, int]]]:
    """The session's run waiting for its client (if any) and its queued runs (id, place),
    head first: what keeps a new run from starting besides the session's holder."""
    waiting: str | None = None
    queued: list[tuple[str, int]] = []
    with SELECT_BLOCKERS.cursor(conn, {"session_id": session_id}) as cursor:
        for run_id, status, position in cast("Iterable[Sequence[Any]]", cursor):
            if status == RunStatus.REQUIRES_ACTION.value:
                waiting = waiting or str(run_id)
            else:
                queued.append((str(run_id), int(position)))
    return waiting, queued


def live_holder(conn: Connection, session_id: str) -> str:
    """The run holding the session under a live lease ("" when free or expired)."""
    holder = conn.execute(
        select(session_table.c.active_run_id, session_table.c.lease_expires_at)
        .where(session_table.c.id == session_id)
        .with_for_update()
    ).first()
    if holder is None:
        raise NotFoundError("session", session_id)
    live = holder.active_run_id and lease_live(holder.lease_expires_at, utc_now())
    return str(holder.active_run_id) if live else ""


CONTINUE_RUN: Final = Prepared(UPDATE_RUN)


def enqueue(
    conn: Connection,
    run: Run,
    steps: Sequence[Step],
    queued: list[tuple[str, int]],
    holder: str,
    queue: QueueRequest,
    journal: Journal | None,
    instance: str | None,
) -> RunStart:
    """Store `run` QUEUED behind (or, `queue.ahead`, before) the session's queue, its input
    kept on its row, with its caller (`instance`, this server's, when the caller's stream
    owns it) and the caller's deadline; ahead, the holder is asked to stop
    (`queue.supersede`) and, for a ROLLBACK, named with its first sequence so that its
    steps go when this run starts."""
    if len(queued) >= queue.max_queued:
        raise QueueFullError(run.session_id, queue.max_queued)
    positions = [position for _, position in queued]
    position = min(positions, default=1) - 1 if queue.ahead else max(positions, default=0) + 1
    waiting_run = replace(
        run,
        input=steps[0].content,
        queue_position=position,
        caller_instance=(instance or "") if queue.followed else "",
        caller_deadline=queue.deadline,
    ).queued()
    if queue.ahead and holder:
        waiting_run.supersedes = holder
        if queue.supersede is not None:
            conn.execute(
                update(run_table)
                .where(
                    run_table.c.id == holder,
                    run_table.c.status == RunStatus.RUNNING.value,
                    run_table.c.cancel_request.is_(None),
                )
                .values(cancel_request=stop_signal_json(queue.supersede))
            )
        if queue.rollback:
            first = conn.execute(
                select(run_table.c.first_sequence).where(run_table.c.id == holder)
            ).scalar()
            waiting_run.rollback_from = int(first or 0)
    stored = stored_run(waiting_run)
    records = journal(stored, ()) if journal is not None else ()
    # Its queued start's events come before those of its start.
    stored.last_event_seq = max((record.seq for record in records), default=0)
    insert_run(conn, stored)
    write_journal(conn, run.id, records)
    return RunStart(stored, [], [], interrupted=holder if queue.ahead else "", holder=holder)


def store_start(
    conn: Connection,
    run: Run,
    steps: Sequence[Step],
    since: HistoryMark | None,
    journal: Journal | None,
    *,
    insert: bool,
    fresh: bool = False,
) -> RunStart:
    """A run starting on the session it holds: the steps of the run it rolls back deleted,
    its first steps appended (at 1, 2... in a `fresh` session, created holding them), the
    run inserted (or, queued before, updated), its journal, and the history read back after
    `since`."""
    if run.rollback_from:
        roll_back(conn, run.session_id, run.supersedes, run.rollback_from)
    stored_steps = insert_steps(conn, steps, 1) if fresh else append(conn, run.session_id, steps)
    started = stored_run(run)
    started.first_sequence = stored_steps[0].sequence
    started.last_sequence = stored_steps[-1].sequence
    started.step_count = len(stored_steps)
    if insert:
        insert_run(conn, started)
    elif CONTINUE_RUN.execute(conn, run_update(started)) != 1:
        raise NotFoundError("run", run.id)
    if journal is not None:
        write_journal(conn, run.id, journal(started, stored_steps))
    first = stored_steps[0].sequence
    start = read_start(conn, run.session_id, since, first - 1)
    if start == first:
        history = list(stored_steps)
    else:
        before = read_history(conn, run.session_id, start, first - 1, known_session=True)
        history = before + stored_steps
    return RunStart(run=started, steps=stored_steps, history=history, history_start=start)


def roll_back(conn: Connection, session_id: str, run_id: str, start: int) -> None:
    """Delete the session's steps from `start` on, when every one of them is the rolled
    back run's. When another run wrote after it (a later INTERRUPT went first), its steps
    are no longer the log's end and nothing is deleted: the ROLLBACK starts as an INTERRUPT
    would, rather than delete another run's work or never start."""
    last = require_session(conn, session_id, lock=True)
    if start > last:
        return
    others = conn.execute(
        select(func.count()).where(
            step_table.c.session_id == session_id,
            step_table.c.sequence >= start,
            step_table.c.run_id != run_id,
        )
    ).scalar()
    if not others:
        delete_steps(conn, session_id, start)
