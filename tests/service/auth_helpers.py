"""What the authentication tests share: a server started with an `auth` section, the refusal
a call gets, and a settings factory whose agent can say who its run serves."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from agio_grpc.client import AgioClient, AgioError
from agio_grpc.config import AgentConfig, LimitsConfig, Settings
from agio_grpc.service.app import AgioApp
from tests.service.conftest import make_settings

WHOAMI = "Please use the whoami tool"


def auth_settings(database_url: str, model_url: str, **overrides: Any) -> Settings:
    """The service tests' settings, with the `whoami` tool on the agent."""
    values: dict[str, Any] = {
        "tool_modules": ["tests.service.sample_tools", "tests.service.identity_tools"],
        "agents": [
            AgentConfig(
                name="assistant",
                instructions="You are a test assistant.",
                tools=["calculate", "whoami"],
                limits=LimitsConfig(max_steps=5, tool_timeout_s=2.0),
            )
        ],
    }
    return make_settings(database_url, model_url, **(values | overrides))


@contextlib.asynccontextmanager
async def serving(settings: Settings) -> AsyncIterator[AgioApp]:
    app = await AgioApp.start(settings)
    try:
        yield app
    finally:
        await app.stop(grace=0)


def bearer(credential: str) -> tuple[str, str]:
    return ("authorization", f"Bearer {credential}")


async def refusal(address: str, *metadata: tuple[str, str]) -> AgioError:
    """The error a unary call (ListAgents) made with `metadata` gets."""
    async with AgioClient(address, metadata=metadata) as client:
        with pytest.raises(AgioError) as refused:
            await client.list_agents()
    return refused.value


def unauthenticated(error: AgioError) -> str:
    """The ErrorInfo reason of an UNAUTHENTICATED refusal (anything else fails the test)."""
    assert error.code is grpc.StatusCode.UNAUTHENTICATED, error
    assert error.domain == "agio-grpc"
    return error.reason


async def whoami(address: str, *metadata: tuple[str, str]) -> str:
    """`tenant|subject|mode` as the run's tool sees its caller (a streamed Run)."""
    async with AgioClient(address, metadata=metadata) as client:
        result = await client.run_to_end(WHOAMI)
    [tool_step] = [step for step in result.steps if step.name == "whoami"]
    return tool_step.content
