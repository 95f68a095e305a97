"""The fake model server, specified through the real `openai.AsyncOpenAI` client over HTTP."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import openai
import pytest
from openai.types.chat import ChatCompletionChunk, ChatCompletionToolParam

from agio_grpc.testing import (
    FakeModelServer,
    FinishReason,
    ToolCallSpec,
    Turn,
    UsageSpec,
    paced_responder,
)
from agio_grpc.testing.responders import find_arithmetic
from agio_grpc.testing.script import split_even, split_words

HELLO: list[Any] = [{"role": "user", "content": "hello"}]


def function_tool(name: str) -> ChatCompletionToolParam:
    return {"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}


@pytest.fixture
async def server() -> AsyncIterator[FakeModelServer]:
    async with FakeModelServer() as started:
        yield started


@pytest.fixture
async def client(server: FakeModelServer) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(
        base_url=server.base_url, api_key="test", max_retries=0
    ) as opened:
        yield opened


async def stream_chunks(
    client: openai.AsyncOpenAI,
    messages: list[Any] | None = None,
    *,
    model: str = "fake-model",
    tools: list[ChatCompletionToolParam] | None = None,
    include_usage: bool = True,
) -> list[ChatCompletionChunk]:
    """Every chunk of one streamed chat completion."""
    stream = await client.chat.completions.create(
        model=model,
        messages=messages or HELLO,
        stream=True,
        stream_options={"include_usage": include_usage},
        tools=tools or openai.omit,
    )
    return [chunk async for chunk in stream]


async def collect_into(
    received: list[ChatCompletionChunk], stream: openai.AsyncStream[ChatCompletionChunk]
) -> None:
    """Append every chunk of `stream` to `received`, so chunks before an error are kept."""
    async for chunk in stream:
        received.append(chunk)


def content_of(chunks: list[ChatCompletionChunk]) -> str:
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def finish_reasons(chunks: list[ChatCompletionChunk]) -> list[str]:
    return [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]


def reassemble_tool_calls(chunks: list[ChatCompletionChunk]) -> dict[int, dict[str, str]]:
    """Tool call fragments accumulated by index, the way an agent loop does it."""
    calls: dict[int, dict[str, str]] = {}
    for chunk in chunks:
        for fragment in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            call = calls.setdefault(fragment.index, {"id": "", "name": "", "arguments": ""})
            call["id"] += fragment.id or ""
            if fragment.function is not None:
                call["name"] += fragment.function.name or ""
                call["arguments"] += fragment.function.arguments or ""
    return calls


# --- streamed text -----------------------------------------------------------------------


async def test_text_chunks_reassemble_and_usage_chunk_comes_last(
    server: FakeModelServer, client: openai.AsyncOpenAI
) -> None:
    server.enqueue(Turn.text("Hello there, general Kenobi", chunks=4))

    chunks = await stream_chunks(client)

    assert content_of(chunks) == "Hello there, general Kenobi"
    assert [c.choices[0].delta.content for c in chunks[1:5]] == [
        "Hello t",
        "here, g",
        "eneral ",
        "Kenobi",
    ]
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None
    assert all(c.usage is None for c in chunks[:-1])


async def test_first_chunk_announces_the_assistant_role_with_empty_content(
    server: FakeModelServer, client: openai.AsyncOpenAI
) -> None:
    server.enqueue(Turn.text("hi"))

    first = (await stream_chunks(client))[0]

    assert first.choices[0].delta.role == "assistant"
    assert first.choices[0].delta.content == ""


async def test_every_chunk_echoes_the_model_and_shares_one_id(
    server: FakeModelServer, client: openai.AsyncOpenAI
) -> None:
    server.enqueue(Turn.text("a b c", chunks=3))

    chunks = await stream_chunks(client, model="my-model-7b")

    assert {c.model for c in chunks} == {"my-model-7b"}
    assert {c.object for c in chunks} == {"chat.completion.chunk"}
    assert len({c.id for c in chunks}) == 1
    assert chunks[0].id.startswith("chatcmpl-")
    assert all(c.created > 0 for c in chunks)


async def test_tokens_turn_streams_one_word_per_chunk(
    server: FakeModelServer, client: openai.AsyncOpenAI
) -> None:
    server.enqueue(Turn.tokens(100))

    chunks = await stream_chunks(client)

    words = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(words) == 100
    assert all(len(word.split()) == 1 for word in words if word)


async def test_reasoning_content_streams_before_the_content(
    server: FakeModelServer, client: openai.AsyncOpenAI
) -> None:
    server.enqueue(Turn.text("42", reasoning="Six times seven."))

    chunks = await stream_chunks(client)

    kinds = [
        "reasoning" if getattr(c.choices[0].delta, "reasoning_content", None) else "content"
        for c in chunks[1:]
        if c.choices and c.choices[0].finish_reason is None
    ]
    reasoning = "".join(getattr(c.choices[0].delta, "reasoning_content", "") for c in chunks[1:4])
    assert kinds == ["reasoning", "reasoning", "reasoning", "content"]
    assert reasoning == "Six times seven."
    assert content_of(chunks) == "42"


# --- tool calls --------------------------------------------------------------------------


async def test_parallel_tool_calls_reassemble_by_index(
    server: FakeModelServer, client: openai.AsyncOpenAI
) -> None:
    server.enqueue(
        Turn.tool_calls(
            [
                ToolCallSpec(name="add", arguments='{"a": 1, "b": 2}'),
                ToolCallSpec(name="multiply", arguments='{"a": 3, "b": 4}'),
            ],
            chunks_per_call=3,
        )
    )

    chunks = await stream_chunks(client, tools=[function_tool("add"), function_tool("multiply")])

    calls = reassemble_tool_calls(chunks)
    assert sorted(calls) == [0, 1]
    assert calls[0]["name"] == "add"
    assert json.loads(calls[0]["arguments"]) == {"a": 1, "b": 2}
    assert calls[1]["name"] == "multiply"
    assert json.loads(calls[1]["arguments"]) == {"a": 3, "b": 4}
    assert calls[0]["id"].startswith("call_")
    assert calls[0]["id"] != calls[1]["id"]
    assert finish_reasons(chunks) == ["tool_calls"]


async def test_tool_call_opens_with_id_and_name_then_sends_only_argument_pieces(
    server: FakeModelServer, client: openai.AsyncOpenAI
) -> None:
    server.enqueue(Turn.tool_calls([ToolCallSpec("add", '{"a": 1}')], chunks_per_call=2))

    chunks = await stream_chunks(client)

    fragments = [f for c in chunks if c.choices for f in c.choices[0].delta.tool_calls or []]
    opening, *pieces = fragments
    assert opening.id is not None
    assert opening.type == "function"
    assert opening.function is not None
    assert (opening.function.name, opening.function.arguments) == ("add", "")
    assert len(pieces) == 2
    for piece in pieces:
        assert (piece.index, piece.id, piece.type) == (0, None, None)
        assert piece.function is not None
        assert piece.function.name is None


async def test_explicit_id_and_malformed_arguments_pass_through_verbatim(
    server: FakeModelServer, client: openai.AsyncOpenAI
) -> None:
    server.enqueue(Turn.tool_calls([ToolCallSpec("add", '{"a": 1,', id="call_fixed")]))

    calls = reassemble_tool_calls(await stream_chunks(client))

    assert calls == {0: {"id": "call_fixed", "name": "add", "arguments": '{"a": 1,'}}


async def test_text_before_tool_calls_is_streamed_as_content(
    server: FakeModelServer, client: openai.AsyncOpenAI
) -> None:
    server.enqueue(Turn.tool_calls([ToolCallSpec("lookup")], content="Let me check."))

    chunks = await stream_chunks(client)

    assert content_of(chunks) == "Let me check."
    assert reassemble_tool_calls(chunks)[0]["arguments"] == "{}"


# --- finish reasons and usage ------------------------------------------------------------


async def test_finish_reason_defaults_to_stop_for_text(
    server: FakeModelServer, client: openai.AsyncOpenAI
) -> None:
    server.enqueue(Turn.text("done"))

    chunks = await stream_chunks(client)

    assert finish_reasons(chunks) == ["stop"]
    last_choice = [c for c in chunks if c.choices][-1]
    assert last_choice.choices[0].delta.content is None
    assert last_choice.choices[0].finish_reason == "stop"


@pytest.mark.parametrize("reason", ["stop", "length", "content_filter", "tool_calls"])
async def test_finish_reason_override_is_reported_once(
    server: FakeModelServer, client: openai.AsyncOpenAI, reason: FinishReason
) -> None:
    server.enqueue(Turn.text("truncated", finish_reason=reason))

    assert finish_reasons(await stream_chunks(client)) == [reason]


async def test_omit_finish_reason_ends_the_stream_cleanly_without_one(
    server: FakeModelServer, client: openai.AsyncOpenAI
) -> None:
    server.enqueue(Turn.text("never finished", chunks=2, omit_finish_reason=True))

    chunks = await stream_chunks(client)

    assert content_of(chunks) == "never finished"
    assert finish_reasons(chunks) == []
    assert chunks[-1].usage is not None


async def test_default_usage_counts_prompt_words_and_output_chunks(
    server: FakeModelServer, client: openai.AsyncOpenAI
) -> None:
    server.enqueue(Turn.text("one two three", chunks=3, reasoning="hmm ok"))
    messages: list[Any] = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "count to three"},
    ]

    usage = (await stream_chunks(client, messages))[-1].usage

    assert usage is not None
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (5, 5, 10)
    assert usage.prompt_tokens_details is not None
    assert usage.prompt_tokens_details.cached_tokens == 0
    assert usage.completion_tokens_details is not None
    assert usage.completion_tokens_details.reasoning_tokens == 2


async def test_usage_override_is_reported_as_scripted(
    server: FakeModelServer, client: openai.AsyncOpenAI
) -> None:
    scripted = UsageSpec(
        prompt_tokens=1000, completion_tokens=50, cached_tokens=800, reasoning_tokens=20
    )
    server.enqueue(Turn.text("ok", usage=scripted))

    usage = (await stream_chunks(client))[-1].usage

    assert usage is not None
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (1000, 50, 1050)
    assert usage.prompt_tokens_details is not None
    assert usage.prompt_tokens_details.cached_tokens == 800
    assert usage.completion_tokens_details is not None
    assert usage.completion_tokens_details.reasoning_tokens == 20


async def test_no_usage_chunk_unless_the_request_asks_for_it(
    server: FakeModelServer, client: openai.AsyncOpenAI
) -> None:
    server.enqueue(Turn.text("ok"))

    chunks = await stream_chunks(client, include_usage=False)

    assert all(c.choices and c.usage is None for c in chunks)
    assert finish_reasons(chunks) == ["stop"]


# --- HTTP faults -------------------------------------------------------------------------


async def test_rate_limit_answers_429_with_retry_after_header(
    server: FakeModelServer, client: openai.AsyncOpenAI
) -> None:
    server.enqueue(Turn.error(429, retry_after=7))

    with pytest.raises(openai.RateLimitError) as raised:
        await stream_chunks(client)

    assert raised.value.status_code == 429
    assert raised.value.response.headers["retry-after"] == "7"
    assert raised.value.code == "rate_limit_exceeded"


async def test_client_retries_after_429_and_gets_the_next_turn(server: FakeModelServer) -> None:
    server.enqueue(Turn.error(429, retry_after=0.01), Turn.text("ok"))

    async with openai.AsyncOpenAI(
        base_url=server.base_url, api_key="test", max_retries=1
    ) as retrying_client:
        chunks = await stream_chunks(retrying_client)

    assert content_of(chunks) == "ok"
    assert len(server.requests) == 2
    assert server.pending == 0


async def test_server_error_answers_500_with_openai_error_body(
    server: FakeModelServer, client: openai.AsyncOpenAI
) -> None:
    server.enqueue(Turn.error(500, message="the GPU caught fire"))

    with pytest.raises(openai.InternalServerError) as raised:
        await stream_chunks(client)

    assert raised.value.status_code == 500
    assert raised.value.body == {
        "message": "the GPU caught fire",
        "type": "server_error",
        "param": None,
        "code": None,
    }


async def test_a_prompt_over_the_context_window_is_refused_as_openai_refuses_it(
    server: FakeModelServer, client: openai.AsyncOpenAI
) -> None:
    server.context_window = 3
    server.enqueue(Turn.text("kept for the next request"))
    prompt: list[Any] = [{"role": "user", "content": "one two three four"}]

    with pytest.raises(openai.BadRequestError) as raised:
        await stream_chunks(client, prompt)

    assert raised.value.status_code == 400
    assert raised.value.body == {
        "message": "This model's maximum context length is 3 tokens. However, your messages "
        "resulted in 4 tokens. Please reduce the length of the messages.",
        "type": "invalid_request_error",
        "param": "messages",
        "code": "context_length_exceeded",
    }
    server.refusal_states_window = False
    with pytest.raises(openai.BadRequestError) as raised:
        await stream_chunks(client, prompt)
    assert raised.value.body == {
        "message": "the request exceeds the available context size, try increasing it",
        "type": "exceed_context_size_error",
        "code": 400,
    }
    assert server.pending == 1  # a refused request consumes no turn
    assert content_of(await stream_chunks(client)) == "kept for the next request"


async def test_cut_after_drops_the_connection_mid_stream(
    server: FakeModelServer, client: openai.AsyncOpenAI
) -> None:
    server.enqueue(Turn.text("Hello there friend", chunks=3, cut_after=2))
    received: list[ChatCompletionChunk] = []

    stream = await client.chat.completions.create(
        model="fake-model",
        messages=HELLO,
        stream=True,
        stream_options={"include_usage": True},
    )
    with pytest.raises(openai.APIConnectionError):
        await collect_into(received, stream)

    assert len(received) == 2
    assert received[0].choices[0].delta.role == "assistant"
    assert content_of(received) == "Hello "
    assert finish_reasons(received) == []


async def test_a_raw_turn_streams_its_payloads_verbatim_then_done(
    server: FakeModelServer,
) -> None:
    server.enqueue(Turn.raw('{"choices": "oops"}', '{"id": 1}'))
    request = {"model": "fake-model", "messages": HELLO, "stream": True}

    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{server.base_url}/chat/completions", json=request) as response,
    ):
        body = await response.read()

    assert response.status == 200
    assert body == b'data: {"choices": "oops"}\n\ndata: {"id": 1}\n\ndata: [DONE]\n\n'


async def test_a_raw_error_object_is_an_error_inside_a_200_stream(
    server: FakeModelServer, client: openai.AsyncOpenAI
) -> None:
    error = {"message": "Incorrect API key provided", "type": "invalid_request_error"}
    server.enqueue(Turn.raw(json.dumps({"error": error | {"code": "invalid_api_key"}})))

    with pytest.raises(openai.APIError) as raised:
        await stream_chunks(client)

    assert not isinstance(raised.value, openai.APIStatusError)  # the answer was a 200
    assert raised.value.message == "Incorrect API key provided"
    assert raised.value.code == "invalid_api_key"


async def test_the_connection_after_a_cut_is_not_needed_for_the_next_request(
    server: FakeModelServer, client: openai.AsyncOpenAI
) -> None:
    server.enqueue(Turn.text("lost", cut_after=1), Turn.text("found"))

    with pytest.raises(openai.APIConnectionError):
        await stream_chunks(client)

    assert content_of(await stream_chunks(client)) == "found"


async def test_hanging_request_is_abandoned_when_the_client_gives_up(
    server: FakeModelServer, client: openai.AsyncOpenAI
) -> None:
    server.enqueue(Turn.hanging(), Turn.text("next"))

    waiting = asyncio.create_task(stream_chunks(client))
    await server.wait_for_requests(1)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting

    assert content_of(await stream_chunks(client)) == "next"


async def test_a_held_request_takes_no_turn_if_it_leaves_and_the_next_turn_once_released(
    server: FakeModelServer, client: openai.AsyncOpenAI
) -> None:
    server.enqueue(Turn.text("first"), Turn.text("second"))
    server.hold = asyncio.Event()

    leaving = asyncio.create_task(stream_chunks(client))
    await server.wait_for_requests(1)
    leaving.cancel()
    with pytest.raises(asyncio.CancelledError):
        await leaving
    assert server.pending == 2
    waiting = asyncio.create_task(stream_chunks(client))
    await server.wait_for_requests(2)
    assert server.pending == 2
    server.hold.set()

    assert content_of(await waiting) == "first"
    assert server.pending == 1


async def test_stopping_the_server_releases_a_hanging_request(
    server: FakeModelServer, client: openai.AsyncOpenAI
) -> None:
    server.enqueue(Turn.hanging())

    waiting = asyncio.create_task(stream_chunks(client))
    await server.wait_for_requests(1)
    await server.stop()

    with pytest.raises(openai.APIConnectionError):
        await waiting


# --- pacing ------------------------------------------------------------------------------


async def test_chunk_delay_paces_chunks_in_order(
    server: FakeModelServer, client: openai.AsyncOpenAI
) -> None:
    server.enqueue(Turn.words("one two three four", first_token_delay=0.05, chunk_delay=0.05))

    arrivals: list[tuple[float, str]] = []
    stream = await client.chat.completions.create(model="fake-model", messages=HELLO, stream=True)
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            arrivals.append((time.monotonic(), chunk.choices[0].delta.content))

    assert [word for _, word in arrivals] == ["one", " two", " three", " four"]
    times = [at for at, _ in arrivals]
    assert times == sorted(times)
    # Sleeps never end early, so three gaps take at least most of 3 x 50 ms.
    assert times[-1] - times[0] >= 0.1


# --- non-streaming and other endpoints ---------------------------------------------------


async def test_non_streaming_request_gets_a_whole_chat_completion(
    server: FakeModelServer, client: openai.AsyncOpenAI
) -> None:
    server.enqueue(
        Turn.tool_calls([ToolCallSpec("add", '{"a": 1}', id="call_1")], content="Adding.")
    )

    completion = await client.chat.completions.create(model="m-1", messages=HELLO)

    assert completion.object == "chat.completion"
    assert completion.model == "m-1"
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Adding."
    assert choice.message.tool_calls is not None
    call = choice.message.tool_calls[0]
    assert call.type == "function"
    assert (call.id, call.function.name, call.function.arguments) == ("call_1", "add", '{"a": 1}')
    assert completion.usage is not None
    assert completion.usage.prompt_tokens == 1


async def test_models_endpoint_lists_the_configured_model_ids() -> None:
    async with (
        FakeModelServer(models=["small", "large"]) as server,
        openai.AsyncOpenAI(base_url=server.base_url, api_key="test", max_retries=0) as client,
    ):
        page = await client.models.list()

    assert [model.id for model in page.data] == ["small", "large"]


async def test_unknown_path_answers_404_json(
    server: FakeModelServer, client: openai.AsyncOpenAI
) -> None:
    with pytest.raises(openai.NotFoundError) as raised:
        await client.embeddings.create(model="fake-model", input="hi")

    assert raised.value.body is not None
    assert "Unknown request URL" in str(raised.value.body)
    assert server.requests == []


# --- connections -------------------------------------------------------------------------


async def test_one_connection_serves_several_streams_with_keep_alive(
    server: FakeModelServer,
) -> None:
    server.enqueue(Turn.text("first"), Turn.text("second"))
    reader, writer = await asyncio.open_connection(server.host, server.port)
    body = json.dumps({"model": "m", "messages": HELLO, "stream": True}).encode()
    request = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: test\r\n"
        b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%b" % (len(body), body)
    )

    answers: list[bytes] = []
    for _ in range(2):
        writer.write(request)
        head = await reader.readuntil(b"\r\n\r\n")
        answers.append(head + await reader.readuntil(b"\r\n0\r\n\r\n"))
    writer.close()
    await writer.wait_closed()

    for answer, text in zip(answers, ["first", "second"], strict=True):
        assert answer.startswith(b"HTTP/1.1 200 OK\r\n")
        assert b"Content-Type: text/event-stream" in answer
        assert b"Transfer-Encoding: chunked" in answer
        assert b'"content":"%b"' % text.encode() in answer
        assert b"data: [DONE]\n\n" in answer


async def test_many_concurrent_streams_all_complete(
    server: FakeModelServer, client: openai.AsyncOpenAI
) -> None:
    results = await asyncio.gather(
        *(stream_chunks(client, [{"role": "user", "content": f"n{i}"}]) for i in range(100))
    )

    assert sorted(content_of(chunks) for chunks in results) == sorted(
        f"You said: n{i}" for i in range(100)
    )
    assert len(server.requests) == 100


async def test_requests_record_the_messages_the_model_received(
    server: FakeModelServer, client: openai.AsyncOpenAI
) -> None:
    server.enqueue(Turn.text("one"), Turn.text("two"))

    await stream_chunks(client, [{"role": "user", "content": "first question"}])
    await client.chat.completions.create(
        model="fake-model",
        messages=[
            {"role": "user", "content": "first question"},
            {"role": "assistant", "content": "one"},
            {"role": "user", "content": "second question"},
        ],
        temperature=0.5,
    )

    assert [r["messages"][-1]["content"] for r in server.requests] == [
        "first question",
        "second question",
    ]
    assert server.requests[0]["stream"] is True
    assert server.requests[0]["stream_options"] == {"include_usage": True}
    assert server.requests[1]["temperature"] == 0.5
    assert len(server.requests[1]["messages"]) == 3


# --- default responders ------------------------------------------------------------------


async def test_default_responder_calls_the_calculator_then_reports_the_result(
    server: FakeModelServer, client: openai.AsyncOpenAI
) -> None:
    tools = [function_tool("calculate"), function_tool("current_time")]
    question: list[Any] = [{"role": "user", "content": "What is 12 * 7?"}]

    call = reassemble_tool_calls(await stream_chunks(client, question, tools=tools))[0]
    answer = await stream_chunks(
        client,
        [
            *question,
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": call["id"],
                        "type": "function",
                        "function": {"name": call["name"], "arguments": call["arguments"]},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": call["id"], "content": "84"},
        ],
        tools=tools,
    )

    assert call["name"] == "calculate"
    assert json.loads(call["arguments"]) == {"expression": "12 * 7"}
    assert content_of(answer) == "The result is 84."
    assert finish_reasons(answer) == ["stop"]


async def test_default_responder_joins_several_tool_results(
    server: FakeModelServer, client: openai.AsyncOpenAI
) -> None:
    messages: list[Any] = [
        {"role": "user", "content": "2+3 and 4*5"},
        {"role": "tool", "tool_call_id": "call_a", "content": "5"},
        {"role": "tool", "tool_call_id": "call_b", "content": "20"},
    ]

    assert content_of(await stream_chunks(client, messages)) == "The result is 5, 20."


async def test_default_responder_calls_current_time_when_asked_the_time(
    server: FakeModelServer, client: openai.AsyncOpenAI
) -> None:
    messages: list[Any] = [{"role": "user", "content": "What time is it?"}]

    chunks = await stream_chunks(client, messages, tools=[function_tool("current_time")])

    call = reassemble_tool_calls(chunks)[0]
    assert (call["name"], call["arguments"]) == ("current_time", "{}")


async def test_default_responder_calls_an_offered_tool_it_is_told_to_use(
    server: FakeModelServer, client: openai.AsyncOpenAI
) -> None:
    tools = [function_tool("weather")]
    told: list[Any] = [{"role": "user", "content": "Use the weather tool, please"}]
    call = reassemble_tool_calls(await stream_chunks(client, told, tools=tools))[0]
    assert (call["name"], call["arguments"]) == ("weather", "{}")

    not_offered: list[Any] = [{"role": "user", "content": "Use the radar tool"}]
    echoed = await stream_chunks(client, not_offered, tools=tools)
    assert content_of(echoed) == "You said: Use the radar tool"


async def test_default_responder_echoes_word_by_word_without_matching_tools(
    server: FakeModelServer, client: openai.AsyncOpenAI
) -> None:
    messages: list[Any] = [{"role": "user", "content": "What is 12 * 7 at this time?"}]

    chunks = await stream_chunks(client, messages)

    assert content_of(chunks) == "You said: What is 12 * 7 at this time?"
    assert [c.choices[0].delta.content for c in chunks[1:4]] == ["You", " said:", " What"]


async def test_paced_responder_calls_a_tool_first_then_streams_tokens() -> None:
    responder = paced_responder(tokens=5, tokens_per_second=1000)
    async with (
        FakeModelServer(default=responder) as server,
        openai.AsyncOpenAI(base_url=server.base_url, api_key="test", max_retries=0) as client,
    ):
        tools = [function_tool("calculate")]
        first = await stream_chunks(client, tools=tools)
        after_tool: list[Any] = [*HELLO, {"role": "tool", "tool_call_id": "c", "content": "4"}]
        second = await stream_chunks(client, after_tool, tools=tools)

    assert reassemble_tool_calls(first)[0]["name"] == "calculate"
    assert len([c for c in second if c.choices and c.choices[0].delta.content]) == 5
    assert finish_reasons(second) == ["stop"]


# --- command line ------------------------------------------------------------------------


async def test_command_line_serves_until_terminated() -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "agio_grpc.testing",
        "--port",
        "0",
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert process.stdout is not None
        line = (await process.stdout.readline()).decode().strip()
        base_url = line.removeprefix("fake model listening on ")
        async with openai.AsyncOpenAI(base_url=base_url, api_key="test", max_retries=0) as client:
            chunks = await stream_chunks(client)
    finally:
        process.terminate()
        await process.wait()

    assert line.startswith("fake model listening on http://127.0.0.1:")
    assert content_of(chunks) == "You said: hello"


# --- script helpers ----------------------------------------------------------------------


def test_split_even_keeps_every_character() -> None:
    assert split_even("abcdefghij", 3) == ("abcd", "efg", "hij")
    assert split_even("ab", 5) == ("a", "b")
    assert split_even("", 3) == ()


def test_split_words_keeps_the_whitespace_before_each_word() -> None:
    assert split_words("  You said:  hi ") == ("  You", " said:", "  hi ")
    assert split_words("") == ()


@pytest.mark.parametrize(
    ("text", "expression"),
    [
        ("What is 12 * 7?", "12 * 7"),
        ("2+3", "2+3"),
        ("compute (2 + 3) / 4.5.", "(2 + 3) / 4.5"),
        ("I have 3 apples", None),
    ],
)
def test_find_arithmetic(text: str, expression: str | None) -> None:
    assert find_arithmetic(text) == expression


# --- structured output -----------------------------------------------------------------------

ORDER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "id": {"type": "integer", "minimum": 1},
        "status": {"enum": ["open", "closed"]},
        "lines": {"type": "array", "items": {"$ref": "#/$defs/line"}, "minItems": 1},
        "note": {"type": ["string", "null"]},
    },
    "required": ["id", "status", "lines", "note"],
    "$defs": {
        "line": {
            "type": "object",
            "properties": {"sku": {"type": "string", "minLength": 3}},
            "required": ["sku"],
        }
    },
}
SMALLEST_ORDER = {"id": 1, "status": "open", "lines": [{"sku": "xxx"}], "note": ""}


async def test_the_default_responder_answers_a_requested_schema_with_its_smallest_instance(
    server: FakeModelServer, client: openai.AsyncOpenAI
) -> None:
    stream = await client.chat.completions.create(
        model="fake-model",
        messages=HELLO,
        stream=True,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "order", "schema": ORDER_SCHEMA, "strict": True},
        },
    )
    chunks = [chunk async for chunk in stream]

    assert json.loads(content_of(chunks)) == SMALLEST_ORDER


async def test_the_default_responder_calls_an_offered_final_output_tool_with_the_answer(
    server: FakeModelServer, client: openai.AsyncOpenAI
) -> None:
    final_output: ChatCompletionToolParam = {
        "type": "function",
        "function": {"name": "final_output", "parameters": ORDER_SCHEMA},
    }

    chunks = await stream_chunks(client, tools=[final_output])

    (call,) = reassemble_tool_calls(chunks).values()
    assert call["name"] == "final_output"
    assert json.loads(call["arguments"]) == SMALLEST_ORDER


async def test_a_refusal_streams_as_delta_refusal(
    server: FakeModelServer, client: openai.AsyncOpenAI
) -> None:
    server.enqueue(Turn.refusing("I can't help with that."))

    chunks = await stream_chunks(client)

    refusal = "".join(c.choices[0].delta.refusal or "" for c in chunks if c.choices)
    assert refusal == "I can't help with that."
    assert content_of(chunks) == ""
