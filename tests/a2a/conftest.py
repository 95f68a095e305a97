"""A2A fixtures: the service with its HTTP listener and API keys on the backend under test,
and the official `a2a-sdk` client over each of the three bindings, created from the card it
resolves over HTTP as any A2A client would."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc
import httpx
import pytest
import uvicorn
from a2a.client import Client, ClientCallContext, ClientConfig, ClientFactory
from a2a.client.card_resolver import A2ACardResolver
from a2a.types import a2a_pb2 as a2a

from agio_grpc.config import AgentConfig, LimitsConfig, ToolOptionsConfig
from agio_grpc.service.app import AgioApp
from agio_grpc.store.keys import KeyStore
from agio_grpc.testing import FakeModelServer
from tests.service.auth_helpers import serving
from tests.service.conftest import make_settings

BINDINGS = ("JSONRPC", "HTTP+JSON", "GRPC")
TENANT = "acme"


def a2a_settings(store_url: str, model_url: str, **overrides: Any) -> Any:
    values: dict[str, Any] = {
        "http_address": "127.0.0.1:0",
        "auth": {"mode": "api_key", "api_key": {"cache_s": 0}},
        "agents": [
            AgentConfig(
                name="assistant",
                description="Answers questions and does sums.",
                instructions="You are a test assistant. SECRET-INSTRUCTIONS",
                tools=["calculate", "echo", "hang"],
                agents=["helper"],
                tool_options={"echo": ToolOptionsConfig(needs_approval=True)},
                limits=LimitsConfig(max_steps=5, tool_timeout_s=5.0),
            ),
            AgentConfig(name="helper", instructions="You help.", tools=["calculate"]),
        ],
    }
    return make_settings(store_url, model_url, **(values | overrides))


@pytest.fixture
async def fake_model() -> AsyncIterator[FakeModelServer]:
    async with FakeModelServer() as server:
        yield server


@pytest.fixture
async def a2a_app(store_url: str, fake_model: FakeModelServer) -> AsyncIterator[AgioApp]:
    async with serving(a2a_settings(store_url, fake_model.base_url)) as app:
        yield app


@dataclass
class Remote:
    """An agent as an A2A client sees it: the SDK's client and the caller's credential."""

    client: Client
    card: a2a.AgentCard
    token: str

    @property
    def context(self) -> ClientCallContext:
        return ClientCallContext(service_parameters={"authorization": f"Bearer {self.token}"})

    async def stream(self, request: a2a.SendMessageRequest) -> list[a2a.StreamResponse]:
        return [event async for event in self.client.send_message(request, context=self.context)]


def base_url(app: AgioApp) -> str:
    assert app.http is not None
    return f"http://{app.http.address}"


Connect = Callable[..., Awaitable[Remote]]


@pytest.fixture(params=BINDINGS)
def binding(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On PostgreSQL, one binding: what the store does is the same under each (SQLite runs
    all three); a test marked `one_binding` runs over JSON-RPC only."""
    kept, dropped = [], []
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        one = params.get("backend") == "postgres" or item.get_closest_marker("one_binding")
        if one and params.get("binding", "JSONRPC") != "JSONRPC":
            dropped.append(item)
        else:
            kept.append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


@pytest.fixture
async def connect(a2a_app: AgioApp, keys: KeyStore, binding: str) -> AsyncIterator[Connect]:
    """Makes a client of an agent of the service over `binding`, as `tenant`'s caller."""
    opened: list[Client] = []
    http = httpx.AsyncClient(timeout=30)
    channels: list[grpc.aio.Channel] = []

    def channel(url: str) -> grpc.aio.Channel:
        channels.append(grpc.aio.insecure_channel(url))
        return channels[-1]

    async def make(agent: str = "", tenant: str = TENANT, streaming: bool = True) -> Remote:
        issued = await keys.create(tenant)
        path = f"/a2a/{agent}" if agent else ""
        card = await A2ACardResolver(http, base_url(a2a_app) + path).get_agent_card()
        config = ClientConfig(
            streaming=streaming,
            supported_protocol_bindings=[binding],
            use_client_preference=True,
            httpx_client=http,
            grpc_channel_factory=channel,
        )
        client = ClientFactory(config).create(card)
        opened.append(client)
        return Remote(client, card, issued.token)

    try:
        yield make
    finally:
        await http.aclose()
        for open_channel in channels:
            await open_channel.close()


def user_message(text: str = "", **fields: Any) -> a2a.Message:
    parts = [a2a.Part(text=text)] if text else []
    fields.setdefault("message_id", f"msg-{uuid.uuid4().hex}")
    return a2a.Message(role=a2a.ROLE_USER, parts=parts, **fields)


def send(text: str = "", **fields: Any) -> a2a.SendMessageRequest:
    return a2a.SendMessageRequest(message=user_message(text, **fields))


def final_task(events: list[a2a.StreamResponse]) -> tuple[a2a.Task, str]:
    """The task a stream started with, its last state's name, and the answer text it
    streamed (every artifact chunk of `answer` artifacts, in order)."""
    assert events[0].HasField("task"), events[0]
    return events[0].task, answer_text(events)


def answer_text(events: list[a2a.StreamResponse]) -> str:
    text = ""
    for event in events:
        if event.HasField("artifact_update"):
            update = event.artifact_update
            if update.artifact.name == "answer":
                text += "".join(p.text for p in update.artifact.parts)
    return text


def last_state(events: list[a2a.StreamResponse]) -> int:
    states = [e.status_update.status.state for e in events if e.HasField("status_update")]
    return states[-1]


@contextlib.asynccontextmanager
async def on_uvicorn(app_at: Callable[[str], Any]) -> AsyncIterator[str]:
    """The ASGI application `app_at(url)` makes, served by uvicorn on 127.0.0.1 at a port of
    its own, `url` (`http://127.0.0.1:PORT/`) yielded while it serves."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{sock.getsockname()[1]}/"
    server = uvicorn.Server(uvicorn.Config(app_at(url), log_level="warning", lifespan="off"))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    for _ in range(500):
        if server.started:
            break
        await asyncio.sleep(0.01)
    try:
        yield url
    finally:
        server.should_exit = True
        await task
        sock.close()
