"""The span tree of a run that calls a tool of an MCP server (stdio): the call is an
`execute_tool` span under the run's `invoke_agent`, like any tool's, with the MCP attributes
of the semantic conventions, and its step keeps the span's ids."""

from __future__ import annotations

import sys
from pathlib import Path

from agio_grpc.client import AgioClient
from agio_grpc.config import AgentConfig, McpServerConfig
from agio_grpc.service.app import AgioApp
from agio_grpc.testing import FakeModelServer
from agio_grpc.v1 import resources_pb2
from tests.mcp.conftest import TOOLBOX
from tests.service.conftest import make_settings
from tests.sqlite import sqlite_at
from tests.telemetry.conftest import make_traced
from tests.telemetry.test_span_tree import RUN_SPAN, attrs, children, hex_span, one


async def test_an_mcp_tool_call_is_an_execute_tool_span_under_the_run(tmp_path: Path) -> None:
    traced = make_traced()
    toolbox = McpServerConfig(name="toolbox", command=sys.executable, args=[str(TOOLBOX)])
    async with FakeModelServer() as fake_model:
        settings = make_settings(
            sqlite_at(tmp_path / "agio.db"),
            fake_model.base_url,
            mcp_servers=[toolbox],
            agents=[AgentConfig(name="assistant", tools=["toolbox.hello"])],
        )
        app = await AgioApp.start(settings, traced.telemetry)
        try:
            async with AgioClient(app.address) as client:
                events = [event async for event in client.run("use the toolbox__hello tool")]
                run = events[-1].run_completed.run
                steps = await client.list_steps(run.session_id)
            await traced.open_spans.all_ended()
        finally:
            await app.stop(grace=0)
    spans = traced.spans()
    server = one(spans, RUN_SPAN)
    agent = one(spans, "invoke_agent assistant")
    tool = one(spans, "execute_tool toolbox__hello")
    assert children(spans, server) == [agent]
    assert [span.name for span in children(spans, agent)] == [
        "chat fake-model",
        "execute_tool toolbox__hello",
        "chat fake-model",
    ]
    assert {
        key: attrs(tool).get(key)
        for key in (
            "gen_ai.operation.name",
            "gen_ai.tool.name",
            "mcp.method.name",
            "mcp.protocol.version",
            "network.transport",
            "agio.mcp.server",
            "agio.mcp.tool",
        )
    } == {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "toolbox__hello",
        "mcp.method.name": "tools/call",
        "mcp.protocol.version": "2025-11-25",
        "network.transport": "pipe",
        "agio.mcp.server": "toolbox",
        "agio.mcp.tool": "hello",
    }
    (tool_step,) = [step for step in steps if step.role == resources_pb2.ROLE_TOOL]
    assert tool_step.span_id == hex_span(tool)
    assert not tool_step.is_error
