"""The span tree of a run, end to end: a real gRPC client (with its own trace) -> the server
-> the real openai client -> the fake model, recorded by an in-memory exporter.

    agio.v1.AgentService/Run (SERVER, child of the caller's span)
      invoke_agent assistant
        chat fake-model               (one per model call)
        execute_tool <tool>           (one per server tool call)
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanKind, StatusCode

from agio_grpc.client import AgioClient, AgioError
from agio_grpc.service.app import AgioApp
from agio_grpc.testing import FakeModelServer, ToolCallSpec, Turn, UsageSpec
from agio_grpc.v1 import agent_service_pb2, events_pb2, resources_pb2
from tests.service.conftest import make_settings
from tests.sqlite import sqlite_at
from tests.telemetry.conftest import Traced, make_traced

StepEvent = events_pb2.StepEvent
RUN_SPAN = "agio.v1.AgentService/Run"


async def drain(events: AsyncIterator[StepEvent]) -> list[StepEvent]:
    return [event async for event in events]


def final_run(events: list[StepEvent]) -> resources_pb2.Run:
    last = events[-1]
    kind = last.WhichOneof("event")
    assert kind in ("run_completed", "run_failed")
    run: resources_pb2.Run = getattr(last, kind).run
    return run


def hex_trace(span: ReadableSpan) -> str:
    assert span.context is not None
    return trace.format_trace_id(span.context.trace_id)


def hex_span(span: ReadableSpan) -> str:
    assert span.context is not None
    return trace.format_span_id(span.context.span_id)


def one(spans: Sequence[ReadableSpan], name: str) -> ReadableSpan:
    found = [span for span in spans if span.name == name]
    assert len(found) == 1, [span.name for span in spans]
    return found[0]


def children(spans: Sequence[ReadableSpan], parent: ReadableSpan) -> list[ReadableSpan]:
    assert parent.context is not None
    return sorted(
        (s for s in spans if s.parent is not None and s.parent.span_id == parent.context.span_id),
        key=lambda s: s.start_time or 0,
    )


def attrs(span: ReadableSpan) -> dict[str, object]:
    return dict(span.attributes or {})


async def test_a_plain_reply_is_a_server_span_an_agent_span_and_a_chat_span(
    client: AgioClient, fake_model: FakeModelServer, traced: Traced
) -> None:
    fake_model.enqueue(
        Turn.text("Hello there.", chunks=3, usage=UsageSpec(prompt_tokens=12, completion_tokens=3))
    )
    caller = traced.tracer_provider.get_tracer("test")
    with caller.start_as_current_span("caller") as caller_span:
        events = await drain(client.run("Hi!"))
    await traced.open_spans.all_ended()
    run = final_run(events)
    spans = traced.spans()
    assert sorted(s.name for s in spans) == sorted(
        ["caller", RUN_SPAN, "invoke_agent assistant", "chat fake-model"]
    )
    server = one(spans, RUN_SPAN)
    agent = one(spans, "invoke_agent assistant")
    chat = one(spans, "chat fake-model")
    caller_id = caller_span.get_span_context().span_id
    assert server.parent is not None
    assert server.parent.span_id == caller_id
    assert server.kind is SpanKind.SERVER
    assert attrs(server)["rpc.grpc.status_code"] == 0
    assert children(spans, server) == [agent]
    assert children(spans, agent) == [chat]
    assert {hex_trace(s) for s in spans} == {run.trace_id}

    assert {
        key: attrs(agent)[key]
        for key in (
            "gen_ai.operation.name",
            "gen_ai.agent.name",
            "gen_ai.conversation.id",
            "gen_ai.request.model",
            "agio.run.id",
            "agio.session.id",
            "agio.step.sequence",
            "agio.stop.reason",
            "agio.run.status",
            "gen_ai.usage.input_tokens",
            "gen_ai.usage.output_tokens",
        )
    } == {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.agent.name": "assistant",
        "gen_ai.conversation.id": run.session_id,
        "gen_ai.request.model": "fake-model",
        "agio.run.id": run.id,
        "agio.session.id": run.session_id,
        "agio.step.sequence": 1,
        "agio.stop.reason": "COMPLETED",
        "agio.run.status": "COMPLETED",
        "gen_ai.usage.input_tokens": 12,
        "gen_ai.usage.output_tokens": 3,
    }
    assert agent.status.status_code is StatusCode.UNSET
    chat_attrs = attrs(chat)
    assert chat.kind is SpanKind.CLIENT
    assert chat_attrs["gen_ai.operation.name"] == "chat"
    assert chat_attrs["gen_ai.provider.name"] == "openai_compatible"
    assert chat_attrs["gen_ai.request.model"] == "fake-model"
    assert chat_attrs["gen_ai.response.model"] == "fake-model"
    assert chat_attrs["gen_ai.response.finish_reasons"] == ("stop",)
    assert (chat_attrs["gen_ai.usage.input_tokens"], chat_attrs["gen_ai.usage.output_tokens"]) == (
        12,
        3,
    )
    assert isinstance(chat_attrs["gen_ai.response.time_to_first_chunk"], float)
    assert str(chat_attrs["gen_ai.response.id"]).startswith("chatcmpl-")
    assert chat_attrs["gen_ai.conversation.id"] == run.session_id
    assert chat_attrs["agio.step.sequence"] == 2
    assert chat_attrs["server.address"] == "127.0.0.1"

    # Every stored step points at its span; the run keeps its trace.
    steps = await client.list_steps(run.session_id)
    assert [(s.trace_id, s.span_id) for s in steps] == [
        (run.trace_id, hex_span(agent)),
        (run.trace_id, hex_span(chat)),
    ]
    assert chat_attrs["agio.step.id"] == steps[1].id
    caller_trace = trace.format_trace_id(caller_span.get_span_context().trace_id)
    assert (await client.get_run(run.id)).trace_id == caller_trace

    names = traced.metric_names()
    for metric in (
        "gen_ai.client.token.usage",
        "gen_ai.client.operation.duration",
        "gen_ai.client.operation.time_to_first_chunk",
        "agio.runs.ended",
        "agio.runs.active",
        "agio.steps.written",
        "agio.context.build.duration",
        "agio.store.operation.duration",
    ):
        assert metric in names


def reply_chunk(delta: dict[str, object], finish: str | None, **fields: object) -> str:
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    return json.dumps({"object": "chat.completion.chunk", "choices": [choice], **fields})


async def test_a_chat_span_carries_the_response_id_the_model_sent(
    client: AgioClient, fake_model: FakeModelServer, traced: Traced
) -> None:
    call = {"index": 0, "id": "call_1", "function": {"name": "echo", "arguments": '{"text": "x"}'}}
    fake_model.enqueue(
        Turn.raw(
            reply_chunk({"tool_calls": [call]}, None, id="chatcmpl-first"),
            reply_chunk({}, "tool_calls", id="chatcmpl-first"),
        ),
        Turn.raw(reply_chunk({"content": "done"}, "stop")),  # a server that sends no id
    )
    events = await drain(client.run("echo x"))
    await traced.open_spans.all_ended()
    assert final_run(events).stop_signal.reason == resources_pb2.STOP_REASON_COMPLETED
    chats = [s for s in traced.spans() if s.name == "chat fake-model"]
    chats.sort(key=lambda span: span.start_time or 0)
    assert [attrs(span).get("gen_ai.response.id") for span in chats] == ["chatcmpl-first", None]


async def test_parallel_tools_are_sibling_spans_under_the_run(
    client: AgioClient, fake_model: FakeModelServer, traced: Traced
) -> None:
    fake_model.enqueue(
        Turn.tool_calls(
            [
                ToolCallSpec("slow_echo", '{"text": "first", "delay_s": 0.3}', id="call_slow"),
                ToolCallSpec("echo", '{"text": "second"}', id="call_fast"),
                ToolCallSpec("explode", '{"message": "kaboom"}', id="call_bad"),
            ]
        ),
        Turn.text("done"),
    )
    events = await drain(client.run("three at once"))
    await traced.open_spans.all_ended()
    run = final_run(events)
    spans = traced.spans()
    agent = one(spans, "invoke_agent assistant")
    under_agent = children(spans, agent)
    assert [s.name for s in under_agent if s.name.startswith("chat")] == ["chat fake-model"] * 2
    tools = {attrs(s)["gen_ai.tool.call.id"]: s for s in under_agent if "execute_tool" in s.name}
    assert {call_id: s.name for call_id, s in tools.items()} == {
        "call_slow": "execute_tool slow_echo",
        "call_fast": "execute_tool echo",
        "call_bad": "execute_tool explode",
    }
    slow, fast = tools["call_slow"], tools["call_fast"]
    assert slow.start_time is not None
    assert fast.end_time is not None
    assert fast.end_time < (slow.end_time or 0)  # they overlapped: the fast one did not wait
    assert attrs(slow)["gen_ai.tool.name"] == "slow_echo"
    assert attrs(slow)["gen_ai.operation.name"] == "execute_tool"
    assert slow.status.status_code is StatusCode.UNSET
    bad = tools["call_bad"]
    assert bad.status.status_code is StatusCode.ERROR
    assert attrs(bad)["error.type"] == "tool_error"
    steps = await client.list_steps(run.session_id)
    tool_steps = [s for s in steps if s.role == resources_pb2.ROLE_TOOL]
    assert [(s.tool_call_id, s.span_id) for s in tool_steps] == [
        (call_id, hex_span(tools[call_id])) for call_id in ("call_slow", "call_fast", "call_bad")
    ]
    assert [attrs(tools[s.tool_call_id])["agio.step.sequence"] for s in tool_steps] == [
        s.sequence for s in tool_steps
    ]
    assert [attrs(tools[s.tool_call_id])["agio.step.id"] for s in tool_steps] == [
        s.id for s in tool_steps
    ]
    assert "agio.tool.duration" in traced.metric_names()


async def test_a_cancelled_run_ends_every_span_with_the_stop_reason(
    client: AgioClient, fake_model: FakeModelServer, traced: Traced
) -> None:
    fake_model.enqueue(Turn.tool_calls([ToolCallSpec("hang", "{}", id="call_hang")]))
    events: list[StepEvent] = []
    async for event in client.run("hang a tool"):
        events.append(event)
        started = event.step_started
        if event.WhichOneof("event") == "step_started" and started.tool_call_id:
            await client.cancel_run(event.run_id, "user pressed stop")
    await traced.open_spans.all_ended()
    run = final_run(events)
    spans = traced.spans()
    agent = one(spans, "invoke_agent assistant")
    assert attrs(agent)["agio.stop.reason"] == "CANCELLED"
    assert attrs(agent)["agio.run.status"] == "CANCELLED"
    assert agent.status.status_code is StatusCode.UNSET  # a cancel is an outcome, not an error
    tool = one(spans, "execute_tool hang")
    assert attrs(tool)["agio.cancelled"] is True
    assert tool.parent is not None
    assert agent.context is not None
    assert tool.parent.span_id == agent.context.span_id
    cancel = one(spans, "agio.v1.AgentService/CancelRun")
    assert attrs(cancel)["rpc.grpc.status_code"] == 0
    steps = await client.list_steps(run.session_id)
    assert steps[-1].span_id == hex_span(tool)  # the synthetic result points at the cut call


async def test_a_client_disconnect_ends_the_run_and_server_spans(
    client: AgioClient, fake_model: FakeModelServer, traced: Traced
) -> None:
    fake_model.enqueue(Turn.hanging())
    run_id = ""
    async for event in client.run("wait forever"):
        run_id = event.run_id
        if event.WhichOneof("event") == "step_started":
            await fake_model.wait_for_requests(1)  # the model call is out, hanging
            break  # leaving the loop cancels the call
    watched = await drain(client.watch_run(run_id))
    await traced.open_spans.all_ended()
    assert final_run(watched).status == resources_pb2.RUN_STATUS_CANCELLED
    spans = traced.spans()
    server = one(spans, RUN_SPAN)
    assert attrs(server)["rpc.grpc.status_code"] == 1  # CANCELLED
    assert server.status.status_code is StatusCode.UNSET
    agent = one(spans, "invoke_agent assistant")
    assert attrs(agent)["agio.stop.reason"] == "CANCELLED"
    assert attrs(agent)["agio.stop.source"] == "client"
    chat = one(spans, "chat fake-model")
    assert attrs(chat)["agio.cancelled"] is True
    assert "gen_ai.response.model" not in attrs(chat)


async def test_a_model_error_marks_the_chat_and_agent_spans_failed(
    client: AgioClient, fake_model: FakeModelServer, traced: Traced
) -> None:
    fake_model.enqueue(Turn.error(400, message="bad request from the provider"))
    events = await drain(client.run("hello"))
    await traced.open_spans.all_ended()
    run = final_run(events)
    assert run.status == resources_pb2.RUN_STATUS_FAILED
    spans = traced.spans()
    chat = one(spans, "chat fake-model")
    assert chat.status.status_code is StatusCode.ERROR
    assert attrs(chat)["error.type"] == "400"
    assert [event.name for event in chat.events] == ["exception"]
    agent = one(spans, "invoke_agent assistant")
    assert agent.status.status_code is StatusCode.ERROR
    assert attrs(agent)["error.type"] == "MODEL_ERROR"
    assert attrs(agent)["agio.stop.reason"] == "MODEL_ERROR"
    # The run failed in-band: the RPC itself succeeded.
    server = one(spans, RUN_SPAN)
    assert server.status.status_code is StatusCode.UNSET
    assert attrs(server)["rpc.grpc.status_code"] == 0


@pytest.mark.parametrize(
    ("turn", "error_type"),
    [
        (Turn.error(429, retry_after=0), "429"),  # the last status, after the retries
        (
            Turn.raw(json.dumps({"error": {"message": "no", "code": "invalid_api_key"}})),
            "invalid_api_key",  # an error sent inside a 200 stream
        ),
    ],
    ids=["http-status-after-retries", "in-band-code"],
)
async def test_a_failed_chat_span_names_the_status_or_the_in_band_code(
    client: AgioClient, fake_model: FakeModelServer, traced: Traced, turn: Turn, error_type: str
) -> None:
    fake_model.enqueue(*[turn] * 4)
    events = await drain(client.run("hello"))
    await traced.open_spans.all_ended()
    assert final_run(events).status == resources_pb2.RUN_STATUS_FAILED
    chat = one(traced.spans(), "chat fake-model")
    assert chat.status.status_code is StatusCode.ERROR
    assert attrs(chat)["error.type"] == error_type


async def test_a_refused_call_sets_the_grpc_status_on_the_server_span(
    client: AgioClient, traced: Traced
) -> None:
    with pytest.raises(AgioError, match="NOT_FOUND"):
        await client.get_run("run_does_not_exist")
    await traced.open_spans.all_ended()
    span = one(traced.spans(), "agio.v1.AgentService/GetRun")
    assert attrs(span)["rpc.grpc.status_code"] == 5
    assert span.status.status_code is StatusCode.UNSET  # NOT_FOUND is not a server error
    assert json.dumps(attrs(span))  # attributes are plain values


async def test_a_shutdown_interrupts_the_run_and_ends_every_span(
    tmp_path: Path, fake_model: FakeModelServer
) -> None:
    traced = make_traced()
    settings = make_settings(sqlite_at(tmp_path / "agio.db"), fake_model.base_url)
    app = await AgioApp.start(settings, traced.telemetry)
    fake_model.enqueue(Turn.hanging())
    stopped = False
    try:
        async with AgioClient(app.address) as client:
            events = client.run("wait forever")
            async for event in events:
                if event.WhichOneof("event") == "step_started":
                    await fake_model.wait_for_requests(1)  # the model call is out, hanging
                    await app.stop(grace=0.5)
                    stopped = True
                    break
    finally:
        if not stopped:
            await app.stop(grace=0)
    await traced.open_spans.all_ended()
    agent = one(traced.spans(), "invoke_agent assistant")
    assert attrs(agent)["agio.stop.reason"] == "INTERRUPTED"
    assert attrs(agent)["agio.stop.retryable"] is True
    assert attrs(one(traced.spans(), "chat fake-model"))["agio.cancelled"] is True
    traced.tracer_provider.shutdown()


async def test_a_run_span_says_how_much_history_the_server_kept_and_how_much_it_read(
    client: AgioClient, fake_model: FakeModelServer, traced: Traced
) -> None:
    fake_model.enqueue(Turn.text("First."), Turn.text("Second."))
    first = final_run(await drain(client.run("One?")))
    final_run(await drain(client.run("Two?", session_id=first.session_id)))
    await traced.open_spans.all_ended()
    agents = [s for s in traced.spans() if s.name == "invoke_agent assistant"]
    # The first run read its one step; the second kept the first run's two and read its own.
    assert [
        (attrs(s)["agio.history.kept_steps"], attrs(s)["agio.history.read_steps"]) for s in agents
    ] == [(0, 1), (2, 1)]


async def test_submit_tool_outputs_is_a_second_segment_of_the_same_run(
    client: AgioClient, fake_model: FakeModelServer, traced: Traced
) -> None:
    weather = {"name": "get_weather", "description": "Weather.", "parameters_json": "{}"}
    fake_model.enqueue(
        Turn.tool_calls([ToolCallSpec("get_weather", "{}", id="call_w")]), Turn.text("Sunny.")
    )
    first = final_run(await drain(client.run("Weather?", client_tools=[weather])))
    assert first.status == resources_pb2.RUN_STATUS_REQUIRES_ACTION
    output = agent_service_pb2.ToolOutput(tool_call_id="call_w", output="sunny")
    second = final_run(await drain(client.submit_tool_outputs(first.id, [output])))
    await traced.open_spans.all_ended()
    agents = [s for s in traced.spans() if s.name == "invoke_agent assistant"]
    assert [attrs(s)["agio.run.operation"] for s in agents] == ["run", "submit_tool_outputs"]
    assert [attrs(s)["agio.stop.reason"] for s in agents] == ["REQUIRES_ACTION", "COMPLETED"]
    assert {attrs(s)["agio.run.id"] for s in agents} == {first.id}
    assert second.trace_id == first.trace_id == hex_trace(agents[0])  # the run keeps its first
    steps = await client.list_steps(first.session_id)
    tool_output, reply = steps[2], steps[3]
    assert (tool_output.trace_id, tool_output.span_id) == (
        hex_trace(agents[1]),
        hex_span(agents[1]),
    )
    chats = [s for s in traced.spans() if s.name == "chat fake-model"]
    assert reply.span_id == hex_span(chats[-1])
    assert children(traced.spans(), agents[1]) == [chats[-1]]
