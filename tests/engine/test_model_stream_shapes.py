"""What the model sends, end to end: the fake model streams each chunk over HTTP, the real
driver reads it inside the runtime, and the run's events and the stored log are checked.

Malformed chunks end the run MODEL_ERROR naming the field (the table in docs/errors.md lists
the same shapes); text the store cannot carry is stored with U+FFFD; error objects sent
inside a 200 stream are classified as HTTP statuses are; token counts are clamped.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from agio_grpc.domain import Role, RunStatus, StopReason, StopSignal
from agio_grpc.engine import RunFailed
from agio_grpc.engine.events import ErrorNotice, StepDelta
from agio_grpc.engine.models import MAX_TOKEN_COUNT
from agio_grpc.testing import Turn, UsageSpec
from tests.engine.harness import FAST_RETRIES, Harness, Outcome

ATTEMPTS = FAST_RETRIES.max_retries + 1
"""Requests a call makes when every attempt fails transiently."""


def chunk(delta: Any = None, *, finish: Any = None, **fields: Any) -> str:
    """A `chat.completion.chunk` as JSON text: one choice carrying `delta` and `finish`,
    any top-level field replaced by `fields`. Lone surrogates and NULs in strings go out as
    JSON escapes (`\\ud800`, `\\u0000`), as a provider's encoder writes them."""
    body: dict[str, Any] = {
        "id": "chatcmpl-shapes",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "fake-model",
        "choices": [{"index": 0, "delta": delta or {}, "finish_reason": finish}],
    }
    return json.dumps(body | fields)


def call(**fields: Any) -> dict[str, Any]:
    """A delta opening one tool call of `echo`, any of its fields replaced by `fields`."""
    fragment = {
        "index": 0,
        "id": "call_shapes",
        "type": "function",
        "function": {"name": "echo", "arguments": '{"text": "hi"}'},
    }
    return {"tool_calls": [fragment | fields]}


def usage(**fields: Any) -> str:
    """A usage chunk (no choices) with these counts."""
    return chunk(choices=[], usage={"prompt_tokens": 3, "completion_tokens": 2} | fields)


def around(malformed: str) -> Turn:
    """A reply that streams a content delta, then `malformed`, then finishes as if well."""
    return Turn.raw(
        chunk({"role": "assistant", "content": "partial "}),
        malformed,
        chunk(finish="stop"),
        usage(),
    )


def in_band(**error: Any) -> Turn:
    """A 200 stream whose only event is an error object."""
    return Turn.raw(json.dumps({"error": {"message": "the provider says no"} | error}))


def signal_of(outcome: Outcome) -> StopSignal:
    signal = outcome.run.stop_signal
    assert signal is not None
    return signal


def one_terminal_event(outcome: Outcome) -> RunFailed:
    terminal = [e.event for e in outcome.events if e.is_terminal]
    assert len(terminal) == 1
    assert isinstance(terminal[0], RunFailed)
    return terminal[0]


PREFIX = "choices[0].delta"
CALL = f"{PREFIX}.tool_calls[0]"

MALFORMED = [
    pytest.param("[1, 2]", "the chunk must be an object, got list", id="chunk-an-array"),
    pytest.param(chunk(choices="oops"), "choices must be an array or null, got str", id="choices"),
    pytest.param(chunk(choices=[7]), "choices[0] must be an object, got int", id="choice"),
    pytest.param(
        chunk(choices=[{"index": 0, "delta": "hi"}]),
        f"{PREFIX} must be an object or null, got str",
        id="delta",
    ),
    pytest.param(
        chunk({"content": 5}), f"{PREFIX}.content must be a string or null, got int", id="content"
    ),
    pytest.param(
        chunk({"reasoning_content": ["why"]}),
        f"{PREFIX}.reasoning_content must be a string or null, got list",
        id="reasoning_content",
    ),
    pytest.param(
        chunk({"refusal": {"text": "no"}}),
        f"{PREFIX}.refusal must be a string or null, got dict",
        id="refusal",
    ),
    pytest.param(
        chunk(finish=1),
        "choices[0].finish_reason must be a string or null, got int",
        id="finish_reason",
    ),
    pytest.param(
        chunk({"tool_calls": {"index": 0}}),
        f"{PREFIX}.tool_calls must be an array or null, got dict",
        id="tool_calls",
    ),
    pytest.param(
        chunk({"tool_calls": ["echo"]}), f"{CALL} must be an object, got str", id="tool_call"
    ),
    pytest.param(
        chunk(call(index=[0])), f"{CALL}.index must be an integer, got list", id="index-a-list"
    ),
    pytest.param(
        chunk(call(index=True)), f"{CALL}.index must be an integer, got bool", id="index-a-bool"
    ),
    pytest.param(chunk(call(id=7)), f"{CALL}.id must be a string or null, got int", id="call-id"),
    pytest.param(
        chunk(call(type=1)), f'{CALL}.type must be "function" or null, got int', id="type-a-number"
    ),
    pytest.param(
        chunk(call(type="custom")),
        f"{CALL}.type must be \"function\" or null, got 'custom'",
        id="type-another-word",
    ),
    pytest.param(
        chunk(call(function="echo")),
        f"{CALL}.function must be an object or null, got str",
        id="function",
    ),
    pytest.param(
        chunk(call(function={"name": 7, "arguments": "{}"})),
        f"{CALL}.function.name must be a string or null, got int",
        id="function-name",
    ),
    pytest.param(
        chunk(call(function={"name": "echo", "arguments": {"text": "hi"}})),
        f"{CALL}.function.arguments must be a string or null, got dict",
        id="arguments-an-object",
    ),
    pytest.param(chunk(model=7), "model must be a string or null, got int", id="model"),
    pytest.param(
        chunk(choices=[], usage="lots"), "usage must be an object or null, got str", id="usage"
    ),
    pytest.param(
        usage(prompt_tokens="12"),
        "usage.prompt_tokens must be an integer or null, got str",
        id="prompt_tokens",
    ),
    pytest.param(
        usage(completion_tokens=1.5),
        "usage.completion_tokens must be an integer or null, got float",
        id="completion_tokens",
    ),
    pytest.param(
        usage(total_tokens=True),
        "usage.total_tokens must be an integer or null, got bool",
        id="total_tokens",
    ),
    pytest.param(
        usage(prompt_tokens=-1), "usage.prompt_tokens must not be negative", id="negative-count"
    ),
    pytest.param(
        usage(prompt_tokens_details="none"),
        "usage.prompt_tokens_details must be an object or null, got str",
        id="prompt_tokens_details",
    ),
    pytest.param(
        usage(completion_tokens_details=[]),
        "usage.completion_tokens_details must be an object or null, got list",
        id="completion_tokens_details",
    ),
    pytest.param(
        usage(prompt_tokens_details={"cached_tokens": "4"}),
        "usage.prompt_tokens_details.cached_tokens must be an integer or null, got str",
        id="cached_tokens",
    ),
    pytest.param(
        usage(completion_tokens_details={"reasoning_tokens": -3}),
        "usage.completion_tokens_details.reasoning_tokens must not be negative",
        id="reasoning_tokens",
    ),
]


@pytest.mark.parametrize(("malformed", "message"), MALFORMED)
async def test_a_malformed_chunk_ends_the_run_model_error_naming_the_field(
    harness: Harness, malformed: str, message: str
) -> None:
    harness.model.enqueue(around(malformed))
    outcome = await harness.run("hello")

    one_terminal_event(outcome)
    signal = signal_of(outcome)
    assert (signal.reason, signal.retryable) == (StopReason.MODEL_ERROR, False)
    assert signal.message == f"model stream: {message}"
    assert signal.context == {}
    assert len(harness.model.requests) == 1  # a server that sent it once would send it again
    assert [d.content for d in outcome.of(StepDelta)] == ["partial "]  # streamed, then failed
    stored = await harness.history(outcome.session_id)
    assert [step.role for step in stored] == [Role.USER]  # no half-parsed reply
    run = await harness.store.get_run(outcome.run_id)
    assert run.status is RunStatus.FAILED
    assert run.stop_signal == signal


# Surrogates built with chr: a linter cannot tell the literals apart.
@pytest.mark.parametrize("unsafe", ["\x00", chr(0xD800), chr(0xDFFF)], ids=["nul", "high", "low"])
@pytest.mark.parametrize("field", ["content", "reasoning_content"])
async def test_nul_and_lone_surrogates_in_model_text_are_stored_as_replacement_characters(
    harness: Harness, unsafe: str, field: str
) -> None:
    harness.model.enqueue(
        Turn.raw(chunk({field: f"a{unsafe}b"}), chunk({field: " 😀"}), chunk(finish="stop"))
    )
    outcome = await harness.run("hello")

    assert outcome.reason is StopReason.COMPLETED
    assert "".join(getattr(delta, field) for delta in outcome.of(StepDelta)) == "a\ufffdb 😀"
    (assistant,) = (await harness.history(outcome.session_id))[1:]
    assert getattr(assistant, field) == "a\ufffdb 😀"  # a surrogate pair is one character


@pytest.mark.parametrize("unsafe", ["\x00", "\ud800"], ids=["nul", "lone-surrogate"])
async def test_an_unsafe_character_in_a_tool_name_is_replaced_and_the_call_answered(
    harness: Harness, unsafe: str
) -> None:
    name = f"ec{unsafe}ho"
    opening = call(function={"name": name, "arguments": '{"text": "hi"}'})
    harness.model.enqueue(Turn.raw(chunk(opening), chunk(finish="tool_calls")))
    outcome = await harness.run("hello")

    assert outcome.reason is StopReason.COMPLETED  # the model answered the error result
    _, assistant, tool, reply = await harness.history(outcome.session_id)
    assert assistant.tool_calls[0].name == "ec\ufffdho"
    assert (tool.role, tool.name, tool.is_error) == (Role.TOOL, "ec\ufffdho", True)
    assert reply.role is Role.ASSISTANT


@pytest.mark.parametrize("unsafe", ["\x00", "\ud800"], ids=["nul", "lone-surrogate"])
async def test_an_unsafe_character_in_tool_arguments_is_replaced_and_the_tool_runs(
    harness: Harness, unsafe: str
) -> None:
    arguments = json.dumps({"text": "a?b"}).replace("?", unsafe)  # raw, not a JSON escape
    opening = call(function={"name": "echo", "arguments": arguments})
    harness.model.enqueue(Turn.raw(chunk(opening), chunk(finish="tool_calls")))
    outcome = await harness.run("hello")

    assert outcome.reason is StopReason.COMPLETED
    _, assistant, tool, _ = await harness.history(outcome.session_id)
    assert json.loads(assistant.tool_calls[0].arguments) == {"text": "a\ufffdb"}
    assert (tool.content, tool.is_error) == ("a\ufffdb", False)


@pytest.mark.parametrize(
    ("reported", "stored_as"), [(2**40, 2**40), (2**70, MAX_TOKEN_COUNT)], ids=["2^40", "2^70"]
)
async def test_a_huge_token_count_is_clamped_and_the_run_completes(
    backend_harness: Harness, reported: int, stored_as: int
) -> None:
    harness = backend_harness
    harness.model.enqueue(
        Turn.text("ok", usage=UsageSpec(prompt_tokens=reported, completion_tokens=2))
    )
    outcome = await harness.run("hello")

    assert outcome.reason is StopReason.COMPLETED
    (assistant,) = outcome.steps_of(Role.ASSISTANT)
    stored = await harness.store.get_step(outcome.session_id, assistant.sequence)
    assert stored.metrics.input_tokens == stored_as
    assert stored.metrics.output_tokens == 2
    assert stored.metrics.total_tokens == min(stored_as + 2, MAX_TOKEN_COUNT)
    run = await harness.store.get_run(outcome.run_id)
    assert (run.status, run.usage.input_tokens) == (RunStatus.COMPLETED, stored_as)
    session = await harness.store.get_session(outcome.session_id)
    assert session.active_run_id == ""


async def test_an_in_band_invalid_api_key_is_not_retried_and_not_retryable(
    harness: Harness,
) -> None:
    error = in_band(
        message="Incorrect API key provided", type="invalid_request_error", code="invalid_api_key"
    )
    harness.model.enqueue(*[error] * ATTEMPTS)
    outcome = await harness.run("hello")

    one_terminal_event(outcome)
    signal = signal_of(outcome)
    assert (signal.reason, signal.retryable) == (StopReason.MODEL_ERROR, False)
    assert signal.message == (
        "the model stream reported an error (invalid_api_key): Incorrect API key provided"
    )
    assert signal.context == {"error_code": "invalid_api_key"}
    assert len(harness.model.requests) == 1
    assert outcome.of(ErrorNotice) == []


async def test_an_in_band_rate_limit_is_retried_then_ends_retryable_with_code_and_retries(
    harness: Harness,
) -> None:
    harness.model.enqueue(*[in_band(type="requests", code="rate_limit_exceeded")] * ATTEMPTS)
    outcome = await harness.run("hello")

    one_terminal_event(outcome)
    signal = signal_of(outcome)
    assert (signal.reason, signal.retryable) == (StopReason.MODEL_ERROR, True)
    assert signal.message == (
        f"model call failed after {FAST_RETRIES.max_retries} retries: "
        "the model stream reported an error (rate_limit_exceeded): the provider says no"
    )
    assert signal.context == {
        "error_code": "rate_limit_exceeded",
        "retries": FAST_RETRIES.max_retries,
    }
    assert len(harness.model.requests) == ATTEMPTS
    notices = outcome.of(ErrorNotice)
    assert [n.reason for n in notices] == ["MODEL_RETRY"] * FAST_RETRIES.max_retries


async def test_an_http_500_after_retries_keeps_its_status_in_the_stop_signal(
    harness: Harness,
) -> None:
    harness.model.enqueue(*[Turn.error(500)] * ATTEMPTS)
    outcome = await harness.run("hello")

    signal = signal_of(outcome)
    assert (signal.reason, signal.retryable) == (StopReason.MODEL_ERROR, True)
    assert signal.context == {"status_code": 500, "retries": FAST_RETRIES.max_retries}
    assert len(harness.model.requests) == ATTEMPTS


@pytest.mark.parametrize(
    ("error", "code", "retried"),
    [
        ({"type": "invalid_request_error", "code": "invalid_api_key"}, "invalid_api_key", False),
        ({"type": "authentication_error"}, "authentication_error", False),
        ({"type": "AuthenticationError", "code": 401}, "401", False),  # vLLM: a status as code
        ({"type": "PermissionDeniedError", "code": 403}, "403", False),
        ({"type": "invalid_request_error", "code": "model_not_found"}, "model_not_found", False),
        ({"type": "NotFoundError", "code": "404"}, "404", False),
        ({"type": "invalid_request_error", "code": None}, "invalid_request_error", False),
        ({"type": "BadRequestError", "code": 400}, "400", False),
        (
            {"type": "invalid_request_error", "code": "context_length_exceeded"},
            "context_length_exceeded",
            False,
        ),
        ({"type": "requests", "code": "rate_limit_exceeded"}, "rate_limit_exceeded", True),
        ({"type": "RateLimitError", "code": 429}, "429", True),
        ({"type": "server_error", "code": None}, "server_error", True),
        ({"type": "InternalServerError", "code": 500}, "500", True),
        ({"type": "overloaded_error"}, "overloaded_error", True),
        ({"code": "something_new"}, "something_new", True),  # unknown: transient, as before
        ({}, None, True),
    ],
)
async def test_in_band_errors_are_classified_as_http_statuses_are(
    harness: Harness, error: dict[str, Any], code: str | None, retried: bool
) -> None:
    harness.model.enqueue(*[in_band(**error)] * ATTEMPTS)
    outcome = await harness.run("hello")

    # A context too long for the model: compaction's to handle; with nothing to summarize in
    # a one-step session, the run stops CONTEXT_WINDOW, a limit (docs/compaction.md).
    if code == "context_length_exceeded":
        assert [e.event.type for e in outcome.events if e.is_terminal] == ["run_completed"]
    else:
        one_terminal_event(outcome)
    signal = signal_of(outcome)
    expected = (
        StopReason.CONTEXT_WINDOW if code == "context_length_exceeded" else (StopReason.MODEL_ERROR)
    )
    assert (signal.reason, signal.retryable) == (expected, retried)
    assert signal.context.get("error_code") == code
    assert "status_code" not in signal.context  # each answer was an HTTP 200
    assert len(harness.model.requests) == (ATTEMPTS if retried else 1)
    assert [step.role for step in await harness.history(outcome.session_id)] == [Role.USER]
