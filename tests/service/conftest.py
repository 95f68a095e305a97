"""Fixtures for the service: the real server on 127.0.0.1:0 over a real store, the real
openai client inside it talking HTTP to the fake model, and a real gRPC client."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from agio_grpc.client import AgioClient
from agio_grpc.config import AgentConfig, LimitsConfig, Settings
from agio_grpc.service.app import AgioApp
from agio_grpc.testing import FakeModelServer
from tests.service.tenancy import tenant_interceptors, tenant_metadata

AppFactory = Callable[..., Any]


def make_settings(database_url: str, model_url: str, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "listen_address": "127.0.0.1:0",
        "database_url": database_url,
        "openai_base_url": model_url,
        "openai_api_key": "test-key",
        "default_agent": "assistant",
        "tool_modules": ["tests.service.sample_tools"],
        "agents": [
            AgentConfig(
                name="assistant",
                model="fake-model",
                instructions="You are a test assistant.",
                tools=["current_time", "calculate", "echo", "slow_echo", "explode", "hang"],
                limits=LimitsConfig(max_steps=5, tool_timeout_s=2.0),
            )
        ],
    }
    values.update(overrides)
    return Settings(**values)


@pytest.fixture
async def fake_model() -> AsyncIterator[FakeModelServer]:
    async with FakeModelServer() as server:
        yield server


@pytest.fixture
async def app(sqlite_url: str, fake_model: FakeModelServer) -> AsyncIterator[AgioApp]:
    """The service on SQLite in tmp_path (agio.db)."""
    settings = make_settings(sqlite_url, fake_model.base_url)
    started = await AgioApp.start(settings)
    try:
        yield started
    finally:
        await started.stop(grace=0)


@pytest.fixture
async def client(app: AgioApp) -> AsyncIterator[AgioClient]:
    async with AgioClient(app.address) as connected:
        yield connected


@pytest.fixture
async def backend_app(store_url: str, fake_model: FakeModelServer) -> AsyncIterator[AgioApp]:
    """The service on the backend under test (`store_url`: SQLite, then PostgreSQL)."""
    started = await AgioApp.start(make_settings(store_url, fake_model.base_url))
    try:
        yield started
    finally:
        await started.stop(grace=0)


@pytest.fixture
async def backend_client(backend_app: AgioApp) -> AsyncIterator[AgioClient]:
    async with AgioClient(backend_app.address) as connected:
        yield connected


@pytest.fixture
async def tenant_app(store_url: str, fake_model: FakeModelServer) -> AsyncIterator[AgioApp]:
    """The service on the backend under test, each call in the tenant `tenant_metadata`
    gave it (tests/service/tenancy.py)."""
    settings = make_settings(store_url, fake_model.base_url)
    started = await AgioApp.start(settings, interceptors=tenant_interceptors())
    try:
        yield started
    finally:
        await started.stop(grace=0)


@pytest.fixture
async def tenant_client(
    tenant_app: AgioApp,
) -> AsyncIterator[Callable[[str], AgioClient]]:
    """Clients of `tenant_app`, one per tenant: `tenant_client("tenant-a")`."""
    clients: dict[str, AgioClient] = {}

    def client_of(tenant: str) -> AgioClient:
        if tenant not in clients:
            clients[tenant] = AgioClient(tenant_app.address, metadata=tenant_metadata(tenant))
        return clients[tenant]

    try:
        yield client_of
    finally:
        for connected in clients.values():
            await connected.close()
