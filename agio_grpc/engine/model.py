"""The model driver: one streamed chat.completions call, with retries, as a `ModelReply`.

`ModelDriver` is the protocol the loop depends on; `OpenAIModelDriver` implements it for any
OpenAI-compatible endpoint (OpenAI, vLLM, Ollama, llama.cpp). Every call streams with
`stream_options.include_usage`; deltas are reported to the caller as they arrive; tool call
fragments are joined by index (a fragment with a new id at a used index starts a new call,
as Ollama sends them); `reasoning_content` (vLLM, DeepSeek) is kept.

Failure policy (every retry is ours: counted in `StepMetrics.retries` and reported as a
`ModelRetry` event):
- Before anything streamed, transient failures (429, 408, 409, 5xx, connection errors,
  timeouts, an empty stream) are retried with exponential backoff and jitter, honouring
  `Retry-After` up to a cap.
- After the first delta, a failure (cut stream, dropped connection, a stream that ends
  without `finish_reason`) restarts the call ONCE: the caller gets `ModelRestart` and must
  discard the step's deltas so far. If the restarted call fails too, the call fails with a
  retryable `ModelError`. Partial output is never returned as a reply.
- Other 4xx (400, 401, 403, 404, 422) fail at once with the provider's message, not retryable.
- An error object sent inside a 200 stream (`data: {"error": {...}}`) is classified as its
  HTTP status would be (`_is_transient`, one rule for both): authentication, unknown model
  and invalid request fail at once, rate limits and server errors are retried.
- A stream that ends without `finish_reason` is never a success.
- A chunk that is JSON but not the Chat Completions chunk shape fails at once, not
  retryable, naming the field (`model stream: choices[0].delta must be an object or null,
  got str`): a server that sends it once will send it again. Text that is not JSON at all is
  what a cut stream looks like, and is a transient failure.
- Nothing the model sends can fail a later write: text (content, reasoning, tool call ids,
  names and arguments, the model name, error messages) is cleaned with `clean_text` (U+0000
  and lone surrogates become U+FFFD), and token counts are clamped to `MAX_TOKEN_COUNT`.

The request is the one the `openai` client would send: the client resolves the endpoint,
the API key (as a bearer token), the organisation and project (`OPENAI_ORG_ID`,
`OPENAI_PROJECT_ID`) and its identifying headers, once. It goes out on aiohttp directly, and
the stream is parsed here from the raw SSE lines with `json.loads`, because of what the
client's own path cost:
- its typed chunks ~80 µs of CPU each in pydantic model construction, about 20x the parse;
- its request path (a TypedDict transform of the body, URL and header building per request,
  httpx2 above the transport) ~0.9 ms of the event loop per call: a short call took 1.38 ms
  through it here and 0.5-0.7 ms without it;
- httpx2's read path above aiohttp, per chunk of a paced stream: 100 concurrent 100-chunk
  streams cost ~90-110 µs of CPU per chunk through the client and ~40-50 µs without it.
Transport failures are `aiohttp.ClientError`s (or `OSError`s) and are all classified alike,
as connection failures. The wait for the model is bounded by the driver's own idle watchdog,
not by a read timeout in the transport: one timer per call, re-armed only when it fires,
instead of one per chunk; and it also ends a stream the transport stopped delivering without
an error (aiohttp stalls on a garbled chunk header after valid data).
After each delta the driver yields to the event loop once, so a burst of chunks already
buffered on the socket cannot starve the tasks relaying the deltas to clients.

This module knows nothing of steps, the store or the event channel, and never imports grpc.
"""

from __future__ import annotations

import asyncio
import email.utils
import io
import json
import random
import re
import time
import urllib.request
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import TracebackType
from typing import Any, Final, Protocol
from urllib.parse import urlparse

import aiohttp
import httpx2
import openai
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.payload import TOO_LARGE_BYTES_BODY as _RAW_BODY_BYTES

from agio_grpc.domain import StepMetrics, StopReason, ToolCall, clean_text
from agio_grpc.engine.events import ToolCallDelta

_TRANSIENT_STATUS = frozenset({408, 409, 429})
# In-band error codes and types (OpenAI's, Anthropic-style and vLLM's names) that decide
# without a status: a retry cannot fix the first kind, and may fix the second.
_FINAL_ERROR_CODES = frozenset(
    {
        "invalid_api_key",
        "authentication_error",
        "permission_error",
        "permission_denied",
        "model_not_found",
        "not_found_error",
        "invalid_request_error",
        "context_length_exceeded",
    }
)
_TRANSIENT_ERROR_CODES = frozenset(
    {
        "rate_limit_exceeded",
        "rate_limit_error",
        "server_error",
        "api_error",
        "overloaded",
        "overloaded_error",
        "service_unavailable",
        "timeout",
    }
)
_ERROR_BODY_LIMIT = 64 * 1024
_ERROR_TEXT_LIMIT = 500
_ERROR_CODE_LIMIT = 64
_BODY_END_WAIT_S = 1.0

MAX_TOKEN_COUNT = 2**53 - 1
"""Token counts the model reports are clamped to this. The store keeps 64-bit integers and
sums a run's counts over its steps; 2**53 - 1 is also the largest integer every client (a
JSON number, a JavaScript number) reads exactly. A negative count is a malformed chunk."""


@dataclass(frozen=True, slots=True)
class ModelRequest:
    """One model call: the messages and tools to send and the sampling settings."""

    model: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] = field(default_factory=list)
    temperature: float | None = None
    max_tokens: int | None = None
    max_reply_bytes: int | None = None
    """The largest reply kept (its texts' UTF-8 bytes): a longer one is cut off there, its
    tool calls dropped, and it ends as `oversized` with finish_reason `length`."""


@dataclass(slots=True)
class ModelReply:
    """A complete model reply (the stream ended with a finish_reason)."""

    content: str
    reasoning_content: str
    tool_calls: list[ToolCall]
    finish_reason: str
    metrics: StepMetrics
    oversized: bool = False
    """Cut off at the request's `max_reply_bytes`."""
    response_id: str = ""
    """The provider's id of the completion (the chunks' `id`, e.g. `chatcmpl-...`); "" when
    it sent none."""

    @property
    def stop_reason(self) -> StopReason | None:
        """MAX_TOKENS for `length`, CONTENT_FILTER for `content_filter`, else None."""
        return _FINISH_STOP_REASONS.get(self.finish_reason)


_FINISH_STOP_REASONS = {
    "length": StopReason.MAX_TOKENS,
    "content_filter": StopReason.CONTENT_FILTER,
}


@dataclass(frozen=True, slots=True)
class ModelDelta:
    """Fragments of the reply as they arrive."""

    content: str = ""
    reasoning_content: str = ""
    tool_calls: tuple[ToolCallDelta, ...] = ()


@dataclass(frozen=True, slots=True)
class ModelRetry:
    """A call failed before streaming anything and is retried after `delay_s`."""

    attempt: int
    delay_s: float
    message: str


@dataclass(frozen=True, slots=True)
class ModelRestart:
    """The stream broke after deltas: discard the deltas so far, the call starts over."""

    message: str


ModelEvent = ModelDelta | ModelRetry | ModelRestart
ModelListener = Callable[[ModelEvent], None]


class ModelError(Exception):
    """The model call failed for good; `retryable` says whether trying later may work.

    `status_code` is the HTTP status of the last attempt's answer when it was an error status;
    `error_code` the `code` (else `type`) of an error object the model sent inside its stream;
    `retries` the retries and restarts made before giving up.
    """

    def __init__(
        self,
        message: str,
        *,
        retryable: bool,
        status_code: int | None = None,
        error_code: str | None = None,
        retries: int = 0,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.retryable = retryable
        self.status_code = status_code
        self.error_code = error_code
        self.retries = retries

    @property
    def context_exceeded(self) -> bool:
        """Whether the provider refused the request as longer than the model's context
        window: OpenAI's `context_length_exceeded` code, or the messages vLLM, llama.cpp and
        Anthropic-compatible servers send for it."""
        if self.error_code == "context_length_exceeded":
            return True
        return self.status_code in (400, 413, 422) and bool(_CONTEXT_EXCEEDED.search(self.message))


_CONTEXT_EXCEEDED: Final = re.compile(
    r"maximum context length|context length|context window|prompt is too long"
    r"|exceeds? the (?:model'?s? )?context",
    re.IGNORECASE,
)


class ModelDriver(Protocol):
    """What the loop needs from a model."""

    async def complete(self, request: ModelRequest, on_event: ModelListener) -> ModelReply:
        """Stream one reply, reporting events; raise ModelError when it cannot be had."""
        ...

    async def close(self) -> None:
        """Release connections."""
        ...


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How model calls are retried."""

    max_retries: int = 3
    """Retries of a call that failed before streaming anything."""
    initial_backoff_s: float = 0.5
    max_backoff_s: float = 8.0
    jitter: float = 0.25
    """Each backoff is shortened by a random share up to this."""
    max_retry_after_s: float = 30.0
    """A longer `Retry-After` is capped to this."""
    stream_restarts: int = 1
    """Restarts of a call whose stream broke after deltas."""

    def backoff_s(self, retry: int, retry_after_s: float | None) -> float:
        """The wait before retry number `retry` (0-based)."""
        if retry_after_s is not None:
            return max(0.0, min(retry_after_s, self.max_retry_after_s))
        delay = min(self.max_backoff_s, self.initial_backoff_s * 2.0**retry)
        return delay * (1 - random.random() * self.jitter)


def provider_name(base_url: str) -> str:
    """`openai` for api.openai.com, else `openai_compatible`."""
    host = urlparse(base_url).hostname or ""
    return "openai" if host == "api.openai.com" else "openai_compatible"


class _Failed(Exception):  # noqa: N818 - internal control flow
    """A failed attempt; its kind (the subclass) says what `complete` does next."""

    def __init__(
        self,
        message: str,
        *,
        status_code: int | None = None,
        error_code: str | None = None,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status_code = status_code
        self.error_code = error_code
        self.retry_after_s = retry_after_s

    def error(self, *, retryable: bool, retries: int, after: str = "") -> ModelError:
        """The call's `ModelError`, its message prefixed with `after` (what was tried)."""
        return ModelError(
            f"{after}: {self.message}" if after else self.message,
            retryable=retryable,
            status_code=self.status_code,
            error_code=self.error_code,
            retries=retries,
        )


class _Final(_Failed):
    """Trying again cannot help: a refused request, a malformed chunk."""


class _Transient(_Failed):
    """Retried after a backoff (nothing streamed yet)."""


class _StreamBroken(_Failed):
    """The stream failed after deltas: the call restarts."""


def _failed(reply: _ReplyBuilder, failure: _Transient) -> _Transient | _StreamBroken:
    """A failed attempt: retried while nothing streamed, else the stream restarts."""
    if not reply.streamed:
        return failure
    return _StreamBroken(
        failure.message, status_code=failure.status_code, error_code=failure.error_code
    )


class OpenAIModelDriver:
    """`ModelDriver` for an OpenAI-compatible endpoint (retries are ours, see the module)."""

    def __init__(
        self,
        *,
        base_url: str,
        api_key: str,
        retry: RetryPolicy | None = None,
        timeout_s: float = 120.0,
    ) -> None:
        """`timeout_s` bounds connecting, the wait for the response and each wait for the next
        chunk (the idle watchdog: a model silent this long fails the attempt)."""
        # Only for what a request must carry; nothing is sent through it.
        self._client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key)
        self._url = f"{str(self._client.base_url).rstrip('/')}/chat/completions"
        self._headers = _request_headers(self._client)
        self._proxy = _proxy_from_environment(self._url)
        self._ssl = httpx2.create_ssl_context()  # the certificates the openai client trusts
        # No read timeout in the transport: `_IdleWatchdog` bounds every wait instead.
        self._timeout = aiohttp.ClientTimeout(total=None, connect=timeout_s, sock_connect=timeout_s)
        self._http: aiohttp.ClientSession | None = None
        self._closed = False
        self._idle_timeout_s = timeout_s
        # Well inside the watchdog, so a finished reply is never failed by it.
        self._body_end_wait_s = min(_BODY_END_WAIT_S, timeout_s / 2)
        self.retry = retry or RetryPolicy()
        self.provider = provider_name(base_url)

    async def close(self) -> None:
        self._closed = True
        http, self._http = self._http, None
        if http is not None:
            await http.close()
        await self._client.close()

    def _session(self) -> aiohttp.ClientSession:
        """The connection pool, made on first use (inside the event loop that uses it)."""
        if self._closed:  # a call outliving the server's shutdown fails rather than leaks
            raise ModelError("the model driver is closed", retryable=True)
        if self._http is None:
            # No `trust_env`: it looks up the proxy and ~/.netrc on a worker thread at every
            # request (two thread hops, ~0.1-0.3 ms each here); the proxy is read once instead.
            self._http = aiohttp.ClientSession(
                # No cap on connections: a run holds at most one at a time, so the runs a
                # server admits bound them (a cap would queue model calls behind it, silently).
                connector=aiohttp.TCPConnector(limit=0, ssl=self._ssl),
                timeout=self._timeout,
                cookie_jar=aiohttp.DummyCookieJar(),
            )
        return self._http

    async def complete(self, request: ModelRequest, on_event: ModelListener) -> ModelReply:
        started = time.perf_counter()
        retries = restarts = 0
        while True:
            try:
                reply = await self._attempt(request, on_event, started)
            except _Final as failure:
                raise failure.error(retryable=False, retries=retries + restarts) from None
            except _Transient as failure:
                if retries >= self.retry.max_retries:
                    raise failure.error(
                        retryable=True,
                        retries=retries + restarts,
                        after=f"model call failed after {retries} retries",
                    ) from None
                delay = self.retry.backoff_s(retries, failure.retry_after_s)
                retries += 1
                on_event(ModelRetry(retries, delay, failure.message))
                await asyncio.sleep(delay)
                continue
            except _StreamBroken as failure:
                if restarts >= self.retry.stream_restarts:
                    raise failure.error(
                        retryable=True,
                        retries=retries + restarts,
                        after=f"model stream failed after {restarts} restart(s)",
                    ) from None
                restarts += 1
                on_event(ModelRestart(failure.message))
                continue
            reply.metrics.retries = retries + restarts
            reply.metrics.duration_ms = _ms_since(started)
            reply.metrics.provider = self.provider
            return reply

    async def _attempt(
        self, request: ModelRequest, on_event: ModelListener, started: float
    ) -> ModelReply:
        reply = _ReplyBuilder(model_name=request.model)
        body = json.dumps(self._body(request)).encode()
        # aiohttp sends a large body from a file object, in chunks (as bytes it would copy
        # it in one go, holding up the event loop, and warn).
        payload: bytes | io.BytesIO = io.BytesIO(body) if len(body) > _RAW_BODY_BYTES else body
        try:
            async with (
                _IdleWatchdog(self._idle_timeout_s) as watchdog,
                self._session().post(
                    self._url, data=payload, headers=self._headers, proxy=self._proxy
                ) as response,
            ):
                if response.status >= 300:
                    raise await _status_failure(response)
                async for data in _sse_data(_lines(response.content), watchdog.saw_data):
                    delta = reply.add(_chunk_of(data))
                    limit = request.max_reply_bytes
                    if limit is not None and reply.size > limit:
                        reply.cut_off(limit)
                        break  # the rest is not read: the connection closes with the response
                    if delta is not None:
                        if reply.first_token_latency_ms is None:
                            reply.first_token_latency_ms = _ms_since(started)
                        on_event(delta)
                        await asyncio.sleep(0)  # let the relay run (see the module docstring)
                if not reply.oversized:
                    await _finish_body(response.content, self._body_end_wait_s)
        # An error status, an error object in the stream, a chunk that is not JSON.
        except _Transient as failure:
            raise _failed(reply, failure) from None
        # aiohttp's own timeouts are TimeoutErrors too: its errors are classified first. A
        # malformed response surfaces as an HttpProcessingError with aiohttp's Python parser.
        except (aiohttp.ClientError, HttpProcessingError) as error:
            raise _failed(reply, _Transient(_describe_transport_error(error))) from None
        except TimeoutError:  # the watchdog
            message = f"the model sent nothing for {self._idle_timeout_s:g}s"
            raise _failed(reply, _Transient(message)) from None
        except OSError as error:
            raise _failed(reply, _Transient(_describe_transport_error(error))) from None
        if reply.finish_reason is None:
            message = "the model stream ended without a finish_reason (truncated response)"
            raise _failed(reply, _Transient(message))
        return reply.build()

    def _body(self, request: ModelRequest) -> dict[str, Any]:
        """The request body, as JSON-ready data."""
        arguments: dict[str, Any] = {
            "model": request.model,
            "messages": request.messages,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if request.tools:
            arguments["tools"] = request.tools
        if request.temperature is not None:
            arguments["temperature"] = request.temperature
        if request.max_tokens is not None:
            # OpenAI's newer models refuse `max_tokens`; many compatible servers only know it.
            key = "max_completion_tokens" if self.provider == "openai" else "max_tokens"
            arguments[key] = request.max_tokens
        return arguments


@dataclass(slots=True)
class _PartialCall:
    id: str = ""
    name: str = ""
    arguments: str = ""


@dataclass(frozen=True, slots=True)
class _Usage:
    """The token counts of a usage chunk, checked and clamped."""

    input_tokens: int
    output_tokens: int
    total_tokens: int
    cached_input_tokens: int
    reasoning_tokens: int


@dataclass(slots=True)
class _ReplyBuilder:
    """Accumulates the chunks of one streamed reply, checking the shape of each.

    Only the fields a reply is made of are checked (others pass unread): a field of the wrong
    type raises `_Final` naming it, which fails the call (so what the chunk's earlier fields
    changed here is never used).
    """

    model_name: str
    response_id: str = ""
    content: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    calls: list[_PartialCall] = field(default_factory=list)
    slot_of_index: dict[int, int] = field(default_factory=dict)
    finish_reason: str | None = None
    usage: _Usage | None = None
    first_token_latency_ms: int | None = None
    streamed: bool = False
    size: int = 0
    """UTF-8 bytes of the texts so far (content, reasoning, tool call ids, names, arguments)."""
    oversized: bool = False

    def add(self, chunk: object) -> ModelDelta | None:
        """Take one parsed chunk; return the fragments it carries, if any."""
        if not isinstance(chunk, dict):
            raise _malformed("the chunk", "an object", chunk)
        model = _text(chunk, "model", "")
        if model:
            self.model_name = model
        if not self.response_id:
            self.response_id = _response_id(chunk)
        usage = chunk.get("usage")
        if usage is not None:
            self.usage = _usage_of(usage)
        choices = chunk.get("choices")
        if choices is None:  # the usage chunk (vLLM sends `choices: null`)
            return None
        if not isinstance(choices, list):
            raise _malformed("choices", "an array or null", choices)
        return self._add_choice(choices[0]) if choices else None

    def _add_choice(self, choice: object) -> ModelDelta | None:
        if not isinstance(choice, dict):
            raise _malformed("choices[0]", "an object", choice)
        finish_reason = choice.get("finish_reason")
        if finish_reason is not None:
            if not isinstance(finish_reason, str):
                raise _malformed("choices[0].finish_reason", "a string or null", finish_reason)
            self.finish_reason = finish_reason
        delta = choice.get("delta")
        if delta is None:
            delta = {}
        elif not isinstance(delta, dict):
            raise _malformed("choices[0].delta", "an object or null", delta)
        content = _text(delta, "content", "choices[0].delta.")
        reasoning = _reasoning_of(delta)
        _text(delta, "refusal", "choices[0].delta.")  # checked; a refusal is not kept
        fragments = delta.get("tool_calls")
        if fragments is None:
            fragments = ()
        elif not isinstance(fragments, list):
            raise _malformed("choices[0].delta.tool_calls", "an array or null", fragments)
        calls = tuple(self._add_call(fragment, n) for n, fragment in enumerate(fragments))
        if not (content or reasoning or calls):
            return None
        self.size += _utf8_len(content) + _utf8_len(reasoning)
        for call in calls:
            self.size += _utf8_len(call.id) + _utf8_len(call.name) + _utf8_len(call.arguments)
        self.content.append(content)
        self.reasoning.append(reasoning)
        self.streamed = True
        return ModelDelta(content, reasoning, calls)

    def _add_call(self, fragment: object, position: int) -> ToolCallDelta:
        index, fragment_id, name, arguments = _call_fragment(fragment, position)
        slot = self.slot_of_index.get(index)
        if slot is None or (fragment_id and self.calls[slot].id not in ("", fragment_id)):
            slot = len(self.calls)
            self.calls.append(_PartialCall())
            self.slot_of_index[index] = slot
        call = self.calls[slot]
        if fragment_id and not call.id:
            call.id = fragment_id
        if name and not call.name:
            call.name = name
        call.arguments += arguments
        return ToolCallDelta(index=slot, id=fragment_id, name=name, arguments=arguments)

    def cut_off(self, max_bytes: int) -> None:
        """End the reply at `max_bytes` of its texts: content first, then reasoning, no tool
        calls (an argument cut short is no call)."""
        content = _utf8_prefix("".join(self.content), max_bytes)
        reasoning = _utf8_prefix("".join(self.reasoning), max_bytes - _utf8_len(content))
        self.content, self.reasoning, self.calls = [content], [reasoning], []
        self.finish_reason, self.oversized = "length", True

    def build(self) -> ModelReply:
        metrics = StepMetrics(
            first_token_latency_ms=self.first_token_latency_ms or 0, model_name=self.model_name
        )
        if self.usage is not None:
            metrics.input_tokens = self.usage.input_tokens
            metrics.output_tokens = self.usage.output_tokens
            metrics.total_tokens = self.usage.total_tokens
            metrics.cached_input_tokens = self.usage.cached_input_tokens
            metrics.reasoning_tokens = self.usage.reasoning_tokens
        return ModelReply(
            content="".join(self.content),
            reasoning_content="".join(self.reasoning),
            tool_calls=[
                ToolCall(call.id or f"call_{uuid.uuid4().hex[:24]}", call.name, call.arguments)
                for call in self.calls
            ],
            finish_reason=self.finish_reason or "stop",
            metrics=metrics,
            oversized=self.oversized,
            response_id=self.response_id,
        )


def _utf8_len(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode())


def _utf8_prefix(text: str, max_bytes: int) -> str:
    """The longest prefix of `text` of at most `max_bytes` UTF-8 bytes."""
    if _utf8_len(text) <= max_bytes:
        return text
    return text.encode()[: max(0, max_bytes)].decode(errors="ignore")


def _call_fragment(fragment: object, position: int) -> tuple[int, str, str, str]:
    """The index, id, function name and arguments of `choices[0].delta.tool_calls[position]`,
    checked and cleaned."""
    where = f"choices[0].delta.tool_calls[{position}]"
    if not isinstance(fragment, dict):
        raise _malformed(where, "an object", fragment)
    index = fragment.get("index")
    if index is None:  # some servers leave it out of single calls
        index = 0
    elif type(index) is not int:  # a bool is an int to isinstance
        raise _malformed(f"{where}.index", "an integer", index)
    kind = fragment.get("type")
    if kind is not None and kind != "function":
        # A protocol word, not model output: quoted (shortened), as "got str" would not help.
        got = repr(kind)[:40] if isinstance(kind, str) else type(kind).__name__
        raise _Final(f'model stream: {where}.type must be "function" or null, got {got}')
    fragment_id = _text(fragment, "id", f"{where}.")
    function = fragment.get("function")
    if function is None:
        return index, fragment_id, "", ""
    if not isinstance(function, dict):
        raise _malformed(f"{where}.function", "an object or null", function)
    name = _text(function, "name", f"{where}.function.")
    return index, fragment_id, name, _text(function, "arguments", f"{where}.function.")


def _text(container: dict[str, Any], name: str, prefix: str) -> str:
    """The string field `name` (null or absent: ""), cleaned; `prefix` + `name` is its path."""
    value = container.get(name)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise _malformed(prefix + name, "a string or null", value)
    return clean_text(value)


MAX_RESPONSE_ID_CHARS = 256
"""An id longer than this (no provider sends one) is cut: it only labels the chat span."""


def _response_id(chunk: dict[str, Any]) -> str:
    """The chunk's completion `id`, cleaned; read only when it is a string (a reply needs
    none, so a server that shapes it otherwise loses nothing)."""
    value = chunk.get("id")
    return clean_text(value[:MAX_RESPONSE_ID_CHARS]) if isinstance(value, str) else ""


def _reasoning_of(delta: dict[str, Any]) -> str:
    """`reasoning_content` (vLLM, DeepSeek) or `reasoning` (Ollama, OpenRouter), if sent.

    `reasoning` is an extension others shape differently: anything but a string is ignored.
    """
    reasoning = _text(delta, "reasoning_content", "choices[0].delta.")
    if reasoning:
        return reasoning
    value = delta.get("reasoning")
    return clean_text(value) if isinstance(value, str) else ""


def _usage_of(usage: object) -> _Usage:
    """The counts of a `usage` object, checked and clamped to `MAX_TOKEN_COUNT`."""
    if not isinstance(usage, dict):
        raise _malformed("usage", "an object or null", usage)
    input_tokens = _count(usage, "prompt_tokens", "usage.")
    output_tokens = _count(usage, "completion_tokens", "usage.")
    total_tokens = _count(usage, "total_tokens", "usage.")
    prompt_details = _details(usage, "prompt_tokens_details")
    completion_details = _details(usage, "completion_tokens_details")
    return _Usage(
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        total_tokens=total_tokens or min(input_tokens + output_tokens, MAX_TOKEN_COUNT),
        cached_input_tokens=_count(prompt_details, "cached_tokens", "usage.prompt_tokens_details."),
        reasoning_tokens=_count(
            completion_details, "reasoning_tokens", "usage.completion_tokens_details."
        ),
    )


def _details(usage: dict[str, Any], name: str) -> dict[str, Any]:
    value = usage.get(name)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _malformed(f"usage.{name}", "an object or null", value)
    return value


def _count(container: dict[str, Any], name: str, prefix: str) -> int:
    """The token count `name` (null or absent: 0), clamped to `MAX_TOKEN_COUNT`."""
    value = container.get(name)
    if value is None:
        return 0
    if type(value) is not int:  # a bool is an int to isinstance
        raise _malformed(prefix + name, "an integer or null", value)
    if value < 0:
        raise _Final(f"model stream: {prefix}{name} must not be negative")
    return min(value, MAX_TOKEN_COUNT)


def _malformed(path: str, expected: str, value: object) -> _Final:
    """A chunk field of the wrong type. Names the type only: the value may be model output."""
    return _Final(f"model stream: {path} must be {expected}, got {type(value).__name__}")


class _IdleWatchdog:
    """Fails the task with TimeoutError once `saw_data` has not been called for `seconds`.

    One timer per model call, moved on only when it fires (a line just records the time),
    rather than a timer rescheduled for every chunk as a read timeout would be.
    """

    def __init__(self, seconds: float) -> None:
        self._seconds = seconds
        self._loop = asyncio.get_running_loop()
        self._last = self._loop.time()
        self._timeout = asyncio.timeout(None)
        self._timer: asyncio.TimerHandle | None = None

    def saw_data(self) -> None:
        self._last = self._loop.time()

    def _check(self) -> None:
        due = self._last + self._seconds
        now = self._loop.time()
        if now >= due:
            self._timeout.reschedule(now)  # expired: the task is cancelled, then TimeoutError
        else:
            self._timer = self._loop.call_at(due, self._check)

    async def __aenter__(self) -> _IdleWatchdog:
        await self._timeout.__aenter__()
        self._timer = self._loop.call_later(self._seconds, self._check)
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._timer is not None:
            self._timer.cancel()
        await self._timeout.__aexit__(kind, error, traceback)


async def _lines(body: aiohttp.StreamReader) -> AsyncGenerator[str, None]:
    """The body's lines without their endings (`\\n`, `\\r\\n` or `\\r`), as reads bring them.

    One await per read of the socket rather than one per line: an SSE event is two lines.
    """
    pending = b""
    # The last read ended in `\r`: a `\n` opening the next one is the rest of that line's
    # ending (`\r\n` is one ending, not two), not an empty line.
    after_cr = False
    async for data in body.iter_any():
        if after_cr and data:
            after_cr = False
            if data.startswith(b"\n"):
                data = data[1:]
        if not data:
            continue
        lines = (pending + data).splitlines(keepends=True)
        last = lines[-1]
        if last.endswith(b"\r"):
            # Ended already: waiting to see whether `\n` follows would hold the line (and
            # the event it may end) until the next read.
            pending, after_cr = b"", True
        elif last.endswith(b"\n"):
            pending = b""
        else:  # unfinished: the next read brings the rest
            pending = lines.pop()
        for line in lines:
            yield line.rstrip(b"\r\n").decode(errors="replace")
    if pending:
        yield pending.rstrip(b"\r\n").decode(errors="replace")


async def _finish_body(body: aiohttp.StreamReader, wait_s: float) -> None:
    """Read what follows `[DONE]` (the chunked body's end, usually already here) so HTTP/1.1
    can reuse the connection. A server that keeps the body open past `wait_s`, or breaks it
    off, costs the connection (closed with the response), never the reply."""
    try:
        async with asyncio.timeout(wait_s):
            while await body.readany():
                pass
    except (TimeoutError, aiohttp.ClientError, HttpProcessingError, OSError):
        pass


async def _sse_data(
    lines: AsyncGenerator[str, None], saw_line: Callable[[], None]
) -> AsyncIterator[str]:
    """The `data` of each server-sent event, until `[DONE]`; `saw_line` hears of every line,
    keep-alive comments included (a provider thinking for long may send only those)."""
    data: list[str] = []
    async for line in lines:
        saw_line()
        if line.startswith("data:"):
            value = line[5:]
            data.append(value[1:] if value.startswith(" ") else value)
            continue
        if line or not data:  # other fields (event:, id:, comments) and stray blank lines
            continue
        event, data = "\n".join(data), []
        if event.startswith("[DONE]"):
            await lines.aclose()
            return
        yield event
    if data and not data[0].startswith("[DONE]"):
        yield "\n".join(data)


def _chunk_of(data: str) -> object:
    """One parsed chunk (its shape is `_ReplyBuilder.add`'s to check); an error object
    raises as `_in_band_failure` classifies it, text that is not JSON as a transient failure
    (what a stream cut mid-event looks like)."""
    try:
        chunk = json.loads(data)
    except (ValueError, RecursionError):  # RecursionError: nested deeper than json can parse
        message = f"the model sent a malformed stream chunk: {data[:200]!r}"
        raise _Transient(message) from None
    if isinstance(chunk, dict):
        error = chunk.get("error")
        if error:
            raise _in_band_failure(error)
    return chunk


def _is_transient(status: int | None, codes: tuple[str, ...] = ()) -> bool:
    """Whether a failure with this HTTP status, or else these error codes and types (most
    telling first), may pass on a retry. The one rule for error answers and in-band errors:
    - 408, 409, 429 and 5xx: yes; other statuses (400, 401, 403, 404, 422): no;
    - `_FINAL_ERROR_CODES` (authentication, unknown model, invalid request): no;
      `_TRANSIENT_ERROR_CODES` (rate limits, server errors, overload): yes;
    - nothing known: yes, as for a dropped connection.
    """
    if status is not None:
        return status in _TRANSIENT_STATUS or status >= 500
    for code in codes:
        if code.lower() in _FINAL_ERROR_CODES:
            return False
        if code.lower() in _TRANSIENT_ERROR_CODES:
            return True
    return True


def _in_band_failure(error: object) -> _Final | _Transient:
    """An error object sent inside a 200 stream, classified as an HTTP error answer is.

    `{"message", "type", "code"}` as OpenAI sends it; vLLM sends an HTTP status as `code`,
    Anthropic-style servers only a `type`. The failure's `error_code` is the `code`, else the
    `type`.
    """
    fields: dict[str, Any] = error if isinstance(error, dict) else {"message": error}
    code, kind = fields.get("code"), fields.get("type")
    names = tuple(
        clean_text(str(name))[:_ERROR_CODE_LIMIT]
        for name in (code, kind)
        if (isinstance(name, str) and name) or type(name) is int
    )
    status = _status_in(code)
    error_code = names[0] if names else None
    message = fields.get("message")
    text = clean_text(message)[:_ERROR_TEXT_LIMIT] if isinstance(message, str) else ""
    description = "the model stream reported an error" + (f" ({error_code})" if error_code else "")
    failure = _Transient if _is_transient(status, names) else _Final
    return failure(f"{description}: {text}" if text else description, error_code=error_code)


def _status_in(value: object) -> int | None:
    """An HTTP error status given as an in-band `code` (400-599, a number or digits)."""
    if isinstance(value, str) and value.isdigit() and len(value) == 3:
        value = int(value)
    if type(value) is int and 400 <= value <= 599:
        return value
    return None


async def _status_failure(response: aiohttp.ClientResponse) -> _Final | _Transient:
    """An HTTP error answer: transient (retried) or final, with the provider's message."""
    status = response.status
    body = await _read_up_to(response.content, _ERROR_BODY_LIMIT)
    message = f"HTTP {status}: {_error_message(body) or response.reason or 'no message'}"
    if _is_transient(status):
        return _Transient(
            message, status_code=status, retry_after_s=_retry_after_s(response.headers)
        )
    return _Final(message, status_code=status, error_code=_error_code(body))


async def _read_up_to(body: aiohttp.StreamReader, limit: int) -> bytes:
    """The body to its end or its first `limit` bytes (one `read` returns one socket read)."""
    parts: list[bytes] = []
    size = 0
    while size < limit:
        part = await body.read(limit - size)
        if not part:
            break
        parts.append(part)
        size += len(part)
    return b"".join(parts)


def _error_message(body: bytes) -> str:
    """The provider's message: `error.message` of an OpenAI-style body, else the text."""
    try:
        parsed = json.loads(body)
    except (ValueError, RecursionError):
        return clean_text(body.decode(errors="replace").strip()[:_ERROR_TEXT_LIMIT])
    error = parsed.get("error", parsed) if isinstance(parsed, dict) else parsed
    message = error.get("message") if isinstance(error, dict) else None
    if isinstance(message, str) and message:
        return clean_text(message)
    return json.dumps(parsed)[:_ERROR_TEXT_LIMIT]


def _error_code(body: bytes) -> str | None:
    """The `error.code` of an OpenAI-style error body, when it has a string one."""
    try:
        parsed = json.loads(body)
    except (ValueError, RecursionError):
        return None
    error = parsed.get("error") if isinstance(parsed, dict) else None
    code = error.get("code") if isinstance(error, dict) else None
    return clean_text(code)[:_ERROR_TEXT_LIMIT] if isinstance(code, str) and code else None


def _describe_transport_error(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__


def _retry_after_s(headers: Mapping[str, str]) -> float | None:
    milliseconds = headers.get("retry-after-ms")
    if milliseconds:
        try:
            return float(milliseconds) / 1000
        except ValueError:
            pass
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return float(value)
    except ValueError:
        pass
    try:
        moment = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if moment.tzinfo is None:  # "-0000": UTC, with no claim about the local zone (RFC 5322)
        moment = moment.replace(tzinfo=UTC)
    return max(0.0, (moment - datetime.now(UTC)).total_seconds())


def _proxy_from_environment(url: str) -> str | None:
    """The proxy `HTTP_PROXY`/`HTTPS_PROXY` name for `url`, unless `NO_PROXY` exempts it."""
    parts = urlparse(url)
    if not parts.hostname or urllib.request.proxy_bypass(parts.hostname):
        return None
    return urllib.request.getproxies().get(parts.scheme)


def _request_headers(client: openai.AsyncOpenAI) -> dict[str, str]:
    """The headers the openai client sends with a request (omitted ones left out)."""
    headers = {**client.default_headers, **client.auth_headers}
    return {name: value for name, value in headers.items() if isinstance(value, str)}


def _ms_since(started: float) -> int:
    return int((time.perf_counter() - started) * 1000)
