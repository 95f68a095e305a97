"""A2A push notifications, with the official `a2a-sdk` client over each binding on both
backends: configs stored per task (made, read, listed, deleted; another tenant's not
found; at most ten), state changes POSTed to a real receiver on 127.0.0.1 (uvicorn) with
the token and credentials, retried on 5xx, and internal addresses refused unless allowed."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from a2a.client import ClientConfig, ClientFactory
from a2a.client.card_resolver import A2ACardResolver
from a2a.types import a2a_pb2 as a2a
from a2a.utils import errors as a2a_errors
from google.protobuf import json_format, struct_pb2
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from agio_grpc.client import AgioClient
from agio_grpc.service.app import AgioApp
from agio_grpc.testing import FakeModelServer, ToolCallSpec, Turn
from tests.a2a.conftest import (
    Connect,
    Remote,
    a2a_settings,
    base_url,
    final_task,
    on_uvicorn,
    send,
)
from tests.roles import open_roles
from tests.service.auth_helpers import bearer, serving


@dataclass
class Receiver:
    """The webhook: what it was sent, and how many first requests it fails with 503."""

    url: str
    received: list[tuple[dict[str, str], dict[str, Any]]] = field(default_factory=list)
    failures: int = 0
    attempts: int = 0

    async def handle(self, request: Request) -> Response:
        self.attempts += 1
        if self.failures:
            self.failures -= 1
            return Response(status_code=503)
        self.received.append((dict(request.headers), await request.json()))
        return Response(status_code=204)

    async def wait_for(self, count: int) -> None:
        for _ in range(500):
            if len(self.received) >= count:
                return
            await asyncio.sleep(0.01)
        raise AssertionError(f"{len(self.received)} notifications, not {count}")


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    found = Receiver("")

    def app_at(url: str) -> Starlette:
        found.url = f"{url}hook"
        return Starlette(routes=[Route("/hook", found.handle, methods=["POST"])])

    async with on_uvicorn(app_at):
        yield found


@pytest.fixture
async def a2a_app(store_url: str, fake_model: FakeModelServer) -> AsyncIterator[AgioApp]:
    """The A2A service, allowed to notify this machine's receiver."""
    allowed = {"push_allow_private_hosts": True}
    settings = a2a_settings(store_url, fake_model.base_url, a2a=allowed)
    async with serving(settings) as app:
        yield app


def config(url: str, **fields: Any) -> a2a.TaskPushNotificationConfig:
    made = a2a.TaskPushNotificationConfig(url=url, token="tok-1", **fields)
    made.authentication.scheme = "Bearer"
    made.authentication.credentials = "hook-secret"
    return made


@pytest.mark.one_binding
async def test_a_background_task_notifies_working_then_its_answer(
    connect: Connect, fake_model: FakeModelServer, receiver: Receiver
) -> None:
    remote = await connect(streaming=False)
    fake_model.enqueue(Turn.words("all done here", chunk_delay=0.05))
    request = send("go")
    request.configuration.return_immediately = True
    request.configuration.task_push_notification_config.CopyFrom(config(receiver.url))
    [event] = await remote.stream(request)
    assert event.task.status.state in (a2a.TASK_STATE_SUBMITTED, a2a.TASK_STATE_WORKING)
    await receiver.wait_for(2)
    (headers, working), (_, done) = receiver.received
    assert headers["x-a2a-notification-token"] == "tok-1"
    assert headers["authorization"] == "Bearer hook-secret"
    assert working["statusUpdate"]["status"]["state"] == "TASK_STATE_WORKING"
    assert done["task"]["id"] == event.task.id
    assert done["task"]["status"]["state"] == "TASK_STATE_COMPLETED"
    assert done["task"]["artifacts"][0]["parts"][0]["text"] == "all done here"


async def test_configs_are_made_read_listed_and_deleted_per_task(
    connect: Connect, fake_model: FakeModelServer, receiver: Receiver
) -> None:
    remote = await connect()
    theirs = await connect(tenant="other")
    fake_model.enqueue(Turn.text("Done."))
    task, _ = final_task(await remote.stream(send("hi")))
    made = await remote.client.create_task_push_notification_config(
        config(receiver.url, task_id=task.id, id="hook-a"), context=remote.context
    )
    assert made.id == "hook-a"
    assert made.task_id == task.id
    unnamed = await remote.client.create_task_push_notification_config(
        config(receiver.url, task_id=task.id), context=remote.context
    )
    assert unnamed.id
    got = await remote.client.get_task_push_notification_config(
        a2a.GetTaskPushNotificationConfigRequest(task_id=task.id, id="hook-a"),
        context=remote.context,
    )
    assert got.url == receiver.url
    assert got.authentication.credentials == "hook-secret"
    listed = await remote.client.list_task_push_notification_configs(
        a2a.ListTaskPushNotificationConfigsRequest(task_id=task.id), context=remote.context
    )
    assert {c.id for c in listed.configs} == {"hook-a", unnamed.id}
    with pytest.raises(a2a_errors.TaskNotFoundError):
        await theirs.client.get_task_push_notification_config(
            a2a.GetTaskPushNotificationConfigRequest(task_id=task.id, id="hook-a"),
            context=theirs.context,
        )
    with pytest.raises(a2a_errors.TaskNotFoundError):
        await theirs.client.create_task_push_notification_config(
            config(receiver.url, task_id=task.id), context=theirs.context
        )
    await remote.client.delete_task_push_notification_config(
        a2a.DeleteTaskPushNotificationConfigRequest(task_id=task.id, id="hook-a"),
        context=remote.context,
    )
    with pytest.raises(a2a_errors.TaskNotFoundError):
        await remote.client.delete_task_push_notification_config(
            a2a.DeleteTaskPushNotificationConfigRequest(task_id=task.id, id="hook-a"),
            context=remote.context,
        )
    for index in range(9):
        await remote.client.create_task_push_notification_config(
            config(receiver.url, task_id=task.id, id=f"more-{index}"), context=remote.context
        )
    with pytest.raises(a2a_errors.InvalidRequestError, match="10 push notification configs"):
        await remote.client.create_task_push_notification_config(
            config(receiver.url, task_id=task.id, id="one-too-many"), context=remote.context
        )


@pytest.mark.one_binding
async def test_a_config_on_a_working_task_gets_its_end_and_5xx_are_retried(
    connect: Connect, fake_model: FakeModelServer, receiver: Receiver
) -> None:
    remote = await connect()
    receiver.failures = 2
    fake_model.enqueue(Turn.words("slow words to wait for", chunk_delay=0.1))
    events = remote.client.send_message(send("go"), context=remote.context)
    first = await anext(events)
    await remote.client.create_task_push_notification_config(
        config(receiver.url, task_id=first.task.id), context=remote.context
    )
    rest = [event async for event in events]
    assert rest
    await receiver.wait_for(1)  # its end (its start, long past, is not notified)
    states = [
        body.get("task", body.get("statusUpdate", {})).get("status", {}).get("state")
        for _, body in receiver.received
    ]
    assert states == ["TASK_STATE_COMPLETED"]
    assert receiver.attempts == 3  # two 503s, then delivered


@pytest.mark.one_binding
async def test_a_tasks_configs_go_with_its_session(
    connect: Connect,
    fake_model: FakeModelServer,
    receiver: Receiver,
    a2a_app: AgioApp,
    store_url: str,
) -> None:
    remote = await connect()
    fake_model.enqueue(Turn.text("Done."))
    task, _ = final_task(await remote.stream(send("hi")))
    await remote.client.create_task_push_notification_config(
        config(receiver.url, task_id=task.id, id="hook"), context=remote.context
    )
    store = await open_roles(store_url)
    try:
        assert [c.id for c in await store.push_configs().for_run(task.id)] == ["hook"]
        async with AgioClient(a2a_app.address, metadata=[bearer(remote.token)]) as client:
            await client.delete_session(task.context_id)
        assert await store.push_configs().for_run(task.id) == []
    finally:
        await store.close()


async def test_a_restarted_server_takes_up_the_watch_of_a_waiting_task(
    store_url: str, fake_model: FakeModelServer, receiver: Receiver
) -> None:
    settings = a2a_settings(store_url, fake_model.base_url, a2a={"push_allow_private_hosts": True})
    call = ToolCallSpec("echo", json.dumps({"text": "ok"}), id="call_echo")
    fake_model.enqueue(Turn.tool_calls([call]), Turn.text("Echoed."))
    async with serving(settings) as first:
        remote = await jsonrpc_agent(first)
        events = await remote.stream(send("echo ok"))
        task, _ = final_task(events)
        await remote.client.create_task_push_notification_config(
            config(receiver.url, task_id=task.id), context=remote.context
        )
        await receiver.wait_for(1)  # INPUT_REQUIRED, from the watch the config started
        await remote.client.close()
    async with serving(settings) as second:
        await receiver.wait_for(2)  # the new server watches the waiting task again
        remote = await jsonrpc_agent(second)
        reply = a2a.Message(
            message_id="approve",
            role=a2a.ROLE_USER,
            task_id=task.id,
            parts=[
                a2a.Part(
                    data=struct({"approvals": [{"tool_call_id": "call_echo", "approved": True}]})
                )
            ],
        )
        await remote.stream(a2a.SendMessageRequest(message=reply))
        await receiver.wait_for(4)  # and the reply's stretch: working, then completed
        await remote.client.close()
    states = [
        body.get("task", body.get("statusUpdate", {})).get("status", {}).get("state")
        for _, body in receiver.received
    ]
    assert states == [
        "TASK_STATE_INPUT_REQUIRED",
        "TASK_STATE_INPUT_REQUIRED",
        "TASK_STATE_WORKING",
        "TASK_STATE_COMPLETED",
    ]


APPROVE = {"tool_call_id": "call_echo", "approved": True}


async def jsonrpc_agent(app: AgioApp) -> Remote:
    """A JSON-RPC client of the app's default agent, with a key of its own."""
    store = await open_roles(app.settings.database_url)
    try:
        issued = await store.keys().create("acme")
    finally:
        await store.close()
    http = httpx.AsyncClient(timeout=30)
    card = await A2ACardResolver(http, base_url(app)).get_agent_card()
    client = ClientFactory(ClientConfig(httpx_client=http)).create(card)
    return Remote(client, card, issued.token)


def struct(data: dict[str, Any]) -> struct_pb2.Value:
    value = struct_pb2.Value()
    json_format.ParseDict(data, value)
    return value
