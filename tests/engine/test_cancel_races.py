"""CancelRun races, on SQLite and PostgreSQL: two cancels of one waiting run, and a cancel
racing a SubmitToolOutputs, dispatched in the same turn of the event loop, many times. A
cancel never fails for a session that is busy with the run it cancels: it ends the run, or
the run it raced ends CANCELLED all the same."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from agio_grpc.domain import Run, RunStatus, StopReason
from agio_grpc.engine import RunHandle, RunInput, ToolOutput
from agio_grpc.engine.errors import RunStateError
from agio_grpc.testing import FakeModelServer, ToolCallSpec, Turn
from tests.engine.harness import LOOKUP, Gate, Harness, assert_valid_messages, build_runtime
from tests.roles import StoreRoles

REPETITIONS = 15


@pytest.fixture
async def harness_on(store: StoreRoles, fake_model: FakeModelServer) -> AsyncIterator[Harness]:
    built = build_runtime(store, fake_model, Gate(), leases=store, cancel_poll_s=0.05)
    try:
        yield built
    finally:
        await built.runtime.shutdown(grace_s=0)
        await built.driver.close()


async def waiting_run(harness: Harness, session_id: str = "") -> RunHandle:
    """A run that waits for the result of its `lookup` call."""
    harness.model.enqueue(Turn.tool_calls([ToolCallSpec("lookup", "{}", id="call_1")]))
    handle = await harness.runtime.start_run(
        RunInput("where?", session_id=session_id, client_tools=[LOOKUP])
    )
    outcome = await harness.collect(handle)
    assert outcome.reason is StopReason.REQUIRES_ACTION
    return handle


async def assert_valid_log(harness: Harness, session_id: str) -> None:
    steps = await harness.store.get_steps(session_id)
    assert [step.sequence for step in steps] == list(range(1, len(steps) + 1))
    assert_valid_messages([step.to_message() for step in steps])


async def test_two_cancels_of_a_waiting_run_both_return_it_cancelled(
    harness_on: Harness,
) -> None:
    session_id = ""
    for _ in range(REPETITIONS):
        waiting = await waiting_run(harness_on, session_id)
        session_id = waiting.session_id
        both = await asyncio.gather(
            harness_on.runtime.cancel(waiting.run_id, "first"),
            harness_on.runtime.cancel(waiting.run_id, "second"),
            return_exceptions=True,
        )
        assert all(isinstance(result, Run) for result in both), both
        runs = [result for result in both if isinstance(result, Run)]
        assert {run.status for run in runs} == {RunStatus.CANCELLED}
        assert runs[0].stop_signal == runs[1].stop_signal  # one cancel won; both see it
        await assert_valid_log(harness_on, session_id)


async def test_a_cancel_racing_a_submit_ends_the_run_or_its_continuation(
    harness_on: Harness,
) -> None:
    session_id = ""
    for _ in range(REPETITIONS):
        waiting = await waiting_run(harness_on, session_id)
        session_id = waiting.session_id
        # The continuation's model call gets the fake model's default reply (nothing queued).
        submit, cancel = await asyncio.gather(
            harness_on.runtime.submit_tool_outputs(waiting.run_id, [ToolOutput("call_1", "ok")]),
            harness_on.runtime.cancel(waiting.run_id, "stop"),
            return_exceptions=True,
        )
        assert isinstance(cancel, Run), cancel
        if isinstance(submit, RunHandle):  # the submit went first: cancelled, or done before
            outcome = await harness_on.collect(submit)
            assert outcome.reason in (StopReason.CANCELLED, StopReason.COMPLETED)
            assert cancel.status in (RunStatus.CANCELLED, RunStatus.COMPLETED)
        else:  # the cancel went first: the submit found the run no longer waiting
            assert isinstance(submit, RunStateError), submit
            assert cancel.status is RunStatus.CANCELLED
        stored = await harness_on.store.get_run(waiting.run_id)
        assert stored.status is cancel.status
        await assert_valid_log(harness_on, session_id)
