"""A tool's `on_error` from the config, end to end: a `stop` tool's failure ends the `Run`
stream with STOP_REASON_TOOL_ERROR (status OK, `run_failed`), its error stored as the call's
result; the setting refuses anything but `continue` or `stop`."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from google.protobuf.json_format import MessageToDict
from pydantic import ValidationError

from agio_grpc.client import AgioClient
from agio_grpc.config import AgentConfig, LimitsConfig, Settings, ToolOptionsConfig
from agio_grpc.testing import FakeModelServer, ToolCallSpec, Turn
from agio_grpc.v1 import resources_pb2
from tests.service.auth_helpers import serving
from tests.service.conftest import make_settings
from tests.sqlite import sqlite_at

TOOLS = ["current_time", "calculate", "echo", "explode"]


def payments_agent(**tool_options: ToolOptionsConfig) -> AgentConfig:
    return AgentConfig(
        name="assistant",
        model="fake-model",
        tools=TOOLS,
        tool_options=tool_options,
        limits=LimitsConfig(max_steps=5, tool_timeout_s=2.0),
    )


@pytest.fixture
async def strict_client(tmp_path: Path, fake_model: FakeModelServer) -> AsyncIterator[AgioClient]:
    agent = payments_agent(explode=ToolOptionsConfig(on_error="stop"))
    settings = make_settings(sqlite_at(tmp_path / "agio.db"), fake_model.base_url, agents=[agent])
    async with serving(settings) as app, AgioClient(app.address) as client:
        yield client


async def test_a_stop_tools_failure_ends_the_run_tool_error(
    strict_client: AgioClient, fake_model: FakeModelServer
) -> None:
    fake_model.enqueue(
        Turn.tool_calls(
            [
                ToolCallSpec("explode", '{"message": "card declined"}', id="call_bad"),
                ToolCallSpec("echo", '{"text": "still answered"}', id="call_ok"),
            ]
        ),
        Turn.text("never asked for"),
    )
    result = await strict_client.run_to_end("refund order 7")

    signal = result.stop_signal
    assert signal.reason == resources_pb2.STOP_REASON_TOOL_ERROR
    assert (signal.source, signal.retryable) == ("tool:explode", False)
    assert MessageToDict(signal.context) == {"tool_name": "explode", "tool_call_id": "call_bad"}
    assert result.run.status == resources_pb2.RUN_STATUS_FAILED
    steps = await strict_client.list_steps(result.session_id)
    tools = [step for step in steps if step.role == resources_pb2.ROLE_TOOL]
    assert [(t.tool_call_id, t.is_error) for t in tools] == [("call_bad", True), ("call_ok", False)]
    assert all(t.metrics.duration_ms >= t.metrics.tool_exec_time_ms for t in tools)
    assert len(fake_model.requests) == 1


def test_on_error_is_continue_or_stop() -> None:
    assert ToolOptionsConfig().on_error == "continue"
    with pytest.raises(ValidationError, match=r"on_error\n  Input should be 'continue' or 'stop'"):
        Settings.model_validate(
            {
                "agents": [
                    {
                        "name": "assistant",
                        "tools": ["calculate"],
                        "tool_options": {"calculate": {"on_error": "retry"}},
                    }
                ]
            }
        )


def test_tool_options_name_only_the_agents_tools() -> None:
    with pytest.raises(ValidationError, match="tool_options names 'refund', not among"):
        payments_agent(refund=ToolOptionsConfig(on_error="stop"))
    agent = payments_agent(
        explode=ToolOptionsConfig(on_error="stop"), echo=ToolOptionsConfig(on_error="continue")
    )
    assert agent.stop_on_error_tools() == ["explode"]
