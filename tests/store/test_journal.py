"""The run event journal and the session queues in the store, on SQLite and PostgreSQL.

Journal records are written by the same transaction as the change they announce (a write
refused writes none), read back whole and in seq order, and go with their run. Queued runs
keep their input and place until `start_queued_run` starts the head of a free session.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import UTC, datetime

import pytest

from agio_grpc.domain import (
    ApprovalDecision,
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
from agio_grpc.store import (
    LeaseLostError,
    QueueFullError,
    RunRequiresActionError,
    RunStateConflictError,
    SessionBusyError,
)
from agio_grpc.store.records import TAKEOVER_SEQ_GAP, JournalRecord, QueueRequest, terminal_kind
from tests.roles import StoreRoles, open_roles
from tests.store.test_leases import TINY_LEASE_S, crashing, start, user, wait_for_expiry

__all__ = ["crashing"]  # a fixture this module uses

NOW = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)


def opened(run: Run | None, steps: Sequence[Step]) -> list[JournalRecord]:
    """As the engine journals a start: run_started, then each first step."""
    assert run is not None
    return [
        JournalRecord(run.last_event_seq + 1, NOW, "run_started", run=run),
        *(
            JournalRecord(run.last_event_seq + 2 + offset, NOW, "step_completed", step=step)
            for offset, step in enumerate(steps)
        ),
    ]


async def test_a_start_journals_its_run_and_steps_whole(store: StoreRoles) -> None:
    session = Session()
    run = Run(session_id=session.id, agent="a", metadata={"k": "v"}, options={"model": "m"})
    step = Step(
        session.id,
        run.id,
        Role.USER,
        content="héllo \U0001f600",
        metrics=StepMetrics(input_tokens=3, model_name="m"),
        trace_id="t" * 32,
        span_id="s" * 16,
    )
    started = await store.start_run(run, [step], new_session=session, journal=opened)

    records = await store.read_journal(run.id)
    assert [(record.seq, record.kind) for record in records] == [
        (1, "run_started"),
        (2, "step_completed"),
    ]
    assert records[0].run == started.run  # every field, read back as written
    assert records[1].step == started.steps[0]
    assert records[1].time == NOW
    assert await store.read_journal(run.id, 1) == records[1:]
    assert await store.read_journal("run_missing") == []


async def test_a_refused_start_journals_nothing(store: StoreRoles) -> None:
    first = await start(store)
    second = Run(session_id=first.session_id, agent="a")
    with pytest.raises(SessionBusyError):
        await store.start_run(second, [user(second.session_id, second.id)], journal=opened)
    assert await store.read_journal(second.id) == []


async def test_steps_and_a_run_end_journal_with_their_write(store: StoreRoles) -> None:
    run = await start(store)
    reply = Step(
        run.session_id,
        run.id,
        Role.ASSISTANT,
        tool_calls=[ToolCall("call_1", "calc", '{"x": 1}')],
        approval=ApprovalDecision(True, "fine", "key_1", NOW),  # any step round-trips it
    )

    def completed(_: Run | None, steps: Sequence[Step]) -> list[JournalRecord]:
        return [JournalRecord(5, NOW, "step_started", data={"step_id": steps[0].id})] + [
            JournalRecord(9, NOW, "step_completed", step=step) for step in steps
        ]

    with pytest.raises(ValueError, match="holding"):
        await store.append_steps([reply], journal=completed)
    (stored,) = await store.append_steps([reply], held_by=run.id, journal=completed)
    with pytest.raises(LeaseLostError):  # a write refused journals nothing
        await store.append_steps([reply], held_by="run_other", journal=completed)

    signal = StopSignal(StopReason.MODEL_ERROR, "boom", "model", context={"n": [1, 2]})
    ended = run.ended(signal, NOW)
    ended.last_event_seq = 10

    def closed(final: Run | None, _: Sequence[Step]) -> list[JournalRecord]:
        assert final is not None
        return [JournalRecord(10, NOW, terminal_kind(final), run=final)]

    await store.end_run(ended, journal=closed)
    records = await store.read_journal(run.id)
    assert [(record.seq, record.kind) for record in records] == [
        (5, "step_started"),
        (9, "step_completed"),
        (10, "run_failed"),
    ]
    assert records[0].data == {"step_id": stored.id}
    assert records[1].step == stored
    assert records[1].step.approval == reply.approval
    assert records[2].run is not None
    assert records[2].run.stop_signal == signal
    assert records[2].run.status is RunStatus.FAILED


async def test_a_take_over_journals_the_end_past_what_its_dead_server_streamed(
    store: StoreRoles, crashing: StoreRoles, store_url: str
) -> None:
    session = Session()
    run = Run(session_id=session.id, agent="a")
    await crashing.start_run(run, [user(session.id, run.id)], new_session=session, journal=opened)
    await wait_for_expiry(store_url, session.id)
    assert run.id in await store.recover_expired_runs()

    *_, terminal = await store.read_journal(run.id)
    assert terminal.kind == "run_completed"
    assert terminal.seq == 2 + TAKEOVER_SEQ_GAP
    assert terminal.run is not None
    assert terminal.run.status is RunStatus.INTERRUPTED
    assert (await store.get_run(run.id)).last_event_seq == terminal.seq
    assert TINY_LEASE_S < 1


async def test_journal_records_go_with_their_session(store: StoreRoles) -> None:
    session = Session()
    run = Run(session_id=session.id, agent="a")
    await store.start_run(run, [user(session.id, run.id)], new_session=session, journal=opened)
    await store.release_session(session.id, run.id)
    await store.delete_session(session.id)
    assert await store.read_journal(run.id) == []


async def enqueue(
    store: StoreRoles, session_id: str, text: str, request: QueueRequest | None = None
) -> Run:
    run = Run(session_id=session_id, agent="a")
    started = await store.start_run(
        run, [user(session_id, run.id, text)], journal=opened, queue=request or QueueRequest(10)
    )
    assert started.run.status is RunStatus.QUEUED
    assert started.steps == []
    return started.run


async def test_an_end_racing_a_queued_start_always_hears_of_the_queued_run(
    store: StoreRoles, store_url: str
) -> None:
    # Whichever goes first, an end never says no run waits while one is queued behind it
    # (nothing would start that run until the sweeper). test_postgres.py forces the order
    # where the end waits for the queueing start's lock.
    other = await open_roles(store_url)
    try:
        for attempt in range(10):
            holder = await start(store)
            queued = Run(session_id=holder.session_id, agent="a")
            ending = store.end_run(holder.ended(StopSignal(StopReason.COMPLETED)))
            queueing = other.start_run(
                queued, [user(queued.session_id, queued.id)], queue=QueueRequest(10)
            )
            if attempt % 2:
                began, ended = await asyncio.gather(queueing, ending)
            else:
                ended, began = await asyncio.gather(ending, queueing)
            if began.run.status is RunStatus.QUEUED:
                assert ended.queued, f"attempt {attempt}: the queued run went unreported"
            else:  # the end went first: the session was free, and the run took it
                assert began.run.status is RunStatus.RUNNING
                assert not ended.queued
    finally:
        await other.close()


async def test_a_busy_session_queues_runs_in_order_and_refuses_past_the_limit(
    store: StoreRoles,
) -> None:
    busy = await start(store)
    two = QueueRequest(2)
    queued = [await enqueue(store, busy.session_id, f"later {n}", two) for n in range(2)]
    assert [run.queue_position for run in queued] == [1, 2]
    assert [run.input for run in queued] == ["later 0", "later 1"]
    assert await store.step_count(busy.session_id) == 1  # no input stored yet
    with pytest.raises(QueueFullError):
        await enqueue(store, busy.session_id, "too many", two)
    # A plain run is refused while runs wait in line, even on a free session.
    await store.end_run(busy.ended(StopSignal(StopReason.COMPLETED)))
    late = Run(session_id=busy.session_id, agent="a")
    with pytest.raises(SessionBusyError):
        await store.start_run(late, [user(late.session_id, late.id)])
    assert await store.ready_queues() == [busy.session_id]

    head = await store.next_queued_run(busy.session_id)
    assert head is not None
    assert head.id == queued[0].id
    with pytest.raises(SessionBusyError):  # not the head
        await store.start_queued_run(queued[1], [user(busy.session_id, queued[1].id)])
    started = await store.start_queued_run(
        head, [user(busy.session_id, head.id, head.input)], journal=opened
    )
    assert started.run.status is RunStatus.RUNNING
    assert [step.content for step in started.history] == ["hi", "later 0"]
    assert [record.kind for record in await store.read_journal(head.id)] == [
        "run_started",  # queued
        "run_started",  # running
        "step_completed",
    ]
    with pytest.raises(RunStateConflictError):
        await store.start_queued_run(started.run, [user(busy.session_id, head.id)])
    assert await store.ready_queues() == []  # held by the head now


async def test_a_queued_run_cancelled_never_starts(store: StoreRoles) -> None:
    busy = await start(store)
    queued = await enqueue(store, busy.session_id, "never mind")
    cancelled = queued.ended(StopSignal(StopReason.CANCELLED, "no", "client"))
    stored = await store.end_idle_run(cancelled, [])
    assert stored is not None
    assert stored.run.status is RunStatus.CANCELLED
    assert stored.steps == []
    assert await store.end_idle_run(cancelled, []) is None  # no longer idle
    assert await store.next_queued_run(busy.session_id) is None


async def test_interrupt_queues_ahead_and_asks_the_holder_to_stop(
    store: StoreRoles,
) -> None:
    busy = await start(store)
    await enqueue(store, busy.session_id, "in line")
    signal = StopSignal(StopReason.CANCELLED, "superseded", "client")
    request = QueueRequest(10, ahead=True, supersede=signal, rollback=True)
    ahead = await enqueue(store, busy.session_id, "now", request)
    assert ahead.queue_position == 0
    assert (ahead.supersedes, ahead.rollback_from) == (busy.id, busy.first_sequence)
    assert await store.cancel_requests([busy.id]) == {busy.id: signal}
    head = await store.next_queued_run(busy.session_id)
    assert head is not None
    assert head.id == ahead.id

    # The holder ends; the head starts, with the holder's steps rolled back.
    await store.end_run(busy.ended(signal))
    started = await store.start_queued_run(head, [user(busy.session_id, head.id, "now")])
    assert [step.content for step in await store.get_steps(busy.session_id)] == ["now"]
    assert started.run.first_sequence == 1


async def test_a_rollback_over_another_runs_steps_deletes_nothing(store: StoreRoles) -> None:
    first = await start(store)
    await store.end_run(first.ended(StopSignal(StopReason.COMPLETED)))
    second = await start(store, Session(id=first.session_id))
    await store.end_run(second.ended(StopSignal(StopReason.COMPLETED)))
    rolling = Run(session_id=first.session_id, agent="a", supersedes=first.id, rollback_from=1)
    # Step 2 is the second run's: the first run's steps are no longer the log's end, so the
    # rollback starts as an interrupt would, deleting no other run's work.
    started = await store.start_run(rolling, [user(first.session_id, rolling.id, "again")])
    assert [step.content for step in started.history] == ["hi", "hi", "again"]


async def test_a_waiting_run_blocks_starts_and_queues_ahead(store: StoreRoles) -> None:
    waiting = await start(store)
    await store.end_run(waiting.ended(StopSignal(StopReason.REQUIRES_ACTION, "tools", "loop")))
    new = Run(session_id=waiting.session_id, agent="a")
    for request in (None, QueueRequest(10, ahead=True)):
        with pytest.raises(RunRequiresActionError) as refused:
            await store.start_run(new, [user(new.session_id, new.id)], queue=request)
        assert refused.value.active_run_id == waiting.id
    queued = await enqueue(store, waiting.session_id, "after it")  # ENQUEUE waits behind it
    assert queued.status is RunStatus.QUEUED
    assert await store.ready_queues() == []
