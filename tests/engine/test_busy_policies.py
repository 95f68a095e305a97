"""What a Run does on a busy session (BusyPolicy), on SQLite and PostgreSQL.

Races are real: two (or three) `start_run`s dispatched in the same turn of the event loop,
twenty times each, on the real store of each backend and the fake model over HTTP. Each
repetition checks the exact outcome the policy promises, that the stored log is valid
history (every tool call answered, in order) and that its sequences are 1..N.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import timedelta

import pytest

from agio_grpc.domain import (
    BusyPolicy,
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
from agio_grpc.engine import RunHandle, RunInput, ToolOutput
from agio_grpc.engine.events import RunStarted
from agio_grpc.engine.lifecycle import Lifecycle
from agio_grpc.store.errors import (
    QueueFullError,
    RunRequiresActionError,
    SessionBusyError,
)
from agio_grpc.store.records import QueueRequest
from agio_grpc.testing import FakeModelServer, ToolCallSpec, Turn
from tests.engine.harness import (
    LOOKUP,
    Gate,
    Harness,
    Outcome,
    assert_valid_messages,
    build_runtime,
)
from tests.roles import StoreRoles, open_roles

REPETITIONS = 20


@pytest.fixture
async def policies(store: StoreRoles, fake_model: FakeModelServer) -> AsyncIterator[Harness]:
    """A runtime on the store of the backend under test (both backends)."""
    built = build_runtime(store, fake_model, Gate(), leases=store, max_queued_runs=2)
    try:
        yield built
    finally:
        built.gate.release.set()
        await built.runtime.shutdown(grace_s=0)
        await built.driver.close()


async def idle_session(harness: Harness) -> str:
    """A session with one finished turn (user 1, assistant 2)."""
    harness.model.enqueue(Turn.text("hello"))
    return (await harness.run("hi")).session_id


async def race(harness: Harness, *requests: RunInput) -> list[RunHandle | BaseException]:
    """The requests' `start_run`s, dispatched together."""
    return await asyncio.gather(
        *(harness.runtime.start_run(request) for request in requests), return_exceptions=True
    )


async def assert_valid_log(harness: Harness, session_id: str) -> None:
    steps = await harness.store.get_steps(session_id)
    assert [step.sequence for step in steps] == list(range(1, len(steps) + 1))
    assert_valid_messages([step.to_message() for step in steps])


def handles(results: list[RunHandle | BaseException]) -> list[RunHandle]:
    return [result for result in results if isinstance(result, RunHandle)]


async def test_reject_two_racing_runs_one_starts_one_is_refused(policies: Harness) -> None:
    session_id = await idle_session(policies)
    for _ in range(REPETITIONS):
        # The run that starts holds the session at the gate until both requests are answered:
        # a run that finished before the other request reached the store would free it.
        policies.gate.release.clear()
        policies.model.enqueue(Turn.tool_calls([ToolCallSpec("wait_for_gate", "{}")]))
        policies.model.enqueue(Turn.text("done"))
        requests = [RunInput(f"run {n}", session_id=session_id) for n in range(2)]
        results = await race(policies, *requests)
        (started,) = handles(results)
        (refused,) = [result for result in results if not isinstance(result, RunHandle)]
        assert isinstance(refused, SessionBusyError)
        policies.gate.release.set()
        assert (await policies.collect(started)).run.status is RunStatus.COMPLETED
    await assert_valid_log(policies, session_id)
    assert len(await policies.store.list_runs(session_id, limit=100)) == 1 + REPETITIONS


async def test_reject_a_run_waiting_for_its_client_names_it_and_leaves_it_waiting(
    policies: Harness,
) -> None:
    policies.model.enqueue(Turn.tool_calls([ToolCallSpec("lookup", "{}", id="call_client")]))
    waiting = await policies.run("where is my order?", client_tools=[LOOKUP])
    with pytest.raises(RunRequiresActionError) as refused:
        await policies.runtime.start_run(RunInput("hello?", session_id=waiting.session_id))
    assert refused.value.active_run_id == waiting.run_id
    assert (await policies.store.get_run(waiting.run_id)).status is RunStatus.REQUIRES_ACTION

    policies.model.enqueue(Turn.text("It ships tomorrow."))
    handle = await policies.runtime.submit_tool_outputs(
        waiting.run_id, [ToolOutput("call_client", "packed")]
    )
    assert (await policies.collect(handle)).run.status is RunStatus.COMPLETED
    await assert_valid_log(policies, waiting.session_id)


async def test_enqueue_racing_runs_all_run_first_in_first_out(policies: Harness) -> None:
    session_id = await idle_session(policies)
    for _ in range(REPETITIONS):
        # The run that starts holds the session at the gate until all three are answered
        # (a run that finished before another reached the store would not queue it).
        policies.gate.release.clear()
        policies.model.enqueue(Turn.tool_calls([ToolCallSpec("wait_for_gate", "{}")]))
        requests = [
            RunInput(f"run {n}", session_id=session_id, on_busy=BusyPolicy.ENQUEUE)
            for n in range(3)
        ]
        started = handles(await race(policies, *requests))
        policies.gate.release.set()
        outcomes = await asyncio.gather(*(policies.collect(handle) for handle in started))
        assert len(outcomes) == 3
        runs = [await policies.store.get_run(outcome.run_id) for outcome in outcomes]
        assert [run.status for run in runs] == [RunStatus.COMPLETED] * 3
        queued = sorted((run for run in runs if run.queue_position), key=queue_order)
        assert len(queued) == 2  # one started at once, two waited
        # First in, first out: the queued runs' inputs are stored in the order they queued.
        assert [run.first_sequence for run in queued] == sorted(r.first_sequence for r in queued)
        for outcome in outcomes:
            if outcome.run_id in {run.id for run in queued}:
                opened = outcome.of(RunStarted)
                assert [event.run.status for event in opened] == [
                    RunStatus.QUEUED,
                    RunStatus.RUNNING,
                ]
    await assert_valid_log(policies, session_id)


def queue_order(run: Run) -> tuple[int, object]:
    return run.queue_position, run.create_time


async def test_enqueue_beyond_the_queue_limit_is_refused(policies: Harness) -> None:
    session_id = await idle_session(policies)
    policies.model.enqueue(Turn.tool_calls([ToolCallSpec("wait_for_gate", "{}")]))
    busy = await policies.runtime.start_run(RunInput("work", session_id=session_id))
    await policies.gate.entered.wait()
    queued = [
        await policies.runtime.start_run(
            RunInput(f"later {n}", session_id=session_id, on_busy=BusyPolicy.ENQUEUE)
        )
        for n in range(2)
    ]
    assert [handle.run.status for handle in queued] == [RunStatus.QUEUED] * 2
    with pytest.raises(QueueFullError):
        await policies.runtime.start_run(
            RunInput("one too many", session_id=session_id, on_busy=BusyPolicy.ENQUEUE)
        )
    policies.gate.release.set()
    for handle in (busy, *queued):
        assert (await policies.collect(handle)).run.status is RunStatus.COMPLETED
    await assert_valid_log(policies, session_id)


async def test_a_queued_run_cancelled_before_it_starts_never_starts(policies: Harness) -> None:
    session_id = await idle_session(policies)
    policies.model.enqueue(Turn.tool_calls([ToolCallSpec("wait_for_gate", "{}")]))
    busy = await policies.runtime.start_run(RunInput("work", session_id=session_id))
    await policies.gate.entered.wait()
    queued = await policies.runtime.start_run(
        RunInput("never mind", session_id=session_id, on_busy=BusyPolicy.ENQUEUE)
    )
    cancelled = await policies.runtime.cancel(queued.run_id, "changed my mind")
    assert cancelled.status is RunStatus.CANCELLED
    watched = await policies.collect(queued)  # its stream: queued, then its end
    assert [type(event.event).__name__ for event in watched.events] == [
        "RunStarted",
        "RunCompleted",
    ]
    policies.gate.release.set()
    await policies.collect(busy)
    steps = await policies.store.get_steps(session_id)
    assert "never mind" not in [step.content for step in steps]
    assert (await policies.store.get_session(session_id)).active_run_id == ""


async def superseded_pair(policies: Harness, policy: BusyPolicy) -> tuple[Outcome, Outcome]:
    """Two runs racing with `policy` on an idle session: the one that started is interrupted
    by the other. Returns (interrupted, winner). The model holds every call until one of the
    runs has ended, which can only be the interrupted one: a call it made is cut by the
    interrupt, and the winner's call is answered after it."""
    session_id = await idle_session(policies)
    policies.model.enqueue(Turn.text("answer"))
    policies.model.hold = ended = asyncio.Event()
    requests = [RunInput(f"run {n}", session_id=session_id, on_busy=policy) for n in range(2)]
    first, second = handles(await race(policies, *requests))
    check = policy is not BusyPolicy.ROLLBACK  # the loser's steps go as it is collected

    async def collect(handle: RunHandle) -> Outcome:
        try:
            return await policies.collect(handle, check_stored=check)
        finally:
            ended.set()

    try:
        one, other = await asyncio.gather(collect(first), collect(second))
    finally:
        policies.model.hold = None
    interrupted, winner = (one, other) if one.run.status is RunStatus.CANCELLED else (other, one)
    return interrupted, winner


@pytest.mark.parametrize("policy", [BusyPolicy.INTERRUPT, BusyPolicy.ROLLBACK])
async def test_interrupt_and_rollback_racing_runs_the_later_supersedes_the_other(
    policies: Harness, policy: BusyPolicy
) -> None:
    for _ in range(REPETITIONS):
        interrupted, winner = await superseded_pair(policies, policy)
        assert interrupted.run.status is RunStatus.CANCELLED
        signal = interrupted.run.stop_signal
        assert signal is not None
        assert signal.reason is StopReason.CANCELLED
        assert signal.context == {"superseded_by": winner.run_id}
        assert winner.run.status is RunStatus.COMPLETED
        steps = await policies.store.get_steps(winner.session_id)
        mine = [step.run_id for step in steps if step.run_id == interrupted.run_id]
        if policy is BusyPolicy.ROLLBACK:  # as if the interrupted run never happened
            assert mine == []
            assert [step.content for step in steps[:2]] == ["hi", "hello"]
        else:
            assert len(mine) == 1  # its input; the hanging reply was never stored
        await assert_valid_log(policies, winner.session_id)


@pytest.mark.parametrize("policy", [BusyPolicy.INTERRUPT, BusyPolicy.ROLLBACK])
async def test_interrupting_a_run_mid_tool_answers_its_call_first(
    policies: Harness, policy: BusyPolicy
) -> None:
    session_id = await idle_session(policies)
    policies.model.enqueue(Turn.tool_calls([ToolCallSpec("wait_for_gate", "{}", id="call_w")]))
    busy = await policies.runtime.start_run(RunInput("work", session_id=session_id))
    await policies.gate.entered.wait()
    policies.model.enqueue(Turn.text("new answer"))
    winner = await policies.runtime.start_run(
        RunInput("instead", session_id=session_id, on_busy=policy)
    )
    assert winner.run.status is RunStatus.QUEUED
    # A ROLLBACK deletes the interrupted run's steps as soon as it starts, which may be
    # before the interrupted run's events are all read.
    rolled_back = policy is BusyPolicy.ROLLBACK
    interrupted = await policies.collect(busy, check_stored=not rolled_back)
    assert interrupted.run.status is RunStatus.CANCELLED
    done = await policies.collect(winner)
    assert done.run.status is RunStatus.COMPLETED
    steps = await policies.store.get_steps(session_id)
    if policy is BusyPolicy.INTERRUPT:
        result = next(step for step in steps if step.tool_call_id == "call_w")
        assert result.is_error
        assert f"superseded by run {winner.run_id}" in result.content
        assert [step.content for step in steps[-2:]] == ["instead", "new answer"]
    else:
        assert [step.content for step in steps] == ["hi", "hello", "instead", "new answer"]
    await assert_valid_log(policies, session_id)


@pytest.mark.parametrize("policy", [BusyPolicy.INTERRUPT, BusyPolicy.ROLLBACK])
async def test_interrupting_a_run_waiting_for_its_client_ends_it_with_its_calls_answered(
    policies: Harness, policy: BusyPolicy
) -> None:
    policies.model.enqueue(Turn.tool_calls([ToolCallSpec("lookup", "{}", id="call_client")]))
    waiting = await policies.run("where is my order?", client_tools=[LOOKUP])
    policies.model.enqueue(Turn.text("Let us start over."))
    winner = await policies.runtime.start_run(
        RunInput("forget it", session_id=waiting.session_id, on_busy=policy)
    )
    assert (await policies.collect(winner)).run.status is RunStatus.COMPLETED
    ended = await policies.store.get_run(waiting.run_id)
    assert ended.status is RunStatus.CANCELLED
    assert ended.stop_signal is not None
    assert ended.stop_signal.context == {"superseded_by": winner.run_id}
    steps = await policies.store.get_steps(waiting.session_id)
    if policy is BusyPolicy.ROLLBACK:
        assert [step.content for step in steps] == ["forget it", "Let us start over."]
    else:
        assert [step.role for step in steps] == [
            Role.USER,
            Role.ASSISTANT,
            Role.TOOL,  # the waiting call, answered with an error
            Role.USER,
            Role.ASSISTANT,
        ]
        assert steps[2].is_error
    await assert_valid_log(policies, waiting.session_id)


async def test_a_rollback_queued_behind_a_later_interrupt_still_starts(
    policies: Harness,
) -> None:
    # The later INTERRUPT goes first and writes after the run the ROLLBACK was to undo: the
    # ROLLBACK then deletes nothing of another run's work, and starts (the queue never jams).
    session_id = await idle_session(policies)
    policies.model.enqueue(Turn.tool_calls([ToolCallSpec("wait_for_gate", "{}", id="call_w")]))
    busy = await policies.runtime.start_run(RunInput("work", session_id=session_id))
    await policies.gate.entered.wait()
    rollback, interrupt = handles(
        await race(
            policies,
            RunInput("undo it", session_id=session_id, on_busy=BusyPolicy.ROLLBACK),
            RunInput("instead", session_id=session_id, on_busy=BusyPolicy.INTERRUPT),
        )
    )
    outcomes = await asyncio.gather(
        policies.collect(busy, check_stored=False),
        policies.collect(rollback, check_stored=False),
        policies.collect(interrupt, check_stored=False),
    )
    assert outcomes[0].run.status is RunStatus.CANCELLED
    assert [outcome.run.status for outcome in outcomes[1:]] == [RunStatus.COMPLETED] * 2
    assert await policies.store.next_queued_run(session_id) is None
    await assert_valid_log(policies, session_id)


async def test_an_interrupt_whose_run_went_to_wait_for_its_client_ends_that_run(
    policies: Harness, store: StoreRoles
) -> None:
    # The run to interrupt runs elsewhere and stops to wait for its client before it sees
    # the request (its end clears the request): the interrupting run ends it and starts.
    session = Session()
    elsewhere = Run(session_id=session.id, agent="assistant")
    call = ToolCall("call_client", "lookup", "{}")
    await store.start_run(
        elsewhere,
        [Step(session.id, elsewhere.id, Role.USER, content="where?")],
        new_session=session,
    )
    policies.model.enqueue(Turn.text("Starting over."))
    handle = await policies.runtime.start_run(
        RunInput("forget it", session_id=session.id, on_busy=BusyPolicy.INTERRUPT)
    )
    assert handle.run.status is RunStatus.QUEUED
    (asked,) = await store.append_steps(
        [Step(session.id, elsewhere.id, Role.ASSISTANT, tool_calls=[call])], held_by=elsewhere.id
    )
    waiting = replace(elsewhere, first_sequence=1, last_sequence=asked.sequence, step_count=2)
    await store.end_run(waiting.ended(StopSignal(StopReason.REQUIRES_ACTION, "tools", "loop")))
    policies.runtime._queues.start_next_soon(session.id)  # as the owner's end tells it

    assert (await policies.collect(handle)).run.status is RunStatus.COMPLETED
    ended = await store.get_run(elsewhere.id)
    assert ended.status is RunStatus.CANCELLED
    assert ended.stop_signal is not None
    assert ended.stop_signal.context == {"superseded_by": handle.run_id}
    await assert_valid_log(policies, session.id)


async def test_a_queued_run_whose_caller_s_deadline_passed_ends_timeout_instead_of_starting(
    policies: Harness,
) -> None:
    # Its caller was on another server (no timer here): only the stored deadline says so.
    session_id = await idle_session(policies)
    policies.gate.release.clear()
    policies.model.enqueue(Turn.tool_calls([ToolCallSpec("wait_for_gate", "{}")]))
    policies.model.enqueue(Turn.text("done"))
    holder = await policies.runtime.start_run(RunInput("hold it", session_id=session_id))
    late = Run(session_id=session_id, agent="assistant")
    queue = QueueRequest(2, followed=True, deadline=utc_now() - timedelta(seconds=1))
    stored = await policies.store.start_run(
        late, [Step(session_id, late.id, Role.USER, content="too late")], queue=queue
    )
    assert stored.run.status is RunStatus.QUEUED
    policies.model.enqueue(Turn.text("never asked"))
    policies.gate.release.set()
    assert (await policies.collect(holder)).run.status is RunStatus.COMPLETED

    events = [event async for event in policies.follow(late.id)]  # to its terminal event
    ended = await policies.store.get_run(late.id)
    assert events[-1].event.run.stop_signal == ended.stop_signal  # type: ignore[union-attr]
    assert ended.status.is_terminal
    assert ended.stop_signal is not None
    assert ended.stop_signal.reason is StopReason.TIMEOUT
    assert not any(step.run_id == late.id for step in await policies.store.get_steps(session_id))


async def test_a_restart_ends_the_queued_runs_whose_callers_it_held_as_their_ends_would(
    store_url: str,
) -> None:
    before = await open_roles(store_url, instance_id="host-a/0.0.0.0:50051")
    try:
        session = Session()
        busy = Run(session_id=session.id, agent="assistant")
        steps = [Step(session.id, busy.id, Role.USER, content="busy")]
        await before.start_run(busy, steps, new_session=session)
        queued: dict[str, Run] = {}
        for name, followed, deadline_s in (
            ("late", True, -1),
            ("waiting", True, 300),
            ("background", False, 300),
        ):
            run = Run(session_id=session.id, agent="assistant")
            deadline = utc_now() + timedelta(seconds=deadline_s)
            queue = QueueRequest(10, followed=followed, deadline=deadline)
            step = Step(session.id, run.id, Role.USER, content=name)
            queued[name] = (await before.start_run(run, [step], queue=queue)).run
    finally:
        await before.close()  # killed: its callers' streams are gone with it
    restarted = await open_roles(store_url, instance_id="host-a/0.0.0.0:50051")
    try:
        ended = await Lifecycle(restarted, restarted).recover_own()
        runs = {name: await restarted.get_run(run.id) for name, run in queued.items()}
        journal = await restarted.read_journal(queued["waiting"].id)
    finally:
        await restarted.close()

    assert set(ended) == {busy.id, queued["late"].id, queued["waiting"].id}
    reasons = {
        name: run.stop_signal.reason if run.stop_signal else None for name, run in runs.items()
    }
    assert reasons == {
        "late": StopReason.TIMEOUT,
        "waiting": StopReason.CANCELLED,
        "background": None,  # its caller asked it to go on: it runs when its turn comes
    }
    assert runs["background"].status is RunStatus.QUEUED
    assert journal[-1].kind == "run_completed"  # its watchers see it end
