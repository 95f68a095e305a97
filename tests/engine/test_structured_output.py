"""Structured output: a run whose final answer must be JSON valid against a schema
(engine/output.py), on each backend, against the fake model over HTTP."""

from __future__ import annotations

import json
from typing import Any

import pytest

from agio_grpc.domain import Role, RunStatus, StopReason
from agio_grpc.engine import ClientTool, RunCompleted, RunFailed, RunOverrides
from agio_grpc.engine.errors import InvalidInputError
from agio_grpc.engine.events import StepDelta
from agio_grpc.engine.output import FINAL_OUTPUT_TOOL
from agio_grpc.testing import ToolCallSpec, Turn
from tests.engine.harness import CITY_SCHEMA, Harness, Outcome, assert_valid_messages

PARIS = {"city": "Paris", "population": 2_100_000}


def output_of(outcome: Outcome) -> Any:
    assert outcome.run.output_json, "the run has an output"
    return json.loads(outcome.run.output_json)


def terminal_run_output(outcome: Outcome) -> Any:
    (terminal,) = [e.event for e in outcome.events if e.is_terminal]
    assert isinstance(terminal, RunCompleted | RunFailed)
    return json.loads(terminal.run.output_json) if terminal.run.output_json else None


async def test_a_valid_answer_is_the_run_output_the_stored_run_and_the_terminal_event(
    backend_harness: Harness,
) -> None:
    harness = backend_harness
    harness.model.enqueue(Turn.json(PARIS))

    outcome = await harness.run("Which city?", agent="structured_json_schema")

    assert outcome.reason is StopReason.COMPLETED
    assert output_of(outcome) == PARIS
    assert terminal_run_output(outcome) == PARIS
    stored = await harness.store.get_run(outcome.run_id)
    assert json.loads(stored.output_json) == PARIS
    replayed = [event async for event in harness.follow(outcome.run_id)]
    assert terminal_run_output(Outcome(replayed)) == PARIS, "the journal keeps it too"
    (assistant,) = outcome.steps_of(Role.ASSISTANT)
    assert json.loads(assistant.content) == PARIS, "the final step keeps the raw JSON"
    (request,) = harness.model.requests
    assert request["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "final_answer", "schema": CITY_SCHEMA, "strict": True},
    }


async def test_an_invalid_answer_is_repaired_once_with_its_validation_errors(
    backend_harness: Harness,
) -> None:
    harness = backend_harness
    harness.model.enqueue(Turn.json({"city": "Paris"}), Turn.json(PARIS))

    outcome = await harness.run("Which city?", agent="structured_json_schema")

    assert outcome.reason is StopReason.COMPLETED
    assert output_of(outcome) == PARIS
    first, repair = harness.model.requests
    asked_again = repair["messages"][-1]
    assert asked_again["role"] == "user"
    assert "'population' is a required property" in asked_again["content"]
    assert repair["response_format"] == first["response_format"]
    roles = [step.role for step in await harness.history(outcome.session_id)]
    assert roles == [Role.USER, Role.ASSISTANT, Role.USER, Role.ASSISTANT]


async def test_an_answer_that_stays_invalid_stops_the_run_output_invalid(
    backend_harness: Harness,
) -> None:
    harness = backend_harness
    harness.model.enqueue(Turn.text("Paris, I think"), Turn.json({"city": 7, "population": 1}))

    outcome = await harness.run("Which city?", agent="structured_json_schema")

    assert outcome.reason is StopReason.OUTPUT_INVALID
    assert outcome.run.status is RunStatus.FAILED
    assert not outcome.run.output_json
    signal = outcome.run.stop_signal
    assert signal is not None
    assert signal.retryable
    assert signal.context["errors"] == ["at $.city: 7 is not of type 'string'"]
    assert signal.context["repairs"] == 1
    last_answer = outcome.steps_of(Role.ASSISTANT)[-1]
    assert signal.resume_from_sequence == last_answer.sequence
    assert len(harness.model.requests) == 2, "one answer, one repair: output_retries is 1"
    stored = await harness.store.get_run(outcome.run_id)
    assert stored.stop_signal is not None
    assert stored.stop_signal.reason is StopReason.OUTPUT_INVALID


async def test_a_retry_of_an_invalid_run_asks_again_with_the_same_schema(
    backend_harness: Harness,
) -> None:
    harness = backend_harness
    harness.model.enqueue(Turn.text("no"), Turn.text("still no"), Turn.json(PARIS))
    failed = await harness.run("Which city?", agent="structured_json_schema")
    signal = failed.run.stop_signal
    assert signal is not None

    retried = await harness.collect(
        await harness.runtime.retry(failed.session_id, signal.resume_from_sequence)
    )

    assert retried.reason is StopReason.COMPLETED
    assert output_of(retried) == PARIS
    assert harness.model.requests[-1]["response_format"]["json_schema"]["schema"] == CITY_SCHEMA


async def test_a_run_schema_replaces_the_agent_schema(backend_harness: Harness) -> None:
    harness = backend_harness
    numbers = {"type": "array", "items": {"type": "integer"}}
    harness.model.enqueue(Turn.json([1, 2, 3]))

    outcome = await harness.run(
        "Count to three", agent="structured_json_schema", output_schema=numbers
    )

    assert outcome.reason is StopReason.COMPLETED
    assert output_of(outcome) == [1, 2, 3]
    (request,) = harness.model.requests
    assert request["response_format"]["json_schema"]["schema"] == numbers


async def test_a_run_schema_on_a_text_agent_asks_for_json_schema(
    backend_harness: Harness,
) -> None:
    harness = backend_harness
    harness.model.enqueue(Turn.json(PARIS))

    outcome = await harness.run("Which city?", output_schema=CITY_SCHEMA)

    assert output_of(outcome) == PARIS
    assert harness.model.requests[0]["response_format"]["type"] == "json_schema"


async def test_json_object_mode_sends_the_schema_in_a_system_message(
    backend_harness: Harness,
) -> None:
    harness = backend_harness
    harness.model.enqueue(Turn.json(PARIS))

    outcome = await harness.run("Which city?", agent="structured_json_object")

    assert output_of(outcome) == PARIS
    (request,) = harness.model.requests
    assert request["response_format"] == {"type": "json_object"}
    system = [m["content"] for m in request["messages"] if m["role"] == "system"]
    assert len(system) == 2
    assert json.dumps(CITY_SCHEMA) in system[1]


async def test_tool_mode_takes_the_final_output_call_as_the_answer(
    backend_harness: Harness,
) -> None:
    harness = backend_harness
    harness.model.enqueue(Turn.tool_calls([ToolCallSpec(FINAL_OUTPUT_TOOL, json.dumps(PARIS))]))

    outcome = await harness.run("Which city?", agent="structured_tool")

    assert output_of(outcome) == PARIS
    (request,) = harness.model.requests
    assert "response_format" not in request
    assert request["tool_choice"] == "required"
    (final,) = [t for t in request["tools"] if t["function"]["name"] == FINAL_OUTPUT_TOOL]
    assert final["function"]["parameters"] == CITY_SCHEMA
    (assistant,) = [
        step for step in await harness.history(outcome.session_id) if step.role is Role.ASSISTANT
    ]
    assert (json.loads(assistant.content), assistant.tool_calls) == (PARIS, [])
    assert outcome.run.tool_call_count == 0


async def test_tool_mode_repairs_invalid_arguments(backend_harness: Harness) -> None:
    harness = backend_harness
    harness.model.enqueue(
        Turn.tool_calls([ToolCallSpec(FINAL_OUTPUT_TOOL, '{"city": "Paris"')]),
        Turn.tool_calls([ToolCallSpec(FINAL_OUTPUT_TOOL, json.dumps(PARIS))]),
    )

    outcome = await harness.run("Which city?", agent="structured_tool")

    assert output_of(outcome) == PARIS
    repair = harness.model.requests[1]["messages"][-1]["content"]
    assert "not JSON" in repair
    assert FINAL_OUTPUT_TOOL in repair
    assert_valid_messages(harness.model.requests[1]["messages"])


async def test_a_number_too_long_to_read_is_repaired_in_words_the_model_can_act_on(
    harness: Harness,
) -> None:
    # Python refuses to read an integer of more than 4,300 digits; its message names an
    # interpreter setting the model cannot change.
    harness.model.enqueue(
        Turn.text('{"city": "Paris", "population": ' + "9" * 5_000 + "}"),
        Turn.json(PARIS),
    )

    outcome = await harness.run("Which city?", agent="structured_json_schema")

    assert output_of(outcome) == PARIS
    repair = harness.model.requests[1]["messages"][-1]["content"]
    assert "the answer holds a number too long to be read" in repair
    assert "sys." not in repair


@pytest.mark.parametrize("agent", ["structured_json_schema", "structured_tool"])
async def test_a_tool_call_before_the_final_structured_answer_runs_as_usual(
    backend_harness: Harness, agent: str
) -> None:
    harness = backend_harness
    harness.model.enqueue(
        Turn.tool_calls([ToolCallSpec("echo", '{"text": "Paris"}')]),
        Turn.json(PARIS)
        if agent == "structured_json_schema"
        else Turn.tool_calls([ToolCallSpec(FINAL_OUTPUT_TOOL, json.dumps(PARIS))]),
    )

    outcome = await harness.run("Which city?", agent=agent)

    assert outcome.reason is StopReason.COMPLETED
    assert output_of(outcome) == PARIS
    (tool,) = outcome.steps_of(Role.TOOL)
    assert (tool.name, tool.content) == ("echo", "Paris")
    assert_valid_messages(harness.model.requests[-1]["messages"])


async def test_a_refusal_ends_the_run_content_filter(backend_harness: Harness) -> None:
    harness = backend_harness
    harness.model.enqueue(Turn.refusing("I cannot help with that."))

    outcome = await harness.run("Which city?", agent="structured_json_schema")

    assert outcome.reason is StopReason.CONTENT_FILTER
    assert outcome.run.stop_signal is not None
    assert "I cannot help with that." in outcome.run.stop_signal.message
    assert not outcome.run.output_json


async def test_no_repair_is_asked_past_max_steps(harness: Harness) -> None:
    harness.model.enqueue(Turn.text("not JSON"))

    outcome = await harness.run(
        "Which city?", agent="structured_json_schema", overrides=RunOverrides(max_steps=1)
    )

    assert outcome.reason is StopReason.OUTPUT_INVALID
    assert outcome.run.stop_signal is not None
    assert outcome.run.stop_signal.context["repairs"] == 0
    assert len(harness.model.requests) == 1


async def test_the_json_streams_as_deltas(harness: Harness) -> None:
    harness.model.enqueue(Turn.json(PARIS, chunks=4))

    outcome = await harness.run("Which city?", agent="structured_json_schema")

    deltas = outcome.of(StepDelta)
    assert deltas, "the answer streams"
    assert json.loads("".join(delta.content for delta in deltas)) == PARIS


async def test_a_text_agent_has_no_output_and_asks_for_no_format(harness: Harness) -> None:
    harness.model.enqueue(Turn.text('{"city": "Paris"}'))

    outcome = await harness.run("Which city?")

    assert outcome.reason is StopReason.COMPLETED
    assert outcome.run.output_json == ""
    assert "response_format" not in harness.model.requests[0]


async def test_a_client_tool_named_final_output_is_refused_in_tool_mode(harness: Harness) -> None:
    clash = ClientTool(FINAL_OUTPUT_TOOL, "mine", '{"type": "object"}')

    with pytest.raises(InvalidInputError, match="final_output"):
        await harness.run("Which city?", agent="structured_tool", client_tools=[clash])

    assert harness.model.requests == []
