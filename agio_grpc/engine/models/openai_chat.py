"""The OpenAI Chat Completions adapter: `OpenAIModelDriver`, a `ModelDriver` for any
OpenAI-compatible endpoint (OpenAI, vLLM, Ollama, llama.cpp).

One model call is one streamed chat.completions request with `stream_options.include_usage`;
deltas are reported to the caller as they arrive; retries follow `retries.py`; the chunks
are read and checked by `openai_chunks.py` from the SSE lines `sse.py` reads. Here:
- transient failures (429, 408, 409, 5xx, connection errors, timeouts, an empty stream) are
  retried while nothing streamed; a cut stream, a dropped connection or a stream that ends
  without `finish_reason` after the first delta restarts the call; a stream that ends without
  `finish_reason` is never a success;
- other 4xx (400, 401, 403, 404, 422) fail at once with the provider's message, not retryable;
- the text of every failed attempt (an error answer's body, an in-band error, a transport
  error) is redacted of credentials (`redaction.py`, the configured key among them) in
  `_attempt`, before it becomes a `ModelError`, `ModelRetry` or `ModelRestart`.

The request is the one the `openai` client would send: the client resolves the endpoint,
the API key (as a bearer token), the organisation and project (`OPENAI_ORG_ID`,
`OPENAI_PROJECT_ID`) and its identifying headers, once. It goes out on aiohttp directly, and
the stream is parsed from the raw SSE lines (`json_codec`, as is the request's body
encoded), because of what the client's own path cost:
- its typed chunks ~80 µs of CPU each in pydantic model construction, about 20x the parse;
- its request path (a TypedDict transform of the body, URL and header building per request,
  httpx2 above the transport) ~0.9 ms of the event loop per call: a short call took 1.38 ms
  through it here and 0.5-0.7 ms without it;
- httpx2's read path above aiohttp, per chunk of a paced stream: 100 concurrent 100-chunk
  streams cost ~90-110 µs of CPU per chunk through the client and ~40-50 µs without it.
Transport failures are `aiohttp.ClientError`s (or `OSError`s) and are all classified alike,
as connection failures. The wait for the model is bounded by the driver's own idle watchdog
(`sse.IdleWatchdog`), not by a read timeout in the transport.
The driver yields to the event loop after each delta until its listener says the call's
first delta is out (`ModelListener`), so a burst of chunks already read cannot hold back
the first token, nor the writes ahead of it; after that, after every `DELTAS_PER_TURN`, so
the deltas of a burst reach the channel together and go out as one message (a gRPC message
costs more than a chunk's parse), and a long burst cannot starve the tasks relaying it. A
model that paces its tokens is read a chunk at a time anyway.

Only the place that builds the driver from settings (`service/app.py`) imports this module;
the engine speaks the port (`agio_grpc.engine.models`). Never imports grpc.
"""

from __future__ import annotations

import asyncio
import email.utils
import io
import logging
import time
import urllib.request
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlparse

import aiohttp
import httpx2
import openai
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.payload import TOO_LARGE_BYTES_BODY as _RAW_BODY_BYTES

from agio_grpc import json_codec
from agio_grpc.engine.models import ModelError, ModelListener, ModelReply, ModelRequest
from agio_grpc.engine.models.openai_chunks import ReplyBuilder, chunk_of, error_code, error_message
from agio_grpc.engine.models.redaction import Redactor
from agio_grpc.engine.models.retries import (
    AttemptFailure,
    FinalFailure,
    RetryPolicy,
    TransientFailure,
    complete_with_retries,
    failed_attempt,
    is_transient,
)
from agio_grpc.engine.models.sse import IdleWatchdog, body_lines, finish_body, sse_data
from agio_grpc.engine.tls import client_tls_context

log = logging.getLogger(__name__)

_ERROR_BODY_LIMIT = 64 * 1024
_BODY_END_WAIT_S = 1.0
DELTAS_PER_TURN = 32
"""The most deltas the driver reports without yielding to the event loop once its listener
lets it (module docstring): about half a millisecond of parsing here."""


def provider_name(base_url: str) -> str:
    """`openai` for api.openai.com, else `openai_compatible`."""
    host = urlparse(base_url).hostname or ""
    return "openai" if host == "api.openai.com" else "openai_compatible"


class OpenAIModelDriver:
    """`ModelDriver` for an OpenAI-compatible endpoint (every retry is ours: `retries.py`)."""

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
        self._client = openai.AsyncOpenAI(
            base_url=base_url,
            api_key=api_key,
            http_client=httpx2.AsyncClient(verify=client_tls_context()),
        )
        self._url = f"{str(self._client.base_url).rstrip('/')}/chat/completions"
        self._headers = _request_headers(self._client)
        self._proxy = _proxy_from_environment(self._url)
        self._ssl = client_tls_context()  # the certificates the openai client trusts
        # No read timeout in the transport: `IdleWatchdog` bounds every wait instead.
        self._timeout = aiohttp.ClientTimeout(total=None, connect=timeout_s, sock_connect=timeout_s)
        self._http: aiohttp.ClientSession | None = None
        self._closed = False
        self._idle_timeout_s = timeout_s
        # Well inside the watchdog, so a finished reply is never failed by it.
        self._body_end_wait_s = min(_BODY_END_WAIT_S, timeout_s / 2)
        self._redactor = Redactor(self._client.api_key)
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
        try:
            reply = await complete_with_retries(
                lambda: self._attempt(request, on_event, started), self.retry, on_event
            )
        except ModelError as error:
            log.warning("model call failed: %s", _failure_summary(error))
            raise
        reply.metrics.duration_ms = _ms_since(started)
        reply.metrics.provider = self.provider
        return reply

    async def _attempt(
        self, request: ModelRequest, on_event: ModelListener, started: float
    ) -> ModelReply:
        """One attempt; a failure leaves with its text redacted (`redaction.py`): every word
        of the provider's the engine keeps or shows passes here first."""
        try:
            return await self._stream(request, on_event, started)
        except AttemptFailure as failure:
            redacted = failure.redacted(self._redactor.redact)
        # Raised outside the handler, so the failure with the provider's raw text is not kept
        # as its `__context__` (nor is the transport error with its own).
        raise redacted

    async def _stream(
        self, request: ModelRequest, on_event: ModelListener, started: float
    ) -> ModelReply:
        reply = ReplyBuilder(model_name=request.model)
        body = json_codec.dump_bytes(self._body(request))
        # aiohttp sends a large body from a file object, in chunks (as bytes it would copy
        # it in one go, holding up the event loop, and warn).
        payload: bytes | io.BytesIO = io.BytesIO(body) if len(body) > _RAW_BODY_BYTES else body
        try:
            async with (
                IdleWatchdog(self._idle_timeout_s) as watchdog,
                self._session().post(
                    self._url, data=payload, headers=self._headers, proxy=self._proxy
                ) as response,
            ):
                if response.status >= 300:
                    raise await _status_failure(response)
                unyielded = 0  # deltas reported since the driver last yielded
                async for data in sse_data(body_lines(response.content), watchdog.saw_data):
                    delta = reply.add(chunk_of(data))
                    limit = request.max_reply_bytes
                    if limit is not None and reply.size > limit:
                        reply.cut_off(limit)
                        break  # the rest is not read: the connection closes with the response
                    if delta is not None:
                        if reply.first_token_latency_ms is None:
                            reply.first_token_latency_ms = _ms_since(started)
                        unyielded += 1
                        if not on_event(delta) or unyielded >= DELTAS_PER_TURN:
                            unyielded = 0
                            await asyncio.sleep(0)  # let the relay run (module docstring)
                if not reply.oversized:
                    await finish_body(response.content, self._body_end_wait_s)
        # An error status, an error object in the stream, a chunk that is not JSON.
        except TransientFailure as failure:
            raise failed_attempt(failure, streamed=reply.streamed) from None
        # aiohttp's own timeouts are TimeoutErrors too: its errors are classified first. A
        # malformed response surfaces as an HttpProcessingError with aiohttp's Python parser.
        except (aiohttp.ClientError, HttpProcessingError) as error:
            dropped = TransientFailure(_describe_transport_error(error))
            raise failed_attempt(dropped, streamed=reply.streamed) from None
        except TimeoutError:  # the watchdog
            message = f"the model sent nothing for {self._idle_timeout_s:g}s"
            raise failed_attempt(TransientFailure(message), streamed=reply.streamed) from None
        except OSError as error:
            dropped = TransientFailure(_describe_transport_error(error))
            raise failed_attempt(dropped, streamed=reply.streamed) from None
        if reply.finish_reason is None:
            message = "the model stream ended without a finish_reason (truncated response)"
            raise failed_attempt(TransientFailure(message), streamed=reply.streamed)
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
        if request.tool_choice is not None and request.tools:
            arguments["tool_choice"] = request.tool_choice
        if request.response_format is not None:
            arguments["response_format"] = request.response_format
        if request.temperature is not None:
            arguments["temperature"] = request.temperature
        if request.max_tokens is not None:
            # OpenAI's newer models refuse `max_tokens`; many compatible servers only know it.
            key = "max_completion_tokens" if self.provider == "openai" else "max_tokens"
            arguments[key] = request.max_tokens
        return arguments


async def _status_failure(response: aiohttp.ClientResponse) -> FinalFailure | TransientFailure:
    """An HTTP error answer: transient (retried) or final, with the provider's message."""
    status = response.status
    body = await _read_up_to(response.content, _ERROR_BODY_LIMIT)
    message = f"HTTP {status}: {error_message(body) or response.reason or 'no message'}"
    if is_transient(status):
        return TransientFailure(
            message, status_code=status, retry_after_s=retry_after_s(response.headers)
        )
    return FinalFailure(message, status_code=status, error_code=error_code(body))


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


def _failure_summary(error: ModelError) -> str:
    """A failed call as its log line tells it: the HTTP status, the provider's error code,
    whether it may pass, the retries; never the provider's message, which may quote the
    request's content (log lines carry none, docs/observability.md)."""
    parts = [] if error.status_code is None else [f"HTTP {error.status_code}"]
    if error.error_code is not None:
        parts.append(f"code {error.error_code}")
    parts.append("retryable" if error.retryable else "not retryable")
    if error.retries:
        parts.append(f"after {error.retries} {'retry' if error.retries == 1 else 'retries'}")
    return ", ".join(parts)


def _describe_transport_error(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__


def retry_after_s(headers: Mapping[str, str]) -> float | None:
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
