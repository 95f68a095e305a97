"""The model driver over the real openai client against the fake model on HTTP."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import openai
import pytest

from agio_grpc.domain import StopReason, ToolCall, clean_text
from agio_grpc.engine.events import ToolCallDelta
from agio_grpc.engine.models import (
    ModelDelta,
    ModelError,
    ModelEvent,
    ModelRequest,
    ModelRestart,
    ModelRetry,
)
from agio_grpc.engine.models.openai_chat import OpenAIModelDriver, provider_name, retry_after_s
from agio_grpc.engine.models.openai_chunks import ReplyBuilder, error_message
from agio_grpc.engine.models.retries import RetryPolicy
from agio_grpc.testing import FakeModelServer, ToolCallSpec, Turn, UsageSpec
from tests.engine.harness import FAST_RETRIES

HELLO = ModelRequest(model="fake-model", messages=[{"role": "user", "content": "hello"}])


class Recorder:
    def __init__(self) -> None:
        self.events: list[ModelEvent] = []

    def __call__(self, event: ModelEvent) -> None:
        self.events.append(event)

    def of(self, kind: type[Any]) -> list[Any]:
        return [event for event in self.events if isinstance(event, kind)]


async def complete(server: FakeModelServer, request: ModelRequest = HELLO) -> tuple[Any, Recorder]:
    driver = OpenAIModelDriver(base_url=server.base_url, api_key="k", retry=FAST_RETRIES)
    recorder = Recorder()
    try:
        return await driver.complete(request, recorder), recorder
    finally:
        await driver.close()


async def test_text_reply_streams_deltas_and_fills_metrics(fake_model: FakeModelServer) -> None:
    fake_model.enqueue(
        Turn.text(
            "Hello there friend",
            chunks=3,
            reasoning="think first",
            usage=UsageSpec(
                prompt_tokens=11, completion_tokens=7, cached_tokens=4, reasoning_tokens=2
            ),
        )
    )
    reply, recorder = await complete(fake_model)
    assert reply.content == "Hello there friend"
    assert reply.reasoning_content == "think first"
    assert reply.finish_reason == "stop"
    assert reply.stop_reason is None
    assert reply.tool_calls == []
    deltas = recorder.of(ModelDelta)
    assert "".join(d.content for d in deltas) == "Hello there friend"
    assert "".join(d.reasoning_content for d in deltas) == "think first"
    metrics = reply.metrics
    assert (metrics.input_tokens, metrics.output_tokens, metrics.total_tokens) == (11, 7, 18)
    assert (metrics.cached_input_tokens, metrics.reasoning_tokens) == (4, 2)
    assert metrics.model_name == "fake-model"
    assert metrics.provider == "openai_compatible"
    assert metrics.retries == 0
    assert metrics.duration_ms >= metrics.first_token_latency_ms >= 0
    request = fake_model.requests[-1]
    assert request["stream"] is True
    assert request["stream_options"] == {"include_usage": True}
    assert "tools" not in request


async def test_a_request_of_several_megabytes_goes_out_whole(fake_model: FakeModelServer) -> None:
    # Over aiohttp's 1 MiB mark for raw bytes (warnings are errors here, as they fail runs).
    long_input = "x" * 3_000_000
    fake_model.enqueue(Turn.text("read it all"))
    request = ModelRequest(model="fake-model", messages=[{"role": "user", "content": long_input}])

    reply, _ = await complete(fake_model, request)

    assert reply.content == "read it all"
    assert fake_model.requests[-1]["messages"][0]["content"] == long_input


async def test_the_reply_keeps_the_completion_id_its_chunks_carry(
    fake_model: FakeModelServer,
) -> None:
    fake_model.enqueue(Turn.text("one"), Turn.text("two"))
    first, _ = await complete(fake_model)
    second, _ = await complete(fake_model)
    assert re.fullmatch(r"chatcmpl-[0-9a-f]{24}", first.response_id)
    assert re.fullmatch(r"chatcmpl-[0-9a-f]{24}", second.response_id)
    assert first.response_id != second.response_id


@pytest.mark.parametrize(("sent", "kept"), [(None, ""), (7, ""), ("resp\u0000-1", "resp\ufffd-1")])
async def test_a_completion_id_is_optional_and_read_only_as_text(
    fake_model: FakeModelServer, sent: object, kept: str
) -> None:
    chunk: dict[str, Any] = {
        "object": "chat.completion.chunk",
        "model": "fake-model",
        "choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": "stop"}],
    }
    if sent is not None:
        chunk["id"] = sent
    fake_model.enqueue(Turn.raw(json.dumps(chunk)))
    reply, _ = await complete(fake_model)
    assert (reply.content, reply.response_id) == ("hi", kept)


async def test_tool_call_fragments_join_by_index(fake_model: FakeModelServer) -> None:
    fake_model.enqueue(
        Turn.tool_calls(
            [
                ToolCallSpec("calculate", '{"expression": "1 + 2"}', id="call_a"),
                ToolCallSpec("echo", '{"text": "hi"}', id="call_b"),
            ],
            chunks_per_call=4,
        )
    )
    reply, recorder = await complete(fake_model)
    assert reply.finish_reason == "tool_calls"
    assert reply.tool_calls == [
        ToolCall("call_a", "calculate", '{"expression": "1 + 2"}'),
        ToolCall("call_b", "echo", '{"text": "hi"}'),
    ]
    fragments = [call for d in recorder.of(ModelDelta) for call in d.tool_calls]
    assert {f.index for f in fragments} == {0, 1}
    assert "".join(f.arguments for f in fragments if f.index == 1) == '{"text": "hi"}'


async def test_request_carries_tools_and_sampling_settings(fake_model: FakeModelServer) -> None:
    tool = {"type": "function", "function": {"name": "echo", "parameters": {"type": "object"}}}
    request = ModelRequest("m", [{"role": "user", "content": "x"}], [tool], 0.2, 50)
    fake_model.enqueue(Turn.text("ok"))
    await complete(fake_model, request)
    body = fake_model.requests[-1]
    assert (body["model"], body["tools"], body["temperature"], body["max_tokens"]) == (
        "m",
        [tool],
        0.2,
        50,
    )


async def test_the_request_carries_what_the_openai_client_sends(
    fake_model: FakeModelServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_ORG_ID", "org-7")
    monkeypatch.setenv("OPENAI_PROJECT_ID", "proj-7")
    async with openai.AsyncOpenAI(base_url=fake_model.base_url, api_key="k") as client:
        stream = await client.chat.completions.create(
            model="fake-model", messages=[{"role": "user", "content": "hello"}], stream=True
        )
        async for _ in stream:
            pass
    await complete(fake_model)
    sdk, driver = fake_model.request_headers
    # What the HTTP library or one attempt of the SDK's retry loop sets, not the client.
    transport = {"content-length", "connection", "accept-encoding"}
    transport |= {"x-stainless-retry-count", "x-stainless-read-timeout"}
    assert {k: v for k, v in driver.items() if k not in transport} == {
        k: v for k, v in sdk.items() if k not in transport
    }
    assert driver["authorization"] == "Bearer k"
    assert (driver["openai-organization"], driver["openai-project"]) == ("org-7", "proj-7")


@pytest.mark.parametrize(
    ("finish", "reason"),
    [("length", StopReason.MAX_TOKENS), ("content_filter", StopReason.CONTENT_FILTER)],
)
async def test_finish_reasons_map_to_stop_reasons(
    fake_model: FakeModelServer, finish: Any, reason: StopReason
) -> None:
    fake_model.enqueue(Turn.text("cut", finish_reason=finish))
    reply, _ = await complete(fake_model)
    assert reply.stop_reason is reason


async def test_rate_limit_is_retried_before_anything_streamed(fake_model: FakeModelServer) -> None:
    fake_model.enqueue(Turn.error(429, retry_after=0), Turn.error(503), Turn.text("ok"))
    reply, recorder = await complete(fake_model)
    assert reply.content == "ok"
    assert reply.metrics.retries == 2
    retries = recorder.of(ModelRetry)
    assert [r.attempt for r in retries] == [1, 2]
    assert retries[0].delay_s == 0
    assert "HTTP 429" in retries[0].message
    assert len(fake_model.requests) == 3


async def test_retries_give_up_retryable_after_the_limit(fake_model: FakeModelServer) -> None:
    fake_model.enqueue(*[Turn.error(500)] * 4)
    with pytest.raises(ModelError) as raised:
        await complete(fake_model)
    assert raised.value.retryable
    assert "after 3 retries" in raised.value.message
    assert (raised.value.status_code, raised.value.retries) == (500, 3)  # the last status
    assert len(fake_model.requests) == 4


@pytest.mark.parametrize("status", [400, 401, 404])
async def test_client_errors_fail_at_once_with_the_providers_message(
    fake_model: FakeModelServer, status: int
) -> None:
    fake_model.enqueue(Turn.error(status, message="model 'x' does not exist"))
    with pytest.raises(ModelError) as raised:
        await complete(fake_model)
    assert not raised.value.retryable
    assert raised.value.status_code == status
    assert raised.value.message == f"HTTP {status}: model 'x' does not exist"
    assert len(fake_model.requests) == 1


async def test_an_in_band_server_error_after_deltas_restarts_the_stream(
    fake_model: FakeModelServer,
) -> None:
    partial = {"choices": [{"index": 0, "delta": {"content": "partial"}}]}
    error = {"error": {"message": "try again", "type": "server_error", "code": None}}
    fake_model.enqueue(Turn.raw(json.dumps(partial), json.dumps(error)), Turn.text("whole"))
    reply, recorder = await complete(fake_model)
    assert (reply.content, reply.metrics.retries) == ("whole", 1)
    (restart,) = recorder.of(ModelRestart)
    assert restart.message == "the model stream reported an error (server_error): try again"


async def test_a_malformed_chunk_fails_at_once_even_after_deltas(
    fake_model: FakeModelServer,
) -> None:
    partial = {"choices": [{"index": 0, "delta": {"content": "partial"}}]}
    fake_model.enqueue(Turn.raw(json.dumps(partial), '{"choices": [{"delta": 7}]}'))
    with pytest.raises(ModelError) as raised:
        await complete(fake_model)
    assert (
        raised.value.message == "model stream: choices[0].delta must be an object or null, got int"
    )
    assert (raised.value.retryable, raised.value.retries) == (False, 0)
    assert len(fake_model.requests) == 1


async def test_stream_cut_after_deltas_restarts_once(fake_model: FakeModelServer) -> None:
    fake_model.enqueue(Turn.text("partial answer", chunks=5, cut_after=3), Turn.text("whole"))
    reply, recorder = await complete(fake_model)
    assert reply.content == "whole"
    assert reply.metrics.retries == 1
    kinds = [type(event).__name__ for event in recorder.events]
    restart = kinds.index("ModelRestart")
    assert "ModelDelta" in kinds[:restart]  # the partial deltas came first
    assert "".join(d.content for d in recorder.of(ModelDelta)[restart:]) == "whole"


async def test_a_stream_cut_twice_fails_retryable(fake_model: FakeModelServer) -> None:
    fake_model.enqueue(*[Turn.text("partial answer", chunks=5, cut_after=3)] * 2)
    with pytest.raises(ModelError) as raised:
        await complete(fake_model)
    assert raised.value.retryable
    assert "restart" in raised.value.message


async def test_a_stream_without_finish_reason_is_never_a_success(
    fake_model: FakeModelServer,
) -> None:
    fake_model.enqueue(*[Turn.text("looks complete", omit_finish_reason=True)] * 2)
    with pytest.raises(ModelError) as raised:
        await complete(fake_model)
    assert "without a finish_reason" in raised.value.message
    assert raised.value.retryable


async def complete_within(
    base_url: str, timeout_s: float, request: ModelRequest = HELLO
) -> tuple[Any, Recorder]:
    """`complete` with the driver's idle timeout set to `timeout_s`."""
    driver = OpenAIModelDriver(
        base_url=base_url, api_key="k", retry=FAST_RETRIES, timeout_s=timeout_s
    )
    recorder = Recorder()
    try:
        return await driver.complete(request, recorder), recorder
    finally:
        await driver.close()


async def test_a_model_that_never_answers_is_retried_then_fails_retryable(
    fake_model: FakeModelServer,
) -> None:
    attempts = FAST_RETRIES.max_retries + 1
    fake_model.enqueue(*[Turn.hanging()] * attempts)
    with pytest.raises(ModelError) as raised:
        await complete_within(fake_model.base_url, 0.2)
    assert raised.value.retryable
    assert "sent nothing for 0.2s" in raised.value.message
    assert raised.value.retries == FAST_RETRIES.max_retries  # every attempt made
    # The fake model runs in this event loop: a stall past the idle timeout lets the driver
    # give up on an attempt and close its connection before the model has read the request.
    assert attempts - 1 <= len(fake_model.requests) <= attempts


async def test_a_stream_that_goes_silent_after_deltas_restarts(
    fake_model: FakeModelServer,
) -> None:
    fake_model.enqueue(Turn.words("first then silence", chunk_delay=5.0), Turn.words("whole"))
    reply, recorder = await complete_within(fake_model.base_url, 0.2)
    assert reply.content == "whole"
    (restart,) = recorder.of(ModelRestart)
    assert "sent nothing" in restart.message


class RawHttpServer:
    """Answers every request on a socket with fixed bytes (in parts, 0.1 s apart, the last
    only once `before_last` is set, when given), then holds the connection open (or closes
    it, without `hold`): what no well-behaved HTTP server sends."""

    def __init__(
        self, *parts: bytes, hold: bool = True, before_last: asyncio.Event | None = None
    ) -> None:
        self.parts = parts
        self.hold = hold
        self.before_last = before_last
        self.connections = 0
        self.heads: list[bytes] = []
        self._server: asyncio.Server | None = None
        self._writers: list[asyncio.StreamWriter] = []

    async def __aenter__(self) -> str:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}/v1"

    async def __aexit__(self, *exc_info: object) -> None:
        assert self._server is not None
        self._server.close()
        for writer in self._writers:
            writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self._writers.append(writer)
        self.heads.append(await reader.readuntil(b"\r\n\r\n"))
        for index, part in enumerate(self.parts):
            if index:
                await asyncio.sleep(0.1)
            if index == len(self.parts) - 1 and self.before_last is not None:
                await self.before_last.wait()
            writer.write(part)
            await writer.drain()
        if self.hold:
            await reader.read()  # until the client leaves
        else:
            writer.close()


async def test_a_malformed_response_is_a_connection_failure_and_retried() -> None:
    garbage = RawHttpServer(b"NOT HTTP AT ALL\r\n\r\n")
    async with garbage as base_url:
        with pytest.raises(ModelError) as raised:
            await complete_within(base_url, 5.0)
    assert raised.value.retryable
    assert garbage.connections == FAST_RETRIES.max_retries + 1


async def test_a_garbled_chunk_after_deltas_restarts_then_fails_retryable() -> None:
    chunk = json.dumps({"choices": [{"index": 0, "delta": {"content": "partial"}}]})
    event = f"data: {chunk}\n\n".encode()
    garbled = RawHttpServer(
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
        b"transfer-encoding: chunked\r\n\r\n" + f"{len(event):x}\r\n".encode() + event,
        b"\r\nZZZ not a chunk size\r\n",  # once the delta is out
    )
    async with garbled as base_url:
        with pytest.raises(ModelError) as raised:
            await complete_within(base_url, 0.3)
    assert raised.value.retryable
    assert "restart" in raised.value.message
    assert garbled.connections == 2  # the call, then its one restart


def http_chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


async def test_keep_alive_comments_keep_a_slow_model_within_the_idle_timeout() -> None:
    ping = http_chunk(b": still thinking\n\n")
    answer = json.dumps(
        {"choices": [{"index": 0, "delta": {"content": "late"}, "finish_reason": "stop"}]}
    )
    slow = RawHttpServer(
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
        b"transfer-encoding: chunked\r\n\r\n" + ping,
        *[ping] * 4,  # 0.5 s in all, longer than the 0.3 s idle timeout
        http_chunk(f"data: {answer}\n\n".encode()) + http_chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n",
    )
    async with slow as base_url:
        reply, recorder = await complete_within(base_url, 0.3)
    assert reply.content == "late"
    assert recorder.of(ModelRestart) == []
    assert slow.connections == 1


async def test_events_split_across_reads_and_any_line_ending_are_joined() -> None:
    def event(content: str, finish: str | None = None) -> bytes:
        delta = {"choices": [{"index": 0, "delta": {"content": content}, "finish_reason": finish}]}
        return f"data: {json.dumps(delta)}".encode()

    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: "
    body = [
        event("one ")[:20],  # an event cut mid-line
        event("one ")[20:] + b"\r",  # a line ending cut between its \r and its \n
        b"\n\r\n" + event("two ") + b"\r\r",  # \r alone ends lines too
        event("three", "stop") + b"\n\ndata: [DONE]\n\n",
    ]
    parts = [head + str(sum(map(len, body))).encode() + b"\r\n\r\n" + body[0], *body[1:]]
    async with RawHttpServer(*parts) as base_url:
        reply, recorder = await complete_within(base_url, 5.0)
    assert reply.content == "one two three"
    assert [d.content for d in recorder.of(ModelDelta)] == ["one ", "two ", "three"]


async def test_an_event_ended_by_lone_crs_is_delivered_before_the_next_read() -> None:
    def event(content: str, finish: str | None = None) -> bytes:
        delta = {"choices": [{"index": 0, "delta": {"content": content}, "finish_reason": finish}]}
        return f"data: {json.dumps(delta)}".encode()

    class FirstDelta(Recorder):
        def __init__(self) -> None:
            super().__init__()
            self.seen = asyncio.Event()

        def __call__(self, event: ModelEvent) -> None:
            super().__call__(event)
            if isinstance(event, ModelDelta):
                self.seen.set()

    # The first read ends in `\r`, which may be half of a `\r\n` the next read completes;
    # the server sends that next read only once the first delta is out.
    body = [event("one ") + b"\r\r", event("two", "stop") + b"\r\rdata: [DONE]\r\r"]
    length = sum(map(len, body))
    head = f"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: {length}"
    recorder = FirstDelta()
    server = RawHttpServer(f"{head}\r\n\r\n".encode() + body[0], body[1], before_last=recorder.seen)
    async with server as base_url:
        driver = OpenAIModelDriver(
            base_url=base_url, api_key="k", retry=FAST_RETRIES, timeout_s=2.0
        )
        try:
            reply = await driver.complete(HELLO, recorder)
        finally:
            await driver.close()
    assert reply.content == "one two"
    assert recorder.of(ModelRestart) == []


@pytest.mark.parametrize(("status", "retried"), [(503, True), (400, False)])
async def test_an_error_answer_that_is_not_json_reports_its_text(
    status: int, retried: bool
) -> None:
    text = b"upstream says no"
    head = f"HTTP/1.1 {status} Whatever\r\nconnection: close\r\ncontent-length: {len(text)}"
    answer = f"{head}\r\n\r\n".encode()
    server = RawHttpServer(answer + text)
    async with server as base_url:
        with pytest.raises(ModelError) as raised:
            await complete_within(base_url, 5.0)
    assert f"HTTP {status}: upstream says no" in raised.value.message
    assert raised.value.retryable is retried
    assert server.connections == (FAST_RETRIES.max_retries + 1 if retried else 1)


async def test_an_error_answer_read_in_parts_reports_the_whole_message() -> None:
    body = json.dumps({"error": {"message": "model 'x' does not exist", "type": "invalid"}})
    head = b"HTTP/1.1 404 Not Found\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n"
    server = RawHttpServer(
        head + http_chunk(body[:10].encode()), http_chunk(body[10:].encode()) + b"0\r\n\r\n"
    )
    async with server as base_url:
        with pytest.raises(ModelError) as raised:
            await complete_within(base_url, 5.0)
    assert raised.value.message == "HTTP 404: model 'x' does not exist"


@pytest.mark.parametrize(
    ("hold", "idle_timeout_s"),
    [(True, 10.0), (True, 0.5), (False, 10.0)],  # held open (past a short watchdog), cut off
)
async def test_a_body_left_open_or_cut_after_done_costs_the_connection_not_the_reply(
    hold: bool, idle_timeout_s: float
) -> None:
    answer = json.dumps(
        {"choices": [{"index": 0, "delta": {"content": "whole"}, "finish_reason": "stop"}]}
    )
    server = RawHttpServer(  # never sends the chunked body's end
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
        + http_chunk(f"data: {answer}\n\ndata: [DONE]\n\n".encode()),
        hold=hold,
    )
    async with server as base_url:
        reply, recorder = await complete_within(base_url, idle_timeout_s)
    assert reply.content == "whole"
    assert recorder.of(ModelRestart) == []
    assert server.connections == 1


@pytest.mark.parametrize("exempt", [False, True])
async def test_requests_go_through_the_proxy_the_environment_names(
    fake_model: FakeModelServer, monkeypatch: pytest.MonkeyPatch, exempt: bool
) -> None:
    answer = json.dumps(
        {"choices": [{"index": 0, "delta": {"content": "via"}, "finish_reason": "stop"}]}
    )
    body = f"data: {answer}\n\ndata: [DONE]\n\n".encode()
    head = f"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: {len(body)}"
    proxy = RawHttpServer(f"{head}\r\n\r\n".encode() + body)
    fake_model.enqueue(Turn.text("direct"))
    async with proxy as proxy_url:
        monkeypatch.setenv("HTTP_PROXY", proxy_url.removesuffix("/v1"))
        monkeypatch.setenv("NO_PROXY", fake_model.host if exempt else "example.invalid")
        reply, _ = await complete(fake_model)
    if exempt:
        assert (reply.content, proxy.connections) == ("direct", 0)
    else:
        assert (reply.content, len(fake_model.requests)) == ("via", 0)
        assert proxy.heads[0].startswith(f"POST {fake_model.base_url}/chat/completions ".encode())


async def test_no_retries_when_the_policy_allows_none(fake_model: FakeModelServer) -> None:
    driver = OpenAIModelDriver(
        base_url=fake_model.base_url, api_key="k", retry=RetryPolicy(max_retries=0)
    )
    fake_model.enqueue(Turn.error(429, retry_after=0))
    with pytest.raises(ModelError):
        await driver.complete(HELLO, Recorder())
    await driver.close()


def test_retry_after_is_honoured_up_to_the_cap() -> None:
    policy = RetryPolicy(initial_backoff_s=1, max_backoff_s=4, jitter=0, max_retry_after_s=10)
    assert policy.backoff_s(0, 3.0) == 3.0
    assert policy.backoff_s(0, 60.0) == 10.0
    assert [policy.backoff_s(n, None) for n in range(4)] == [1, 2, 4, 4]


def test_an_error_body_nested_too_deep_to_parse_is_reported_as_text() -> None:
    assert error_message(b"[" * 100_000).startswith("[[[")


async def test_a_closed_driver_fails_calls_retryable_instead_of_reconnecting(
    fake_model: FakeModelServer,
) -> None:
    driver = OpenAIModelDriver(base_url=fake_model.base_url, api_key="k", retry=FAST_RETRIES)
    await driver.close()
    with pytest.raises(ModelError) as raised:
        await driver.complete(HELLO, Recorder())
    assert (raised.value.message, raised.value.retryable) == ("the model driver is closed", True)
    assert fake_model.requests == []


def test_a_retry_after_date_without_a_zone_is_read_as_utc() -> None:
    assert retry_after_s({"retry-after": "Wed, 21 Oct 2015 07:28:00 -0000"}) == 0.0
    assert retry_after_s({"retry-after": "soon"}) is None
    assert retry_after_s({"retry-after-ms": "1500"}) == 1.5


def test_provider_is_derived_from_the_base_url() -> None:
    assert provider_name("https://api.openai.com/v1") == "openai"
    assert provider_name("http://localhost:11434/v1") == "openai_compatible"


def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    """A chunk as the driver parses it off the wire (JSON, not the client's typed model)."""
    return {
        "id": "c",
        "created": 0,
        "model": "m",
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


def test_calls_reusing_index_zero_with_new_ids_stay_separate() -> None:
    builder = ReplyBuilder(model_name="m")
    call = {"type": "function"}
    builder.add(
        chunk(
            {
                "tool_calls": [
                    {**call, "index": 0, "id": "a", "function": {"name": "x", "arguments": "{}"}}
                ]
            }
        )
    )
    second = builder.add(
        chunk(
            {
                "tool_calls": [
                    {**call, "index": 0, "id": "b", "function": {"name": "y", "arguments": "{"}}
                ]
            }
        )
    )
    builder.add(chunk({"tool_calls": [{"index": 0, "function": {"arguments": "}"}}]}, "tool_calls"))
    assert second is not None
    assert second.tool_calls == (ToolCallDelta(1, "b", "y", "{"),)
    assert builder.build().tool_calls == [ToolCall("a", "x", "{}"), ToolCall("b", "y", "{}")]


def test_reasoning_is_read_from_provider_extra_fields() -> None:
    builder = ReplyBuilder(model_name="m")
    delta = builder.add(chunk({"reasoning_content": "hmm"}))
    assert delta == ModelDelta(reasoning_content="hmm")
    assert builder.add(chunk({"reasoning": "ollama"})) == ModelDelta(reasoning_content="ollama")


@pytest.mark.parametrize(
    ("text", "cleaned"),
    [
        ("a\x00b", "a\ufffdb"),
        ("\ud800 und \udfff", "\ufffd und \ufffd"),
        ("naïve\x00", "naïve\ufffd"),
        ("\ud83d\ude00", "\ufffd\ufffd"),  # a pair split in two strings stays two halves
    ],
)
def test_clean_text_replaces_nuls_and_lone_surrogates(text: str, cleaned: str) -> None:
    assert clean_text(text) == cleaned


@pytest.mark.parametrize("text", ["", "plain ascii", "naïve café 😀", "\ufffd"])
def test_clean_text_returns_ordinary_text_itself(text: str) -> None:
    assert clean_text(text) is text


def test_a_call_without_an_id_gets_one() -> None:
    builder = ReplyBuilder(model_name="m")
    builder.add(
        chunk({"tool_calls": [{"index": 0, "function": {"name": "x", "arguments": "{}"}}]}, "stop")
    )
    (call,) = builder.build().tool_calls
    assert call.id.startswith("call_")
    assert json.loads(call.arguments) == {}
