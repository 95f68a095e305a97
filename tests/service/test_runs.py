"""The agent loop end to end: a real gRPC client -> the server on 127.0.0.1:0 -> the real
openai client -> the fake model over HTTP, with every step in a real SQLite file.

Each test scripts the model turn by turn and asserts what a client sees (events, stop
signal, status) and what the store holds afterwards.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from google.protobuf import duration_pb2

from agio_grpc.client import AgioClient, AgioError
from agio_grpc.service.app import AgioApp
from agio_grpc.testing import FakeModelServer, ToolCallSpec, Turn, UsageSpec
from agio_grpc.v1 import agent_service_pb2, events_pb2, resources_pb2
from agio_grpc.v1.resources_pb2 import Role, RunStatus, StopReason

StepEvent = events_pb2.StepEvent


async def drain(events: AsyncIterator[StepEvent]) -> list[StepEvent]:
    return [event async for event in events]


def kinds(events: list[StepEvent]) -> list[str]:
    return [str(event.WhichOneof("event")) for event in events]


def final_run(events: list[StepEvent]) -> resources_pb2.Run:
    last = events[-1]
    kind = last.WhichOneof("event")
    assert kind in ("run_completed", "run_failed"), kinds(events)
    run: resources_pb2.Run = getattr(last, kind).run
    return run


def assert_well_formed(events: list[StepEvent], first_seq: int = 1) -> None:
    """Gapless seq, run_started first, exactly one terminal event, last."""
    assert [e.seq for e in events] == list(range(first_seq, first_seq + len(events)))
    assert kinds(events)[0] == "run_started"
    terminals = [k for k in kinds(events) if k in ("run_completed", "run_failed")]
    assert len(terminals) == 1
    assert kinds(events)[-1] in ("run_completed", "run_failed")


def completed_steps(events: list[StepEvent]) -> list[resources_pb2.Step]:
    return [e.step_completed.step for e in events if e.WhichOneof("event") == "step_completed"]


def reason_of(run: resources_pb2.Run) -> str:
    return StopReason.Name(run.stop_signal.reason)


def calc(expression: str, call_id: str | None = None) -> ToolCallSpec:
    return ToolCallSpec("calculate", json.dumps({"expression": expression}), id=call_id)


def assert_valid_history(messages: list[dict[str, Any]]) -> None:
    """Every assistant tool call is answered by a tool message before the next turn."""
    open_calls: set[str] = set()
    for message in messages:
        if message["role"] == "tool":
            assert message["tool_call_id"] in open_calls, message
            open_calls.discard(message["tool_call_id"])
            continue
        assert not open_calls, f"unanswered calls {open_calls} before {message}"
        for call in message.get("tool_calls") or []:
            open_calls.add(call["id"])
    assert not open_calls


async def test_plain_reply_streams_deltas_and_stores_the_steps(
    client: AgioClient, fake_model: FakeModelServer
) -> None:
    fake_model.enqueue(
        Turn.text(
            "Hello there, friend.", chunks=4, usage=UsageSpec(prompt_tokens=12, completion_tokens=4)
        )
    )
    events = await drain(client.run("Hi!"))
    assert_well_formed(events)
    assert kinds(events)[:3] == ["run_started", "step_completed", "step_started"]
    deltas = "".join(e.step_delta.content for e in events if e.WhichOneof("event") == "step_delta")
    assert deltas == "Hello there, friend."
    run = final_run(events)
    assert kinds(events)[-1] == "run_completed"
    assert reason_of(run) == "STOP_REASON_COMPLETED"
    assert run.status == RunStatus.RUN_STATUS_COMPLETED
    assert (run.usage.input_tokens, run.usage.output_tokens, run.usage.total_tokens) == (12, 4, 16)
    steps = await client.list_steps(run.session_id)
    assert [(s.sequence, s.role) for s in steps] == [(1, Role.ROLE_USER), (2, Role.ROLE_ASSISTANT)]
    reply = steps[1]
    assert reply.content == "Hello there, friend."
    metrics = reply.metrics
    assert (metrics.input_tokens, metrics.output_tokens, metrics.total_tokens) == (12, 4, 16)
    assert metrics.model_name == "fake-model"
    assert metrics.provider
    assert metrics.duration_ms >= metrics.first_token_latency_ms >= 0
    assert reply.create_time.seconds > 0
    stored = await client.get_run(run.id)
    assert stored.status == RunStatus.RUN_STATUS_COMPLETED
    assert (stored.first_sequence, stored.last_sequence, stored.step_count) == (1, 2, 2)
    assert fake_model.requests[0]["messages"] == [
        {"role": "system", "content": "You are a test assistant."},
        {"role": "user", "content": "Hi!"},
    ]
    assert fake_model.requests[0]["stream_options"] == {"include_usage": True}


async def test_one_tool_call_runs_and_the_model_sees_its_result(
    client: AgioClient, fake_model: FakeModelServer
) -> None:
    fake_model.enqueue(Turn.tool_calls([calc("12 * 7")], chunks_per_call=3), Turn.text("It is 84."))
    events = await drain(client.run("What is 12 * 7?"))
    assert_well_formed(events)
    run = final_run(events)
    assert reason_of(run) == "STOP_REASON_COMPLETED"
    assert run.tool_call_count == 1
    steps = await client.list_steps(run.session_id)
    assert [s.role for s in steps] == [
        Role.ROLE_USER,
        Role.ROLE_ASSISTANT,
        Role.ROLE_TOOL,
        Role.ROLE_ASSISTANT,
    ]
    call = steps[1].tool_calls[0]
    assert (call.name, json.loads(call.arguments)) == ("calculate", {"expression": "12 * 7"})
    tool = steps[2]
    assert (tool.content, tool.tool_call_id, tool.name, tool.is_error) == (
        "84",
        call.id,
        "calculate",
        False,
    )
    assert tool.metrics.tool_exec_time_ms >= 0
    second = fake_model.requests[1]["messages"]
    assert second[-1] == {"role": "tool", "content": "84", "tool_call_id": call.id}
    assert_valid_history(second)


async def test_parallel_tools_are_stored_in_call_order(
    client: AgioClient, fake_model: FakeModelServer
) -> None:
    fake_model.enqueue(
        Turn.tool_calls(
            [
                ToolCallSpec("slow_echo", '{"text": "first", "delay_s": 0.3}'),
                ToolCallSpec("echo", '{"text": "second"}'),
            ],
            chunks_per_call=2,
        ),
        Turn.text("done"),
    )
    events = await drain(client.run("two at once"))
    assert_well_formed(events)
    steps = await client.list_steps(final_run(events).session_id)
    tools = [s for s in steps if s.role == Role.ROLE_TOOL]
    assert [t.content for t in tools] == ["first", "second"]
    assert [t.tool_call_id for t in tools] == [c.id for c in steps[1].tool_calls]
    # They ran in parallel: the fast one did not wait for the slow one to start.
    assert tools[1].metrics.tool_exec_time_ms < 300


@pytest.mark.parametrize(
    ("call", "expected"),
    [
        (ToolCallSpec("explode", '{"message": "kaboom"}'), "kaboom"),
        (ToolCallSpec("hang", "{}"), "timed out"),
        (ToolCallSpec("no_such_tool", "{}"), "no_such_tool"),
        (ToolCallSpec("calculate", '{"expression": "1 +'), "JSON"),
        (ToolCallSpec("calculate", '{"wrong": 1}'), "expression"),
    ],
    ids=["raises", "hangs-past-timeout", "unknown", "malformed-json", "invalid-arguments"],
)
async def test_tool_failures_become_error_steps_the_model_can_act_on(
    client: AgioClient, fake_model: FakeModelServer, call: ToolCallSpec, expected: str
) -> None:
    fake_model.enqueue(Turn.tool_calls([call]), Turn.text("I see the tool failed."))
    events = await drain(client.run("use a tool"))
    assert_well_formed(events)
    run = final_run(events)
    assert reason_of(run) == "STOP_REASON_COMPLETED"
    tool = next(s for s in completed_steps(events) if s.role == Role.ROLE_TOOL)
    assert tool.is_error
    assert expected.lower() in tool.content.lower()
    assert "Traceback" not in tool.content
    assert "error" in kinds(events)  # the non-fatal notice
    sent = fake_model.requests[1]["messages"]
    assert sent[-1]["role"] == "tool"
    assert expected.lower() in sent[-1]["content"].lower()


async def test_max_steps_stops_the_loop(client: AgioClient, fake_model: FakeModelServer) -> None:
    fake_model.enqueue(Turn.tool_calls([calc("1 + 1")]), Turn.tool_calls([calc("2 + 2")]))
    overrides = agent_service_pb2.RunOverrides(max_steps=2)
    events = await drain(client.run("loop forever", overrides=overrides))
    assert_well_formed(events)
    run = final_run(events)
    assert reason_of(run) == "STOP_REASON_MAX_STEPS"
    assert run.status == RunStatus.RUN_STATUS_COMPLETED
    assert len(fake_model.requests) == 2
    steps = await client.list_steps(run.session_id)
    assert_valid_history(
        [{"role": "user"}]
        + [
            {"role": "tool", "tool_call_id": s.tool_call_id}
            if s.role == Role.ROLE_TOOL
            else {"role": "assistant", "tool_calls": [{"id": c.id} for c in s.tool_calls]}
            for s in steps[1:]
        ]
    )


@pytest.mark.parametrize(
    ("finish", "reason"),
    [("length", "STOP_REASON_MAX_TOKENS"), ("content_filter", "STOP_REASON_CONTENT_FILTER")],
)
async def test_finish_reasons_map_to_stop_reasons(
    client: AgioClient, fake_model: FakeModelServer, finish: Any, reason: str
) -> None:
    fake_model.enqueue(Turn.text("truncated repl", chunks=2, finish_reason=finish))
    events = await drain(client.run("say a lot"))
    assert_well_formed(events)
    run = final_run(events)
    assert kinds(events)[-1] == "run_completed"
    assert reason_of(run) == reason
    assert run.stop_signal.source == "model"


async def test_rate_limit_then_success_is_one_step_with_a_retry_counted(
    client: AgioClient, fake_model: FakeModelServer
) -> None:
    fake_model.enqueue(Turn.error(429, retry_after=0.05), Turn.text("made it"))
    events = await drain(client.run("hello"))
    assert_well_formed(events)
    run = final_run(events)
    assert reason_of(run) == "STOP_REASON_COMPLETED"
    assistant = [s for s in completed_steps(events) if s.role == Role.ROLE_ASSISTANT]
    assert len(assistant) == 1
    assert assistant[0].content == "made it"
    assert assistant[0].metrics.retries == 1
    notices = [e.error for e in events if e.WhichOneof("event") == "error"]
    assert [n.reason for n in notices] == ["MODEL_RETRY"]


async def test_a_stream_cut_after_deltas_never_stores_a_half_step(
    client: AgioClient, fake_model: FakeModelServer
) -> None:
    # The second turn of a session.
    fake_model.enqueue(Turn.text("first"))
    first = final_run(await drain(client.run("hi")))
    fake_model.enqueue(
        Turn.text("partial garbage that must vanish", chunks=6, cut_after=3),
        Turn.text("clean answer", chunks=2),
    )
    events = await drain(client.run("hello", session_id=first.session_id))
    assert_well_formed(events)
    run = final_run(events)
    steps = await client.list_steps(run.session_id)
    contents = [s.content for s in steps if s.role == Role.ROLE_ASSISTANT][1:]
    assert all("garbage" not in c for c in contents)
    if kinds(events)[-1] == "run_completed":  # the step was redone
        assert contents == ["clean answer"]
        assert "MODEL_STREAM_RESTART" in [e.error.reason for e in events if e.HasField("error")]
    else:  # or the run failed, retryable
        assert run.stop_signal.retryable
        assert contents == []


async def test_a_stream_without_finish_reason_is_a_model_error(
    client: AgioClient, fake_model: FakeModelServer
) -> None:
    # The engine restarts a broken stream once (telling the client to drop its deltas); a
    # second stream without finish_reason fails the run.
    broken = Turn.text("looks fine but is not", chunks=3, omit_finish_reason=True)
    fake_model.enqueue(broken, broken)
    events = await drain(client.run("hello"))
    notices = [e.error.reason for e in events if e.WhichOneof("event") == "error"]
    assert notices == ["MODEL_STREAM_RESTART"]
    assert_well_formed(events)
    run = final_run(events)
    assert kinds(events)[-1] == "run_failed"
    assert reason_of(run) == "STOP_REASON_MODEL_ERROR"
    assert run.status == RunStatus.RUN_STATUS_FAILED
    steps = await client.list_steps(run.session_id)
    assert [s.role for s in steps] == [Role.ROLE_USER]


async def _cancel_when(
    client: AgioClient, events: AsyncIterator[StepEvent], ready: str
) -> list[StepEvent]:
    """Read the stream; once an event of kind `ready` arrives, CancelRun from the side."""
    seen: list[StepEvent] = []
    cancelled = False
    async for event in events:
        seen.append(event)
        if not cancelled and event.WhichOneof("event") == ready:
            cancelled = True
            run = await client.cancel_run(event.run_id, "user pressed stop")
            assert run.status == RunStatus.RUN_STATUS_CANCELLED
    return seen


async def test_cancel_during_the_model_stream_then_the_session_goes_on(
    client: AgioClient, fake_model: FakeModelServer
) -> None:
    fake_model.enqueue(Turn.text("a b c d e f g h", chunks=8, chunk_delay=0.5))
    events = await _cancel_when(client, client.run("slow please"), "step_delta")
    assert_well_formed(events)
    run = final_run(events)
    assert reason_of(run) == "STOP_REASON_CANCELLED"
    assert run.stop_signal.message == "user pressed stop"
    steps = await client.list_steps(run.session_id)
    assert [s.role for s in steps] == [Role.ROLE_USER]
    again = await client.cancel_run(run.id)  # idempotent
    assert again.status == RunStatus.RUN_STATUS_CANCELLED
    fake_model.enqueue(Turn.text("fresh"))
    result = await client.run_to_end("again", session_id=run.session_id)
    assert result.text == "fresh"
    assert_valid_history(fake_model.requests[-1]["messages"])


async def test_cancel_during_a_tool_leaves_a_valid_history(
    client: AgioClient, fake_model: FakeModelServer
) -> None:
    fake_model.enqueue(Turn.tool_calls([ToolCallSpec("hang", "{}")]))
    events = await _cancel_when(client, client.run("hang a tool"), "step_started")
    # step_started also fires for the model step; make sure the tool had started too
    run = final_run(events)
    assert reason_of(run) == "STOP_REASON_CANCELLED"
    fake_model.enqueue(Turn.text("recovered"))
    result = await client.run_to_end("continue", session_id=run.session_id)
    assert result.text == "recovered"
    sent = fake_model.requests[-1]["messages"]
    assert_valid_history(sent)
    steps = await client.list_steps(run.session_id)
    assert [s.sequence for s in steps] == list(range(1, len(steps) + 1))


async def test_a_grpc_deadline_ends_the_run_with_timeout(
    client: AgioClient, fake_model: FakeModelServer
) -> None:
    fake_model.enqueue(Turn.text("never in time", chunks=10, chunk_delay=1.0))
    # A deadline long enough for the full 0.25 s margin (10% of a shorter one is all it gets,
    # too little on a machine loaded by the rest of the suite).
    events = await drain(client.run("slow", timeout=3.0))
    assert_well_formed(events)
    run = final_run(events)
    assert reason_of(run) == "STOP_REASON_TIMEOUT"
    stored = await client.get_run(run.id)
    assert stored.stop_signal.reason == StopReason.STOP_REASON_TIMEOUT
    assert stored.end_time.seconds > 0


async def test_a_deadline_too_short_to_run_in_is_refused_before_anything_starts(
    client: AgioClient, fake_model: FakeModelServer
) -> None:
    before = len(await client.list_sessions())
    with pytest.raises(AgioError) as refused:
        await drain(client.run("in no time", timeout=0.2))
    assert refused.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
    # The server answers at once, so its status (not the client's own) is what arrives.
    assert refused.value.reason == "DEADLINE_TOO_SHORT"
    assert refused.value.metadata == {"minimumSeconds": "0.25"}
    assert len(await client.list_sessions()) == before  # no session, no run
    assert fake_model.requests == []


async def test_a_disconnecting_client_cancels_its_run_and_the_record_ends_clean(
    client: AgioClient, fake_model: FakeModelServer
) -> None:
    fake_model.enqueue(Turn.hanging())
    run_id = ""
    async for event in client.run("wait forever"):
        run_id = event.run_id
        if event.WhichOneof("event") == "step_started":
            await fake_model.wait_for_requests(1)  # the model call is out, hanging
            break  # leaving the loop cancels the call
    for _ in range(200):
        run = await client.get_run(run_id)
        if run.status != RunStatus.RUN_STATUS_RUNNING:
            break
        await asyncio.sleep(0.05)
    assert run.status == RunStatus.RUN_STATUS_CANCELLED
    assert run.end_time.seconds > 0
    fake_model.enqueue(Turn.text("next"))
    result = await client.run_to_end("after", session_id=run.session_id)
    assert result.text == "next"


async def test_client_tools_require_action_then_submit_continues_the_same_run(
    client: AgioClient, fake_model: FakeModelServer
) -> None:
    weather = {
        "name": "get_weather",
        "description": "Weather for a city.",
        "parameters_json": json.dumps(
            {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
        ),
    }
    fake_model.enqueue(
        Turn.tool_calls([ToolCallSpec("get_weather", '{"city": "Oslo"}', id="call_w")]),
        Turn.text("It is sunny in Oslo."),
    )
    first = await drain(client.run("Weather in Oslo?", client_tools=[weather]))
    assert_well_formed(first)
    run = final_run(first)
    assert reason_of(run) == "STOP_REASON_REQUIRES_ACTION"
    assert run.status == RunStatus.RUN_STATUS_REQUIRES_ACTION
    offered = {t["function"]["name"] for t in fake_model.requests[0]["tools"]}
    assert "get_weather" in offered
    await_error = client.submit_tool_outputs(
        run.id, [agent_service_pb2.ToolOutput(tool_call_id="call_other", output="x")]
    )
    with pytest.raises(AgioError) as wrong:
        await drain(await_error)
    assert wrong.value.code == grpc.StatusCode.INVALID_ARGUMENT
    second = await drain(
        client.submit_tool_outputs(
            run.id, [agent_service_pb2.ToolOutput(tool_call_id="call_w", output="sunny, 21C")]
        )
    )
    assert_well_formed(second, first_seq=first[-1].seq + 1)
    done = final_run(second)
    assert done.id == run.id
    assert reason_of(done) == "STOP_REASON_COMPLETED"
    assert fake_model.requests[1]["messages"][-1] == {
        "role": "tool",
        "content": "sunny, 21C",
        "tool_call_id": "call_w",
    }
    with pytest.raises(AgioError) as late:
        await drain(
            client.submit_tool_outputs(
                run.id, [agent_service_pb2.ToolOutput(tool_call_id="call_w", output="again")]
            )
        )
    assert late.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert late.value.reason == "RUN_STATE_CONFLICT"


async def _session_with_one_tool_turn(client: AgioClient, fake_model: FakeModelServer) -> str:
    fake_model.enqueue(Turn.tool_calls([calc("6 * 7")]), Turn.text("42, first try"))
    result = await client.run_to_end("What is 6 * 7?")
    return result.session_id  # steps: 1 user, 2 assistant+call, 3 tool, 4 assistant


async def test_retry_from_a_user_step_regenerates_the_whole_turn(
    client: AgioClient, fake_model: FakeModelServer
) -> None:
    session_id = await _session_with_one_tool_turn(client, fake_model)
    fake_model.enqueue(Turn.text("42, regenerated"))
    events = await drain(client.retry(session_id, 2))
    assert_well_formed(events)
    steps = await client.list_steps(session_id)
    assert [s.content for s in steps] == ["What is 6 * 7?", "42, regenerated"]
    assert fake_model.requests[-1]["messages"][-1] == {"role": "user", "content": "What is 6 * 7?"}


async def test_retry_from_a_tool_step_reruns_the_tool(
    client: AgioClient, fake_model: FakeModelServer
) -> None:
    session_id = await _session_with_one_tool_turn(client, fake_model)
    fake_model.enqueue(Turn.text("42, after re-running the tool"))
    events = await drain(client.retry(session_id, 3))
    assert_well_formed(events)
    steps = await client.list_steps(session_id)
    assert [s.role for s in steps] == [
        Role.ROLE_USER,
        Role.ROLE_ASSISTANT,
        Role.ROLE_TOOL,
        Role.ROLE_ASSISTANT,
    ]
    assert steps[2].content == "42"
    assert steps[3].content == "42, after re-running the tool"


async def test_retry_from_the_final_assistant_step_regenerates_the_answer(
    client: AgioClient, fake_model: FakeModelServer
) -> None:
    session_id = await _session_with_one_tool_turn(client, fake_model)
    fake_model.enqueue(Turn.text("42, second opinion"))
    events = await drain(client.retry(session_id, 4))
    assert_well_formed(events)
    steps = await client.list_steps(session_id)
    assert [s.sequence for s in steps] == [1, 2, 3, 4]
    assert steps[3].content == "42, second opinion"
    assert fake_model.requests[-1]["messages"][-1]["role"] == "tool"
    runs = await client.list_runs(session_id)
    assert len(runs) == 2


async def test_retry_with_nothing_left_to_regenerate_is_refused_and_deletes_nothing(
    client: AgioClient, fake_model: FakeModelServer
) -> None:
    session_id = await _session_with_one_tool_turn(client, fake_model)
    with pytest.raises(AgioError) as caught:
        await drain(client.retry(session_id, 1))
    assert caught.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert len(await client.list_steps(session_id)) == 4


async def test_a_second_run_on_a_busy_session_is_refused(
    client: AgioClient, fake_model: FakeModelServer
) -> None:
    fake_model.enqueue(Turn.hanging())
    stream = client.run("occupy the session")
    started = await anext(stream)
    session_id = started.session_id
    with pytest.raises(AgioError) as caught:
        await drain(client.run("me too", session_id=session_id))
    assert caught.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert caught.value.reason == "SESSION_BUSY"
    with pytest.raises(AgioError) as editing:  # the log cannot be edited under a live run
        await client.delete_steps(session_id, 1)
    assert editing.value.reason == "SESSION_BUSY"
    await client.cancel_run(started.run_id)
    rest = await drain(stream)
    assert final_run([started, *rest]).status == RunStatus.RUN_STATUS_CANCELLED
    assert [s.role for s in await client.list_steps(session_id)] == [Role.ROLE_USER]


async def test_every_completed_step_is_readable_from_the_store_when_announced(
    client: AgioClient, fake_model: FakeModelServer
) -> None:
    fake_model.enqueue(Turn.tool_calls([calc("1 + 2"), calc("3 + 4")]), Turn.text("3 and 7"))
    announced = 0
    async for event in client.run("two sums"):
        if event.WhichOneof("event") == "step_completed":
            step = event.step_completed.step
            stored = await client.get_step(step.session_id, step.sequence)
            assert stored == step
            announced += 1
    assert announced == 5


async def test_watch_run_replays_after_a_cursor(
    client: AgioClient, fake_model: FakeModelServer
) -> None:
    fake_model.enqueue(Turn.text("watch me", chunks=3))
    events = await drain(client.run("hello"))
    run = final_run(events)
    replay = await drain(client.watch_run(run.id, after_seq=2))
    # The same events after the cursor, as streamed; the finished reply's deltas only while
    # the run is still live in the server (the journal keeps none).
    assert [e for e in replay if e.WhichOneof("event") != "step_delta"] == [
        e for e in events[2:] if e.WhichOneof("event") != "step_delta"
    ]
    assert all(e in events for e in replay)
    assert kinds(replay)[-1] == "run_completed"


async def test_run_requests_are_validated_before_anything_is_written(
    app: AgioApp, client: AgioClient
) -> None:
    cases: list[tuple[dict[str, Any], grpc.StatusCode, str]] = [
        ({"input": ""}, grpc.StatusCode.INVALID_ARGUMENT, "input"),
        ({"input": "hi", "session_id": "bad id"}, grpc.StatusCode.INVALID_ARGUMENT, "session_id"),
        ({"input": "hi", "agent": "nobody"}, grpc.StatusCode.NOT_FOUND, ""),
        ({"input": "hi", "session_id": "sess_missing"}, grpc.StatusCode.NOT_FOUND, ""),
        (
            {"input": "hi", "overrides": agent_service_pb2.RunOverrides(max_steps=0)},
            grpc.StatusCode.INVALID_ARGUMENT,
            "overrides.max_steps",
        ),
        (
            {
                "input": "hi",
                "overrides": agent_service_pb2.RunOverrides(
                    timeout=duration_pb2.Duration(seconds=-1)
                ),
            },
            grpc.StatusCode.INVALID_ARGUMENT,
            "overrides.timeout",
        ),
    ]
    for kwargs, code, field in cases:
        text = kwargs.pop("input")
        with pytest.raises(AgioError) as caught:
            await drain(client.run(text, **kwargs))
        assert caught.value.code == code, (kwargs, caught.value)
        if field:
            assert [f for f, _ in caught.value.field_violations] == [field]
    assert await client.list_sessions() == []


async def test_list_agents_returns_tool_schemas(client: AgioClient) -> None:
    agents = await client.list_agents()
    assert [a.name for a in agents] == ["assistant"]
    tools = {t.name: t for t in agents[0].tools}
    assert {"calculate", "current_time", "slow_echo"} <= set(tools)
    schema = json.loads(tools["calculate"].parameters_json)
    assert schema["properties"]["expression"]["type"] == "string"
    assert schema["required"] == ["expression"]
    assert "arithmetic" in tools["calculate"].description
