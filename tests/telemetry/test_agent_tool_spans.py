"""A local agent called as a tool (`agents:`): its child run's spans nest under the parent's
`execute_tool` span, in the parent's trace; an A2A call on the gRPC port is a server span
as an agio.v1 call is."""

from __future__ import annotations

import json
from pathlib import Path

import grpc
import httpx
import pytest
from a2a.types import a2a_pb2, a2a_pb2_grpc

from agio_grpc.client import AgioClient
from agio_grpc.config import AgentConfig
from agio_grpc.service.app import AgioApp
from agio_grpc.testing import FakeModelServer, ToolCallSpec, Turn
from tests.service.conftest import make_settings
from tests.sqlite import sqlite_at
from tests.telemetry.conftest import Traced
from tests.telemetry.test_span_tree import children, one


async def test_a_child_runs_spans_nest_under_the_tool_call_span(
    tmp_path: Path, fake_model: FakeModelServer, traced: Traced
) -> None:
    settings = make_settings(
        sqlite_at(tmp_path / "agio.db"),
        fake_model.base_url,
        default_agent="boss",
        agents=[
            AgentConfig(name="boss", tools=[], agents=["worker"]),
            AgentConfig(name="worker", tools=[]),
        ],
    )
    app = await AgioApp.start(settings, traced.telemetry)
    try:
        fake_model.enqueue(
            Turn.tool_calls([ToolCallSpec("worker", json.dumps({"input": "hi"}))]),
            Turn.text("Hello."),
            Turn.text("Worker said hello."),
        )
        async with AgioClient(app.address) as client:
            result = await client.run_to_end("Ask the worker")
    finally:
        await app.stop(grace=0)
    await traced.open_spans.all_ended()
    spans = traced.spans()
    tool = one(spans, "execute_tool worker")
    child = one(spans, "invoke_agent worker")
    assert children(spans, tool) == [child]
    assert child.context is not None
    assert format(child.context.trace_id, "032x") == result.run.trace_id
    assert [s.name for s in children(spans, child)] == ["chat fake-model"]


async def test_an_a2a_grpc_call_is_a_server_span(app: AgioApp, traced: Traced) -> None:
    async with grpc.aio.insecure_channel(app.address) as channel:
        stub = a2a_pb2_grpc.A2AServiceStub(channel)  # type: ignore[no-untyped-call]
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.GetTask(a2a_pb2.GetTaskRequest(id="run_missing"))
    assert refused.value.code() is grpc.StatusCode.NOT_FOUND
    await traced.open_spans.all_ended()
    [server] = [s for s in traced.spans() if s.name == "lf.a2a.v1.A2AService/GetTask"]
    assert (
        dict(server.attributes or {})["rpc.grpc.status_code"] == grpc.StatusCode.NOT_FOUND.value[0]
    )


async def test_an_a2a_http_call_is_a_server_span_parenting_its_run(
    tmp_path: Path, fake_model: FakeModelServer, traced: Traced
) -> None:
    settings = make_settings(
        sqlite_at(tmp_path / "agio.db"),
        fake_model.base_url,
        http_address="127.0.0.1:0",
    )
    app = await AgioApp.start(settings, traced.telemetry)
    trace_id = "0af7651916cd43dd8448eb211c80319c"
    try:
        assert app.http is not None
        fake_model.enqueue(Turn.text("Hi."))
        async with httpx.AsyncClient(base_url=f"http://{app.http.address}") as http:
            response = await http.post(
                "/a2a/assistant/",
                json={
                    "jsonrpc": "2.0",
                    "id": 1,
                    "method": "SendMessage",
                    "params": {
                        "message": {
                            "messageId": "m1",
                            "role": "ROLE_USER",
                            "parts": [{"text": "hi"}],
                        }
                    },
                },
                headers={
                    "a2a-version": "1.0",
                    "traceparent": f"00-{trace_id}-b7ad6b7169203331-01",
                },
            )
        assert response.status_code == 200
    finally:
        await app.stop(grace=0)
    await traced.open_spans.all_ended()
    spans = traced.spans()
    server = one(spans, "POST /a2a/{agent}/")
    assert server.context is not None
    assert format(server.context.trace_id, "032x") == trace_id
    assert dict(server.attributes or {})["http.response.status_code"] == 200
    assert [s.name for s in children(spans, server)] == ["invoke_agent assistant"]
