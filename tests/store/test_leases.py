"""Session leases (store/protocol.py), run unchanged on a SQLite file and on PostgreSQL.

A crashed server is a holder that stops renewing. Each test plays it with a second store on
the same database, opened with a tiny lease the way another process would open it, and waits
for that lease to run out by reading its expiry from the database and watching the clock in
a bounded loop. No test depends on a fixed sleep being long enough.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import datetime, timedelta

import pytest
from alembic import command
from sqlalchemy import Connection, insert, select, update
from sqlalchemy.ext.asyncio import create_async_engine

from agio_grpc.domain import (
    ABANDONED_MESSAGE,
    LEASE_EXPIRED_MESSAGE,
    RESTARTED_MESSAGE,
    Role,
    Run,
    RunStatus,
    Session,
    Step,
    StopReason,
    StopSignal,
    ToolCall,
    utc_now,
)
from agio_grpc.store import (
    HistoryChangedError,
    LeaseLostError,
    NotFoundError,
    RunStateConflictError,
    SessionBusyError,
)
from agio_grpc.store.migrations import alembic_config, head_revision
from agio_grpc.store.records import HistoryMark, QueueRequest
from agio_grpc.store.tables import runs, sessions
from tests.roles import StoreRoles, open_roles

TINY_LEASE_S = 0.2


@pytest.fixture
async def crashing(store_url: str) -> AsyncIterator[StoreRoles]:
    """A second store on the same database with a tiny lease: its takes expire unless
    renewed, as those of a server that died right after taking a session."""
    opened = await open_roles(store_url, session_lease_s=TINY_LEASE_S)
    try:
        yield opened
    finally:
        await opened.close()


def user(session_id: str, run_id: str, text: str = "hi") -> Step:
    return Step(session_id=session_id, run_id=run_id, role=Role.USER, content=text)


async def start(store: StoreRoles, session: Session | None = None, text: str = "hi") -> Run:
    """Start a run (on a new session when `session` is None) and return it as stored."""
    fresh = Session() if session is None else None
    run = Run(session_id=(fresh or session or Session()).id, agent="a")
    started = await store.start_run(run, [user(run.session_id, run.id, text)], new_session=fresh)
    return started.run


async def lease_of(store_url: str, session_id: str) -> tuple[str | None, datetime | None]:
    """The session's holder and lease expiry, read past the store."""
    engine = create_async_engine(store_url)
    try:
        async with engine.connect() as conn:
            row = (
                await conn.execute(
                    select(sessions.c.active_run_id, sessions.c.lease_expires_at).where(
                        sessions.c.id == session_id
                    )
                )
            ).one()
    finally:
        await engine.dispose()
    return row.active_run_id, row.lease_expires_at


async def wait_until_past(moment: datetime) -> None:
    """Return once the clock the store uses has passed `moment`."""
    await asyncio.sleep(max((moment - utc_now()).total_seconds(), 0) + 0.01)
    assert utc_now() > moment


async def expire_lease(store_url: str, session_id: str) -> None:
    """End the session's lease now, past the store, as time would for a holder that died."""
    engine = create_async_engine(store_url)
    try:
        async with engine.begin() as conn:
            await conn.execute(
                update(sessions)
                .where(sessions.c.id == session_id)
                .values(lease_expires_at=utc_now() - timedelta(seconds=1))
            )
    finally:
        await engine.dispose()


async def wait_for_expiry(store_url: str, session_id: str) -> None:
    _, expires = await lease_of(store_url, session_id)
    assert expires is not None
    await wait_until_past(expires)


async def test_a_take_sets_a_lease_of_the_configured_length(
    crashing: StoreRoles, store_url: str
) -> None:
    before = utc_now()
    run = await start(crashing)

    holder, expires = await lease_of(store_url, run.session_id)

    assert holder == run.id
    assert expires is not None
    assert before + timedelta(seconds=TINY_LEASE_S) <= expires
    assert expires <= utc_now() + timedelta(seconds=TINY_LEASE_S)


async def test_a_take_over_an_expired_lease_interrupts_the_previous_run(
    store: StoreRoles, crashing: StoreRoles, store_url: str
) -> None:
    crashed = await start(crashing)
    reply = Step(
        session_id=crashed.session_id,
        run_id=crashed.id,
        role=Role.ASSISTANT,
        content="",
        tool_calls=[],
    )
    await crashing.append_one(reply)  # the crashed run got one step further than its row
    await wait_for_expiry(store_url, crashed.session_id)

    taker = await start(store, await store.get_session(crashed.session_id), "again")

    interrupted = await store.get_run(crashed.id)
    assert interrupted.status is RunStatus.INTERRUPTED
    signal = interrupted.stop_signal
    assert signal is not None
    assert signal.reason is StopReason.INTERRUPTED
    assert signal.source == "server"
    assert signal.message == LEASE_EXPIRED_MESSAGE
    assert signal.retryable
    assert signal.resume_from_sequence == 3  # after the user step and the reply
    assert interrupted.end_time is not None
    assert (interrupted.last_sequence, interrupted.step_count) == (2, 2)
    assert taker.first_sequence == 3
    holder, expires = await lease_of(store_url, crashed.session_id)
    assert holder == taker.id
    assert expires is not None
    assert expires > utc_now() + timedelta(seconds=store.session_lease_s / 2)


async def test_a_take_over_answers_the_calls_the_crashed_run_left_open(
    store: StoreRoles, crashing: StoreRoles, store_url: str
) -> None:
    crashed = await start(crashing)  # user 1
    calls = [ToolCall(f"call_{n}", "lookup", "{}") for n in range(3)]
    reply = Step(crashed.session_id, crashed.id, Role.ASSISTANT, tool_calls=calls)
    done = Step(
        crashed.session_id,
        crashed.id,
        Role.TOOL,
        content="42",
        tool_call_id="call_1",
        name="lookup",
    )
    await crashing.append_steps([reply, done], held_by=crashed.id)  # 2, 3
    await wait_for_expiry(store_url, crashed.session_id)

    taker = await start(store, await store.get_session(crashed.session_id), "again")

    steps = await store.get_steps(crashed.session_id)
    assert [(s.sequence, s.role, s.tool_call_id) for s in steps] == [
        (1, Role.USER, ""),
        (2, Role.ASSISTANT, ""),
        (3, Role.TOOL, "call_1"),
        (4, Role.TOOL, "call_0"),
        (5, Role.TOOL, "call_2"),
        (6, Role.USER, ""),
    ]
    for answer in steps[3:5]:
        assert answer.is_error
        assert answer.run_id == crashed.id
        assert "did not return a result: the run was interrupted" in answer.content
    interrupted = await store.get_run(crashed.id)
    assert interrupted.stop_signal is not None
    assert interrupted.stop_signal.resume_from_sequence == 4  # Retry runs them again
    assert (interrupted.step_count, interrupted.last_sequence) == (5, 5)
    assert taker.first_sequence == 6
    journal = await store.read_journal(crashed.id)
    assert [r.kind for r in journal[-3:]] == ["step_completed", "step_completed", "run_completed"]
    assert [r.step.sequence for r in journal[-3:-1] if r.step] == [4, 5]
    assert [r.seq for r in journal[-3:]] == [
        journal[-3].seq,
        journal[-3].seq + 1,
        journal[-3].seq + 2,
    ]


async def test_a_take_over_adds_nothing_after_a_final_reply(
    store: StoreRoles, crashing: StoreRoles, store_url: str
) -> None:
    crashed = await start(crashing)
    await crashing.append_steps(
        [Step(crashed.session_id, crashed.id, Role.ASSISTANT, content="done")],
        held_by=crashed.id,
    )
    await wait_for_expiry(store_url, crashed.session_id)
    await start(store, await store.get_session(crashed.session_id), "again")
    assert [s.role for s in await store.get_steps(crashed.session_id)] == [
        Role.USER,
        Role.ASSISTANT,
        Role.USER,
    ]


async def test_a_run_whose_session_was_taken_over_can_no_longer_write_to_it(
    store: StoreRoles, crashing: StoreRoles, store_url: str
) -> None:
    # The holder's server only stalled past its lease: it wakes up after the take-over.
    stalled = await start(crashing)
    await wait_for_expiry(store_url, stalled.session_id)
    taker = await start(store, await store.get_session(stalled.session_id), "again")

    late = Step(stalled.session_id, stalled.id, Role.ASSISTANT, content="too late")
    with pytest.raises(LeaseLostError):
        await crashing.append_steps([late], held_by=stalled.id)
    stalled.status = RunStatus.COMPLETED
    stalled.stop_signal = StopSignal(StopReason.COMPLETED, "", "model")
    ended = await crashing.end_run(stalled)

    assert not ended.released
    assert ended.earlier_end is not None
    assert ended.earlier_end.status is RunStatus.INTERRUPTED
    assert ended.earlier_end == await store.get_run(stalled.id)  # the take-over's end stays
    assert [step.run_id for step in await store.get_steps(stalled.session_id)] == [
        stalled.id,
        taker.id,
    ]
    holder, _ = await lease_of(store_url, stalled.session_id)
    assert holder == taker.id
    reply = Step(taker.session_id, taker.id, Role.ASSISTANT, content="mine")
    (stored,) = await store.append_steps([reply], held_by=taker.id)
    assert stored.sequence == 3


async def test_a_held_write_needs_the_session_held_by_that_run(store: StoreRoles) -> None:
    run = await start(store)
    step = Step(run.session_id, run.id, Role.ASSISTANT, content="x")
    with pytest.raises(LeaseLostError):
        await store.append_steps([step], held_by="run_other")
    assert await store.release_session(run.session_id, run.id)
    with pytest.raises(LeaseLostError):
        await store.append_steps([step], held_by=run.id)
    assert await store.step_count(run.session_id) == 1
    with pytest.raises(NotFoundError):
        await store.append_steps(
            [Step("sess_missing", run.id, Role.ASSISTANT, content="x")], held_by=run.id
        )
    # Without `held_by`, a write does not look at the holder (imports, forks, tools).
    assert (await store.append_steps([step]))[0].sequence == 2


async def waiting_run(store: StoreRoles) -> Run:
    """A run ended REQUIRES_ACTION (its session released), as a client tool call leaves it."""
    run = await start(store)
    run.status = RunStatus.REQUIRES_ACTION
    run.stop_signal = StopSignal(StopReason.REQUIRES_ACTION, "client tools", "model")
    assert (await store.end_run(run)).released
    return run


def output(run: Run) -> Step:
    return Step(run.session_id, run.id, Role.TOOL, content="done", tool_call_id="call_1")


async def last_mark(store: StoreRoles, session_id: str) -> HistoryMark:
    last = await store.last_step(session_id)
    assert last is not None
    return HistoryMark(last.sequence, last.id)


async def test_continue_run_stores_the_outputs_and_the_running_run_together(
    store: StoreRoles,
) -> None:
    run = await waiting_run(store)
    mark = await last_mark(store, run.session_id)

    continued = await store.continue_run(run, [output(run)], expect=mark)

    assert [step.sequence for step in continued.steps] == [2]
    assert continued.run.status is RunStatus.RUNNING
    assert continued.run.stop_signal is None
    assert (continued.run.step_count, continued.run.last_sequence) == (2, 2)
    assert await store.get_run(run.id) == continued.run
    assert await store.get_steps(run.session_id, 2) == continued.steps
    assert (await store.get_session(run.session_id)).active_run_id == run.id  # taken with it


async def test_continue_run_stores_nothing_unless_the_run_still_waits_on_the_log_it_read(
    store: StoreRoles,
) -> None:
    run = await waiting_run(store)
    mark = await last_mark(store, run.session_id)
    # A stale read: the log's last step is not the one the call decided on.
    with pytest.raises(HistoryChangedError):
        await store.continue_run(run, [output(run)], expect=HistoryMark(1, "step_other"))
    with pytest.raises(HistoryChangedError):
        await store.continue_run(run, [output(run)], expect=None)
    # Another run holds the session.
    await store.take_session(run.session_id, "run_other")
    with pytest.raises(SessionBusyError):
        await store.continue_run(run, [output(run)], expect=mark)
    assert await store.release_session(run.session_id, "run_other")
    # Each refusal wrote nothing, and took nothing.
    assert (await store.get_run(run.id)).status is RunStatus.REQUIRES_ACTION
    assert await store.step_count(run.session_id) == 1
    assert (await store.get_session(run.session_id)).active_run_id == ""

    ghost = Run(session_id=run.session_id, agent="a")
    with pytest.raises(NotFoundError):
        await store.continue_run(ghost, [output(ghost)], expect=mark)
    # Continued once, the run no longer waits: a second continuation is refused.
    continued = await store.continue_run(run, [output(run)], expect=mark)
    await store.end_run(continued.run.ended(StopSignal(StopReason.COMPLETED)))
    with pytest.raises(RunStateConflictError):
        await store.continue_run(run, [output(run)], expect=await last_mark(store, run.session_id))
    assert await store.step_count(run.session_id) == 2


async def test_acquire_over_an_expired_lease_interrupts_the_previous_run(
    store: StoreRoles, crashing: StoreRoles, store_url: str
) -> None:
    crashed = await start(crashing)
    await wait_for_expiry(store_url, crashed.session_id)

    await store.take_session(crashed.session_id, "run_next")

    assert (await store.get_run(crashed.id)).status is RunStatus.INTERRUPTED
    assert (await store.get_session(crashed.session_id)).active_run_id == "run_next"


async def test_edits_are_refused_while_a_run_holds_the_session_and_leave_it_free(
    store: StoreRoles, store_url: str
) -> None:
    run = await start(store)
    with pytest.raises(SessionBusyError):
        await store.delete_steps_from(run.session_id, 1)
    with pytest.raises(SessionBusyError):
        await store.delete_session(run.session_id)
    assert (await lease_of(store_url, run.session_id))[0] == run.id
    assert await store.step_count(run.session_id) == 1

    await store.release_session(run.session_id, run.id)
    assert await store.delete_steps_from(run.session_id, 1) == 1
    # The edit let go of the session in its own transaction.
    assert (await lease_of(store_url, run.session_id))[0] is None
    assert await store.delete_session(run.session_id) == 0


async def test_an_edit_over_an_expired_lease_interrupts_the_run_that_held_it(
    store: StoreRoles, crashing: StoreRoles, store_url: str
) -> None:
    crashed = await start(crashing)
    await wait_for_expiry(store_url, crashed.session_id)

    assert await store.delete_steps_from(crashed.session_id, 2) == 0

    assert (await store.get_run(crashed.id)).status is RunStatus.INTERRUPTED
    assert (await lease_of(store_url, crashed.session_id))[0] is None


async def test_a_take_over_an_expired_lease_leaves_an_ended_run_as_it_was(
    store: StoreRoles, crashing: StoreRoles, store_url: str
) -> None:
    # The holder wrote its final state, then died before releasing the session.
    ended = await start(crashing)
    ended.status = RunStatus.COMPLETED
    ended.end_time = utc_now()
    await crashing.set_run_row(ended)
    await wait_for_expiry(store_url, ended.session_id)

    await store.take_session(ended.session_id, "run_next")

    assert (await store.get_run(ended.id)).status is RunStatus.COMPLETED


async def test_a_live_lease_is_not_taken(store: StoreRoles) -> None:
    holder = await start(store)

    with pytest.raises(SessionBusyError) as busy:
        await store.take_session(holder.session_id, "run_other")
    with pytest.raises(SessionBusyError):
        await start(store, await store.get_session(holder.session_id))

    assert busy.value.active_run_id == holder.id
    assert (await store.get_run(holder.id)).status is RunStatus.RUNNING
    assert (await store.get_session(holder.session_id)).active_run_id == holder.id


async def test_renewing_keeps_a_lease_alive_past_its_first_expiry(
    store_url: str, store: StoreRoles
) -> None:
    renewing = await open_roles(store_url, session_lease_s=2.0)
    try:
        run = await start(renewing)
        _, first_expiry = await lease_of(store_url, run.session_id)
        assert first_expiry is not None
        await wait_until_past(first_expiry - timedelta(seconds=1.0))

        renewed = await renewing.renew_leases({run.session_id: run.id})

        assert renewed == {run.session_id}
        _, second_expiry = await lease_of(store_url, run.session_id)
        assert second_expiry is not None
        assert second_expiry > first_expiry
        await wait_until_past(first_expiry)
        with pytest.raises(SessionBusyError):
            await store.take_session(run.session_id, "run_other")
        assert (await store.get_run(run.id)).status is RunStatus.RUNNING
    finally:
        await renewing.close()


async def test_renew_extends_only_sessions_still_held_by_the_named_run(
    store: StoreRoles, store_url: str
) -> None:
    held = await start(store)
    released = await start(store)
    await store.release_session(released.session_id, released.id)
    _, before = await lease_of(store_url, held.session_id)

    renewed = await store.renew_leases(
        {
            held.session_id: held.id,
            released.session_id: released.id,
            "sess_missing": "run_missing",
        }
    )
    not_renewed = await store.renew_leases({held.session_id: "run_impostor"})

    assert renewed == {held.session_id}
    assert not_renewed == set()
    assert await store.renew_leases({}) == set()
    _, after = await lease_of(store_url, held.session_id)
    assert before is not None
    assert after is not None
    assert after >= before
    assert await lease_of(store_url, released.session_id) == (None, None)


async def test_release_clears_the_holder_and_the_lease(store: StoreRoles, store_url: str) -> None:
    run = await start(store)

    await store.release_session(run.session_id, run.id)

    assert await lease_of(store_url, run.session_id) == (None, None)
    await store.take_session(run.session_id, "run_next")


async def test_recover_expired_runs_finalises_only_expired_holders(
    store: StoreRoles, crashing: StoreRoles, store_url: str
) -> None:
    crashed = await start(crashing)
    live = await start(store)
    await wait_for_expiry(store_url, crashed.session_id)

    recovered = await store.recover_expired_runs()

    assert recovered == [crashed.id]
    interrupted = await store.get_run(crashed.id)
    assert interrupted.status is RunStatus.INTERRUPTED
    assert interrupted.stop_signal is not None
    assert interrupted.stop_signal.resume_from_sequence == 2
    assert await lease_of(store_url, crashed.session_id) == (None, None)
    assert (await store.get_run(live.id)).status is RunStatus.RUNNING
    assert (await lease_of(store_url, live.session_id))[0] == live.id
    assert await store.recover_expired_runs() == []


async def test_a_restarted_instance_ends_the_runs_it_left_at_once(
    store: StoreRoles, store_url: str
) -> None:
    before = await open_roles(store_url, instance_id="host-a/0.0.0.0:50051")
    try:
        left = await start(before)  # its server dies here: the lease stays live
    finally:
        await before.close()
    other = await open_roles(store_url, instance_id="host-b/0.0.0.0:50051")
    restarted = await open_roles(store_url, instance_id="host-a/0.0.0.0:50051")
    try:
        live = await start(other)
        assert await store.recover_own_runs() == []  # no instance id: nothing is its own

        assert await restarted.recover_own_runs() == [left.id]

        ended = await store.get_run(left.id)
        assert ended.status is RunStatus.INTERRUPTED
        assert ended.stop_signal is not None
        assert (ended.stop_signal.retryable, ended.stop_signal.resume_from_sequence) == (True, 2)
        assert ended.stop_signal.message == RESTARTED_MESSAGE  # not "its lease expired"
        assert await lease_of(store_url, left.session_id) == (None, None)
        assert (await store.get_run(live.id)).status is RunStatus.RUNNING
        assert (await lease_of(store_url, live.session_id))[0] == live.id
        assert await restarted.recover_own_runs() == []
        await start(restarted, await store.get_session(left.session_id))  # usable at once
    finally:
        await other.close()
        await restarted.close()


async def test_a_run_whose_lease_expired_is_interrupted_without_taking_its_session(
    store: StoreRoles, crashing: StoreRoles, store_url: str
) -> None:
    crashed = await start(store)  # a full lease: it still runs, however slow this machine
    await store.append_one(Step(crashed.session_id, crashed.id, Role.ASSISTANT, "partial"))
    assert not await store.interrupt_abandoned_run(crashed.id)
    await expire_lease(store_url, crashed.session_id)  # then its server died

    assert await store.interrupt_abandoned_run(crashed.id)

    interrupted = await store.get_run(crashed.id)
    assert interrupted.status is RunStatus.INTERRUPTED
    assert interrupted.stop_signal is not None
    assert interrupted.stop_signal.message == LEASE_EXPIRED_MESSAGE
    assert interrupted.stop_signal.resume_from_sequence == 3
    assert (interrupted.last_sequence, interrupted.step_count) == (2, 2)
    assert await lease_of(store_url, crashed.session_id) == (None, None)  # free, not taken
    assert not await store.interrupt_abandoned_run(crashed.id)  # once


async def test_a_running_run_that_let_go_of_its_session_is_interrupted(
    store: StoreRoles,
) -> None:
    # Its server released the session, then failed to store the run's end, then went away.
    run = await start(store)
    await store.append_one(Step(run.session_id, run.id, Role.ASSISTANT, "partial"))
    assert await store.release_session(run.session_id, run.id)

    assert await store.interrupt_abandoned_run(run.id)

    interrupted = await store.get_run(run.id)
    assert interrupted.status is RunStatus.INTERRUPTED
    assert interrupted.stop_signal is not None
    assert interrupted.stop_signal.message == ABANDONED_MESSAGE
    assert (interrupted.last_sequence, interrupted.step_count) == (2, 2)


async def test_a_live_or_ended_run_is_not_interrupted(store: StoreRoles) -> None:
    live = await start(store)
    assert not await store.interrupt_abandoned_run(live.id)
    assert (await store.get_run(live.id)).status is RunStatus.RUNNING
    live.status = RunStatus.COMPLETED
    assert (await store.end_run(live)).released
    assert not await store.interrupt_abandoned_run(live.id)
    assert (await store.get_run(live.id)).status is RunStatus.COMPLETED
    with pytest.raises(NotFoundError):
        await store.interrupt_abandoned_run("run_missing")


async def test_a_cancel_request_stands_on_a_running_run_until_its_segment_ends(
    store: StoreRoles,
) -> None:
    run = await start(store)
    other = await start(store)
    first = StopSignal(StopReason.CANCELLED, "stop it", "client")

    assert await store.request_cancel(run.id, first)
    assert await store.request_cancel(run.id, StopSignal(StopReason.CANCELLED, "later"))
    assert await store.cancel_requests([run.id, other.id, "run_missing"]) == {run.id: first}
    assert await store.cancel_requests([other.id]) == {}
    assert await store.cancel_requests([]) == {}

    # The segment ends waiting for the client: the request is spent, and a continuation
    # (RUNNING again) does not inherit it.
    run.status = RunStatus.REQUIRES_ACTION
    await store.set_run_row(run)
    run.status = RunStatus.RUNNING
    await store.set_run_row(run)
    assert await store.cancel_requests([run.id]) == {}


async def test_a_cancel_request_for_an_ended_or_unknown_run_is_not_recorded(
    store: StoreRoles,
) -> None:
    run = await start(store)
    run.status = RunStatus.COMPLETED
    await store.set_run_row(run)
    signal = StopSignal(StopReason.CANCELLED, "too late", "client")

    assert not await store.request_cancel(run.id, signal)
    assert await store.cancel_requests([run.id]) == {}
    with pytest.raises(NotFoundError):
        await store.request_cancel("run_missing", signal)


async def test_a_session_stuck_under_revision_0001_is_taken_over_after_upgrade(
    store_url: str,
) -> None:
    """A database at 0001 (no leases) with a session held by a run its server never ended:
    the upgrade keeps it, and the next take treats the lease-less holder as expired."""
    await (await open_roles(store_url)).close()
    now = utc_now()

    def downgrade_and_crash(conn: Connection) -> None:
        config = alembic_config()
        config.attributes["connection"] = conn
        command.downgrade(config, "0001")
        conn.execute(
            insert(sessions).values(
                id="sess_stuck",
                create_time=now,
                update_time=now,
                last_sequence=0,
                active_run_id="run_stuck",
            )
        )
        conn.execute(
            insert(runs).values(
                id="run_stuck",
                session_id="sess_stuck",
                agent="a",
                status=RunStatus.RUNNING.value,
                create_time=now,
            )
        )

    engine = create_async_engine(store_url)
    try:
        async with engine.begin() as conn:
            await conn.run_sync(downgrade_and_crash)
    finally:
        await engine.dispose()

    upgraded = await open_roles(store_url)
    try:
        assert await lease_of(store_url, "sess_stuck") == ("run_stuck", None)
        await upgraded.take_session("sess_stuck", "run_next")
        stuck = await upgraded.get_run("run_stuck")
    finally:
        await upgraded.close()

    assert stuck.status is RunStatus.INTERRUPTED
    assert stuck.stop_signal is not None
    assert stuck.stop_signal.resume_from_sequence == 1
    holder, expires = await lease_of(store_url, "sess_stuck")
    assert holder == "run_next"
    assert expires is not None
    assert head_revision() == "0015"


async def test_a_queued_run_names_the_instance_holding_its_caller_s_stream(
    store: StoreRoles, store_url: str
) -> None:
    here = await open_roles(store_url, instance_id="host-a/0.0.0.0:50051")
    elsewhere = await open_roles(store_url, instance_id="host-b/0.0.0.0:50051")
    try:
        busy = await start(here)
        deadline = utc_now() + timedelta(minutes=5)
        queued: list[Run] = []
        for followed in (True, False):
            run = Run(session_id=busy.session_id, agent="a")
            request = QueueRequest(10, followed=followed, deadline=deadline)
            started = await here.start_run(run, [user(run.session_id, run.id)], queue=request)
            queued.append(started.run)
        called_here = await here.queued_runs_called_here()
        assert [run.id for run in called_here] == [queued[0].id]
        assert called_here[0].caller_instance == "host-a/0.0.0.0:50051"
        assert called_here[0].caller_deadline == deadline
        assert (await here.get_run(queued[1].id)).caller_instance == ""  # its caller let go
        assert await elsewhere.queued_runs_called_here() == []
        assert await store.queued_runs_called_here() == []  # no instance id: no caller's
    finally:
        await here.close()
        await elsewhere.close()
