"""Executing a step's tool calls: bounded parallelism, call order, and errors as results."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass

from mcp import types as mcp_types

from agio_grpc.domain import StopReason, ToolCall
from agio_grpc.engine.executor import execute_tool_calls
from agio_grpc.engine.mcp import McpServer, McpServerSpec, McpTool
from agio_grpc.engine.tools import ToolContext, ToolRegistry, ToolResult, ToolStop
from tests.engine.harness import Gate, make_registry

OFFERED = ["calculate", "echo", "note", "wait_for_gate", "explode", "finish"]


def context(call: ToolCall) -> ToolContext:
    return ToolContext("run", "sess", call.id, call.name)


async def execute(
    registry: ToolRegistry,
    *calls: ToolCall,
    timeout_s: float = 5.0,
    max_parallel: int = 4,
    completed: dict[str, ToolResult] | None = None,
) -> list[ToolResult]:
    return await execute_tool_calls(
        calls,
        registry,
        offered=[*OFFERED, "sleepy", "forever"],
        make_context=context,
        timeout_s=timeout_s,
        max_parallel=max_parallel,
        completed=completed,
    )


async def test_calls_run_in_parallel_and_results_keep_call_order() -> None:
    gate = Gate()
    registry = make_registry(gate)
    calls = [ToolCall(f"c{i}", "wait_for_gate", f'{{"label": "{i}"}}') for i in range(3)]
    task = asyncio.create_task(execute(registry, *calls, max_parallel=3))
    await gate.wait_running(3)  # all three are inside the tool at once
    gate.release.set()
    results = await task
    assert [r.call.id for r in results] == ["c0", "c1", "c2"]
    assert [r.content for r in results] == ["released 0", "released 1", "released 2"]
    assert not any(r.is_error for r in results)


async def test_parallelism_is_bounded_by_max_parallel() -> None:
    gate = Gate()
    registry = make_registry(gate)
    calls = [ToolCall(f"c{i}", "wait_for_gate", "{}") for i in range(5)]
    task = asyncio.create_task(execute(registry, *calls, max_parallel=2))
    await gate.wait_running(2)
    for _ in range(20):  # give the others every chance to start too
        await asyncio.sleep(0)
    assert gate.running == 2
    gate.release.set()
    assert len(await task) == 5
    assert gate.most_running == 2


async def test_unknown_tool_lists_the_available_ones() -> None:
    (result,) = await execute(make_registry(Gate()), ToolCall("c", "teleport", "{}"))
    assert result.is_error
    assert result.content.startswith("Error: unknown tool 'teleport'. Available tools: ")
    assert "calculate, echo, explode, finish, note, wait_for_gate" in result.content


async def test_a_registered_tool_not_offered_to_the_run_is_unknown() -> None:
    registry = make_registry(Gate())
    (result,) = await execute_tool_calls(
        [ToolCall("c", "explode", '{"reason": "x"}')],
        registry,
        offered=["echo"],
        make_context=context,
        timeout_s=1,
        max_parallel=1,
    )
    assert result.content == "Error: unknown tool 'explode'. Available tools: echo."


async def test_invalid_json_arguments_quote_the_parser_error() -> None:
    (result,) = await execute(make_registry(Gate()), ToolCall("c", "echo", '{"text": '))
    assert result.is_error
    assert result.content.startswith("Error: the arguments of 'echo' are not valid JSON (")
    assert "Expecting value" in result.content


async def test_non_object_arguments_are_refused() -> None:
    (result,) = await execute(make_registry(Gate()), ToolCall("c", "echo", "[1]"))
    assert result.content == "Error: the arguments of 'echo' must be a JSON object."


async def test_arguments_failing_validation_name_the_field() -> None:
    (result,) = await execute(make_registry(Gate()), ToolCall("c", "calculate", '{"expr": "1"}'))
    assert result.is_error
    assert result.content == (
        "Error: invalid arguments for 'calculate': expression: Field required; "
        "expr: Extra inputs are not permitted."
    )


async def test_empty_arguments_mean_no_arguments() -> None:
    (result,) = await execute(make_registry(Gate()), ToolCall("c", "calculate", ""))
    assert "expression: Field required" in result.content


async def test_an_exception_becomes_type_and_message_without_traceback() -> None:
    (result,) = await execute(
        make_registry(Gate()), ToolCall("c", "explode", '{"reason": "disk on fire"}')
    )
    assert result.is_error
    assert result.content == "Error: tool 'explode' failed: RuntimeError: disk on fire"
    assert "Traceback" not in result.content


async def test_a_slow_tool_times_out_and_the_others_still_return() -> None:
    never = asyncio.Event()
    released = threading.Event()

    async def forever() -> str:
        await never.wait()
        return "never"

    def sleepy() -> str:
        released.wait(5)
        return "late"

    registry = make_registry(Gate())
    registry.register(forever)
    registry.register(sleepy)
    try:
        results = await execute(
            registry,
            ToolCall("a", "forever", "{}"),
            ToolCall("b", "sleepy", "{}"),
            ToolCall("c", "echo", '{"text": "fine"}'),
            timeout_s=0.05,
        )
    finally:
        released.set()
    assert [r.content for r in results] == [
        "Error: tool 'forever' timed out after 0.05s.",
        "Error: tool 'sleepy' timed out after 0.05s.",
        "fine",
    ]
    assert results[0].exec_time_ms >= 50


async def test_tool_stop_is_a_result_with_a_stop_signal() -> None:
    (result,) = await execute(make_registry(Gate()), ToolCall("c", "finish", '{"summary": "s"}'))
    assert not result.is_error
    assert result.content == "finished: s"
    assert result.stop is not None
    assert result.stop.reason is StopReason.TOOL_STOP
    assert result.stop.source == "tool:finish"


async def test_cancelling_keeps_the_results_that_finished() -> None:
    gate = Gate()
    registry = make_registry(gate)
    completed: dict[str, ToolResult] = {}
    task = asyncio.create_task(
        execute(
            registry,
            ToolCall("quick", "note", '{"text": "done"}'),
            ToolCall("slow", "wait_for_gate", "{}"),
            completed=completed,
        )
    )
    await gate.entered.wait()  # "quick" never waits: it finished before the gate was entered
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert task.cancelled()
    assert list(completed) == ["quick"]


def test_tool_stop_carries_context() -> None:
    stop = ToolStop("bye", context={"k": 1})
    assert stop.message == "bye"
    assert stop.context == {"k": 1}


def _nested(depth: int) -> str:
    return '{"tree": ' + "[" * depth + "]" * depth + "}"


async def test_arguments_nested_past_the_parsers_depth_are_an_error_result() -> None:
    (result,) = await execute(make_registry(Gate()), ToolCall("c", "echo", _nested(100_000)))
    assert result.is_error
    assert result.content == (
        "Error: the arguments of 'echo' nest too deeply to read. "
        "Send the arguments as one JSON object of fewer levels."
    )


@dataclass
class _Listed:
    """A tool source listing one tool, as a connected MCP server lists its tools."""

    tool: McpTool
    source: str = "mcp:deep"

    def tools(self) -> dict[str, McpTool]:
        return {self.tool.name: self.tool}


async def test_an_integer_too_long_to_read_in_the_arguments_is_an_error_result() -> None:
    arguments = '{"text": ' + "7" * 5_000 + "}"  # past Python's 4,300 digits
    (result,) = await execute(make_registry(Gate()), ToolCall("c", "echo", arguments))
    assert result.is_error
    assert result.content == (
        "Error: the arguments of 'echo' hold a number too long to read. "
        "Send the arguments as one JSON object with shorter numbers."
    )


async def test_arguments_too_deep_for_a_recursive_schemas_check_are_an_error_result() -> None:
    # An MCP server's input schema is checked level by level (jsonschema recurses per
    # level); arguments the parser reads can still be too deep for that.
    node = {"type": "array", "items": {"$ref": "#/$defs/node"}}
    schema = {"type": "object", "properties": {"tree": node["items"]}, "$defs": {"node": node}}
    server = McpServer(McpServerSpec(name="deep", transport="stdio", command="/bin/true"))
    tool = McpTool(server, mcp_types.Tool(name="walk", inputSchema=schema), "walk")
    registry = ToolRegistry()
    registry.attach(_Listed(tool))
    (shallow, deep) = await execute_tool_calls(
        [ToolCall("c1", tool.name, _nested(3)), ToolCall("c2", tool.name, _nested(900))],
        registry,
        offered=[tool.name],
        make_context=context,
        timeout_s=1,
        max_parallel=1,
    )
    assert "nest too deeply" not in shallow.content  # checked, then refused: not connected
    assert deep.is_error
    assert deep.content == (
        f"Error: the arguments of {tool.name!r} nest too deeply to read. "
        "Send the arguments as one JSON object of fewer levels."
    )
