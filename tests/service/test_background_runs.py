"""Runs no caller holds: StartRun, DISCONNECT_POLICY_CONTINUE, and the busy policies as a
gRPC client sees them (statuses with their ErrorInfo, a queued run's stream)."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable
from typing import Any, cast

import grpc
import pytest

from agio_grpc.client import AgioClient, AgioError
from agio_grpc.service.app import AgioApp
from agio_grpc.testing import FakeModelServer, ToolCallSpec, Turn
from agio_grpc.v1 import agent_service_pb2 as pb
from agio_grpc.v1.events_pb2 import StepEvent
from agio_grpc.v1.resources_pb2 import RunStatus, StopReason

ENQUEUE = pb.BUSY_POLICY_ENQUEUE
LOOKUP = {"name": "lookup", "description": "Look it up.", "parameters_json": '{"type": "object"}'}


async def ended(client: AgioClient, run_id: str) -> list[str]:
    """The kinds of the run's events as `follow_run` gives them, to its end."""
    return [str(event.WhichOneof("event")) async for event in client.follow_run(run_id)]


async def test_a_background_run_completes_with_no_client(
    client: AgioClient, fake_model: FakeModelServer
) -> None:
    fake_model.enqueue(Turn.text("Done in the background.", chunks=3))
    run = await client.start_run("Work on it.")
    assert run.status == RunStatus.RUN_STATUS_RUNNING
    kinds = await ended(client, run.id)  # followed live, or replayed from the journal
    assert kinds[0] == "run_started"
    assert kinds[-1] == "run_completed"
    done = await client.get_run(run.id)
    assert done.status == RunStatus.RUN_STATUS_COMPLETED
    steps = await client.list_steps(run.session_id)
    assert [step.content for step in steps] == ["Work on it.", "Done in the background."]


class CountedWatches(grpc.aio.UnaryStreamClientInterceptor):  # type: ignore[misc]
    """Counts the WatchRun calls made through the channel."""

    def __init__(self) -> None:
        self.calls = 0

    async def intercept_unary_stream(
        self,
        continuation: Callable[[grpc.aio.ClientCallDetails, Any], Any],
        client_call_details: grpc.aio.ClientCallDetails,
        request: Any,
    ) -> Any:
        if client_call_details.method == b"/agio.v1.AgentService/WatchRun":
            self.calls += 1
        return await continuation(client_call_details, request)


async def test_following_from_the_terminal_events_seq_ends_at_once_with_one_watch(
    app: AgioApp, client: AgioClient
) -> None:
    run = await client.start_run("What is 12 * 7?")
    terminal_seq = [event.seq async for event in client.follow_run(run.id)][-1]

    watches = CountedWatches()
    channel = grpc.aio.insecure_channel(app.address, interceptors=[watches])
    async with AgioClient(app.address, channel=channel) as counted:
        rest = [event async for event in counted.follow_run(run.id, terminal_seq)]
    assert rest == []  # an empty OK stream: the run ended, nothing is after its end
    assert watches.calls == 1


async def test_a_background_run_is_followed_and_cancelled(
    client: AgioClient, fake_model: FakeModelServer
) -> None:
    fake_model.enqueue(Turn.hanging())
    run = await client.start_run("Think forever.")
    await fake_model.wait_for_requests(1)
    cancelled = await client.cancel_run(run.id, "enough")
    assert cancelled.status == RunStatus.RUN_STATUS_CANCELLED
    assert (await ended(client, run.id))[-1] == "run_completed"


async def test_a_continue_run_outlives_its_caller_and_the_default_does_not(
    client: AgioClient, fake_model: FakeModelServer
) -> None:
    stops = {}
    for policy in (pb.DISCONNECT_POLICY_CONTINUE, pb.DISCONNECT_POLICY_UNSPECIFIED):
        fake_model.enqueue(Turn.hanging())
        asked = len(fake_model.requests) + 1
        stream = client.run("Go on without me.", on_disconnect=policy)
        run_id = (await anext(stream)).run_id
        await fake_model.wait_for_requests(asked)
        await cast(AsyncGenerator[StepEvent], stream).aclose()  # the caller goes away
        if policy == pb.DISCONNECT_POLICY_CONTINUE:
            # Still running: only this cancel ends it (a disconnect would have said so).
            await client.cancel_run(run_id, "stopped by hand")
        events = [event async for event in client.follow_run(run_id)]
        stops[policy] = events[-1].run_completed.run.stop_signal.message
    assert stops == {
        pb.DISCONNECT_POLICY_CONTINUE: "stopped by hand",
        pb.DISCONNECT_POLICY_UNSPECIFIED: "client disconnected",
    }


async def test_a_run_on_a_session_waiting_for_its_client_is_refused_with_the_waiting_run(
    client: AgioClient, fake_model: FakeModelServer
) -> None:
    fake_model.enqueue(Turn.tool_calls([ToolCallSpec("lookup", "{}", id="call_client")]))
    waiting = await client.run_to_end("Where is it?", client_tools=[LOOKUP])
    assert waiting.run.status == RunStatus.RUN_STATUS_REQUIRES_ACTION
    with pytest.raises(AgioError) as refused:
        await client.run_to_end("Hello?", session_id=waiting.run.session_id)
    assert refused.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert refused.value.reason == "RUN_REQUIRES_ACTION"
    assert refused.value.metadata["run_id"] == waiting.run.id
    assert (await client.get_run(waiting.run.id)).status == RunStatus.RUN_STATUS_REQUIRES_ACTION


async def test_a_queued_run_streams_queued_then_running_then_its_end(
    client: AgioClient, fake_model: FakeModelServer
) -> None:
    fake_model.enqueue(Turn.text("first", chunks=2, first_token_delay=0.2), Turn.text("second"))
    first = client.run("one")
    opened = await anext(first)
    queued = client.run("two", session_id=opened.session_id, on_busy=pb.BUSY_POLICY_ENQUEUE)
    second = [event async for event in queued]
    rest = [event async for event in first]
    assert rest[-1].run_completed.run.status == RunStatus.RUN_STATUS_COMPLETED
    opening = [event.run_started.run.status for event in second if event.HasField("run_started")]
    assert opening == [RunStatus.RUN_STATUS_QUEUED, RunStatus.RUN_STATUS_RUNNING]
    assert [event.seq for event in second] == list(range(1, len(second) + 1))
    assert second[-1].run_completed.run.status == RunStatus.RUN_STATUS_COMPLETED
    steps = await client.list_steps(opened.session_id)
    assert [step.content for step in steps] == ["one", "first", "two", "second"]


async def test_a_full_queue_is_resource_exhausted_and_an_unknown_policy_invalid(
    client: AgioClient, fake_model: FakeModelServer
) -> None:
    fake_model.enqueue(Turn.hanging())
    busy = await client.start_run("Think forever.")
    await fake_model.wait_for_requests(1)
    for _ in range(10):  # the default max_queued_runs
        await client.start_run("later", session_id=busy.session_id, on_busy=ENQUEUE)
    with pytest.raises(AgioError) as full:
        await client.start_run("too many", session_id=busy.session_id, on_busy=ENQUEUE)
    assert full.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert full.value.reason == "QUEUE_FULL"
    with pytest.raises(AgioError) as invalid:
        await client.start_run("odd", on_busy=99)  # type: ignore[arg-type]
    assert invalid.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert invalid.value.field_violations[0][0] == "on_busy"
    assert StopReason.Name((await client.cancel_run(busy.id)).stop_signal.reason) == (
        "STOP_REASON_CANCELLED"
    )


async def test_start_run_refuses_what_run_refuses_before_anything_is_stored(
    client: AgioClient,
) -> None:
    refusals = [
        ({"input": ""}, grpc.StatusCode.INVALID_ARGUMENT, "input"),
        ({"input": "hi", "on_disconnect": 7}, grpc.StatusCode.INVALID_ARGUMENT, "on_disconnect"),
        ({"input": "hi", "on_busy": -1}, grpc.StatusCode.INVALID_ARGUMENT, "on_busy"),
        ({"input": "hi", "session_id": "sess_missing"}, grpc.StatusCode.NOT_FOUND, ""),
    ]
    for fields, code, field in refusals:
        with pytest.raises(AgioError) as refused:
            await client._unary(client.agents.StartRun, pb.RunRequest(**fields))  # type: ignore[arg-type]
        assert refused.value.code == code, fields
        if field:
            assert [name for name, _ in refused.value.field_violations] == [field]
    assert await client.list_sessions() == []


async def test_a_queued_run_behind_a_waiting_run_ends_timeout_at_its_callers_deadline(
    client: AgioClient, fake_model: FakeModelServer
) -> None:
    fake_model.enqueue(Turn.tool_calls([ToolCallSpec("lookup", "{}", id="call_client")]))
    waiting = await client.run_to_end("Where is it?", client_tools=[LOOKUP])
    session_id = waiting.run.session_id
    events = [
        event
        async for event in client.run("later", session_id=session_id, on_busy=ENQUEUE, timeout=3)
    ]
    ends = [event for event in events if event.HasField("run_completed")]
    assert len(ends) == 1  # one terminal event, the last
    assert events[-1] is ends[0]
    run = ends[0].run_completed.run
    assert run.stop_signal.reason == StopReason.STOP_REASON_TIMEOUT
    assert run.stop_signal.message == "the run reached its caller's deadline"
    stored = await client.get_run(run.id)
    assert stored.status == RunStatus.RUN_STATUS_CANCELLED
    assert stored.stop_signal.reason == StopReason.STOP_REASON_TIMEOUT
    # The waiting run still waits for its client, and the queue is empty.
    assert (await client.get_run(waiting.run.id)).status == RunStatus.RUN_STATUS_REQUIRES_ACTION
    assert [step.content for step in await client.list_steps(session_id)][-1] == ""


async def test_a_queued_run_started_later_keeps_its_callers_deadline(
    client: AgioClient, fake_model: FakeModelServer
) -> None:
    fake_model.enqueue(
        Turn.text("first", first_token_delay=0.3), Turn.text("too slow", chunks=10, chunk_delay=1.0)
    )
    first = client.run("one")
    opened = await anext(first)
    queued = client.run("two", session_id=opened.session_id, on_busy=ENQUEUE, timeout=3)
    events = [event async for event in queued]
    assert [event async for event in first][-1].run_completed.run.status == (
        RunStatus.RUN_STATUS_COMPLETED
    )
    opening = [event.run_started.run.status for event in events if event.HasField("run_started")]
    assert opening == [RunStatus.RUN_STATUS_QUEUED, RunStatus.RUN_STATUS_RUNNING]
    assert events[-1].run_completed.run.stop_signal.reason == StopReason.STOP_REASON_TIMEOUT
    assert sum(event.HasField("run_completed") for event in events) == 1
