"""The step limit (`Limits.max_step_bytes`): a model reply or a server tool's result over it
is cut to it, stored as a readable step, and ends the run with a typed stop. On SQLite and
PostgreSQL."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest

from agio_grpc.domain import Role, StopReason
from agio_grpc.engine.executor import oversized
from agio_grpc.engine.tools import ToolResult
from agio_grpc.testing import FakeModelServer, ToolCallSpec, Turn
from tests.engine.harness import Gate, Harness, assert_valid_messages, build_runtime
from tests.roles import StoreRoles

LIMIT = 1000


@pytest.fixture
async def limited(store: StoreRoles, fake_model: FakeModelServer) -> AsyncIterator[Harness]:
    built = build_runtime(store, fake_model, Gate(), max_step_bytes=LIMIT)
    try:
        yield built
    finally:
        await built.runtime.shutdown(grace_s=0)
        await built.driver.close()


async def valid_log(harness: Harness, session_id: str) -> None:
    steps = await harness.history(session_id)
    assert_valid_messages([step.to_message() for step in steps])


@pytest.mark.parametrize("text", ["x" * 5000, "é✓" * 2000])
async def test_a_reply_over_the_limit_is_cut_there_and_ends_the_run(
    limited: Harness, text: str
) -> None:
    limited.model.enqueue(Turn.text(text, chunks=40))
    outcome = await limited.run("write a lot")
    signal = outcome.run.stop_signal
    assert signal is not None
    assert (signal.reason, signal.context) == (StopReason.MAX_TOKENS, {"max_step_bytes": LIMIT})
    assert "step limit of 1000 bytes" in signal.message
    (reply,) = outcome.steps_of(Role.ASSISTANT)
    assert text.startswith(reply.content)
    assert LIMIT - 4 < len(reply.content.encode()) <= LIMIT
    stored = (await limited.history(outcome.session_id))[-1]
    assert stored.content == reply.content


async def test_a_reply_whose_tool_calls_go_over_the_limit_runs_none_of_them(
    limited: Harness,
) -> None:
    calls = [ToolCallSpec("echo", json.dumps({"text": "y" * 400})) for _ in range(4)]
    limited.model.enqueue(Turn.tool_calls(calls, content="calling"))
    outcome = await limited.run("echo a lot")
    assert outcome.reason is StopReason.MAX_TOKENS
    (reply,) = outcome.steps_of(Role.ASSISTANT)
    assert (reply.content, reply.tool_calls) == ("calling", [])
    assert not outcome.steps_of(Role.TOOL)
    await valid_log(limited, outcome.session_id)


async def test_a_tool_result_over_the_limit_is_cut_and_ends_the_run_tool_error(
    limited: Harness,
) -> None:
    arguments = '{"text": "0123456789", "times": 150}'
    limited.model.enqueue(Turn.tool_calls([ToolCallSpec("repeat", arguments, id="c1")]))
    outcome = await limited.run("a long result")
    signal = outcome.run.stop_signal
    assert signal is not None
    assert (signal.reason, signal.source) == (StopReason.TOOL_ERROR, "tool:repeat")
    assert signal.context == {"result_bytes": 1500, "max_step_bytes": LIMIT}
    (result,) = outcome.steps_of(Role.TOOL)
    assert result.is_error
    assert len(result.content.encode()) <= LIMIT
    assert result.content.startswith("0123456789" * 50)
    assert result.content.endswith("over the step limit of 1000]")
    await valid_log(limited, outcome.session_id)


def test_a_result_within_the_limit_is_left_as_it_is() -> None:
    from agio_grpc.domain import ToolCall

    result = ToolResult(ToolCall("c", "echo", "{}"), "é" * 500)  # 1,000 bytes exactly
    assert oversized(result, 1000) is result
    cut = oversized(result, 999)
    assert cut.is_error
    assert len(cut.content.encode()) <= 999
