"""Server tools: schemas from type hints, validation, loading from config, the built-ins."""

from __future__ import annotations

import threading
from typing import Annotated, Literal

import pydantic
import pytest
from pydantic import Field

from agio_grpc.engine.builtin_tools import TOOLS, calculate, current_time, echo
from agio_grpc.engine.events import ToolProgress
from agio_grpc.engine.tools import (
    MAX_PROGRESS_ID_CHARS,
    MAX_PROGRESS_MESSAGE_CHARS,
    Tool,
    ToolContext,
    ToolRegistry,
    load_tools,
    render_result,
)

CONTEXT = ToolContext("run_1", "sess_1", "call_1", "t")


def forecast(city: str, days: int = 3, unit: Literal["C", "F"] = "C") -> str:
    """Forecast the weather for a city.

    Longer text that is not part of the description.

    Args:
        city: The city name,
            for example Paris.
        days: How many days ahead.
    """
    return f"{city}:{days}:{unit}"


def test_schema_comes_from_type_hints_and_docstring() -> None:
    tool = Tool(forecast)
    assert tool.name == "forecast"
    assert tool.description == "Forecast the weather for a city."
    schema = tool.parameters
    assert schema["type"] == "object"
    assert schema["required"] == ["city"]
    assert schema["properties"]["city"]["type"] == "string"
    assert schema["properties"]["city"]["description"] == "The city name, for example Paris."
    assert schema["properties"]["days"] == {
        "default": 3,
        "description": "How many days ahead.",
        "title": "Days",
        "type": "integer",
    }
    assert schema["properties"]["unit"]["enum"] == ["C", "F"]
    assert schema["additionalProperties"] is False
    assert tool.definition() == {
        "type": "function",
        "function": {"name": "forecast", "description": tool.description, "parameters": schema},
    }


def test_annotated_field_descriptions_are_kept() -> None:
    def search(query: Annotated[str, Field(description="What to look for")]) -> str:
        return query

    assert Tool(search).parameters["properties"]["query"]["description"] == "What to look for"


def test_arguments_are_validated_and_coerced_by_pydantic() -> None:
    tool = Tool(forecast)
    assert tool.validate({"city": "Oslo", "days": "5"}) == {"city": "Oslo", "days": 5, "unit": "C"}
    with pytest.raises(pydantic.ValidationError):
        tool.validate({"days": 1})
    with pytest.raises(pydantic.ValidationError):
        tool.validate({"city": "Oslo", "unit": "K"})
    with pytest.raises(pydantic.ValidationError):
        tool.validate({"city": "Oslo", "surprise": True})


async def test_tool_context_is_injected_and_hidden_from_the_model() -> None:
    async def charge(amount: int, context: ToolContext) -> dict[str, object]:
        """Charge once per call."""
        return {"amount": amount, "key": context.idempotency_key}

    tool = Tool(charge)
    assert list(tool.parameters["properties"]) == ["amount"]
    result = await tool.invoke(tool.validate({"amount": 5}), CONTEXT)
    assert result == '{"amount":5,"key":"run_1:call_1"}'


async def test_sync_and_async_functions_both_become_tools() -> None:
    async def shout(text: str) -> str:
        return text.upper()

    assert await Tool(shout).invoke({"text": "hi"}, CONTEXT) == "HI"
    assert await Tool(echo).invoke({"text": "hi"}, CONTEXT) == "hi"


async def test_a_sync_tool_runs_in_a_worker_thread_unless_inline() -> None:
    def thread_id() -> int:
        """The id of the thread the call runs on."""
        return threading.get_ident()

    loop_thread = str(threading.get_ident())
    assert await Tool(thread_id).invoke({}, CONTEXT) != loop_thread
    assert await Tool(thread_id, inline=True).invoke({}, CONTEXT) == loop_thread


def test_an_async_tool_cannot_be_inline() -> None:
    async def shout(text: str) -> str:
        return text.upper()

    with pytest.raises(ValueError, match="async function"):
        Tool(shout, inline=True)


def test_the_built_in_tools_run_inline() -> None:
    assert [(tool.name, tool.inline) for tool in TOOLS] == [
        ("current_time", True),
        ("calculate", True),
        ("echo", True),
    ]


def test_results_render_as_text_or_json() -> None:
    assert render_result("plain") == "plain"
    assert render_result({"a": [1, 2]}) == '{"a":[1,2]}'
    assert render_result(None) == "null"


def test_variadic_parameters_are_refused() -> None:
    def anything(*args: str) -> str:
        return ""

    with pytest.raises(TypeError, match="args"):
        Tool(anything)


def test_registry_refuses_duplicates_and_offers_only_named_tools() -> None:
    registry = ToolRegistry([forecast, echo])
    with pytest.raises(ValueError, match="already registered"):
        registry.register(echo)
    assert registry.names() == ["echo", "forecast"]
    assert "echo" in registry
    assert [d["function"]["name"] for d in registry.definitions(["forecast", "nope"])] == [
        "forecast"
    ]


def test_load_tools_from_a_function_or_a_module_tools_list() -> None:
    (one,) = load_tools("agio_grpc.engine.builtin_tools:calculate")
    assert one.name == "calculate"
    names = [tool.name for tool in load_tools("agio_grpc.engine.builtin_tools")]
    assert names == ["current_time", "calculate", "echo"]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("no_such_module_here", "cannot import"),
        ("agio_grpc.engine.builtin_tools:nope", "no attribute"),
        ("agio_grpc.engine.tools", "no TOOLS list"),
        ("agio_grpc.engine.builtin_tools:MAX_NODES", "neither a function"),
    ],
)
def test_load_tools_explains_bad_specs(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        load_tools(spec)


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("1 + 2", "3"),
        ("(2 + 3) * -4", "-20"),
        ("7 / 2", "3.5"),
        ("7 // 2", "3"),
        ("7 % 3", "1"),
        ("2 ** 10", "1024"),
        ("-(-3)", "3"),
        ("+4", "4"),
        ("1.5 * 2", "3.0"),
    ],
)
def test_calculator_evaluates_arithmetic(expression: str, value: str) -> None:
    assert calculate(expression) == value


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("__import__('os').system('true')", "unsupported"),
        ("open('/etc/passwd')", "unsupported"),
        ("(1).__class__", "unsupported"),
        ("x + 1", "unsupported"),
        ("[1, 2]", "unsupported"),
        ("'a' * 3", "only numbers"),
        ("True + 1", "only numbers"),
        ("1 / 0", "division by zero"),
        ("9 ** 9 ** 9", "exponent"),
        ("10 ** 5000", "too large"),
        ("1e308 * 10", "too large"),
        ("(-8) ** 0.5", "not a real number"),
        ("1 +", "not an arithmetic expression"),
        ("1" + "+1" * 300, "longer than"),
        ("+".join(["1"] * 150), "parts"),
    ],
)
def test_calculator_refuses_anything_but_bounded_arithmetic(expression: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        calculate(expression)


def test_current_time_is_iso_utc() -> None:
    assert current_time().endswith("+00:00")


def test_a_progress_message_is_cut_and_an_oversized_id_left_out() -> None:
    reported: list[ToolProgress] = []
    context = ToolContext(
        "run_1", "sess_1", "call_1", "t", step_id="step_1", progress=reported.append
    )
    context.report_progress(
        "x" * (MAX_PROGRESS_MESSAGE_CHARS + 10),
        state="WORKING",
        remote_task_id="t" * (MAX_PROGRESS_ID_CHARS + 1),
        remote_context_id="c" * MAX_PROGRESS_ID_CHARS,
    )
    [event] = reported
    assert len(event.message) == MAX_PROGRESS_MESSAGE_CHARS
    assert event.remote_task_id == ""
    assert event.remote_context_id == "c" * MAX_PROGRESS_ID_CHARS
    assert (event.step_id, event.tool_call_id, event.name, event.state) == (
        "step_1",
        "call_1",
        "t",
        "WORKING",
    )
