"""The runtime's calls beyond a plain run: client tools and SubmitToolOutputs, Retry,
CancelRun, WatchRun and shutdown — on the real store and the fake model over HTTP."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any, cast

import pytest

from agio_grpc.domain import (
    LEASE_EXPIRED_MESSAGE,
    BusyPolicy,
    Role,
    Run,
    RunStatus,
    Session,
    Step,
    StopReason,
)
from agio_grpc.engine import (
    ClientTool,
    InvalidInputError,
    RunChannel,
    RunCompleted,
    RunHandle,
    RunInput,
    RunStarted,
    RunStateError,
    RuntimeClosedError,
    SequencedEvent,
    StepCompleted,
    StepDelta,
    ToolOutput,
)
from agio_grpc.engine import lifecycle as lifecycle_module
from agio_grpc.engine.lifecycle import opened
from agio_grpc.engine.remote import FollowedEvent, RelayedEvent
from agio_grpc.engine.runtime import Runtime
from agio_grpc.store.errors import (
    NotFoundError,
    SessionBusyError,
    StoreUnavailableError,
)
from agio_grpc.testing import FakeModelServer, ToolCallSpec, Turn
from tests.engine.harness import Gate, Harness, Outcome, assert_valid_messages, build_runtime
from tests.roles import StoreRoles, open_roles
from tests.sqlite import sqlite_at
from tests.store.test_leases import wait_for_expiry

LOOKUP = ClientTool(
    name="lookup_order",
    description="Look an order up in the caller's system.",
    parameters_json='{"type": "object", "properties": {"order": {"type": "string"}}}',
)


async def start_waiting_for_client(harness: Harness) -> Outcome:
    """A run that calls a server tool and a client tool, so it waits in REQUIRES_ACTION."""
    harness.model.enqueue(
        Turn.tool_calls(
            [
                ToolCallSpec("lookup_order", '{"order": "A1"}', id="call_client"),
                ToolCallSpec("echo", '{"text": "server side"}', id="call_server"),
            ]
        )
    )
    return await harness.run("where is A1?", client_tools=[LOOKUP])


async def test_a_client_tool_call_ends_the_run_with_requires_action(harness: Harness) -> None:
    outcome = await start_waiting_for_client(harness)
    run = outcome.run
    assert run.status is RunStatus.REQUIRES_ACTION
    assert run.stop_signal is not None
    assert run.stop_signal.reason is StopReason.REQUIRES_ACTION
    assert run.stop_signal.context == {
        "tool_calls": [
            {"id": "call_client", "name": "lookup_order", "arguments": '{"order": "A1"}'}
        ]
    }
    assert run.end_time is None
    (tool,) = outcome.steps_of(Role.TOOL)  # the server call ran; the client call waits
    assert (tool.tool_call_id, tool.content) == ("call_server", "server side")
    offered = [t["function"]["name"] for t in harness.model.requests[-1]["tools"]]
    assert "lookup_order" in offered
    assert (await harness.store.get_run(run.id)).status is RunStatus.REQUIRES_ACTION


async def test_submitting_tool_outputs_continues_the_same_run(harness: Harness) -> None:
    waiting = await start_waiting_for_client(harness)
    harness.model.enqueue(Turn.text("Order A1 ships tomorrow."))
    handle = await harness.runtime.submit_tool_outputs(
        waiting.run_id, [ToolOutput("call_client", '{"status": "packed"}')]
    )
    assert handle.run_id == waiting.run_id
    outcome = await harness.collect(handle)

    assert outcome.events[0].seq == waiting.events[-1].seq + 1  # seq keeps counting
    assert isinstance(outcome.events[0].event, RunStarted)
    submitted = outcome.steps[0]
    assert (submitted.role, submitted.tool_call_id, submitted.name, submitted.content) == (
        Role.TOOL,
        "call_client",
        "lookup_order",
        '{"status": "packed"}',
    )
    run = outcome.run
    assert run.status is RunStatus.COMPLETED
    assert run.id == waiting.run_id
    assert run.step_count == 5  # user, assistant, 2 tools, assistant
    assert (run.first_sequence, run.last_sequence) == (1, 5)
    assert run.last_event_seq == outcome.events[-1].seq
    messages = harness.model.requests[-1]["messages"]
    assert_valid_messages(messages)
    assert "lookup_order" in [t["function"]["name"] for t in harness.model.requests[-1]["tools"]]

    with pytest.raises(RunStateError):
        await harness.runtime.submit_tool_outputs(waiting.run_id, [])


@pytest.mark.parametrize(
    ("outputs", "problem"),
    [
        ([], "missing output(s) for tool_call_id(s): call_client"),
        ([ToolOutput("call_other", "x")], "unknown tool_call_id(s): call_other"),
        (
            [ToolOutput("call_client", "x"), ToolOutput("call_client", "y")],
            "duplicate tool_call_id(s): call_client",
        ),
    ],
)
async def test_tool_outputs_must_answer_exactly_the_pending_calls(
    harness: Harness, outputs: list[ToolOutput], problem: str
) -> None:
    waiting = await start_waiting_for_client(harness)
    with pytest.raises(InvalidInputError) as raised:
        await harness.runtime.submit_tool_outputs(waiting.run_id, outputs)
    assert raised.value.field == "tool_outputs"
    assert problem in raised.value.message
    assert "(pending: call_client)" in raised.value.message
    assert (await harness.store.get_run(waiting.run_id)).status is RunStatus.REQUIRES_ACTION
    assert len(await harness.history(waiting.session_id)) == 3
    assert (await harness.store.get_session(waiting.session_id)).active_run_id == ""


async def test_a_submit_stores_nothing_when_the_log_changed_after_it_was_read(
    harness: Harness, sqlite_store: StoreRoles, monkeypatch: pytest.MonkeyPatch
) -> None:
    waiting = await start_waiting_for_client(harness)  # 1 user, 2 assistant, 3 tool
    write = sqlite_store.continue_run

    async def cut_first(*args: Any, **kwargs: Any) -> Any:
        # After the submit read the log, another client deletes the assistant step that
        # made the client call (DeleteSteps takes and releases the session itself).
        monkeypatch.setattr(sqlite_store, "continue_run", write)
        await sqlite_store.delete_steps_from(waiting.session_id, 2)
        return await write(*args, **kwargs)

    monkeypatch.setattr(sqlite_store, "continue_run", cut_first)
    # Refused for the log it read; checked again against the stored log, which no longer
    # has the call.
    with pytest.raises(InvalidInputError, match="no pending client tool calls"):
        await harness.runtime.submit_tool_outputs(
            waiting.run_id, [ToolOutput("call_client", "packed")]
        )
    # No orphan tool result was stored, and the session is free again.
    assert [step.role for step in await harness.history(waiting.session_id)] == [Role.USER]
    assert (await harness.store.get_session(waiting.session_id)).active_run_id == ""
    assert (await harness.store.get_run(waiting.run_id)).status is RunStatus.REQUIRES_ACTION


async def test_cancelling_a_waiting_run_answers_its_open_calls(harness: Harness) -> None:
    waiting = await start_waiting_for_client(harness)
    cancelled = await harness.runtime.cancel(waiting.run_id, "never mind")
    assert cancelled.status is RunStatus.CANCELLED
    assert cancelled.end_time is not None
    history = await harness.history(waiting.session_id)
    assert history[-1].tool_call_id == "call_client"
    assert history[-1].is_error
    assert_valid_messages([s.to_message() for s in history])
    assert (await harness.runtime.cancel(waiting.run_id, "again")).stop_signal == (
        cancelled.stop_signal
    )


async def test_cancel_is_idempotent_and_leaves_ended_runs_alone(harness: Harness) -> None:
    harness.model.enqueue(Turn.text("done"))
    outcome = await harness.run("hi")
    run = await harness.runtime.cancel(outcome.run_id, "too late")
    assert run.status is RunStatus.COMPLETED
    assert run.stop_signal is not None
    assert run.stop_signal.reason is StopReason.COMPLETED
    with pytest.raises(NotFoundError):
        await harness.runtime.cancel("run_missing", "x")


@asynccontextmanager
async def runtime_on(store: object, fake_model: FakeModelServer) -> AsyncIterator[Harness]:
    """A runtime on `store` (the real one, or a wrapper passing through to it), shut down
    after the block."""
    harness = build_runtime(cast(StoreRoles, store), fake_model, Gate())
    try:
        yield harness
    finally:
        await harness.runtime.shutdown(grace_s=0)
        await harness.driver.close()


@contextmanager
def write_lock(database: Path) -> Iterator[None]:
    """Another process's write lock on a SQLite file: write transactions wait for it."""
    blocker = sqlite3.connect(database, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")
    try:
        yield
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()


class Intercepted:
    """The real store with one method watched: `asked` is set at each call. With `gate`
    set, calls write only once it opens. For the next call only: `failure` raises instead
    of writing; `failure_after` raises after writing (a connection lost after COMMIT: the
    caller cannot know the write committed); `cancel_after` cancels that task (the call's) as
    the write returns (a client leaving just after its write committed)."""

    def __init__(self, store: StoreRoles, method: str) -> None:
        self._store = store
        self._method = method
        self.asked = asyncio.Event()
        self.gate: asyncio.Event | None = None
        self.failure: Exception | None = None
        self.failure_after: Exception | None = None
        self.cancel_after: asyncio.Task[Any] | None = None

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._store, name)
        if name != self._method:
            return attribute

        async def intercepted(*args: Any, **kwargs: Any) -> Any:
            self.asked.set()
            failure, self.failure = self.failure, None
            failure_after, self.failure_after = self.failure_after, None
            cancel_after, self.cancel_after = self.cancel_after, None
            if failure is not None:
                raise failure
            if self.gate is not None:
                await self.gate.wait()
            result = await attribute(*args, **kwargs)
            if failure_after is not None:
                raise failure_after
            if cancel_after is not None:
                cancel_after.cancel()
                await asyncio.sleep(0)
            return result

        return intercepted


async def cancel_twice(task: asyncio.Task[Any]) -> None:
    """Cancel `task`, and again once it is undoing what its call took (a server stopping
    after its client left): a few turns of the loop, with no I/O on the way."""
    task.cancel()
    for _ in range(10):
        await asyncio.sleep(0)
    task.cancel()


async def test_a_run_cancelled_during_its_start_transaction_leaves_the_session_free(
    sqlite_store: StoreRoles, fake_model: FakeModelServer, tmp_path: Path
) -> None:
    announced = Intercepted(sqlite_store, "start_run")
    # The runtime's shutdown, as the block ends, waits for what the calls left to undo.
    async with runtime_on(announced, fake_model) as harness:
        fake_model.enqueue(Turn.text("first"))
        first = await harness.run("one")  # user 1, assistant 2
        with write_lock(tmp_path / "engine.db"):
            starting = asyncio.create_task(
                harness.runtime.start_run(RunInput("two", session_id=first.session_id))
            )
            announced.asked.clear()
            await announced.asked.wait()
            await cancel_twice(starting)  # the client leaves while its run is being stored
        with pytest.raises(asyncio.CancelledError):
            await starting

    # The transaction stored the run; the cancelled call ended it and freed the session.
    (left, _) = await sqlite_store.list_runs(first.session_id, limit=10)
    assert left.status is RunStatus.INTERRUPTED
    assert left.stop_signal is not None
    assert (left.stop_signal.retryable, left.stop_signal.resume_from_sequence) == (True, 4)
    assert (await sqlite_store.get_session(first.session_id)).active_run_id == ""
    assert len(fake_model.requests) == 1  # the cancelled run never called the model


async def test_a_run_whose_start_committed_but_failed_ends_and_frees_the_session(
    sqlite_store: StoreRoles, fake_model: FakeModelServer
) -> None:
    unclear = Intercepted(sqlite_store, "start_run")
    async with runtime_on(unclear, fake_model) as harness:
        fake_model.enqueue(Turn.text("first"))
        first = await harness.run("one")  # user 1, assistant 2
        unclear.failure_after = StoreUnavailableError("connection lost")
        with pytest.raises(StoreUnavailableError):
            await harness.runtime.start_run(RunInput("two", session_id=first.session_id))

        (lost, _first) = await sqlite_store.list_runs(first.session_id, limit=10)
        assert lost.status is RunStatus.INTERRUPTED  # not RUNNING with nobody running it
        assert lost.stop_signal is not None
        assert (lost.stop_signal.retryable, lost.stop_signal.resume_from_sequence) == (True, 4)
        # The client's retry is served at once, not refused as busy until the lease ends.
        fake_model.enqueue(Turn.text("again"))
        retried = await harness.run("two", session_id=first.session_id)
    assert retried.run.status is RunStatus.COMPLETED
    assert len(fake_model.requests) == 2  # the failed start never called the model


async def test_a_start_that_failed_answers_soon_when_the_store_cannot_say_what_it_stored(
    sqlite_store: StoreRoles, fake_model: FakeModelServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(lifecycle_module, "UNCLEAR_WRITE_CHECK_S", 0.05)
    unclear = Intercepted(sqlite_store, "start_run")
    unanswered = Intercepted(cast(StoreRoles, unclear), "get_run")
    unanswered.gate = asyncio.Event()  # never opens: the store stays silent
    async with runtime_on(unanswered, fake_model) as harness:
        unclear.failure_after = StoreUnavailableError("connection lost")
        async with asyncio.timeout(5):  # not the whole connect timeout of a store that is down
            with pytest.raises(StoreUnavailableError):
                await harness.runtime.start_run(RunInput("hello"))
        assert unanswered.asked.is_set()
    # The run is left to its lease.
    (session,) = await sqlite_store.list_sessions(limit=10)
    (left,) = await sqlite_store.list_runs(session.id, limit=10)
    assert left.status is RunStatus.RUNNING


async def test_a_run_whose_start_failed_before_committing_leaves_nothing_behind(
    sqlite_store: StoreRoles, fake_model: FakeModelServer
) -> None:
    failing = Intercepted(sqlite_store, "start_run")
    async with runtime_on(failing, fake_model) as harness:
        fake_model.enqueue(Turn.text("first"))
        first = await harness.run("one")
        failing.failure = StoreUnavailableError("database is locked")
        with pytest.raises(StoreUnavailableError):
            await harness.runtime.start_run(RunInput("two", session_id=first.session_id))

    runs = await sqlite_store.list_runs(first.session_id, limit=10)
    assert [run.id for run in runs] == [first.run_id]
    assert (await sqlite_store.get_session(first.session_id)).active_run_id == ""
    assert len(await sqlite_store.get_steps(first.session_id)) == 2


async def test_a_submit_the_store_fails_leaves_the_run_waiting_for_the_same_outputs(
    sqlite_store: StoreRoles, fake_model: FakeModelServer
) -> None:
    announced = Intercepted(sqlite_store, "continue_run")
    async with runtime_on(announced, fake_model) as harness:
        waiting = await start_waiting_for_client(harness)  # user 1, assistant 2, result 3
        announced.failure = StoreUnavailableError("database is locked")
        outputs = [ToolOutput("call_client", '{"status": "packed"}')]
        with pytest.raises(StoreUnavailableError):
            await harness.runtime.submit_tool_outputs(waiting.run_id, outputs)

        # Nothing was stored: the run still waits, and sending the outputs again works.
        assert (await sqlite_store.get_run(waiting.run_id)).status is RunStatus.REQUIRES_ACTION
        assert (await sqlite_store.get_session(waiting.session_id)).active_run_id == ""
        assert len(await sqlite_store.get_steps(waiting.session_id)) == 3
        harness.model.enqueue(Turn.text("Order A1 ships tomorrow."))
        done = await harness.collect(
            await harness.runtime.submit_tool_outputs(waiting.run_id, outputs)
        )
    assert done.run.status is RunStatus.COMPLETED
    assert (done.run.step_count, done.run.last_sequence) == (5, 5)


async def test_a_submit_whose_write_committed_but_failed_ends_the_run_after_its_outputs(
    sqlite_store: StoreRoles, fake_model: FakeModelServer
) -> None:
    unclear = Intercepted(sqlite_store, "continue_run")
    async with runtime_on(unclear, fake_model) as harness:
        waiting = await start_waiting_for_client(harness)  # user 1, assistant 2, result 3
        unclear.failure_after = StoreUnavailableError("connection lost")
        with pytest.raises(StoreUnavailableError):
            await harness.runtime.submit_tool_outputs(
                waiting.run_id, [ToolOutput("call_client", '{"status": "packed"}')]
            )
    run = await sqlite_store.get_run(waiting.run_id)
    assert run.status is RunStatus.INTERRUPTED  # not RUNNING with nobody running it
    assert run.stop_signal is not None
    assert (run.stop_signal.retryable, run.stop_signal.resume_from_sequence) == (True, 5)
    assert (await sqlite_store.get_session(waiting.session_id)).active_run_id == ""


async def test_two_submits_for_the_same_run_continue_it_once(harness: Harness) -> None:
    waiting = await start_waiting_for_client(harness)
    outputs = [ToolOutput("call_client", '{"status": "packed"}')]
    harness.model.enqueue(Turn.text("Order A1 ships tomorrow."))
    both = await asyncio.gather(
        harness.runtime.submit_tool_outputs(waiting.run_id, outputs),
        harness.runtime.submit_tool_outputs(waiting.run_id, outputs),
        return_exceptions=True,
    )
    continued = [handle for handle in both if isinstance(handle, RunHandle)]
    refused = [error for error in both if not isinstance(error, RunHandle)]
    assert len(continued) == 1
    # Refused whole: by the session its twin holds, or by the run no longer waiting.
    assert len(refused) == 1
    assert isinstance(refused[0], SessionBusyError | RunStateError), refused
    done = await harness.collect(continued[0])
    assert done.run.status is RunStatus.COMPLETED
    assert (done.run.step_count, done.run.last_sequence) == (5, 5)
    assert len(await harness.history(waiting.session_id)) == 5


async def test_a_submit_whose_client_left_as_its_outputs_were_stored_keeps_them(
    sqlite_store: StoreRoles, fake_model: FakeModelServer
) -> None:
    announced = Intercepted(sqlite_store, "continue_run")
    # The runtime's shutdown, as the block ends, waits for what the calls left to undo.
    async with runtime_on(announced, fake_model) as harness:
        waiting = await start_waiting_for_client(harness)  # user 1, assistant 2, result 3
        announced.gate = asyncio.Event()
        submit = asyncio.create_task(
            harness.runtime.submit_tool_outputs(
                waiting.run_id, [ToolOutput("call_client", '{"status": "packed"}')]
            )
        )
        await announced.asked.wait()
        await cancel_twice(submit)  # the client leaves as the outputs are being stored
        announced.gate.set()
        with pytest.raises(asyncio.CancelledError):
            await submit

    # The outputs were stored with the run going on; the call's end ended it, retryable
    # after them, and freed the session.
    run = await sqlite_store.get_run(waiting.run_id)
    assert run.status is RunStatus.INTERRUPTED
    assert run.stop_signal is not None
    assert (run.stop_signal.retryable, run.stop_signal.resume_from_sequence) == (True, 5)
    assert (run.step_count, run.last_sequence) == (4, 4)
    (*_, output) = await sqlite_store.get_steps(waiting.session_id)
    assert (output.sequence, output.tool_call_id) == (4, "call_client")
    assert (await sqlite_store.get_session(waiting.session_id)).active_run_id == ""

    again = build_runtime(sqlite_store, fake_model, Gate())
    try:
        fake_model.enqueue(Turn.text("Order A1 ships tomorrow."))
        resumed = await again.collect(await again.runtime.retry(waiting.session_id, 5))
    finally:
        await again.runtime.shutdown(grace_s=0)
        await again.driver.close()
    assert resumed.run.status is RunStatus.COMPLETED
    sent = fake_model.requests[-1]["messages"]
    assert [message.get("tool_call_id") for message in sent[-2:]] == ["call_client", "call_server"]
    assert sent[-2]["content"] == '{"status": "packed"}'  # the output the call stored


async def test_a_call_cancelled_while_it_undoes_a_failure_is_cancelled_not_failed(
    sqlite_store: StoreRoles, fake_model: FakeModelServer
) -> None:
    # A Retry's write commits but its call sees the connection lost; while the call ends
    # the run it stored, its client leaves.
    creating = Intercepted(sqlite_store, "restart_run")
    ending = Intercepted(cast(StoreRoles, creating), "end_run")
    # The runtime's shutdown, as the block ends, waits for what the calls left to undo.
    async with runtime_on(ending, fake_model) as harness:
        fake_model.enqueue(Turn.text("first try"))
        first = await harness.run("hello")
        creating.failure_after = StoreUnavailableError("connection lost")
        ending.gate = asyncio.Event()
        ending.asked.clear()  # the first run's end asked too
        retrying = asyncio.create_task(harness.runtime.retry(first.session_id, 2))
        await ending.asked.wait()
        retrying.cancel()
        with pytest.raises(asyncio.CancelledError):  # the cancel is not lost
            await retrying
        ending.gate.set()
    # The undo ran to its end all the same: the run it stored is ended, the session free.
    assert (await sqlite_store.get_session(first.session_id)).active_run_id == ""
    (retried, _) = await sqlite_store.list_runs(first.session_id, limit=10)
    assert retried.status is RunStatus.INTERRUPTED


@pytest.mark.parametrize("request_id", ["", "req-1"])
async def test_a_run_whose_client_left_as_its_run_was_stored_leaves_no_run_running(
    sqlite_store: StoreRoles, fake_model: FakeModelServer, request_id: str
) -> None:
    # In every form (a request_id on an existing session too) the run is stored by one
    # transaction: the client leaving as it returns ends the run it stored.
    wrapped = Intercepted(sqlite_store, "start_run")
    async with runtime_on(wrapped, fake_model) as harness:
        harness.model.enqueue(Turn.text("first"))
        first = await harness.run("one")
        second = RunInput("two", session_id=first.session_id, request_id=request_id)
        starting = asyncio.create_task(harness.runtime.start_run(second))
        wrapped.cancel_after = starting
        with pytest.raises(asyncio.CancelledError):
            await starting
        (left, _) = await sqlite_store.list_runs(first.session_id, limit=10)
        assert left.status is RunStatus.INTERRUPTED
        assert left.stop_signal is not None
        assert left.stop_signal.resume_from_sequence == 4
        assert (await sqlite_store.get_session(first.session_id)).active_run_id == ""
        # Its journal ends with its terminal event, right after what the start stored.
        kinds = [record.kind for record in await sqlite_store.read_journal(left.id)]
        assert kinds == ["run_started", "step_completed", "run_completed"]


async def test_a_retry_whose_client_left_as_its_run_was_stored_leaves_no_run_running(
    sqlite_store: StoreRoles, fake_model: FakeModelServer
) -> None:
    wrapped = Intercepted(sqlite_store, "restart_run")
    async with runtime_on(wrapped, fake_model) as harness:
        harness.model.enqueue(Turn.text("first try"))
        first = await harness.run("hello")
        retrying = asyncio.create_task(harness.runtime.retry(first.session_id, 2))
        wrapped.cancel_after = retrying
        with pytest.raises(asyncio.CancelledError):
            await retrying

        (retried, _) = await sqlite_store.list_runs(first.session_id, limit=10)
        assert retried.id != first.run_id
        assert retried.status is RunStatus.INTERRUPTED
        assert retried.stop_signal is not None
        assert retried.stop_signal.resume_from_sequence == 2
        assert (await sqlite_store.get_session(first.session_id)).active_run_id == ""
        harness.model.enqueue(Turn.text("second try"))
        again = await harness.collect(await harness.runtime.retry(first.session_id, 2))
        assert again.run.status is RunStatus.COMPLETED


async def two_turn_session(harness: Harness) -> Outcome:
    """user(1) -> assistant calls calculate(2) -> tool "84"(3) -> "The result is 84."(4)"""
    return await harness.run("What is 12 * 7?")


async def test_retry_from_the_user_step_regenerates_the_reply(harness: Harness) -> None:
    harness.model.enqueue(Turn.text("first try"))
    first = await harness.run("hello")
    harness.model.enqueue(Turn.text("second try"))
    retried = await harness.collect(await harness.runtime.retry(first.session_id, 2))
    assert retried.run_id != first.run_id
    assert retried.reason is StopReason.COMPLETED
    history = await harness.history(first.session_id)
    assert [(s.sequence, s.content) for s in history] == [(1, "hello"), (2, "second try")]
    assert history[1].run_id == retried.run_id
    assert harness.model.requests[-1]["messages"][-1] == {"role": "user", "content": "hello"}
    assert (retried.run.first_sequence, retried.run.last_sequence) == (2, 2)


async def test_retry_from_a_tool_step_continues_after_the_results(harness: Harness) -> None:
    first = await two_turn_session(harness)
    harness.model.enqueue(Turn.text("It is 84, again."))
    retried = await harness.collect(await harness.runtime.retry(first.session_id, 4))
    assert [s.role for s in retried.steps] == [Role.ASSISTANT]
    history = await harness.history(first.session_id)
    assert [s.content for s in history][-2:] == ["84", "It is 84, again."]
    assert harness.model.requests[-1]["messages"][-1]["role"] == "tool"


async def test_retry_from_an_assistant_step_reruns_its_tool_calls(harness: Harness) -> None:
    first = await two_turn_session(harness)
    retried = await harness.collect(await harness.runtime.retry(first.session_id, 3))
    assert [s.role for s in retried.steps] == [Role.TOOL, Role.ASSISTANT]
    history = await harness.history(first.session_id)
    assert [(s.sequence, s.role) for s in history] == [
        (1, Role.USER),
        (2, Role.ASSISTANT),
        (3, Role.TOOL),
        (4, Role.ASSISTANT),
    ]
    assert history[2].run_id == retried.run_id
    assert history[2].content == "84"


async def test_a_retry_after_a_cancelled_wait_takes_its_client_calls_over(
    harness: Harness,
) -> None:
    waiting = await start_waiting_for_client(harness)  # user, calls, server result
    await harness.runtime.cancel(waiting.run_id, "changed my mind")
    history = await harness.history(waiting.session_id)
    assert (history[-1].tool_call_id, history[-1].is_error) == ("call_client", True)

    retried = await harness.collect(await harness.runtime.retry(waiting.session_id, 4))
    assert retried.reason is StopReason.REQUIRES_ACTION  # the error result is gone; it waits
    assert len(await harness.history(waiting.session_id)) == 3
    assert (retried.run.first_sequence, retried.run.step_count) == (0, 0)

    harness.model.enqueue(Turn.text("Order A1 ships tomorrow."))
    outputs = [ToolOutput("call_client", '{"status": "packed"}')]
    answered = await harness.collect(
        await harness.runtime.submit_tool_outputs(retried.run_id, outputs)
    )
    assert answered.reason is StopReason.COMPLETED
    history = await harness.history(waiting.session_id)
    assert [(s.role, s.run_id) for s in history[3:]] == [
        (Role.TOOL, retried.run_id),
        (Role.ASSISTANT, retried.run_id),
    ]
    assert history[3].content == '{"status": "packed"}'


async def test_retry_refuses_what_cannot_be_regenerated_and_deletes_nothing(
    harness: Harness,
) -> None:
    first = await two_turn_session(harness)
    for sequence, field in [(5, "sequence"), (1, "sequence"), (6, "sequence")]:
        if sequence == 5:  # the step before 5 is the final reply: nothing to regenerate
            with pytest.raises(InvalidInputError, match="final assistant reply"):
                await harness.runtime.retry(first.session_id, sequence)
        else:
            with pytest.raises(InvalidInputError) as raised:
                await harness.runtime.retry(first.session_id, sequence)
            assert raised.value.field == field
    assert len(await harness.history(first.session_id)) == 4
    empty = await harness.store.new_session()
    with pytest.raises(InvalidInputError, match="no steps"):
        await harness.runtime.retry(empty.id, 1)
    with pytest.raises(NotFoundError):
        await harness.runtime.retry("sess_missing", 2)


def without_deltas(events: list[SequencedEvent]) -> list[SequencedEvent]:
    """A live stream as the journal replays it: the deltas of finished steps left out."""
    return [event for event in events if not isinstance(event.event, StepDelta)]


async def test_watch_replays_a_finished_run_from_the_journal_as_it_was_streamed(
    harness: Harness,
) -> None:
    harness.model.enqueue(Turn.text("hello there", chunks=2))
    outcome = await harness.run("hi")
    await segment_task_done(harness, outcome.run_id)
    replay = [e async for e in harness.follow(outcome.run_id)]
    # The same events, seqs, times and contents, less the finished step's deltas.
    assert replay == without_deltas(outcome.events)
    assert len(replay) < len(outcome.events)
    tail = [e async for e in harness.follow(outcome.run_id, after_seq=3)]
    assert tail == [e for e in without_deltas(outcome.events) if e.seq > 3]
    assert [e async for e in harness.follow(outcome.run_id, outcome.events[-1].seq)] == []


async def test_watch_of_a_live_run_replays_its_deltas_then_follows_it(harness: Harness) -> None:
    harness.model.enqueue(
        Turn.tool_calls([ToolCallSpec("wait_for_gate", "{}")]), Turn.text("done", chunks=2)
    )
    handle = await harness.runtime.start_run(RunInput("work"))
    await harness.gate.entered.wait()
    watching = asyncio.create_task(drain_events(harness.follow(handle.run_id)))
    harness.gate.release.set()
    outcome = await harness.collect(handle)
    assert await watching == outcome.events  # live: every delta too


async def drain_events(events: AsyncIterator[SequencedEvent]) -> list[SequencedEvent]:
    return [event async for event in events]


async def segment_task_done(harness: Harness, run_id: str) -> None:
    """Wait for the run's loop task itself to end (its stream ends a little before)."""
    running = harness.runtime._live.running()
    if running:
        await asyncio.wait(running)
    # An ended task's done callbacks (the runtime's bookkeeping among them) were scheduled
    # when it ended: one turn of the event loop runs them.
    await asyncio.sleep(0)


@asynccontextmanager
async def two_replicas(
    store: StoreRoles, fake_model: FakeModelServer, gate: Gate, *, cancel_poll_s: float = 0.5
) -> AsyncIterator[tuple[Harness, Harness]]:
    """Two runtimes on one store, as two replicas sharing a database: the first's tools wait
    on `gate`; the second follows runs elsewhere through the store every 0.02 s."""
    owner = build_runtime(store, fake_model, gate, leases=store, cancel_poll_s=cancel_poll_s)
    other = build_runtime(store, fake_model, Gate(), leases=store, watch_poll_s=0.02)
    try:
        yield owner, other
    finally:
        for harness in (owner, other):
            await harness.runtime.shutdown(grace_s=0)
            await harness.driver.close()


async def test_a_run_is_cancelled_through_another_runtime_on_the_same_store(
    sqlite_store: StoreRoles, fake_model: FakeModelServer
) -> None:
    # Two replicas sharing a database: the CancelRun reaches the one not running the run.
    gate = Gate()
    async with two_replicas(sqlite_store, fake_model, gate, cancel_poll_s=0.05) as (owner, other):
        fake_model.enqueue(Turn.tool_calls([ToolCallSpec("wait_for_gate", "{}", id="call_stuck")]))
        handle = await owner.runtime.start_run(RunInput("work"))
        await gate.entered.wait()

        cancelled = await other.runtime.cancel(handle.run_id, "stop it")

        assert cancelled.status is RunStatus.CANCELLED
        assert cancelled.stop_signal is not None
        assert (cancelled.stop_signal.message, cancelled.stop_signal.source) == (
            "stop it",
            "client",
        )
        outcome = await owner.collect(handle)
        assert outcome.run.stop_signal == cancelled.stop_signal
        (result,) = outcome.steps_of(Role.TOOL)  # the stuck call got an error result
        assert (result.tool_call_id, result.is_error) == ("call_stuck", True)
        assert (await other.runtime.cancel(handle.run_id, "again")).stop_signal == (
            cancelled.stop_signal
        )
        # The cancel returned once the run had let go of its session, as a local one does.
        fake_model.enqueue(Turn.text("next answer"))
        assert (await other.run("next", session_id=handle.session_id)).run.status is (
            RunStatus.COMPLETED
        )


async def test_a_run_queued_on_one_replica_and_started_on_another_times_out_at_its_deadline(
    sqlite_store: StoreRoles, fake_model: FakeModelServer
) -> None:
    # The caller follows the queued run on `other`; `owner` starts it once its own run ends,
    # not knowing the caller's deadline: `other` stops it there when the deadline comes.
    gate = Gate()
    async with two_replicas(sqlite_store, fake_model, gate, cancel_poll_s=0.05) as (owner, other):
        fake_model.enqueue(
            Turn.tool_calls([ToolCallSpec("wait_for_gate", "{}", id="call_busy")]),
            Turn.text("first done"),
            Turn.hanging(),
        )
        first = await owner.runtime.start_run(RunInput("work"))
        await gate.entered.wait()
        deadline_at = asyncio.get_running_loop().time() + 1.0
        queued = await other.runtime.start_run(
            RunInput(
                "then this",
                session_id=first.session_id,
                on_busy=BusyPolicy.ENQUEUE,
                deadline_at=deadline_at,
            )
        )
        assert queued.run.status is RunStatus.QUEUED
        gate.release.set()
        assert (await owner.collect(first)).run.status is RunStatus.COMPLETED

        outcome = await other.collect(queued)

        assert outcome.run.stop_signal is not None
        assert outcome.run.stop_signal.reason is StopReason.TIMEOUT
        assert outcome.run.stop_signal.message == "the run reached its caller's deadline"
        assert (await sqlite_store.get_run(queued.run_id)).stop_signal == outcome.run.stop_signal


class OwnerInProcess:
    """The `RemoteRuns` of a replica whose runs elsewhere are `owner`'s: each event relayed
    as the owner serves a member (`Runtime.follow_here`), as service/members.py does it over
    gRPC."""

    def __init__(self, owner: Runtime) -> None:
        self.owner = owner

    async def follow(self, run_id: str, after_seq: int) -> AsyncIterator[RelayedEvent]:
        async for event in self.owner.follow_here(run_id, after_seq):
            yield RelayedEvent(event.seq, event.is_terminal, event)

    async def tell_owner(self, run_id: str, timeout_s: float) -> None:
        """Unreachable: the owner finds the cancel request at its next poll."""


async def test_a_queued_run_another_replica_starts_is_followed_live_from_it(
    sqlite_store: StoreRoles, fake_model: FakeModelServer
) -> None:
    # The caller follows the queued run on `other`; `owner` starts it once its own run ends.
    # The caller gets the step in progress live from `owner`, its deltas included (the
    # journal has none), under the seqs it would have had here. (`other` has no lease
    # keeper: its sweep of free queues cannot start the run first.)
    gate = Gate()
    owner = build_runtime(sqlite_store, fake_model, gate, leases=sqlite_store)
    other = build_runtime(sqlite_store, fake_model, Gate(), remote=OwnerInProcess(owner.runtime))
    events: list[FollowedEvent] = []
    mid_step = asyncio.Event()

    async def follow(queued: RunHandle) -> None:
        async for event in queued.events():
            events.append(event)
            relayed = event.message if isinstance(event, RelayedEvent) else None
            if isinstance(relayed, SequencedEvent) and isinstance(relayed.event, StepDelta):
                mid_step.set()

    try:
        fake_model.enqueue(
            Turn.tool_calls([ToolCallSpec("wait_for_gate", "{}")]),
            Turn.text("first done"),
            Turn.text("Hello world", chunks=2, chunk_delay=3600),  # "Hello ", then waits
        )
        first = await owner.runtime.start_run(RunInput("work"))
        await gate.entered.wait()
        queued = await other.runtime.start_run(
            RunInput("then this", session_id=first.session_id, on_busy=BusyPolicy.ENQUEUE)
        )
        assert queued.run.status is RunStatus.QUEUED
        following = asyncio.create_task(follow(queued))
        gate.release.set()
        async with asyncio.timeout(10):  # a follow that never relays fails here
            await mid_step.wait()
            await owner.runtime.cancel(queued.run_id, "enough")
            await following
    finally:
        for harness in (owner, other):
            await harness.runtime.shutdown(grace_s=0)
            await harness.driver.close()

    assert [event.seq for event in events] == list(range(1, len(events) + 1))
    assert events[-1].is_terminal
    assert isinstance(events[-1], RelayedEvent)  # to its end, from the owner
    assert (await sqlite_store.get_run(queued.run_id)).status is RunStatus.CANCELLED


async def start_run_then_die(url: str, *, lease_s: float) -> Run:
    """A run started by a process that died right after: nobody renews its short lease."""
    crashed = await open_roles(url, session_lease_s=lease_s)
    try:
        session = Session()
        run = Run(session_id=session.id, agent="assistant")
        user = Step(session.id, run.id, Role.USER, content="hi")
        journal = RunChannel(run.id, session.id).journal_for(opened)
        await crashed.start_run(run, [user], new_session=session, journal=journal)
    finally:
        await crashed.close()
    return run


async def test_a_cancel_takes_over_a_run_whose_process_died(
    sqlite_store: StoreRoles, fake_model: FakeModelServer, tmp_path: Path
) -> None:
    url = sqlite_at(tmp_path / "engine.db")
    run = await start_run_then_die(url, lease_s=0.2)
    await wait_for_expiry(url, run.session_id)
    other = build_runtime(sqlite_store, fake_model, Gate(), leases=sqlite_store)
    try:
        ended = await other.runtime.cancel(run.id, "stop it")
    finally:
        await other.runtime.shutdown(grace_s=0)
        await other.driver.close()

    assert ended.status is RunStatus.INTERRUPTED  # taken over, as any take over would
    assert (await sqlite_store.get_session(run.session_id)).active_run_id == ""


async def test_a_run_that_stalled_past_its_lease_writes_nothing_after_the_take_over(
    sqlite_store: StoreRoles,
    fake_model: FakeModelServer,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A replica whose lease runs out while its tool runs (nothing renews it: a stalled
    # server); another replica takes the session over; then the tool returns.
    url = sqlite_at(tmp_path / "engine.db")
    stalled_store = await open_roles(url, session_lease_s=0.2)
    gate = Gate()
    stalled = build_runtime(stalled_store, fake_model, gate)
    taker = build_runtime(sqlite_store, fake_model, Gate(), leases=sqlite_store)
    try:
        fake_model.enqueue(Turn.tool_calls([ToolCallSpec("wait_for_gate", "{}", id="call_slow")]))
        handle = await stalled.runtime.start_run(RunInput("work"))
        await gate.entered.wait()
        await wait_for_expiry(url, handle.session_id)
        fake_model.enqueue(Turn.text("taken over"))
        took = await taker.run("mine now", session_id=handle.session_id)
        gate.release.set()
        late = await stalled.collect(handle)
    finally:
        for harness in (stalled, taker):
            await harness.runtime.shutdown(grace_s=0)
            await harness.driver.close()
        await stalled_store.close()

    assert took.run.status is RunStatus.COMPLETED
    # The stalled run's stream ends as the store has it: interrupted by the take-over.
    assert late.run == await sqlite_store.get_run(handle.run_id)
    assert late.run.status is RunStatus.INTERRUPTED
    assert late.run.stop_signal is not None
    assert late.run.stop_signal.message == LEASE_EXPIRED_MESSAGE
    assert not late.steps_of(Role.TOOL)
    stored = await sqlite_store.get_steps(handle.session_id)
    assert [(step.run_id, step.role) for step in stored] == [
        (handle.run_id, Role.USER),
        (handle.run_id, Role.ASSISTANT),
        (handle.run_id, Role.TOOL),  # the take-over's error result for the open call
        (took.run.id, Role.USER),
        (took.run.id, Role.ASSISTANT),
    ]
    assert stored[2].is_error
    assert stored[2].tool_call_id == "call_slow"
    assert (await sqlite_store.get_session(handle.session_id)).active_run_id == ""
    # A lost lease is an outcome the loop expects, not an error with a traceback.
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


async def test_watch_of_a_run_from_another_process_is_rebuilt_from_the_store(
    harness: Harness, sqlite_store: StoreRoles, fake_model: FakeModelServer
) -> None:
    outcome = await two_turn_session(harness)
    other = build_runtime(sqlite_store, fake_model, Gate())
    try:
        events = [e async for e in other.follow(outcome.run_id)]
    finally:
        await other.driver.close()
    assert events == without_deltas(outcome.events)
    assert [e.event.step.sequence for e in events if isinstance(e.event, StepCompleted)] == [
        1,
        2,
        3,
        4,
    ]
    assert events[-1].is_terminal
    with pytest.raises(NotFoundError):
        [e async for e in other.follow("run_missing")]


async def test_a_watch_through_another_runtime_follows_the_run_to_its_end(
    sqlite_store: StoreRoles, fake_model: FakeModelServer
) -> None:
    # Two replicas sharing a database: the WatchRun reaches the one not running the run.
    gate = Gate()
    async with two_replicas(sqlite_store, fake_model, gate) as (owner, other):
        fake_model.enqueue(
            Turn.tool_calls([ToolCallSpec("wait_for_gate", "{}", id="call_w")]),
            Turn.text("all done"),
        )
        handle = await owner.runtime.start_run(RunInput("work"))
        await gate.entered.wait()
        watched: list[SequencedEvent] = []
        # run_started, the input, the model step's start and the call: all that is stored.
        caught_up = asyncio.Event()

        async def watch() -> None:
            async for event in other.follow(handle.run_id):
                watched.append(event)
                if len(watched) == 4:
                    caught_up.set()

        watching = asyncio.create_task(watch())
        await asyncio.wait_for(caught_up.wait(), 5)
        await asyncio.sleep(0.1)  # several polls of the store
        assert len(watched) == 4
        assert not watching.done()  # still following: the run has not ended
        gate.release.set()
        outcome = await owner.collect(handle)
        await asyncio.wait_for(watching, 5)

    assert watched == without_deltas(outcome.events)
    completed = [e.event.step for e in watched if isinstance(e.event, StepCompleted)]
    assert completed == [step for step in outcome.steps if step.run_id == handle.run_id]
    assert [step.role for step in completed] == [
        Role.USER,
        Role.ASSISTANT,
        Role.TOOL,
        Role.ASSISTANT,
    ]
    final = watched[-1].event
    assert isinstance(final, RunCompleted)
    assert final.run.status is RunStatus.COMPLETED
    assert final.run.stop_signal == outcome.run.stop_signal


async def test_a_watch_of_a_run_whose_process_died_ends_once_its_lease_runs_out(
    sqlite_store: StoreRoles, fake_model: FakeModelServer, tmp_path: Path
) -> None:
    url = sqlite_at(tmp_path / "engine.db")
    run = await start_run_then_die(url, lease_s=0.3)
    watcher_store = await open_roles(url, session_lease_s=0.3)
    other = build_runtime(
        watcher_store, fake_model, Gate(), leases=watcher_store, watch_poll_s=0.02
    )
    try:
        async with asyncio.timeout(10):  # a watch that never ends fails here
            watched = [e async for e in other.follow(run.id)]
    finally:
        await other.runtime.shutdown(grace_s=0)
        await other.driver.close()
        await watcher_store.close()

    assert [type(e.event) for e in watched] == [RunStarted, StepCompleted, RunCompleted]
    final = watched[-1].event
    assert isinstance(final, RunCompleted)
    assert final.run.status is RunStatus.INTERRUPTED


async def test_a_watch_of_a_run_left_running_without_its_session_ends_it_interrupted(
    fake_model: FakeModelServer, tmp_path: Path
) -> None:
    # Its server released the session but failed to store the run's end, then went away.
    url = sqlite_at(tmp_path / "engine.db")
    store = await open_roles(url, session_lease_s=0.3)
    other = build_runtime(store, fake_model, Gate(), leases=store, watch_poll_s=0.02)
    try:
        session = Session()
        run = Run(session_id=session.id, agent="assistant")
        user = Step(session.id, run.id, Role.USER, content="hi")
        await store.start_run(run, [user], new_session=session)
        assert await store.release_session(session.id, run.id)

        async with asyncio.timeout(10):  # a watch that never ends fails here
            watched = [e async for e in other.follow(run.id)]
        assert not (await store.get_session(session.id)).active_run_id  # released again
    finally:
        await other.runtime.shutdown(grace_s=0)
        await other.driver.close()
        await store.close()

    final = watched[-1].event
    assert isinstance(final, RunCompleted)
    assert final.run.status is RunStatus.INTERRUPTED
    assert final.run.stop_signal is not None
    assert final.run.stop_signal.resume_from_sequence == 2  # after the stored input


async def test_a_watch_served_from_the_store_ends_unavailable_when_the_server_stops(
    sqlite_store: StoreRoles, fake_model: FakeModelServer
) -> None:
    gate = Gate()
    async with two_replicas(sqlite_store, fake_model, gate) as (owner, other):
        fake_model.enqueue(Turn.tool_calls([ToolCallSpec("wait_for_gate", "{}")]))
        handle = await owner.runtime.start_run(RunInput("work"))
        await gate.entered.wait()
        watch = other.follow(handle.run_id)
        for _ in range(4):  # run_started, the input, the step's start, the call: all stored
            await anext(watch)

        await other.runtime.shutdown(grace_s=0)

        with pytest.raises(RuntimeClosedError):
            await asyncio.wait_for(anext(watch), 5)
        gate.release.set()


async def test_shutdown_interrupts_runs_and_a_retry_resumes_them(
    harness: Harness, sqlite_store: StoreRoles, fake_model: FakeModelServer
) -> None:
    fake_model.enqueue(
        Turn.tool_calls([ToolCallSpec("wait_for_gate", '{"label": "x"}', id="call_w")]),
    )
    handle = await harness.runtime.start_run(RunInput("long job"))
    await harness.gate.entered.wait()
    await harness.runtime.shutdown(grace_s=0)
    outcome = await harness.collect(handle)
    signal = outcome.run.stop_signal
    assert signal is not None
    assert (signal.reason, signal.retryable, signal.source) == (
        StopReason.INTERRUPTED,
        True,
        "server",
    )
    assert outcome.run.status is RunStatus.INTERRUPTED
    stored = await sqlite_store.get_run(outcome.run_id)
    assert stored.status is RunStatus.INTERRUPTED
    interrupted = await sqlite_store.get_step(handle.session_id, signal.resume_from_sequence)
    assert (interrupted.tool_call_id, interrupted.is_error) == ("call_w", True)
    with pytest.raises(RuntimeClosedError):
        await harness.runtime.start_run(RunInput("more"))

    restarted = build_runtime(sqlite_store, fake_model, Gate())
    restarted.gate.release.set()
    try:
        fake_model.enqueue(Turn.text("job done"))
        resumed = await restarted.collect(
            await restarted.runtime.retry(handle.session_id, signal.resume_from_sequence)
        )
    finally:
        await restarted.driver.close()
    assert [(s.role, s.content) for s in resumed.steps] == [
        (Role.TOOL, "released x"),
        (Role.ASSISTANT, "job done"),
    ]
    assert resumed.reason is StopReason.COMPLETED


async def test_shutdown_lets_runs_finish_within_the_grace_period(harness: Harness) -> None:
    harness.model.enqueue(Turn.tool_calls([ToolCallSpec("wait_for_gate", "{}")]), Turn.text("ok"))
    handle = await harness.runtime.start_run(RunInput("job"))
    await harness.gate.entered.wait()
    harness.gate.release.set()
    await harness.runtime.shutdown(grace_s=30)
    outcome = await harness.collect(handle)
    assert outcome.reason is StopReason.COMPLETED
