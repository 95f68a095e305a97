"""Tool approvals end to end, on SQLite and PostgreSQL: a real gRPC client -> the server on
127.0.0.1:0 -> the real openai client -> the fake model over HTTP.

The agent's `echo` needs approval (`tool_options`), `calculate` does not; a run may add
tools with `require_approval`. Each test asserts what the client sees (the wait in
`Run.required_action`, the events, the stop) and what the model is shown afterwards.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import pytest

from agio_grpc.client import AgioClient, AgioError
from agio_grpc.config import AgentConfig, LimitsConfig, ToolOptionsConfig
from agio_grpc.service.app import AgioApp
from agio_grpc.testing import FakeModelServer, ToolCallSpec, Turn
from agio_grpc.v1 import agent_service_pb2 as pb
from agio_grpc.v1 import events_pb2, resources_pb2
from agio_grpc.v1.resources_pb2 import Role, RunStatus, StopReason
from tests.service.conftest import make_settings
from tests.service.tenancy import tenant_interceptors, tenant_metadata

StepEvent = events_pb2.StepEvent
TENANT = "acme"

WEATHER = {
    "name": "get_weather",
    "description": "Weather for a city.",
    "parameters_json": json.dumps({"type": "object", "properties": {"city": {"type": "string"}}}),
}


def approval_settings(store_url: str, model_url: str, **agent: Any) -> Any:
    return make_settings(
        store_url,
        model_url,
        agents=[
            AgentConfig(
                name="assistant",
                model="fake-model",
                instructions="You are a test assistant.",
                tools=["calculate", "echo", "current_time", "hang"],
                tool_options={"echo": ToolOptionsConfig(needs_approval=True)},
                limits=LimitsConfig(max_steps=5, tool_timeout_s=2.0),
                **agent,
            )
        ],
    )


@pytest.fixture
async def approvals_app(store_url: str, fake_model: FakeModelServer) -> AsyncIterator[AgioApp]:
    started = await AgioApp.start(
        approval_settings(store_url, fake_model.base_url), interceptors=tenant_interceptors()
    )
    try:
        yield started
    finally:
        await started.stop(grace=0)


@pytest.fixture
async def clients(approvals_app: AgioApp) -> AsyncIterator[Callable[[str], AgioClient]]:
    opened: dict[str, AgioClient] = {}

    def client_of(tenant: str = TENANT) -> AgioClient:
        if tenant not in opened:
            opened[tenant] = AgioClient(approvals_app.address, metadata=tenant_metadata(tenant))
        return opened[tenant]

    try:
        yield client_of
    finally:
        for client in opened.values():
            await client.close()


async def drain(events: AsyncIterator[StepEvent]) -> list[StepEvent]:
    return [event async for event in events]


def final_run(events: list[StepEvent]) -> resources_pb2.Run:
    last = events[-1]
    kind = last.WhichOneof("event")
    assert kind in ("run_completed", "run_failed"), kind
    run: resources_pb2.Run = getattr(last, kind).run
    return run


def echo(text: str, call_id: str) -> ToolCallSpec:
    return ToolCallSpec("echo", json.dumps({"text": text}), id=call_id)


def calc(expression: str, call_id: str) -> ToolCallSpec:
    return ToolCallSpec("calculate", json.dumps({"expression": expression}), id=call_id)


def approve(call_id: str, reason: str = "") -> pb.ToolApproval:
    return pb.ToolApproval(tool_call_id=call_id, approved=True, reason=reason)


def reject(call_id: str, reason: str = "") -> pb.ToolApproval:
    return pb.ToolApproval(tool_call_id=call_id, approved=False, reason=reason)


def tool_messages(request: dict[str, Any]) -> dict[str, str]:
    """The tool results a model request shows, by call id."""
    return {m["tool_call_id"]: m["content"] for m in request["messages"] if m["role"] == "tool"}


async def waiting_run(
    client: AgioClient, fake_model: FakeModelServer, *calls: ToolCallSpec, **run: Any
) -> resources_pb2.Run:
    fake_model.enqueue(Turn.tool_calls(list(calls)))
    events = await drain(client.run("Do it.", **run))
    ended = final_run(events)
    assert ended.status == RunStatus.RUN_STATUS_REQUIRES_ACTION, ended.stop_signal
    assert ended.stop_signal.reason == StopReason.STOP_REASON_REQUIRES_ACTION
    return ended


async def test_a_call_needing_approval_waits_then_runs_once_approved(
    clients: Callable[..., AgioClient], fake_model: FakeModelServer
) -> None:
    client = clients()
    waiting = await waiting_run(client, fake_model, echo("mail sent", "call_mail"))
    assert [(c.id, c.name) for c in waiting.required_action.approvals] == [("call_mail", "echo")]
    assert json.loads(waiting.required_action.approvals[0].arguments) == {"text": "mail sent"}
    assert not waiting.required_action.tool_calls
    stored = await client.get_run(waiting.id)
    assert stored.required_action == waiting.required_action
    (listed,) = await client.list_runs(waiting.session_id)
    assert listed.required_action == waiting.required_action
    assert len(fake_model.requests) == 1  # nothing ran: the model was not called again

    fake_model.enqueue(Turn.text("Done: the mail is sent."))
    events = await drain(client.approve(waiting.id, "call_mail", reason="looks right"))
    done = final_run(events)
    assert done.id == waiting.id
    assert done.status == RunStatus.RUN_STATUS_COMPLETED
    assert not done.HasField("required_action")
    assert tool_messages(fake_model.requests[1]) == {"call_mail": "mail sent"}
    steps = await client.list_steps(waiting.session_id)
    (result,) = [step for step in steps if step.role == Role.ROLE_TOOL]
    assert (result.content, result.is_error) == ("mail sent", False)
    # The audit trail: who approved what, when.
    assert result.approval.approved
    assert result.approval.reason == "looks right"
    assert result.approval.decided_by == "test"  # the tenancy interceptor's credential id
    assert result.approval.decide_time.ToDatetime() >= waiting.end_time.ToDatetime()


async def test_a_rejected_call_never_runs_and_the_model_sees_the_reason(
    clients: Callable[..., AgioClient], fake_model: FakeModelServer
) -> None:
    client = clients()
    waiting = await waiting_run(client, fake_model, echo("wire 1M", "call_wire"))
    fake_model.enqueue(Turn.text("Understood, I will not send it."))
    events = await drain(client.reject(waiting.id, reason="too much money"))
    assert final_run(events).status == RunStatus.RUN_STATUS_COMPLETED
    seen = tool_messages(fake_model.requests[1])["call_wire"]
    assert "rejected" in seen
    assert "too much money" in seen
    steps = await client.list_steps(waiting.session_id)
    (result,) = [step for step in steps if step.role == Role.ROLE_TOOL]
    assert result.is_error
    assert "wire 1M" not in result.content  # the tool never ran
    assert not result.approval.approved
    assert (result.approval.reason, result.approval.decided_by) == ("too much money", "test")
    assert result.approval.HasField("decide_time")


async def test_a_mixed_turn_runs_free_calls_first_and_resumes_with_every_answer(
    clients: Callable[..., AgioClient], fake_model: FakeModelServer
) -> None:
    client = clients()
    waiting = await waiting_run(
        client,
        fake_model,
        echo("approved", "call_yes"),
        echo("rejected", "call_no"),
        ToolCallSpec("get_weather", '{"city": "Oslo"}', id="call_client"),
        calc("6 * 7", "call_free"),
        client_tools=[WEATHER],
    )
    action = waiting.required_action
    assert [c.id for c in action.approvals] == ["call_yes", "call_no"]
    assert [c.id for c in action.tool_calls] == ["call_client"]
    steps = await client.list_steps(waiting.session_id)
    assert [(s.tool_call_id, s.content) for s in steps if s.role == Role.ROLE_TOOL] == [
        ("call_free", "42")
    ]

    fake_model.enqueue(Turn.text("All four answered."))
    events = await drain(
        client.submit_tool_outputs(
            waiting.id,
            [pb.ToolOutput(tool_call_id="call_client", output="sunny")],
            approvals=[approve("call_yes"), reject("call_no", "not this one")],
        )
    )
    assert final_run(events).status == RunStatus.RUN_STATUS_COMPLETED
    seen = tool_messages(fake_model.requests[1])
    assert seen["call_free"] == "42"
    assert seen["call_client"] == "sunny"
    assert seen["call_yes"] == "approved"
    assert "not this one" in seen["call_no"]
    steps = await client.list_steps(waiting.session_id)
    decided = {s.tool_call_id: s for s in steps if s.role == Role.ROLE_TOOL}
    assert [decided[i].approval.approved for i in ("call_yes", "call_no")] == [True, False]
    assert not decided["call_free"].HasField("approval")
    assert not decided["call_client"].HasField("approval")


@pytest.mark.parametrize(
    ("outputs", "approvals", "named"),
    [
        ([], [pb.ToolApproval(tool_call_id="call_a", approved=True)], "call_b"),
        (
            [],
            [
                pb.ToolApproval(tool_call_id="call_a", approved=True),
                pb.ToolApproval(tool_call_id="call_b", approved=True),
            ],
            "call_client",
        ),
        (
            [pb.ToolOutput(tool_call_id="call_client", output="x")],
            [pb.ToolApproval(tool_call_id="call_b", approved=False)],
            "call_a",
        ),
    ],
    ids=["an-approval-missing", "the-client-output-missing", "another-approval-missing"],
)
async def test_a_submit_that_leaves_anything_pending_is_refused_and_changes_nothing(
    clients: Callable[..., AgioClient],
    fake_model: FakeModelServer,
    outputs: list[pb.ToolOutput],
    approvals: list[pb.ToolApproval],
    named: str,
) -> None:
    client = clients()
    waiting = await waiting_run(
        client,
        fake_model,
        echo("a", "call_a"),
        echo("b", "call_b"),
        ToolCallSpec("get_weather", "{}", id="call_client"),
        client_tools=[WEATHER],
    )
    steps_before = await client.list_steps(waiting.session_id)
    with pytest.raises(AgioError) as refused:
        await drain(client.submit_tool_outputs(waiting.id, outputs, approvals=approvals))
    assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert named in refused.value.message
    assert await client.list_steps(waiting.session_id) == steps_before
    still = await client.get_run(waiting.id)
    assert still.status == RunStatus.RUN_STATUS_REQUIRES_ACTION
    assert still.required_action == waiting.required_action


async def test_a_run_waits_across_a_restart_and_goes_on_once_approved(
    store_url: str, fake_model: FakeModelServer
) -> None:
    settings = approval_settings(store_url, fake_model.base_url)
    first = await AgioApp.start(settings, interceptors=tenant_interceptors())
    try:
        async with AgioClient(first.address, metadata=tenant_metadata(TENANT)) as client:
            waiting = await waiting_run(client, fake_model, echo("after restart", "call_r"))
    finally:
        await first.stop(grace=0)
    second = await AgioApp.start(settings, interceptors=tenant_interceptors())
    try:
        async with AgioClient(second.address, metadata=tenant_metadata(TENANT)) as client:
            stored = await client.get_run(waiting.id)
            assert stored.status == RunStatus.RUN_STATUS_REQUIRES_ACTION
            assert [c.id for c in stored.required_action.approvals] == ["call_r"]
            replayed = await drain(client.watch_run(waiting.id))
            assert final_run(replayed).required_action == stored.required_action
            fake_model.enqueue(Turn.text("Done after the restart."))
            done = final_run(await drain(client.approve(waiting.id)))
            assert done.status == RunStatus.RUN_STATUS_COMPLETED
            assert tool_messages(fake_model.requests[-1]) == {"call_r": "after restart"}
    finally:
        await second.stop(grace=0)


async def test_another_tenant_can_neither_see_nor_decide_the_wait(
    clients: Callable[..., AgioClient], fake_model: FakeModelServer
) -> None:
    waiting = await waiting_run(clients(), fake_model, echo("secret", "call_s"))
    stranger = clients("intruder")
    with pytest.raises(AgioError) as unseen:
        await stranger.get_run(waiting.id)
    assert unseen.value.code == grpc.StatusCode.NOT_FOUND
    with pytest.raises(AgioError) as undecided:
        await drain(stranger.submit_tool_outputs(waiting.id, [], approvals=[approve("call_s")]))
    assert undecided.value.code == grpc.StatusCode.NOT_FOUND
    still = await clients().get_run(waiting.id)
    assert still.status == RunStatus.RUN_STATUS_REQUIRES_ACTION


async def test_cancelling_a_waiting_run_answers_its_held_calls(
    clients: Callable[..., AgioClient], fake_model: FakeModelServer
) -> None:
    client = clients()
    waiting = await waiting_run(client, fake_model, echo("never", "call_c"))
    cancelled = await client.cancel_run(waiting.id, reason="changed my mind")
    assert cancelled.status == RunStatus.RUN_STATUS_CANCELLED
    assert not cancelled.HasField("required_action")
    steps = await client.list_steps(waiting.session_id)
    (result,) = [step for step in steps if step.role == Role.ROLE_TOOL]
    assert result.tool_call_id == "call_c"
    assert result.is_error
    assert "never" not in result.content
    fake_model.enqueue(Turn.text("Next turn."))
    after = await client.run_to_end("go on", session_id=waiting.session_id)
    assert after.run.status == RunStatus.RUN_STATUS_COMPLETED


async def test_require_approval_holds_a_run_s_calls_of_tools_the_agent_runs_freely(
    clients: Callable[..., AgioClient], fake_model: FakeModelServer
) -> None:
    client = clients()
    waiting = await waiting_run(
        client, fake_model, calc("1 + 1", "call_calc"), require_approval=["calculate"]
    )
    assert [c.id for c in waiting.required_action.approvals] == ["call_calc"]
    fake_model.enqueue(Turn.tool_calls([calc("2 + 2", "call_more")]))
    again = final_run(await drain(client.approve(waiting.id)))
    assert [c.id for c in again.required_action.approvals] == ["call_more"]
    star = await waiting_run(
        client, fake_model, ToolCallSpec("current_time", "{}", id="call_t"), require_approval=["*"]
    )
    assert [c.id for c in star.required_action.approvals] == ["call_t"]


async def test_require_approval_naming_no_server_tool_of_the_run_is_refused(
    clients: Callable[..., AgioClient],
) -> None:
    with pytest.raises(AgioError) as refused:
        await clients().run_to_end("hi", require_approval=["send_mail"])
    assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "require_approval[0]" in str(refused.value)


async def test_a_run_on_a_session_waiting_for_approval_is_refused_under_reject(
    clients: Callable[..., AgioClient], fake_model: FakeModelServer
) -> None:
    client = clients()
    waiting = await waiting_run(client, fake_model, echo("held", "call_h"))
    with pytest.raises(AgioError) as refused:
        await client.run_to_end("hello?", session_id=waiting.session_id)
    assert refused.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert refused.value.reason == "RUN_REQUIRES_ACTION"
    assert (await client.get_run(waiting.id)).status == RunStatus.RUN_STATUS_REQUIRES_ACTION


@pytest.mark.parametrize("policy", [pb.BUSY_POLICY_INTERRUPT, pb.BUSY_POLICY_ROLLBACK])
async def test_a_run_superseding_a_wait_for_approval_answers_or_drops_the_held_call(
    clients: Callable[..., AgioClient], fake_model: FakeModelServer, policy: int
) -> None:
    client = clients()
    waiting = await waiting_run(client, fake_model, echo("held", "call_h"))
    fake_model.enqueue(Turn.text("Starting over."))
    winner = await client.run_to_end("forget it", session_id=waiting.session_id, on_busy=policy)
    assert winner.run.status == RunStatus.RUN_STATUS_COMPLETED
    assert (await client.get_run(waiting.id)).status == RunStatus.RUN_STATUS_CANCELLED
    steps = await client.list_steps(waiting.session_id)
    held = [step for step in steps if step.tool_call_id == "call_h"]
    if policy == pb.BUSY_POLICY_ROLLBACK:
        assert [step.content for step in steps] == ["forget it", "Starting over."]
    else:
        assert len(held) == 1
        assert held[0].is_error
    assert "held" not in [step.content for step in held]  # the held call never ran


async def test_a_run_queued_behind_a_wait_for_approval_starts_once_it_is_decided(
    clients: Callable[..., AgioClient], fake_model: FakeModelServer
) -> None:
    client = clients()
    waiting = await waiting_run(client, fake_model, echo("first", "call_q"))
    queued = await client.start_run(
        "and then?", session_id=waiting.session_id, on_busy=pb.BUSY_POLICY_ENQUEUE
    )
    assert queued.status == RunStatus.RUN_STATUS_QUEUED
    fake_model.enqueue(Turn.text("First done."), Turn.text("Then this."))
    assert final_run(await drain(client.approve(waiting.id))).status == (
        RunStatus.RUN_STATUS_COMPLETED
    )
    after = final_run(await drain(client.watch_run(queued.id)))
    assert after.status == RunStatus.RUN_STATUS_COMPLETED
    steps = await client.list_steps(waiting.session_id)
    assert [step.content for step in steps][-2:] == ["and then?", "Then this."]


async def test_a_wait_past_its_timeout_is_rejected_by_the_server_and_the_run_goes_on(
    store_url: str, fake_model: FakeModelServer
) -> None:
    settings = approval_settings(store_url, fake_model.base_url, approval_timeout_s=0.001)
    app = await AgioApp.start(settings, interceptors=tenant_interceptors())
    try:
        async with AgioClient(app.address, metadata=tenant_metadata(TENANT)) as client:
            fake_model.enqueue(Turn.tool_calls([echo("too late", "call_late")]))
            first = await drain(client.run("Do it."))
            waiting = final_run(first)
            assert waiting.required_action.HasField("approval_deadline")
            fake_model.enqueue(Turn.text("Nobody decided in time."))
            # The sweep of this server may have answered it first: either way, once.
            await app.runtime.expire_approvals()
            second = await drain(client.watch_run(waiting.id, after_seq=first[-1].seq))
            done = final_run(second)
            assert done.status == RunStatus.RUN_STATUS_COMPLETED
            seen = tool_messages(fake_model.requests[1])["call_late"]
            assert "rejected" in seen
            assert "timed out" in seen
            steps = await client.list_steps(waiting.session_id)
            (result,) = [step for step in steps if step.role == Role.ROLE_TOOL]
            assert (result.approval.approved, result.approval.reason) == (False, "timed out")
            assert result.approval.decided_by == "server"
            assert len(fake_model.requests) == 2
    finally:
        await app.stop(grace=0)


async def test_an_approval_submitted_on_another_member_resumes_the_run_there(
    store_url: str, fake_model: FakeModelServer
) -> None:
    settings = approval_settings(store_url, fake_model.base_url)
    first = await AgioApp.start(settings, interceptors=tenant_interceptors())
    second = await AgioApp.start(settings, interceptors=tenant_interceptors())
    try:
        async with (
            AgioClient(first.address, metadata=tenant_metadata(TENANT)) as on_first,
            AgioClient(second.address, metadata=tenant_metadata(TENANT)) as on_second,
        ):
            waiting = await waiting_run(on_first, fake_model, echo("from afar", "call_m"))
            seen = await on_second.get_run(waiting.id)
            assert [c.id for c in seen.required_action.approvals] == ["call_m"]
            fake_model.enqueue(Turn.text("Approved elsewhere."))
            done = final_run(await drain(on_second.approve(waiting.id, "call_m")))
            assert done.status == RunStatus.RUN_STATUS_COMPLETED
            assert tool_messages(fake_model.requests[1]) == {"call_m": "from afar"}
            assert (await on_first.get_run(waiting.id)).status == RunStatus.RUN_STATUS_COMPLETED
    finally:
        await second.stop(grace=0)
        await first.stop(grace=0)


async def test_a_retry_across_a_pending_approval_waits_for_a_decision_again(
    clients: Callable[..., AgioClient], fake_model: FakeModelServer
) -> None:
    client = clients()
    waiting = await waiting_run(client, fake_model, echo("again", "call_again"))
    cancelled = await client.cancel_run(waiting.id)
    assert cancelled.status == RunStatus.RUN_STATUS_CANCELLED
    # From the assistant step that made the call: its call is run again, so it waits again.
    retried = final_run(await drain(client.retry(waiting.session_id, 3)))
    assert retried.status == RunStatus.RUN_STATUS_REQUIRES_ACTION
    assert [c.id for c in retried.required_action.approvals] == ["call_again"]
    fake_model.enqueue(Turn.text("Ran after the retry."))
    done = final_run(await drain(client.approve(retried.id)))
    assert done.status == RunStatus.RUN_STATUS_COMPLETED
    assert tool_messages(fake_model.requests[-1]) == {"call_again": "again"}
