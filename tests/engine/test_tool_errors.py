"""A tool's errors: `on_error: continue` (the default) hands the error result to the model;
`on_error: stop` stores it as the call's result all the same, then ends the run TOOL_ERROR.
Tool steps carry their wall time (`duration_ms`).

The harness's `strict` agent offers the test tools with `explode` set to stop on error.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from agio_grpc.domain import Role, RunStatus, StopReason
from agio_grpc.engine import RunFailed
from agio_grpc.engine.agents import AgentSpec, RunOverrides, RunSettings, resolve_settings
from agio_grpc.engine.events import ErrorNotice
from agio_grpc.testing import ToolCallSpec, Turn
from tests.engine.harness import LOOKUP, Harness, Outcome, assert_valid_messages


async def valid_log(harness: Harness, outcome: Outcome) -> None:
    steps = await harness.history(outcome.session_id)
    assert_valid_messages([step.to_message() for step in steps])


async def test_an_error_of_a_stop_tool_is_stored_then_ends_the_run_tool_error(
    harness: Harness,
) -> None:
    harness.model.enqueue(
        Turn.tool_calls(
            [
                ToolCallSpec("explode", '{"reason": "card declined"}', id="call_bad"),
                ToolCallSpec("note", '{"text": "logged"}', id="call_ok"),
            ]
        ),
        Turn.text("never asked for"),
    )
    outcome = await harness.run("refund it", agent="strict")

    signal = outcome.run.stop_signal
    assert signal is not None
    assert (signal.reason, signal.source, signal.retryable) == (
        StopReason.TOOL_ERROR,
        "tool:explode",
        False,
    )
    assert signal.context == {"tool_name": "explode", "tool_call_id": "call_bad"}
    assert signal.message == "tool 'explode' failed (call call_bad) and its on_error is stop"
    assert "card declined" not in signal.message  # the error text may quote arguments
    assert outcome.run.status is RunStatus.FAILED
    assert isinstance(outcome.events[-1].event, RunFailed)
    # Every call of the step is answered: the failed one by its error, the other by its result.
    tools = outcome.steps_of(Role.TOOL)
    assert [(t.tool_call_id, t.is_error, t.content) for t in tools] == [
        ("call_bad", True, "Error: tool 'explode' failed: RuntimeError: card declined"),
        ("call_ok", False, "logged"),
    ]
    (notice,) = outcome.of(ErrorNotice)
    assert (notice.reason, notice.source) == ("TOOL_FAILED", "tool:explode")
    assert len(harness.model.requests) == 1  # the model never got the error
    await valid_log(harness, outcome)


async def test_on_error_continue_is_the_default_the_model_sees_the_error(
    harness: Harness,
) -> None:
    harness.model.enqueue(
        Turn.tool_calls([ToolCallSpec("calculate", '{"expression": "1 / 0"}')]),
        Turn.text("cannot divide by zero"),
    )
    outcome = await harness.run("divide", agent="strict")  # calculate is not a stop tool
    assert outcome.reason is StopReason.COMPLETED
    (tool,) = outcome.steps_of(Role.TOOL)
    assert tool.is_error
    assert harness.model.requests[-1]["messages"][-1]["content"] == tool.content


async def test_arguments_that_are_not_json_are_an_error_that_stops_a_stop_tool(
    harness: Harness,
) -> None:
    harness.model.enqueue(Turn.tool_calls([ToolCallSpec("explode", "{oops", id="call_1")]))
    outcome = await harness.run("break it", agent="strict")
    assert outcome.reason is StopReason.TOOL_ERROR
    (tool,) = outcome.steps_of(Role.TOOL)
    assert tool.is_error
    assert "not valid JSON" in tool.content
    await valid_log(harness, outcome)


async def test_the_other_calls_of_the_step_run_to_their_results_before_the_stop(
    harness: Harness,
) -> None:
    harness.model.enqueue(
        Turn.tool_calls(
            [
                ToolCallSpec("wait_for_gate", '{"label": "slow"}', id="call_slow"),
                ToolCallSpec("explode", '{"reason": "boom"}', id="call_bad"),
            ]
        )
    )
    running = asyncio.create_task(harness.run("two at once", agent="strict"))
    await harness.gate.entered.wait()
    harness.gate.release.set()
    outcome = await running
    assert outcome.reason is StopReason.TOOL_ERROR
    tools = outcome.steps_of(Role.TOOL)
    assert [(t.tool_call_id, t.is_error, t.content) for t in tools] == [
        ("call_slow", False, "released slow"),
        ("call_bad", True, "Error: tool 'explode' failed: RuntimeError: boom"),
    ]


async def test_a_stop_tools_error_beside_a_client_tool_call_ends_the_run_and_answers_both(
    harness: Harness,
) -> None:
    harness.model.enqueue(
        Turn.tool_calls(
            [
                ToolCallSpec("explode", '{"reason": "boom"}', id="call_bad"),
                ToolCallSpec("lookup", '{"order": 7}', id="call_client"),
            ]
        )
    )
    outcome = await harness.run("both", agent="strict", client_tools=[LOOKUP])
    assert outcome.reason is StopReason.TOOL_ERROR  # stronger than REQUIRES_ACTION
    tools = {t.tool_call_id: t for t in outcome.steps_of(Role.TOOL)}
    assert set(tools) == {"call_bad", "call_client"}
    assert tools["call_client"].is_error
    assert "TOOL_ERROR" in tools["call_client"].content
    await valid_log(harness, outcome)


async def test_tool_steps_carry_the_wall_time_of_their_call(harness: Harness) -> None:
    harness.model.enqueue(
        Turn.tool_calls([ToolCallSpec("wait_for_gate", '{"label": "held"}')]), Turn.text("ok")
    )
    running = asyncio.create_task(harness.run("hold it"))
    await harness.gate.entered.wait()
    entered = time.perf_counter()
    await asyncio.sleep(0.02)  # not synchronisation: the call is held at least this long
    held_ms = int((time.perf_counter() - entered) * 1000)
    harness.gate.release.set()
    outcome = await running

    (tool,) = outcome.steps_of(Role.TOOL)
    metrics = tool.metrics
    assert metrics.duration_ms >= held_ms
    assert metrics.duration_ms >= metrics.tool_exec_time_ms >= held_ms
    stored = await harness.store.get_step(outcome.session_id, tool.sequence)
    assert stored.metrics.duration_ms == metrics.duration_ms


def test_a_run_stops_on_errors_only_of_the_stop_tools_it_is_offered() -> None:
    agent = AgentSpec(
        "payments", "fake-model", tools=["refund", "lookup"], stop_on_error_tools=["refund"]
    )
    assert resolve_settings(agent, RunOverrides(), []).stop_on_error_tools == ["refund"]
    only_lookup = resolve_settings(agent, RunOverrides(tools=["lookup"]), [])
    assert only_lookup.stop_on_error_tools == []


def test_the_stop_tools_survive_a_continuation_and_older_runs_have_none() -> None:
    agent = AgentSpec("payments", "fake-model", tools=["refund"], stop_on_error_tools=["refund"])
    settings = resolve_settings(agent, RunOverrides(), [])
    assert RunSettings.from_options(settings.to_options()) == settings
    older = settings.to_options()
    del older["stop_on_error_tools"]  # stored before the field existed
    assert RunSettings.from_options(older).stop_on_error_tools == []


def test_an_agent_cannot_stop_on_errors_of_a_tool_it_does_not_offer() -> None:
    with pytest.raises(ValueError, match=r"stop_on_error_tools \['refund'\]"):
        AgentSpec("payments", "fake-model", tools=["lookup"], stop_on_error_tools=["refund"])


async def test_arguments_nested_past_the_parsers_depth_are_an_error_the_model_sees(
    harness: Harness,
) -> None:
    deep = '{"expression": ' + "[" * 100_000 + "]" * 100_000 + "}"
    harness.model.enqueue(
        Turn.tool_calls([ToolCallSpec("calculate", deep, id="call_deep")]),
        Turn.text("I will send flat arguments"),
    )
    outcome = await harness.run("nest it", agent="strict")
    assert outcome.reason is StopReason.COMPLETED
    (tool,) = outcome.steps_of(Role.TOOL)
    assert tool.is_error
    assert tool.content == (
        "Error: the arguments of 'calculate' nest too deeply to read. "
        "Send the arguments as one JSON object of fewer levels."
    )
    assert harness.model.requests[-1]["messages"][-1]["content"] == tool.content
    await valid_log(harness, outcome)
