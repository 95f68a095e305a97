"""SessionService over the real server, on SQLite and PostgreSQL: reads, edits, paging,
and every kind of bad input answered with a clear status and nothing written."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path

import grpc
import pytest

from agio_grpc.client import AgioClient, AgioError, decode_error
from agio_grpc.domain import Role, Session, Step, StepMetrics, ToolCall
from agio_grpc.service.app import AgioApp
from agio_grpc.testing import FakeModelServer, Turn
from agio_grpc.v1 import resources_pb2, session_service_pb2
from tests.roles import StoreRoles, open_roles
from tests.service.conftest import make_settings


@pytest.fixture
async def served(
    store_url: str, fake_model: FakeModelServer, tmp_path: Path
) -> AsyncIterator[tuple[AgioClient, StoreRoles]]:
    """The server on the backend under test, with a client and direct store access."""
    app = await AgioApp.start(make_settings(store_url, fake_model.base_url))
    roles = await open_roles(store_url)
    try:
        async with AgioClient(app.address) as client:
            yield client, roles
    finally:
        await roles.close()
        await app.stop(grace=0)


async def seed_session(store: StoreRoles, turns: int = 3) -> Session:
    """A session of `turns` x (user, assistant with a tool call, tool, assistant)."""
    session = await store.new_session()
    for turn in range(turns):
        call = ToolCall(id=f"call_{turn}", name="calculate", arguments='{"expression": "1+1"}')
        await store.append_steps(
            [
                Step(session.id, "run_seed", Role.USER, content=f"question {turn}"),
                Step(
                    session.id,
                    "run_seed",
                    Role.ASSISTANT,
                    tool_calls=[call],
                    metrics=StepMetrics(input_tokens=10, output_tokens=5, total_tokens=15),
                ),
                Step(
                    session.id,
                    "run_seed",
                    Role.TOOL,
                    content="2",
                    tool_call_id=call.id,
                    name="calculate",
                ),
                Step(
                    session.id,
                    "run_seed",
                    Role.ASSISTANT,
                    content=f"answer {turn}",
                    metrics=StepMetrics(input_tokens=20, output_tokens=3, total_tokens=23),
                ),
            ]
        )
    return await store.get_session(session.id)


async def expect_error(call: Awaitable[object], code: grpc.StatusCode, reason: str) -> AgioError:
    """Await a client call (or a raw stub call) that must fail with `code` and `reason`."""
    try:
        await call
    except AgioError as error:
        failure = error
    except grpc.aio.AioRpcError as error:
        failure = decode_error(error)
    else:
        raise AssertionError(f"expected {code.name} {reason}, the call succeeded")
    assert failure.code == code, failure
    assert failure.reason == reason, failure
    return failure


async def test_steps_are_listed_in_pages_to_the_end(
    served: tuple[AgioClient, StoreRoles],
) -> None:
    client, store = served
    session = await seed_session(store, turns=3)
    first = await client.sessions.ListSteps(
        session_service_pb2.ListStepsRequest(session_id=session.id, page_size=5)
    )
    assert [s.sequence for s in first.steps] == [1, 2, 3, 4, 5]
    assert first.next_page_token
    every = await client.list_steps(session.id, page_size=5)
    assert [s.sequence for s in every] == list(range(1, 13))
    ranged = await client.list_steps(session.id, start_sequence=4, end_sequence=9, page_size=2)
    assert [s.sequence for s in ranged] == [4, 5, 6, 7, 8, 9]
    assert every[1].tool_calls[0].name == "calculate"
    assert every[2].role == resources_pb2.ROLE_TOOL


async def test_get_session_step_and_context(served: tuple[AgioClient, StoreRoles]) -> None:
    client, store = served
    session = await seed_session(store, turns=2)
    got = await client.get_session(session.id)
    assert got.step_count == 8
    step = await client.get_step(session.id, 4)
    assert step.content == "answer 0"
    context = await client.get_context(session.id)
    assert context.messages[0].role == resources_pb2.ROLE_SYSTEM
    assert context.messages[0].sequence == 0
    assert context.messages[0].content == "You are a test assistant."
    assert [m.sequence for m in context.messages[1:]] == list(range(1, 9))
    summary = context.summary
    assert (summary.total_steps, summary.user_steps, summary.assistant_steps) == (8, 2, 4)
    assert (summary.tool_steps, summary.tool_calls) == (2, 2)
    assert (summary.min_sequence, summary.max_sequence) == (1, 8)
    assert summary.total_tokens == 2 * (15 + 23)


async def test_delete_steps_then_fork_keep_sequences_gapless(
    served: tuple[AgioClient, StoreRoles],
) -> None:
    client, store = served
    session = await seed_session(store, turns=2)
    assert await client.delete_steps(session.id, 6) == 3
    assert [s.sequence for s in await client.list_steps(session.id)] == [1, 2, 3, 4, 5]
    fork = await client.fork_session(session.id, 4)
    assert fork.parent_session_id == session.id
    assert fork.fork_sequence == 4
    assert fork.step_count == 4
    forked = await client.list_steps(fork.id)
    original = await client.list_steps(session.id)
    assert [s.sequence for s in forked] == [1, 2, 3, 4]
    assert {s.id for s in forked}.isdisjoint({s.id for s in original})
    whole = await client.fork_session(session.id)  # sequence 0: everything
    assert whole.fork_sequence == 5


async def test_edits_cancelled_at_any_moment_never_leave_the_session_held(
    served: tuple[AgioClient, StoreRoles], fake_model: FakeModelServer
) -> None:
    client, store = served
    session = await seed_session(store, turns=3)
    for attempt in range(40):  # cancelled before, during and after the store's transaction
        request = session_service_pb2.DeleteStepsRequest(
            session_id=session.id, start_sequence=12 - attempt % 10
        )
        call = client.sessions.DeleteSteps(request)
        for _ in range(attempt % 8):
            await asyncio.sleep(0)
        call.cancel()
        with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
            await call
    # Nothing holds the session: a run starts on it at once (SESSION_BUSY otherwise).
    assert (await store.get_session(session.id)).active_run_id in ("", None)
    fake_model.enqueue(Turn.text("still usable"))
    result = await client.run_to_end("next", session_id=session.id)
    assert result.text == "still usable"
    sequences = [step.sequence for step in await client.list_steps(session.id)]
    assert sequences == list(range(1, len(sequences) + 1))


async def test_sessions_are_listed_newest_first_across_pages(
    served: tuple[AgioClient, StoreRoles],
) -> None:
    client, store = served
    created = [await store.new_session() for _ in range(5)]
    listed = await client.list_sessions(page_size=2)
    assert [s.id for s in listed] == [s.id for s in reversed(created)]


async def test_sessions_carry_the_start_of_their_first_user_message(
    served: tuple[AgioClient, StoreRoles],
) -> None:
    client, store = served
    asked = await seed_session(store, turns=2)
    long = await store.new_session()
    await store.append_one(Step(long.id, "run_seed", Role.USER, content="é" * 300 + " end"))
    answered = await store.new_session()
    await store.append_one(Step(answered.id, "run_seed", Role.ASSISTANT, content="hello"))
    empty = await store.new_session()
    emptied = await seed_session(store, turns=1)
    await client.delete_steps(emptied.id, 1)
    listed = {s.id: s.first_user_message for s in await client.list_sessions(page_size=2)}
    assert listed == {
        asked.id: "question 0",
        long.id: "é" * 200,
        answered.id: "",
        empty.id: "",
        emptied.id: "",
    }
    assert (await client.get_session(asked.id)).first_user_message == "question 0"
    assert (await client.fork_session(asked.id, 1)).first_user_message == "question 0"


async def test_delete_session_removes_its_steps(served: tuple[AgioClient, StoreRoles]) -> None:
    client, store = served
    session = await seed_session(store, turns=1)
    assert await client.delete_session(session.id) == 4
    await expect_error(
        client.get_session(session.id), grpc.StatusCode.NOT_FOUND, "SESSION_NOT_FOUND"
    )


async def test_unknown_session_and_step_are_not_found(
    served: tuple[AgioClient, StoreRoles],
) -> None:
    client, store = served
    await expect_error(
        client.get_session("sess_missing"), grpc.StatusCode.NOT_FOUND, "SESSION_NOT_FOUND"
    )
    await expect_error(
        client.list_steps("sess_missing"), grpc.StatusCode.NOT_FOUND, "SESSION_NOT_FOUND"
    )
    session = await seed_session(store, turns=1)
    error = await expect_error(
        client.get_step(session.id, 99), grpc.StatusCode.NOT_FOUND, "STEP_NOT_FOUND"
    )
    assert error.metadata["kind"] == "step"


async def test_bad_ids_are_invalid_arguments_with_field_violations(
    served: tuple[AgioClient, StoreRoles],
) -> None:
    client, _ = served
    for bad in ("", "has space", "x" * 200, "../etc", "ünïcode"):
        error = await expect_error(
            client.get_session(bad), grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT"
        )
        assert [field for field, _ in error.field_violations] == ["session_id"]
    error = await expect_error(
        client.get_step("", 0), grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT"
    )
    assert {field for field, _ in error.field_violations} == {"session_id", "sequence"}


async def test_page_sizes_and_tokens_out_of_range_are_handled(
    served: tuple[AgioClient, StoreRoles],
) -> None:
    client, store = served
    session = await seed_session(store, turns=1)
    error = await expect_error(
        client.sessions.ListSteps(
            session_service_pb2.ListStepsRequest(session_id=session.id, page_size=-1)
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_ARGUMENT",
    )
    assert error.field_violations[0][0] == "page_size"
    huge = await client.sessions.ListSteps(
        session_service_pb2.ListStepsRequest(session_id=session.id, page_size=1_000_000)
    )
    assert len(huge.steps) == 4
    for token in ("garbage!", "eyJxIjoiYSIsInAiOlsxXX0"):
        error = await expect_error(
            client.sessions.ListSteps(
                session_service_pb2.ListStepsRequest(session_id=session.id, page_token=token)
            ),
            grpc.StatusCode.INVALID_ARGUMENT,
            "INVALID_ARGUMENT",
        )
        assert error.field_violations[0][0] == "page_token"
    other = await seed_session(store, turns=1)
    page = await client.sessions.ListSteps(
        session_service_pb2.ListStepsRequest(session_id=session.id, page_size=1)
    )
    await expect_error(  # a token only works for the query that issued it
        client.sessions.ListSteps(
            session_service_pb2.ListStepsRequest(
                session_id=other.id, page_size=1, page_token=page.next_page_token
            )
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_ARGUMENT",
    )


async def test_fork_past_the_end_and_deletes_on_missing_sessions_write_nothing(
    served: tuple[AgioClient, StoreRoles],
) -> None:
    client, store = served
    session = await seed_session(store, turns=1)
    before = await client.list_sessions()
    error = await expect_error(
        client.fork_session(session.id, 9),
        grpc.StatusCode.OUT_OF_RANGE,
        "SEQUENCE_OUT_OF_RANGE",
    )
    assert error.metadata["lastSequence"] == "4"
    await expect_error(
        client.delete_steps("sess_missing", 1), grpc.StatusCode.NOT_FOUND, "SESSION_NOT_FOUND"
    )
    await expect_error(
        client.delete_steps(session.id, 0), grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT"
    )
    await expect_error(
        client.fork_session("sess_missing", 1), grpc.StatusCode.NOT_FOUND, "SESSION_NOT_FOUND"
    )
    assert [s.id for s in await client.list_sessions()] == [s.id for s in before]
    assert len(await client.list_steps(session.id)) == 4


async def test_health_and_reflection_list_both_services(app: AgioApp) -> None:
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    async with AgioClient(app.address) as client:
        assert await client.health() == "SERVING"
        assert await client.health("agio.v1.SessionService") == "SERVING"
    async with grpc.aio.insecure_channel(app.address) as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        call = stub.ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")])
        )
        response = await call.read()
        names = {s.name for s in response.list_services_response.service}
    assert {"agio.v1.AgentService", "agio.v1.SessionService", "grpc.health.v1.Health"} <= names


async def test_edits_that_would_split_tool_calls_from_their_results_are_refused(
    served: tuple[AgioClient, StoreRoles],
) -> None:
    """The log stays valid history: a fork or a delete may not keep an assistant step's tool
    calls without their results (a later Run would send the model calls with no answer).
    Seventy calls, so the read back from the cut spans more than one read."""
    client, store = served
    session = await store.new_session()
    calls = [ToolCall(id=f"call_{n}", name="calculate", arguments="{}") for n in range(70)]
    await store.append_steps(
        [
            Step(session.id, "run_seed", Role.USER, content="seventy sums"),
            Step(session.id, "run_seed", Role.ASSISTANT, tool_calls=calls),
            *(
                Step(session.id, "run_seed", Role.TOOL, content="2", tool_call_id=c.id)
                for c in calls
            ),
            Step(session.id, "run_seed", Role.ASSISTANT, content="all 2"),
        ]
    )  # user 1, assistant 2, results 3..72, reply 73
    before = await client.list_steps(session.id)
    sessions_before = len(await client.list_sessions())

    for cut in (2, 3, 40, 71):
        with pytest.raises(AgioError) as split:
            await client.fork_session(session.id, cut)
        assert split.value.code is grpc.StatusCode.INVALID_ARGUMENT
        assert split.value.reason == "INVALID_ARGUMENT"
        assert [field for field, _ in split.value.field_violations] == ["sequence"]
        assert "tool calls of step 2 without results" in split.value.field_violations[0][1]
    for start in (3, 4, 72):
        with pytest.raises(AgioError) as split:
            await client.delete_steps(session.id, start)
        assert [field for field, _ in split.value.field_violations] == ["start_sequence"]
    # Nothing was written by the refused edits.
    assert await client.list_steps(session.id) == before
    assert len(await client.list_sessions()) == sessions_before

    # Cuts that keep every call with its result, or none of the calls, are fine.
    assert (await client.fork_session(session.id, 72)).step_count == 72
    assert (await client.fork_session(session.id, 1)).step_count == 1
    assert await client.delete_steps(session.id, 73) == 1
    assert await client.delete_steps(session.id, 2) == 71
