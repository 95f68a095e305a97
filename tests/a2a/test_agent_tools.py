"""Local agents as tools (`agents: [OTHER]`), on both backends: the real server, the real
gRPC client, the fake model answering the parent's and the child's model calls in turn.

`boss` may call `worker`, which may call `leaf`: nesting, the link between parent and child,
WatchRun of the child, cancel cascading to the child, the child's tokens in the parent's
budget, the depth limit, and the start-up refusal of cycles and unknown agents."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from agio_grpc.client import AgioClient
from agio_grpc.config import AgentConfig, LimitsConfig
from agio_grpc.service.app import AgioApp
from agio_grpc.testing import FakeModelServer, ToolCallSpec, Turn, UsageSpec
from agio_grpc.v1.resources_pb2 import Role, RunStatus, StopReason
from tests.service.conftest import make_settings
from tests.sqlite import sqlite_at


def agents(**boss: Any) -> list[AgentConfig]:
    return [
        AgentConfig(
            name="boss",
            instructions="Delegate.",
            tools=["calculate"],
            agents=["worker"],
            limits=LimitsConfig(max_steps=5, tool_timeout_s=10.0, **boss),
        ),
        AgentConfig(
            name="worker",
            description="Works things out.",
            instructions="Work.",
            tools=["calculate", "hang"],
            agents=["leaf"],
        ),
        AgentConfig(name="leaf", instructions="Leaf.", tools=[]),
    ]


def settings(store_url: str, model_url: str, **overrides: Any) -> Any:
    values: dict[str, Any] = {"agents": agents(), "default_agent": "boss"}
    return make_settings(store_url, model_url, **(values | overrides))


@pytest.fixture
async def fake_model() -> AsyncIterator[FakeModelServer]:
    async with FakeModelServer() as server:
        yield server


async def started(settings_: Any) -> AgioApp:
    return await AgioApp.start(settings_)


@pytest.fixture
async def client(store_url: str, fake_model: FakeModelServer) -> AsyncIterator[AgioClient]:
    app = await started(settings(store_url, fake_model.base_url))
    try:
        async with AgioClient(app.address) as opened:
            yield opened
    finally:
        await app.stop(grace=0)


def ask(agent: str, text: str, call_id: str = "call_1") -> Turn:
    return Turn.tool_calls([ToolCallSpec(agent, json.dumps({"input": text}), id=call_id)])


async def test_a_call_runs_a_child_run_linked_both_ways_and_watchable(
    client: AgioClient, fake_model: FakeModelServer
) -> None:
    fake_model.enqueue(ask("worker", "What is 2+2?"), Turn.text("4"), Turn.text("It is 4."))
    result = await client.run_to_end("Ask the worker")
    assert result.run.status == RunStatus.RUN_STATUS_COMPLETED
    assert result.text == "It is 4."
    [tool_step] = [s for s in result.steps if s.role == Role.ROLE_TOOL]
    assert tool_step.name == "worker"
    linked = json.loads(tool_step.content)
    assert linked["answer"] == "4"
    assert linked["agent"] == "worker"
    child = await client.get_run(linked["run_id"])
    assert child.agent == "worker"
    assert child.session_id == linked["session_id"] != result.run.session_id
    assert child.status == RunStatus.RUN_STATUS_COMPLETED
    assert child.metadata["agio.parent_run_id"] == result.run.id
    assert child.metadata["agio.parent_tool_call_id"] == "call_1"
    assert child.metadata["agio.parent_session_id"] == result.run.session_id
    kinds = [e.WhichOneof("event") async for e in client.watch_run(child.id)]
    assert kinds[0] == "run_started"
    assert kinds[-1] == "run_completed"
    # The child's tokens are the tool step's and the parent's.
    assert tool_step.metrics.total_tokens == child.usage.total_tokens > 0
    own = sum(s.metrics.total_tokens for s in result.steps if s.role == Role.ROLE_ASSISTANT)
    assert result.run.usage.total_tokens == own + child.usage.total_tokens


async def test_the_call_s_progress_names_the_child_run_as_it_starts(
    client: AgioClient, fake_model: FakeModelServer
) -> None:
    fake_model.enqueue(ask("worker", "What is 2+2?"), Turn.text("4"), Turn.text("It is 4."))
    events = [event async for event in client.run("Ask the worker")]
    kinds = [event.WhichOneof("event") for event in events]
    [progress] = [event.tool_progress for event in events if event.HasField("tool_progress")]
    [started] = [
        e.step_started for e in events if e.HasField("step_started") and e.step_started.name
    ]
    [stored] = [
        e.step_completed.step
        for e in events
        if e.HasField("step_completed") and e.step_completed.step.role == Role.ROLE_TOOL
    ]
    assert kinds.index("tool_progress") > kinds.index("step_started")
    assert (progress.step_id, progress.tool_call_id, progress.name) == (
        started.step_id,
        "call_1",
        "worker",
    )
    assert progress.step_id == stored.id
    assert progress.state == "RUN_STATUS_RUNNING"
    linked = json.loads(stored.content)
    assert (progress.child_run_id, progress.child_session_id) == (
        linked["run_id"],
        linked["session_id"],
    )
    assert "worker" in progress.message


async def test_the_worker_is_offered_as_a_tool_with_its_description(
    client: AgioClient, fake_model: FakeModelServer
) -> None:
    fake_model.enqueue(Turn.text("Hi."))
    await client.run_to_end("hi")
    offered = {t["function"]["name"]: t["function"] for t in fake_model.requests[0]["tools"]}
    assert offered["worker"]["description"] == "Works things out."
    assert offered["worker"]["parameters"]["required"] == ["input"]
    assert "leaf" not in offered  # boss may call worker only


async def test_a_failing_child_is_an_error_result_the_model_sees(
    client: AgioClient, fake_model: FakeModelServer
) -> None:
    fake_model.enqueue(
        ask("worker", "go"), Turn.error(400, message="bad request"), Turn.text("It failed.")
    )
    result = await client.run_to_end("Ask the worker")
    [tool_step] = [s for s in result.steps if s.role == Role.ROLE_TOOL]
    assert tool_step.is_error
    assert "agent 'worker' failed (MODEL_ERROR" in tool_step.content
    assert result.text == "It failed."


async def test_cancelling_the_parent_cancels_the_child(
    client: AgioClient, fake_model: FakeModelServer
) -> None:
    fake_model.enqueue(ask("worker", "wait"), Turn.hanging())
    parent = await client.start_run("Ask the worker")
    async for event in client.watch_run(parent.id):
        if event.HasField("tool_progress"):
            child_id = event.tool_progress.child_run_id
            break
    await fake_model.wait_for_requests(2)  # the child's model call hangs
    ended = await client.cancel_run(parent.id)
    assert ended.status == RunStatus.RUN_STATUS_CANCELLED
    child = await client.get_run(child_id)
    assert child.status == RunStatus.RUN_STATUS_CANCELLED
    assert child.stop_signal.source == "parent"


async def test_the_childs_tokens_count_toward_the_parents_budget(
    store_url: str, fake_model: FakeModelServer
) -> None:
    budgeted = settings(store_url, fake_model.base_url, agents=agents(token_budget=500))
    app = await started(budgeted)
    try:
        async with AgioClient(app.address) as client:
            fake_model.enqueue(
                ask("worker", "go"),
                Turn.text("big", usage=UsageSpec(prompt_tokens=900, completion_tokens=100)),
                Turn.text("never asked"),
            )
            result = await client.run_to_end("Ask the worker")
    finally:
        await app.stop(grace=0)
    assert result.stop_signal.reason == StopReason.STOP_REASON_TOKEN_BUDGET
    assert result.run.usage.total_tokens >= 1000
    assert fake_model.pending == 1  # the parent made no further model call


async def test_calls_nest_no_deeper_than_max_agent_depth(
    store_url: str, fake_model: FakeModelServer
) -> None:
    app = await started(settings(store_url, fake_model.base_url, server={"max_agent_depth": 1}))
    try:
        async with AgioClient(app.address) as client:
            fake_model.enqueue(
                ask("worker", "ask the leaf"),  # boss (depth 0) -> worker (depth 1)
                ask("leaf", "hi", call_id="call_2"),  # worker -> leaf: too deep
                Turn.text("Could not."),  # worker's answer
                Turn.text("Done."),  # boss's answer
            )
            result = await client.run_to_end("Go")
            [tool_step] = [s for s in result.steps if s.role == Role.ROLE_TOOL]
            child = json.loads(tool_step.content)
            steps = await client.list_steps(child["session_id"])
    finally:
        await app.stop(grace=0)
    [refused] = [s for s in steps if s.role == Role.ROLE_TOOL]
    assert refused.is_error
    assert "nest at most 1 deep" in refused.content


@pytest.mark.parametrize(
    ("calls", "message"),
    [
        ({"boss": ["worker"], "worker": ["boss"]}, "cycle: boss -> worker -> boss"),
        ({"boss": ["boss"]}, "cycle: boss -> boss"),
        ({"boss": ["nobody"]}, "unknown agent 'nobody'"),
    ],
)
async def test_cycles_and_unknown_agents_are_refused_at_start_up(
    tmp_path: Any, fake_model: FakeModelServer, calls: dict[str, list[str]], message: str
) -> None:
    configured = [AgentConfig(name=name, agents=calls.get(name, [])) for name in ("boss", "worker")]
    url = sqlite_at(tmp_path / "agio.db")
    with pytest.raises(Exception, match=message):
        await started(settings(url, fake_model.base_url, agents=configured))
