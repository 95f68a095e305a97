"""Remote A2A agents as tools (`a2a_agents:`): an agio-grpc agent calls the note keeper of
examples/a2a/sdk_agent.py, an agent built with the `a2a-sdk`'s own server (its
`DefaultRequestHandler`, task store and routes) on uvicorn at 127.0.0.1:0.

The answer, the conversation going on in one remote context per session, a remote failure
and an INPUT_REQUIRED as error results the model sees, a cancel reaching the remote task,
the headers (with `${VAR}`) and the trace context it is sent, and an unreachable agent."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from agio_grpc.client import AgioClient
from agio_grpc.config import A2AAgentConfig, AgentConfig, LimitsConfig
from agio_grpc.domain import Role as DomainRole
from agio_grpc.domain import Step
from agio_grpc.engine.a2a_tools import remote_context
from agio_grpc.service.app import AgioApp
from agio_grpc.testing import FakeModelServer, ToolCallSpec, Turn
from agio_grpc.v1.resources_pb2 import Role, RunStatus
from tests.a2a.conftest import on_uvicorn
from tests.service.conftest import make_settings
from tests.sqlite import sqlite_at
from tests.telemetry.conftest import make_traced

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "a2a" / "sdk_agent.py"


def load_example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("sdk_agent", EXAMPLE)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


sdk_agent = load_example()


class Remote:
    def __init__(self, url: str, keeper: Any) -> None:
        self.url = url
        self.keeper = keeper


@pytest.fixture
async def remote() -> AsyncIterator[Remote]:
    """The note keeper, served by uvicorn on a port of its own."""
    keeper = sdk_agent.NoteKeeper()
    async with on_uvicorn(lambda url: sdk_agent.application(url, keeper)) as url:
        yield Remote(url, keeper)


@pytest.fixture
async def fake_model() -> AsyncIterator[FakeModelServer]:
    async with FakeModelServer() as server:
        yield server


def settings(store_url: str, model_url: str, remote_url: str, **entry: Any) -> Any:
    return make_settings(
        store_url,
        model_url,
        agents=[
            AgentConfig(
                name="assistant",
                tools=["calculate"],
                a2a_agents=[A2AAgentConfig(name="notes", url=remote_url, **entry)],
                limits=LimitsConfig(max_steps=5, tool_timeout_s=10.0),
            )
        ],
    )


@pytest.fixture
async def app(
    store_url: str, fake_model: FakeModelServer, remote: Remote, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[AgioApp]:
    monkeypatch.setenv("NOTES_TOKEN", "s3cret")
    configured = settings(
        store_url,
        fake_model.base_url,
        remote.url,
        headers={"x-notes-token": "${NOTES_TOKEN}"},
    )
    started = await AgioApp.start(configured)
    try:
        await offered(started)
        yield started
    finally:
        await started.stop(grace=0)


async def offered_tool(app: AgioApp, name: str) -> None:
    """Once remote agent `name`'s card is read (in the background, at start)."""
    async with AgioClient(app.address) as client:
        for _ in range(500):
            [agent] = await client.list_agents()
            if not {t.name: t for t in agent.tools}[name].unavailable:
                return
            await asyncio.sleep(0.01)
    raise AssertionError(f"the card of {name} was never read")


async def offered(app: AgioApp) -> None:
    await offered_tool(app, "notes")


def call(text: str, call_id: str = "call_1") -> Turn:
    return Turn.tool_calls([ToolCallSpec("notes", json.dumps({"input": text}), id=call_id)])


def tool_steps(steps: Any) -> list[Any]:
    return [s for s in steps if s.role == Role.ROLE_TOOL]


async def test_the_remote_agent_is_a_tool_described_by_its_card(
    app: AgioApp, fake_model: FakeModelServer
) -> None:
    async with AgioClient(app.address) as client:
        [agent] = await client.list_agents()
        fake_model.enqueue(Turn.text("Hi."))
        await client.run_to_end("hi")
    notes = {t.name: t for t in agent.tools}["notes"]
    assert notes.source == "a2a"
    assert not notes.unavailable
    assert notes.description.startswith("Keeps notes for a conversation")
    offered = {t["function"]["name"] for t in fake_model.requests[0]["tools"]}
    assert "notes" in offered


async def test_a_call_answers_and_the_session_keeps_its_remote_context(
    app: AgioApp, fake_model: FakeModelServer, remote: Remote
) -> None:
    async with AgioClient(app.address) as client:
        fake_model.enqueue(call("note milk"), Turn.text("Noted."))
        first = await client.run_to_end("Remember milk")
        fake_model.enqueue(call("note eggs"), Turn.text("Noted too."))
        second = await client.run_to_end("And eggs", session_id=first.run.session_id)
        fake_model.enqueue(call("note tea"), Turn.text("New list."))
        other = await client.run_to_end("Tea, in a new conversation")
    [one] = tool_steps(first.steps)
    [two] = tool_steps(second.steps)
    [three] = tool_steps(other.steps)
    assert json.loads(one.content)["answer"] == "notes: milk"
    assert json.loads(two.content)["answer"] == "notes: milk; eggs"
    assert json.loads(two.content)["context_id"] == json.loads(one.content)["context_id"]
    assert json.loads(three.content)["answer"] == "notes: tea"
    # The headers of the entry, its ${VAR} resolved, reached the remote agent.
    assert remote.keeper.headers[0]["x-notes-token"] == "s3cret"


async def test_the_remote_task_s_status_streams_as_the_tool_call_s_progress(
    app: AgioApp, fake_model: FakeModelServer
) -> None:
    async with AgioClient(app.address) as client:
        fake_model.enqueue(call("note milk"), Turn.text("Noted."))
        events = [event async for event in client.run("Remember milk")]
    kinds = [event.WhichOneof("event") for event in events]
    progress = [event.tool_progress for event in events if event.HasField("tool_progress")]
    [stored] = [
        e.step_completed.step
        for e in events
        if e.HasField("step_completed") and e.step_completed.step.role == Role.ROLE_TOOL
    ]
    answer = json.loads(stored.content)
    said = [(p.state, p.message) for p in progress]
    assert ("TASK_STATE_WORKING", "Reading 'note'") in said
    assert said[-1] == ("TASK_STATE_COMPLETED", "")
    for each in progress:
        assert (each.step_id, each.tool_call_id, each.name) == (stored.id, "call_1", "notes")
        assert (each.remote_task_id, each.remote_context_id) == (
            answer["task_id"],
            answer["context_id"],
        )
    first, last = kinds.index("tool_progress"), len(kinds) - kinds[::-1].index("tool_progress")
    tool_started = next(
        i for i, e in enumerate(events) if e.HasField("step_started") and e.step_started.name
    )
    tool_stored = events.index(next(e for e in events if e.step_completed.step.id == stored.id))
    assert tool_started < first
    assert last <= tool_stored


def test_the_remote_context_is_the_last_good_answer_s_of_that_tool() -> None:
    def result(name: str, content: str, is_error: bool = False) -> Step:
        return Step("sess", "run", DomainRole.TOOL, content, name=name, is_error=is_error)

    answer = json.dumps({"answer": "a", "context_id": "ctx-1"})
    assert remote_context([], "notes") == ""
    assert remote_context([result("notes", answer)], "notes") == "ctx-1"
    later = [result("notes", answer), result("notes", "Error: failed", is_error=True)]
    assert remote_context(later, "notes") == "ctx-1"
    assert remote_context([result("other", answer)], "notes") == ""
    for bad in ("not json", "[1]", json.dumps({"context_id": 7}), "\x00"):
        assert remote_context([result("notes", bad)], "notes") == ""


async def test_the_remote_context_outlives_a_restart(
    store_url: str, fake_model: FakeModelServer, remote: Remote
) -> None:
    async def run_once(text: str, session_id: str = "") -> Any:
        started = await AgioApp.start(settings(store_url, fake_model.base_url, remote.url))
        try:
            await offered(started)
            async with AgioClient(started.address) as client:
                return await client.run_to_end(text, session_id=session_id)
        finally:
            await started.stop(grace=0)

    fake_model.enqueue(call("note milk"), Turn.text("Noted."))
    first = await run_once("Remember milk")
    fake_model.enqueue(call("note eggs"), Turn.text("Noted too."))
    second = await run_once("And eggs", first.run.session_id)
    [one], [two] = tool_steps(first.steps), tool_steps(second.steps)
    assert json.loads(two.content)["context_id"] == json.loads(one.content)["context_id"]
    assert json.loads(two.content)["answer"] == "notes: milk; eggs"


async def test_a_remote_failure_and_input_required_are_errors_the_model_sees(
    app: AgioApp, fake_model: FakeModelServer
) -> None:
    async with AgioClient(app.address) as client:
        fake_model.enqueue(call("fail"), Turn.text("It failed."))
        failed = await client.run_to_end("Fail")
        fake_model.enqueue(call("ask"), Turn.text("It asked."))
        asked = await client.run_to_end("Ask")
    [failure] = tool_steps(failed.steps)
    assert failure.is_error
    assert "A2A agent 'notes' failed: the note book is on fire" in failure.content
    assert failed.run.status == RunStatus.RUN_STATUS_COMPLETED
    [question] = tool_steps(asked.steps)
    assert question.is_error
    assert "wait for input" in question.content
    assert "Which note do you mean?" in question.content


async def test_cancelling_the_run_cancels_the_remote_task(
    app: AgioApp, fake_model: FakeModelServer, remote: Remote
) -> None:
    async with AgioClient(app.address) as client:
        fake_model.enqueue(call("wait"))
        run = await client.start_run("Wait")
        async for event in client.watch_run(run.id):
            if event.tool_progress.message == "Reading 'wait'":
                break  # the remote task is working
        ended = await client.cancel_run(run.id)
    assert ended.status == RunStatus.RUN_STATUS_CANCELLED
    for _ in range(200):
        if remote.keeper.cancelled:
            break
        await asyncio.sleep(0.02)
    assert len(remote.keeper.cancelled) == 1


async def test_an_unreachable_agent_is_an_unavailable_tool_with_its_reason(
    tmp_path: Path, fake_model: FakeModelServer
) -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
    url = f"http://127.0.0.1:{sock.getsockname()[1]}/"
    app = await AgioApp.start(settings(sqlite_at(tmp_path / "agio.db"), fake_model.base_url, url))
    try:
        async with AgioClient(app.address) as client:
            for _ in range(200):
                [agent] = await client.list_agents()
                notes = {t.name: t for t in agent.tools}["notes"]
                if "could not be read" in notes.unavailable_reason:
                    break
                await asyncio.sleep(0.02)
            assert notes.unavailable
            assert url in notes.unavailable_reason
            fake_model.enqueue(Turn.text("Hi."))
            await client.run_to_end("hi")
        offered = {t["function"]["name"] for t in fake_model.requests[0].get("tools", [])}
        assert "notes" not in offered
    finally:
        await app.stop(grace=0)
        sock.close()


async def test_a_missing_header_variable_stops_the_start(
    tmp_path: Path, fake_model: FakeModelServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("NO_SUCH_VARIABLE_AGIO", raising=False)
    configured = settings(
        sqlite_at(tmp_path / "agio.db"),
        fake_model.base_url,
        "http://127.0.0.1:9/",
        headers={"authorization": "Bearer ${NO_SUCH_VARIABLE_AGIO}"},
    )
    with pytest.raises(Exception, match="NO_SUCH_VARIABLE_AGIO is not set"):
        await AgioApp.start(configured)


async def test_the_remote_agent_gets_the_calls_trace_context(
    tmp_path: Path, fake_model: FakeModelServer, remote: Remote
) -> None:
    traced = make_traced()
    configured = settings(sqlite_at(tmp_path / "agio.db"), fake_model.base_url, remote.url)
    app = await AgioApp.start(configured, traced.telemetry)
    try:
        await offered(app)
        async with AgioClient(app.address) as client:
            fake_model.enqueue(call("note traced"), Turn.text("Done."))
            result = await client.run_to_end("Trace it")
    finally:
        await app.stop(grace=0)
        traced.tracer_provider.shutdown()
    traceparent = remote.keeper.headers[-1]["traceparent"]
    assert traceparent.split("-")[1] == result.run.trace_id
    [tool] = [s for s in traced.spans() if s.name == "execute_tool notes"]
    assert tool.context is not None
    assert traceparent.split("-")[2] == format(tool.context.span_id, "016x")
