"""agio-grpc agents served over A2A, checked with the official `a2a-sdk` client over each of
its three bindings (JSON-RPC, HTTP+JSON, gRPC) on both store backends: the real server on
127.0.0.1:0 with API keys, the real openai client inside it talking to the fake model."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator
from typing import cast

import pytest
from a2a.types import a2a_pb2 as a2a
from a2a.utils import errors as a2a_errors
from google.protobuf import json_format, struct_pb2

from agio_grpc.domain import RunStatus
from agio_grpc.service.a2a.handler import task_filters
from agio_grpc.service.app import AgioApp
from agio_grpc.testing import FakeModelServer, ToolCallSpec, Turn
from tests.a2a.conftest import (
    Connect,
    answer_text,
    final_task,
    last_state,
    send,
)

APPROVE_ECHO = {"tool_call_id": "call_echo", "approved": True}


async def test_the_card_names_the_agent_its_three_bindings_skills_and_bearer_auth(
    connect: Connect, binding: str
) -> None:
    remote = await connect()
    card = remote.card
    assert card.name == "assistant"
    assert card.description == "Answers questions and does sums."
    assert "SECRET-INSTRUCTIONS" not in str(card)
    assert card.capabilities.streaming
    bindings = {i.protocol_binding: i for i in card.supported_interfaces}
    assert set(bindings) == {"JSONRPC", "HTTP+JSON", "GRPC"}
    assert bindings["JSONRPC"].url.endswith("/a2a/assistant/")
    assert bindings["GRPC"].tenant == "assistant"
    assert [s.id for s in card.skills] == ["assistant", "calculate", "echo", "hang", "helper"]
    scheme = card.security_schemes["agio"].http_auth_security_scheme
    assert scheme.scheme == "Bearer"
    helper = await connect("helper")
    assert helper.card.name == "helper"


async def test_a_streamed_task_ends_completed_with_its_answer_artifact(
    connect: Connect, fake_model: FakeModelServer
) -> None:
    remote = await connect()
    fake_model.enqueue(Turn.text("Hello there friend", chunks=3))
    events = await remote.stream(send("hi"))
    task, answer = final_task(events)
    assert task.status.state in (a2a.TASK_STATE_SUBMITTED, a2a.TASK_STATE_WORKING)
    assert task.history[0].parts[0].text == "hi"
    assert answer == "Hello there friend"
    assert last_state(events) == a2a.TASK_STATE_COMPLETED
    found = await remote.client.get_task(a2a.GetTaskRequest(id=task.id), context=remote.context)
    assert found.status.state == a2a.TASK_STATE_COMPLETED
    assert [a.parts[0].text for a in found.artifacts] == ["Hello there friend"]
    assert [(m.role, m.parts[0].text) for m in found.history] == [
        (a2a.ROLE_USER, "hi"),
        (a2a.ROLE_AGENT, "Hello there friend"),
    ]
    assert json_format.MessageToDict(found.metadata)["agio"]["stop_reason"] == "COMPLETED"


async def test_a_blocking_send_returns_the_finished_task(
    connect: Connect, fake_model: FakeModelServer
) -> None:
    remote = await connect(streaming=False)
    fake_model.enqueue(Turn.text("Four."))
    [event] = await remote.stream(send("2+2?"))
    assert event.task.status.state == a2a.TASK_STATE_COMPLETED
    assert event.task.artifacts[0].parts[0].text == "Four."


async def test_a_second_message_in_the_context_continues_the_session(
    connect: Connect, fake_model: FakeModelServer
) -> None:
    remote = await connect()
    fake_model.enqueue(Turn.text("Noted: blue."), Turn.text("Blue."))
    first, _ = final_task(await remote.stream(send("My colour is blue.")))
    events = await remote.stream(send("What is my colour?", context_id=first.context_id))
    second, answer = final_task(events)
    assert second.context_id == first.context_id
    assert second.id != first.id
    assert answer == "Blue."
    seen = [m["content"] for m in fake_model.requests[-1]["messages"]]
    assert "My colour is blue." in seen
    assert "Noted: blue." in seen
    listed = await remote.client.list_tasks(
        a2a.ListTasksRequest(context_id=first.context_id), context=remote.context
    )
    assert {t.id for t in listed.tasks} == {first.id, second.id}


async def test_tasks_are_listed_across_contexts_per_agent_and_tenant_newest_first(
    connect: Connect, fake_model: FakeModelServer
) -> None:
    mine, theirs = await connect(), await connect(tenant="globex")
    helper = await connect("helper")
    fake_model.enqueue(*(Turn.text(f"Reply {n}.") for n in range(5)))
    first, _ = final_task(await mine.stream(send("one")))
    second, _ = final_task(await mine.stream(send("two")))
    third, _ = final_task(await mine.stream(send("three", context_id=first.context_id)))
    final_task(await theirs.stream(send("not yours")))
    final_task(await helper.stream(send("another agent")))

    pages, token, tokens = [], "", []
    while True:
        request = a2a.ListTasksRequest(page_size=2, page_token=token, include_artifacts=True)
        listed = await mine.client.list_tasks(request, context=mine.context)
        pages.append([task.id for task in listed.tasks])
        if not (token := listed.next_page_token):
            break
        tokens.append(token)
    assert pages == [[third.id, second.id], [first.id]]
    assert listed.tasks[0].artifacts[0].parts[0].text == "Reply 0."
    done = await mine.client.list_tasks(
        a2a.ListTasksRequest(status=a2a.TASK_STATE_COMPLETED, context_id=first.context_id),
        context=mine.context,
    )
    assert [task.id for task in done.tasks] == [third.id, first.id]
    failed = a2a.ListTasksRequest(status=a2a.TASK_STATE_FAILED)
    assert not (await mine.client.list_tasks(failed, context=mine.context)).tasks
    rejected = a2a.ListTasksRequest(status=a2a.TASK_STATE_REJECTED)  # no run is ever in it
    assert not (await mine.client.list_tasks(rejected, context=mine.context)).tasks
    other_filter = a2a.ListTasksRequest(
        page_size=2, page_token=tokens[0], status=a2a.TASK_STATE_WORKING
    )
    with pytest.raises(a2a_errors.InvalidParamsError, match="page_token"):
        await mine.client.list_tasks(other_filter, context=mine.context)
    with pytest.raises(a2a_errors.TaskNotFoundError):
        await theirs.client.list_tasks(
            a2a.ListTasksRequest(context_id=first.context_id), context=theirs.context
        )


async def test_a_tool_call_s_progress_is_a_working_status_with_its_message(
    connect: Connect, fake_model: FakeModelServer
) -> None:
    remote = await connect()
    ask = ToolCallSpec("helper", json.dumps({"input": "2+2?"}), id="call_helper")
    fake_model.enqueue(Turn.tool_calls([ask]), Turn.text("4"), Turn.text("The helper says 4."))
    events = await remote.stream(send("Ask the helper"))
    statuses = [e.status_update.status for e in events if e.HasField("status_update")]
    said = [s for s in statuses if s.message.parts]
    [progress] = [s for s in said if "helper is working" in s.message.parts[0].text]
    assert progress.state == a2a.TASK_STATE_WORKING
    facts = json_format.MessageToDict(progress.message.parts[1].data)["tool_progress"]
    assert facts["tool_call_id"] == "call_helper"
    assert facts["state"] == "RUN_STATUS_RUNNING"
    assert facts["child_run_id"].startswith("run_")
    assert answer_text(events) == "The helper says 4."


async def test_input_required_for_an_approval_then_completed_after_the_reply(
    connect: Connect, fake_model: FakeModelServer
) -> None:
    remote = await connect()
    call = ToolCallSpec("echo", json.dumps({"text": "ok"}), id="call_echo")
    fake_model.enqueue(Turn.tool_calls([call]), Turn.text("Echoed."))
    events = await remote.stream(send("echo ok"))
    task, _ = final_task(events)
    assert last_state(events) == a2a.TASK_STATE_INPUT_REQUIRED
    waiting = [e.status_update.status for e in events if e.HasField("status_update")][-1]
    assert "approval of echo" in waiting.message.parts[0].text
    wanted = json_format.MessageToDict(waiting.message.parts[1].data)
    assert wanted["approvals"][0]["tool_call_id"] == "call_echo"
    reply = a2a.Message(
        message_id="approve-1",
        role=a2a.ROLE_USER,
        task_id=task.id,
        context_id=task.context_id,
        parts=[a2a.Part(data=_value({"approvals": [APPROVE_ECHO]}))],
    )
    events = await remote.stream(a2a.SendMessageRequest(message=reply))
    assert last_state(events) == a2a.TASK_STATE_COMPLETED
    assert answer_text(events) == "Echoed."


@pytest.mark.one_binding
async def test_a_reply_to_a_finished_task_is_refused(
    connect: Connect, fake_model: FakeModelServer
) -> None:
    remote = await connect()
    fake_model.enqueue(Turn.text("Done."))
    task, _ = final_task(await remote.stream(send("hi")))
    with pytest.raises(a2a_errors.UnsupportedOperationError, match="TASK_STATE_COMPLETED"):
        await remote.stream(send("more", task_id=task.id))


async def test_cancel_ends_a_working_task_canceled(
    connect: Connect, fake_model: FakeModelServer, a2a_app: AgioApp
) -> None:
    remote = await connect()
    fake_model.enqueue(Turn.hanging())
    events = remote.client.send_message(send("wait"), context=remote.context)
    first = await anext(events)
    task_id = first.task.id
    await fake_model.wait_for_requests(1)
    cancelled = await remote.client.cancel_task(
        a2a.CancelTaskRequest(id=task_id), context=remote.context
    )
    assert cancelled.status.state == a2a.TASK_STATE_CANCELED
    rest = [e async for e in events]
    assert last_state(rest) == a2a.TASK_STATE_CANCELED
    with pytest.raises(a2a_errors.TaskNotCancelableError):
        await remote.client.cancel_task(a2a.CancelTaskRequest(id=task_id), context=remote.context)


async def test_resubscribing_after_the_stream_dropped_gets_the_rest_of_the_task(
    connect: Connect, fake_model: FakeModelServer
) -> None:
    remote = await connect()
    # The model answers only once the subscription is in: the task cannot end before.
    fake_model.hold = answer = asyncio.Event()
    fake_model.enqueue(Turn.words("one two three four five"))
    events = remote.client.send_message(send("count"), context=remote.context)
    first = await anext(events)
    await cast(AsyncGenerator[a2a.StreamResponse], events).aclose()  # the stream drops
    subscription = remote.client.subscribe(
        a2a.SubscribeToTaskRequest(id=first.task.id), context=remote.context
    )
    resumed = [await anext(subscription)]  # the task as it stands
    answer.set()
    resumed += [e async for e in subscription]
    assert resumed[0].task.id == first.task.id
    assert answer_text(resumed) == "one two three four five"
    assert last_state(resumed) == a2a.TASK_STATE_COMPLETED


async def test_another_tenants_task_is_not_found(
    connect: Connect, fake_model: FakeModelServer
) -> None:
    mine = await connect()
    theirs = await connect(tenant="other")
    fake_model.enqueue(Turn.text("Mine."))
    task, _ = final_task(await mine.stream(send("hi")))
    for call in (
        theirs.client.get_task(a2a.GetTaskRequest(id=task.id), context=theirs.context),
        theirs.client.cancel_task(a2a.CancelTaskRequest(id=task.id), context=theirs.context),
    ):
        with pytest.raises(a2a_errors.TaskNotFoundError):
            await call
    with pytest.raises(a2a_errors.TaskNotFoundError):
        await theirs.stream(send("hello", context_id=task.context_id))


@pytest.mark.one_binding
async def test_another_agents_task_is_not_found_through_this_agent(
    connect: Connect, fake_model: FakeModelServer
) -> None:
    assistant = await connect()
    helper = await connect("helper")
    fake_model.enqueue(Turn.text("Hi."))
    task, _ = final_task(await assistant.stream(send("hi")))
    with pytest.raises(a2a_errors.TaskNotFoundError):
        await helper.client.get_task(a2a.GetTaskRequest(id=task.id), context=helper.context)


async def test_bad_messages_get_a2a_errors(connect: Connect) -> None:
    remote = await connect()
    with pytest.raises(a2a_errors.InvalidParamsError, match="input"):
        await remote.stream(send(""))
    file_part = a2a.SendMessageRequest(
        message=a2a.Message(
            message_id="f", role=a2a.ROLE_USER, parts=[a2a.Part(url="https://x.test/f.pdf")]
        )
    )
    with pytest.raises(a2a_errors.ContentTypeNotSupportedError):
        await remote.stream(file_part)
    with pytest.raises(a2a_errors.InvalidParamsError, match="id"):
        await remote.client.get_task(a2a.GetTaskRequest(id="bad id!"), context=remote.context)
    with pytest.raises(a2a_errors.TaskNotFoundError):
        await remote.client.get_task(a2a.GetTaskRequest(id="run_missing"), context=remote.context)
    with pytest.raises(a2a_errors.InvalidParamsError, match="context_id"):
        await remote.client.list_tasks(
            a2a.ListTasksRequest(context_id="bad id!"), context=remote.context
        )
    with pytest.raises(a2a_errors.InvalidParamsError, match="page_size"):
        await remote.client.list_tasks(a2a.ListTasksRequest(page_size=101), context=remote.context)
    with pytest.raises(a2a_errors.TaskNotFoundError):
        await remote.client.create_task_push_notification_config(
            a2a.TaskPushNotificationConfig(task_id="run_x", url="https://x.test/hook"),
            context=remote.context,
        )


@pytest.mark.one_binding
async def test_a_nul_in_a_message_is_stored_as_every_text_is(
    connect: Connect, fake_model: FakeModelServer
) -> None:
    remote = await connect()
    fake_model.enqueue(Turn.text("Fine."))
    task, _ = final_task(await remote.stream(send("a\x00b")))
    found = await remote.client.get_task(a2a.GetTaskRequest(id=task.id), context=remote.context)
    assert found.history[0].parts[0].text == "a\ufffdb"


@pytest.mark.one_binding
async def test_a_push_url_naming_an_internal_host_or_no_web_url_is_refused(
    connect: Connect, fake_model: FakeModelServer
) -> None:
    remote = await connect()
    fake_model.enqueue(Turn.text("Done."))
    task, _ = final_task(await remote.stream(send("hi")))
    for url in (
        "http://127.0.0.1:9/hook",
        "http://169.254.169.254/latest/meta-data",
        "http://[::1]/hook",
        "http://10.0.0.1/hook",
        "ftp://x.test/",
        "not a url",
        "https://" + "x" * 2_000 + ".test/",
    ):
        with pytest.raises(a2a_errors.InvalidParamsError, match="url"):
            await remote.client.create_task_push_notification_config(
                a2a.TaskPushNotificationConfig(task_id=task.id, url=url),
                context=remote.context,
            )
    listed = await remote.client.list_task_push_notification_configs(
        a2a.ListTaskPushNotificationConfigsRequest(task_id=task.id), context=remote.context
    )
    assert not listed.configs


@pytest.mark.one_binding
async def test_push_config_fields_out_of_bounds_are_refused_naming_the_field(
    connect: Connect, fake_model: FakeModelServer
) -> None:
    remote = await connect()
    fake_model.enqueue(Turn.text("Done."))
    task, _ = final_task(await remote.stream(send("hi")))
    url = "https://93.184.216.34/hook"  # public, and no name to look up
    bad: list[tuple[a2a.TaskPushNotificationConfig, str]] = [
        (a2a.TaskPushNotificationConfig(task_id=task.id, url=url, id="bad id!"), "id"),
        (a2a.TaskPushNotificationConfig(task_id=task.id, url=url, token="t" * 5000), "token"),
        (a2a.TaskPushNotificationConfig(task_id=task.id, url="https://x\x00.test/"), "url"),
        (
            a2a.TaskPushNotificationConfig(
                task_id=task.id,
                url=url,
                authentication=a2a.AuthenticationInfo(scheme="Bearer x", credentials="c"),
            ),
            "authentication.scheme",
        ),
        (
            a2a.TaskPushNotificationConfig(
                task_id=task.id,
                url=url,
                authentication=a2a.AuthenticationInfo(scheme="Bearer", credentials="c" * 5000),
            ),
            "authentication.credentials",
        ),
    ]
    for config, field in bad:
        with pytest.raises(a2a_errors.InvalidParamsError, match=field):
            await remote.client.create_task_push_notification_config(config, context=remote.context)


def _value(data: dict[str, object]) -> struct_pb2.Value:
    value = struct_pb2.Value()
    json_format.ParseDict(data, value)
    return value


def test_list_filters_refuse_what_no_task_state_or_time_is() -> None:
    assert task_filters(a2a.ListTasksRequest()) == (frozenset(), None)
    failed = task_filters(a2a.ListTasksRequest(status=a2a.TASK_STATE_FAILED))
    assert failed == (frozenset({RunStatus.FAILED, RunStatus.INTERRUPTED}), None)
    assert task_filters(a2a.ListTasksRequest(status=a2a.TASK_STATE_AUTH_REQUIRED))[0] is None
    with pytest.raises(a2a_errors.InvalidParamsError, match="status"):
        task_filters(a2a.ListTasksRequest(status=cast(a2a.TaskState, 99)))
    for seconds, nanos in ((2**62, 0), (-(2**62), 0), (0, -1)):
        late = a2a.ListTasksRequest()
        late.status_timestamp_after.seconds = seconds
        late.status_timestamp_after.nanos = nanos
        with pytest.raises(a2a_errors.InvalidParamsError, match="status_timestamp_after"):
            task_filters(late)
