"""A run's usual writes as one statement each on PostgreSQL (store/sql/single.py): one
round trip each, the same rows as the transactions they stand for, and those transactions
whenever the usual outcome is not what happens."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Iterator, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import event, select
from sqlalchemy.dialects.postgresql.asyncpg import AsyncAdapt_asyncpg_connection
from sqlalchemy.ext.asyncio import create_async_engine

from agio_grpc.domain import (
    DEFAULT_TENANT,
    Role,
    Run,
    RunStatus,
    Session,
    Step,
    StepMetrics,
    StopReason,
    StopSignal,
    ToolCall,
)
from agio_grpc.store import StoreError
from agio_grpc.store.errors import (
    DuplicateRequestError,
    LeaseLostError,
    NotFoundError,
    RunRequiresActionError,
    RunStateConflictError,
    SessionBusyError,
    TenantQuotaError,
)
from agio_grpc.store.records import HistoryMark, JournalRecord, TenantQuotas
from agio_grpc.store.sql import DEFAULT_SESSION_LEASE_S, open_store
from agio_grpc.store.sql.takes import Lease
from agio_grpc.store.tables import run_events, runs, sessions, steps
from tests.postgres import TestDatabases
from tests.roles import StoreRoles, open_roles

pytestmark = pytest.mark.postgres

ONLY_POSTGRES = pytest.mark.parametrize("backend", ["postgres"])

T0 = datetime(2026, 11, 28, 9, 0, tzinfo=UTC)


class Transactions(StoreRoles):
    """The store with every write in its transaction, as on SQLite."""

    @property
    def _one_statement(self) -> bool:
        return False


@pytest.fixture
async def transactions(postgres_databases: TestDatabases) -> AsyncIterator[Transactions]:
    """The store of a second database, writing through its transactions only."""
    url = await postgres_databases.create()
    front = await open_store(url)
    try:
        yield Transactions(
            front, Lease(timedelta(seconds=DEFAULT_SESSION_LEASE_S), None), TenantQuotas()
        )
    finally:
        await front.close()
        await postgres_databases.drop(url)


class RoundTrips:
    """The statements and BEGINs the store sends, from now on."""

    def __init__(self, store: StoreRoles, monkeypatch: pytest.MonkeyPatch) -> None:
        self.statements: list[str] = []
        self.begins = 0
        self._engine = store._database._engine.sync_engine  # type: ignore[attr-defined]
        event.listen(self._engine, "before_cursor_execute", self._statement)
        started = AsyncAdapt_asyncpg_connection._start_transaction

        async def start_transaction(connection: AsyncAdapt_asyncpg_connection) -> None:
            self.begins += connection.isolation_level != "autocommit"
            await started(connection)  # type: ignore[no-untyped-call]

        monkeypatch.setattr(AsyncAdapt_asyncpg_connection, "_start_transaction", start_transaction)

    def close(self) -> None:
        event.remove(self._engine, "before_cursor_execute", self._statement)

    def _statement(self, *args: Any) -> None:
        self.statements.append(str(args[2]))

    def take(self) -> tuple[int, int]:
        """(statements, BEGINs) since the last take."""
        taken = (len(self.statements), self.begins)
        self.statements.clear()
        self.begins = 0
        return taken


@pytest.fixture
def trips(store: StoreRoles, monkeypatch: pytest.MonkeyPatch) -> Iterator[RoundTrips]:
    counted = RoundTrips(store, monkeypatch)
    yield counted
    counted.close()


def journal_of(seq: int) -> Any:
    """A journal whose records depend only on what the write stored."""

    def journal(run: Run | None, stored: Sequence[Step]) -> list[JournalRecord]:
        data = {
            "sequences": [step.sequence for step in stored],
            "status": run.status.value if run is not None else "",
            "steps": run.step_count if run is not None else 0,
        }
        return [JournalRecord(seq=seq, time=T0, kind="step_completed", data=data)]

    return journal


def step(
    sequence: int, role: Role, *, calls: int = 0, run_id: str = "run_x", **fields: Any
) -> Step:
    return Step(
        id=f"step_{sequence}",
        session_id="session_x",
        run_id=run_id,
        sequence=sequence,
        role=role,
        tool_calls=[ToolCall(id=f"call_{i}", name="lookup", arguments="{}") for i in range(calls)],
        **fields,
    )


async def a_tool_run(store: StoreRoles) -> list[Step]:
    """A fresh session's tool run (the input, the call, its result and the answer), then a
    short run on the same session, stored and journaled as the engine stores them; every
    step as stored."""
    session = Session(id="session_x", create_time=T0, update_time=T0)
    run = Run(id="run_x", session_id=session.id, agent="a", create_time=T0, trace_id="ab" * 16)
    start = await store.start_run(
        run, [step(1, Role.USER, content="hi")], new_session=session, journal=journal_of(1)
    )
    call = step(2, Role.ASSISTANT, calls=1, metrics=StepMetrics(input_tokens=7, total_tokens=9))
    stored = await store.append_steps([call], held_by=run.id, journal=journal_of(2))
    result = step(3, Role.TOOL, content="42", tool_call_id="call_0", name="lookup")
    stored += await store.append_steps([result], held_by=run.id, journal=journal_of(3))
    answer = step(4, Role.ASSISTANT, content="done", metrics=StepMetrics(output_tokens=3))
    ended = start.run.with_steps(stored).ended(StopSignal(StopReason.COMPLETED), at=T0)
    end = await store.end_run(ended, steps=[answer], journal=journal_of(4))
    assert (end.released, end.queued) == (True, False)
    # The session's next run, on the history the caller holds.
    again = Run(id="run_y", session_id=session.id, agent="a", create_time=T0, request_id="r")
    next_start = await store.start_run(
        again,
        [step(5, Role.USER, run_id=again.id, content="again")],
        since=HistoryMark(4, "step_4"),
        journal=journal_of(1),
    )
    reply = step(6, Role.ASSISTANT, run_id=again.id, content="sure")
    next_ended = next_start.run.ended(StopSignal(StopReason.COMPLETED), at=T0)
    next_end = await store.end_run(next_ended, steps=[reply], journal=journal_of(2))
    # A run on it from a server that holds none of its history (another member's).
    other = Run(id="run_z", session_id=session.id, agent="a", create_time=T0)
    cold = await store.start_run(
        other, [step(7, Role.USER, run_id=other.id, content="more")], journal=journal_of(1)
    )
    assert cold.history_start == 1
    return [
        *start.steps,
        *stored,
        *end.steps,
        *next_start.steps,
        *next_end.steps,
        *cold.history,
    ]


def unclocked(stored: list[Step]) -> list[Step]:
    return [dataclasses.replace(step, create_time=T0) for step in stored]


async def rows_of(store: StoreRoles) -> dict[str, list[dict[str, Any]]]:
    """Every row the store holds, but the times its writes read from the clock."""
    clock = {"update_time", "lease_expires_at", "create_time"}
    engine = create_async_engine(store._database._engine.url)  # type: ignore[attr-defined]
    tables: dict[str, list[dict[str, Any]]] = {}
    try:
        async with engine.connect() as conn:
            for table in (sessions, steps, runs, run_events):
                keys = list(table.primary_key.columns)
                result = await conn.execute(select(table).order_by(*keys))
                tables[table.name] = [
                    {name: value for name, value in row.items() if name not in clock}
                    for row in result.mappings()
                ]
    finally:
        await engine.dispose()
    return tables


async def a_run(store: StoreRoles, content: str = "hi") -> Run:
    """A run started on a new session, its input at 1; the run as stored."""
    session = Session()
    run = Run(session_id=session.id, agent="a")
    started = await store.start_run(run, [of(run, Role.USER, content=content)], new_session=session)
    return started.run


def of(run: Run, role: Role, sequence: int = 0, **fields: Any) -> Step:
    """A step of `run`, numbered `sequence` (0: not numbered)."""
    return Step(session_id=run.session_id, run_id=run.id, role=role, sequence=sequence, **fields)


async def a_finished_run(
    store: StoreRoles, signal: StopSignal, **fields: Any
) -> tuple[str, HistoryMark]:
    """A run on a new session that ended with `signal` after its answer at 2: the session,
    and the mark of the history the caller then holds."""
    session = Session()
    run = Run(session_id=session.id, agent="a", **fields)
    started = await store.start_run(run, [of(run, Role.USER, content="hi")], new_session=session)
    answer = of(run, Role.ASSISTANT, 2, content="done")
    end = await store.end_run(started.run.ended(signal), steps=[answer])
    return session.id, HistoryMark(2, end.steps[0].id)


def next_run(session_id: str, **fields: Any) -> tuple[Run, list[Step]]:
    run = Run(session_id=session_id, agent="a", **fields)
    return run, [of(run, Role.USER, content="again")]


@ONLY_POSTGRES
async def test_a_run_s_usual_writes_are_a_statement_each_with_no_begin(
    store: StoreRoles, trips: RoundTrips
) -> None:
    run = await a_run(store)
    assert trips.take() == (1, 0)

    call = of(run, Role.ASSISTANT, 2, content="thinking")
    await store.append_steps([call], held_by=run.id, journal=journal_of(2))
    assert trips.take() == (1, 0)

    answer = of(run, Role.ASSISTANT, 3, content="done")
    ended = run.ended(StopSignal(StopReason.COMPLETED))
    end = await store.end_run(ended, steps=[answer], journal=journal_of(3))
    assert trips.take() == (1, 0)
    assert end.released
    assert [s.sequence for s in end.steps] == [3]

    # Read back through the store, as any reader would.
    assert [s.sequence for s in await store.get_steps(run.session_id)] == [1, 2, 3]
    assert (await store.get_run(run.id)).status is RunStatus.COMPLETED
    assert (await store.get_session(run.session_id)).active_run_id == ""


@ONLY_POSTGRES
async def test_the_one_statement_writes_store_what_the_transactions_store(
    store: StoreRoles, transactions: Transactions
) -> None:
    assert unclocked(await a_tool_run(store)) == unclocked(await a_tool_run(transactions))
    written, expected = await rows_of(store), await rows_of(transactions)
    assert [len(written[table]) for table in written] == [1, 7, 3, 7]
    assert written == expected


@ONLY_POSTGRES
async def test_steps_numbered_past_the_log_s_end_go_through_the_transaction(
    store: StoreRoles, trips: RoundTrips
) -> None:
    run = await a_run(store)
    trips.take()

    numbered_wrong = of(run, Role.ASSISTANT, 5)
    stored = await store.append_steps([numbered_wrong], held_by=run.id, journal=journal_of(2))

    assert [s.sequence for s in stored] == [2]  # where the log's end is
    statements, begins = trips.take()
    assert (statements, begins) == (1 + 3, 1)  # the statement, then the transaction
    assert [s.sequence for s in await store.get_steps(run.session_id)] == [1, 2]
    assert [r.data["sequences"] for r in await store.read_journal(run.id)] == [[2]]


@ONLY_POSTGRES
async def test_a_write_of_a_run_that_let_go_of_its_session_raises_and_writes_nothing(
    store: StoreRoles,
) -> None:
    run = await a_run(store)
    assert await store.release_session(run.session_id, run.id)

    with pytest.raises(LeaseLostError):
        await store.append_steps([of(run, Role.ASSISTANT, 2)], held_by=run.id)

    assert [s.sequence for s in await store.get_steps(run.session_id)] == [1]
    assert await store.read_journal(run.id) == []


@ONLY_POSTGRES
async def test_an_end_of_a_run_no_longer_running_aborts_and_the_transaction_refuses_it(
    store: StoreRoles, trips: RoundTrips
) -> None:
    run = await a_run(store)
    # Still holding its session, yet no longer RUNNING: no end of a run does that.
    await store.set_run_row(run.ended(StopSignal(StopReason.CANCELLED)))
    trips.take()

    answer = of(run, Role.ASSISTANT, 2, content="x")
    with pytest.raises(RunStateConflictError):
        await store.end_run(run.ended(StopSignal(StopReason.COMPLETED)), steps=[answer])

    assert trips.take()[1] == 1  # the statement aborted; the transaction decided
    assert [s.sequence for s in await store.get_steps(run.session_id)] == [1]
    assert (await store.get_session(run.session_id)).active_run_id == run.id
    assert (await store.get_run(run.id)).status is RunStatus.CANCELLED


@ONLY_POSTGRES
async def test_a_value_postgresql_refuses_fails_as_in_the_transaction_and_writes_nothing(
    store: StoreRoles, transactions: Transactions
) -> None:
    errors: list[str] = []
    for roles in (store, transactions):
        run = await a_run(roles)
        huge = of(run, Role.ASSISTANT, 2, metrics=StepMetrics(input_tokens=2**63))  # > bigint
        with pytest.raises(StoreError) as raised:
            await roles.append_steps([huge], held_by=run.id, journal=journal_of(2))
        errors.append(type(raised.value).__name__)
        assert [s.sequence for s in await roles.get_steps(run.session_id)] == [1]
        assert await roles.read_journal(run.id) == []
    assert errors[0] == errors[1]


@ONLY_POSTGRES
async def test_nul_and_lone_surrogates_are_stored_as_the_transactions_store_them(
    store: StoreRoles, trips: RoundTrips
) -> None:
    run = await a_run(store, "a\x00b\ud800c")
    odd = of(run, Role.TOOL, 2, content="\x00", tool_call_id="call_\udfff", name="n\x00")
    await store.append_steps([odd], held_by=run.id, journal=journal_of(2))
    assert trips.take() == (2, 0)

    first, second = await store.get_steps(run.session_id)
    assert first.content == "a\ufffdb\ufffdc"
    assert (second.content, second.tool_call_id, second.name) == (
        "\ufffd",
        "call_\ufffd",
        "n\ufffd",
    )


@ONLY_POSTGRES
async def test_a_tenant_quota_on_running_runs_starts_through_the_transaction(
    store_url: str,
) -> None:
    quotas = TenantQuotas(max_running_runs=1)
    roles = await open_roles(store_url, quotas=quotas)
    try:
        await a_run(roles)
        with pytest.raises(TenantQuotaError):  # counted: the start's transaction ran
            await a_run(roles)
    finally:
        await roles.close()


@ONLY_POSTGRES
async def test_a_run_on_a_session_whose_history_the_caller_holds_starts_in_one_statement(
    store: StoreRoles, trips: RoundTrips
) -> None:
    session_id, mark = await a_finished_run(store, StopSignal(StopReason.COMPLETED))
    run, first = next_run(session_id, request_id="req-2")
    trips.take()

    started = await store.start_run(run, first, since=mark, journal=journal_of(1))

    assert trips.take() == (1, 0)
    assert [s.sequence for s in started.steps] == [3]
    assert (started.history_start, started.history) == (3, started.steps)
    assert (started.run.first_sequence, started.run.last_sequence) == (3, 3)
    assert (await store.get_session(session_id)).active_run_id == run.id
    assert [s.sequence for s in await store.get_steps(session_id)] == [1, 2, 3]
    assert [r.data["sequences"] for r in await store.read_journal(run.id)] == [[3]]


@ONLY_POSTGRES
@pytest.mark.parametrize(
    ("why", "raised"),
    [
        ("a run waits for its client", RunRequiresActionError),
        ("the request id was used", DuplicateRequestError),
        ("another run holds it", SessionBusyError),
        ("another tenant's", NotFoundError),
    ],
)
@pytest.mark.parametrize("holds_history", [True, False])
async def test_a_start_the_transaction_refuses_is_refused_as_it_refuses_it(
    store: StoreRoles,
    trips: RoundTrips,
    why: str,
    raised: type[Exception],
    holds_history: bool,
) -> None:
    if why == "a run waits for its client":
        session_id, mark = await a_finished_run(store, StopSignal(StopReason.REQUIRES_ACTION))
    else:
        session_id, mark = await a_finished_run(
            store, StopSignal(StopReason.COMPLETED), request_id="req-1"
        )
    if why == "another run holds it":
        await store.take_session(session_id, "run_other")
    run, first = next_run(
        session_id,
        request_id="req-1" if why == "the request id was used" else "",
        tenant="other" if why == "another tenant's" else DEFAULT_TENANT,
    )
    trips.take()

    with pytest.raises(raised):
        await store.start_run(run, first, since=mark if holds_history else None)

    assert trips.take()[1] == 1  # the statements wrote nothing; the transaction decided
    assert [s.sequence for s in await store.get_steps(session_id)] == [1, 2]
    with pytest.raises(NotFoundError):
        await store.get_run(run.id)


@ONLY_POSTGRES
@pytest.mark.parametrize("stale", ["missed_the_last_step", "another_last_step"])
async def test_a_start_after_a_history_the_caller_does_not_hold_reads_it_in_the_transaction(
    store: StoreRoles, trips: RoundTrips, stale: str
) -> None:
    session_id, mark = await a_finished_run(store, StopSignal(StopReason.COMPLETED))
    if stale == "missed_the_last_step":
        held = HistoryMark(1, mark.step_id)
    else:  # a log rolled back and written again to the same length
        held = HistoryMark(2, "step_gone")
    run, first = next_run(session_id)
    trips.take()

    started = await store.start_run(run, first, since=held)

    assert trips.take()[1] == 1
    assert [s.sequence for s in started.steps] == [3]
    assert started.history_start == 1
    assert [s.sequence for s in started.history] == [1, 2, 3]


@ONLY_POSTGRES
async def test_a_run_on_a_session_whose_history_the_caller_does_not_hold_reads_it_then_starts(
    store: StoreRoles, trips: RoundTrips
) -> None:
    session_id, _ = await a_finished_run(store, StopSignal(StopReason.COMPLETED))
    before = await store.get_history(session_id)
    run, first = next_run(session_id)
    trips.take()

    started = await store.start_run(run, first, journal=journal_of(1))

    assert trips.take() == (2, 0)  # the history read, then the start: no transaction
    assert [s.sequence for s in started.steps] == [3]
    assert started.history_start == 1
    assert started.history == [*before, *started.steps]
    assert (await store.get_session(session_id)).active_run_id == run.id
    assert [r.data["sequences"] for r in await store.read_journal(run.id)] == [[3]]
