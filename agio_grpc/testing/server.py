"""`FakeModelServer`: a scriptable OpenAI-compatible model on real HTTP.

Serves `POST /v1/chat/completions` (SSE or JSON) and `GET /v1/models` on
127.0.0.1 with asyncio streams, so the real `openai` client (httpx, pooled
keep-alive connections) talks to it exactly as to a hosted model. Each chat
request is answered by the next queued `Turn`, or by the default responder
when the queue is empty. This module routes requests and plays turns back
onto the socket; what a turn looks like on the wire is `sse.py`'s and
`payloads.py`'s business.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import deque
from collections.abc import Sequence
from types import TracebackType
from typing import Any, Self

from agio_grpc.testing import payloads
from agio_grpc.testing.chat_request import DEFAULT_MODEL, estimate_prompt_tokens, wants_stream
from agio_grpc.testing.http11 import (
    LAST_CHUNK,
    HttpError,
    Request,
    chunk,
    event_stream_head,
    json_response,
    read_request,
)
from agio_grpc.testing.responders import Responder, default_responder
from agio_grpc.testing.script import Turn
from agio_grpc.testing.sse import stream_events

logger = logging.getLogger(__name__)

CHAT_COMPLETIONS_PATH = "/v1/chat/completions"
MODELS_PATH = "/v1/models"

# Benchmarks open ~1,000 connections at once; the default backlog of 100
# would make the kernel drop SYNs and the client wait a second to retry.
_LISTEN_BACKLOG = 4096
_READ_LIMIT = 1024 * 1024


class FakeModelServer:
    """An OpenAI-compatible chat model, scripted turn by turn, served over HTTP.

    ```python
    async with FakeModelServer() as server:
        server.enqueue(Turn.error(429, retry_after=0), Turn.text("ok"))
        client = openai.AsyncOpenAI(base_url=server.base_url, api_key="test")
        ...
        assert server.requests[-1]["messages"][-1]["content"] == "hi"
    ```
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        default: Responder = default_responder,
        models: Sequence[str] = (DEFAULT_MODEL,),
        context_window: int | None = None,
        refusal_states_window: bool = True,
    ) -> None:
        """Configure the server; nothing listens until `start`.

        `port=0` picks a free port. `default` answers requests when no turn is
        queued. `models` are the ids `GET /v1/models` lists (any model name is
        accepted in requests, and echoed back). With `context_window`, a request whose
        prompt is estimated (`estimate_prompt_tokens`: its words) over it is refused as
        OpenAI refuses one: HTTP 400 with code `context_length_exceeded` and a message
        stating the window, consuming no queued turn; with `refusal_states_window` False, as
        a server that states no window refuses one (an HTTP 400 saying only that the
        request exceeds the available context size).
        """
        self.requests: list[dict[str, Any]] = []
        """Every chat.completions request body received (parsed JSON), in arrival order."""
        self.request_headers: list[dict[str, str]] = []
        """The headers of each request in `requests` (names lower-cased), in the same order."""
        self._host = host
        self._port = port
        self._default = default
        self._models = list(models)
        self.context_window = context_window
        """The prompt size over which requests are refused (None: no limit); settable."""
        self.refusal_states_window = refusal_states_window
        """Whether a refusal's message states `context_window`; settable."""
        self.hold: asyncio.Event | None = None
        """While an unset event: each chat.completions request waits for it to be set
        before it takes a turn; a client that leaves meanwhile takes none. For races whose
        first model call must wait for the other side, without a timed delay; settable."""
        self._turns: deque[Turn] = deque()
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self._request_arrived = asyncio.Event()

    async def start(self) -> None:
        """Start listening; afterwards `port` and `base_url` are known."""
        if self._server is not None:
            raise RuntimeError("FakeModelServer is already started")
        self._server = await asyncio.start_server(
            self._serve_connection,
            self._host,
            self._port,
            backlog=_LISTEN_BACKLOG,
            limit=_READ_LIMIT,
        )
        self._port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        """Stop listening and drop every open connection, hanging requests included."""
        server, self._server = self._server, None
        if server is None:
            return
        server.close()
        connections = list(self._connections)
        for task in connections:
            task.cancel()
        await asyncio.gather(*connections, return_exceptions=True)
        await server.wait_closed()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.stop()

    @property
    def host(self) -> str:
        """The address the server listens on."""
        return self._host

    @property
    def port(self) -> int:
        """The port the server listens on (the chosen one when started with port 0)."""
        if self._server is None:
            raise RuntimeError("FakeModelServer is not started")
        return self._port

    @property
    def base_url(self) -> str:
        """The URL to give an OpenAI client, e.g. `http://127.0.0.1:8089/v1`."""
        return f"http://{self._host}:{self.port}/v1"

    @property
    def pending(self) -> int:
        """How many enqueued turns are still waiting for a request."""
        return len(self._turns)

    def enqueue(self, *turns: Turn) -> None:
        """Queue turns; each chat.completions request consumes the oldest one.

        An HTTP-error turn is consumed too, so `enqueue(Turn.error(429),
        Turn.text("ok"))` answers a 429 and then, on the retry, "ok".
        """
        self._turns.extend(turns)

    async def wait_for_requests(self, count: int) -> None:
        """Return once at least `count` chat.completions requests have arrived.

        For tests that must act while a request is in flight (for example
        cancel during a `Turn.hanging()`), instead of sleeping.
        """
        while len(self.requests) < count:
            await self._request_arrived.wait()

    def _record(self, body: dict[str, Any], headers: dict[str, str]) -> None:
        self.requests.append(body)
        self.request_headers.append(headers)
        # Wake every waiter with the current event and arm a fresh one.
        self._request_arrived.set()
        self._request_arrived = asyncio.Event()

    def _next_turn(self, body: dict[str, Any]) -> Turn:
        return self._turns.popleft() if self._turns else self._default(body)

    async def _serve_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        """Answer requests on one connection until either side closes it."""
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        try:
            keep_alive = True
            while keep_alive:
                try:
                    request = await read_request(reader)
                except HttpError as exc:
                    body = payloads.error(exc.status, exc.message)
                    writer.write(json_response(exc.status, body, keep_alive=False))
                    await writer.drain()
                    return
                if request is None:
                    return
                keep_alive = await self._answer(request, reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the client went away; nothing to answer
        except asyncio.CancelledError:
            # `stop` cancels connection tasks. Nothing awaits them, and asyncio
            # logs a cancelled connection task as an error, so end it quietly.
            pass
        except Exception:
            logger.exception("fake model: unexpected error while serving a connection")
        finally:
            self._connections.discard(task)
            writer.close()

    async def _answer(
        self, request: Request, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        """Answer one request; return whether the connection may serve another."""
        if request.path == CHAT_COMPLETIONS_PATH and request.method == "POST":
            return await self._answer_chat(request, reader, writer)
        if request.path == MODELS_PATH and request.method == "GET":
            answer = payloads.model_list(self._models)
            writer.write(json_response(200, answer, keep_alive=request.keep_alive))
        else:
            message = f"Unknown request URL: {request.method} {request.path}."
            answer = payloads.error(404, message)
            writer.write(json_response(404, answer, keep_alive=request.keep_alive))
        await writer.drain()
        return request.keep_alive

    async def _answer_chat(
        self, request: Request, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        try:
            body = json.loads(request.body)
        except ValueError:
            body = None
        if not isinstance(body, dict):
            answer = payloads.error(400, "The request body must be a JSON object.")
            writer.write(json_response(400, answer, keep_alive=request.keep_alive))
            await writer.drain()
            return request.keep_alive

        self._record(body, request.headers)
        if self.context_window is not None:
            prompt = estimate_prompt_tokens(body)
            if prompt > self.context_window:
                answer = (
                    payloads.context_length_exceeded(self.context_window, prompt)
                    if self.refusal_states_window
                    else payloads.context_size_exceeded()
                )
                writer.write(json_response(400, answer, keep_alive=request.keep_alive))
                await writer.drain()
                return request.keep_alive
        if self.hold is not None and not await _held(self.hold, reader):
            return False
        turn = self._next_turn(body)
        if turn.hang:
            await _wait_for_disconnect(reader)
            return False
        if turn.http_status != 200:
            return await _send_error(turn, request.keep_alive, writer)
        if wants_stream(body):
            return await _send_stream(turn, body, request.keep_alive, writer)
        return await _send_completion(turn, body, request.keep_alive, writer)


async def _held(hold: asyncio.Event, reader: asyncio.StreamReader) -> bool:
    """Wait for `hold` to be set (True) or the client to leave first (False)."""
    released = asyncio.ensure_future(hold.wait())
    left = asyncio.ensure_future(_wait_for_disconnect(reader))
    try:
        await asyncio.wait((released, left), return_when=asyncio.FIRST_COMPLETED)
    finally:
        released.cancel()
        left.cancel()
    return hold.is_set() and not left.done()


async def _wait_for_disconnect(reader: asyncio.StreamReader) -> None:
    """Hold the connection, reading and discarding, until the client closes it."""
    while await reader.read(65536):
        pass


async def _send_error(turn: Turn, keep_alive: bool, writer: asyncio.StreamWriter) -> bool:
    headers: dict[str, str] = {}
    if turn.retry_after is not None:
        headers["Retry-After"] = f"{turn.retry_after:g}"
    answer = payloads.error(turn.http_status, turn.error_message)
    writer.write(json_response(turn.http_status, answer, keep_alive=keep_alive, headers=headers))
    await writer.drain()
    return keep_alive


async def _send_completion(
    turn: Turn, body: dict[str, Any], keep_alive: bool, writer: asyncio.StreamWriter
) -> bool:
    if turn.cut_after is not None:
        return False  # close without a response
    # A non-streamed answer arrives when the whole (paced) generation would have ended.
    generation_time = sum(event.delay for event in stream_events(turn, body))
    if generation_time > 0:
        await asyncio.sleep(generation_time)
    writer.write(json_response(200, payloads.chat_completion(turn, body), keep_alive=keep_alive))
    await writer.drain()
    return keep_alive


async def _send_stream(
    turn: Turn, body: dict[str, Any], keep_alive: bool, writer: asyncio.StreamWriter
) -> bool:
    """Stream the turn's events; `cut_after` ends it early by closing the connection."""
    events = stream_events(turn, body)
    cut = turn.cut_after is not None and turn.cut_after < len(events)
    if cut:
        events = events[: turn.cut_after]
    # Each event is due at a fixed offset from the start, so pacing does not
    # drift under load; events already due go out together in one write (a
    # thousand unpaced streams cost one send each, not one per chunk).
    loop = asyncio.get_running_loop()
    due = loop.time()
    batch = [event_stream_head(keep_alive=keep_alive)]
    for event in events:
        due += event.delay
        wait = due - loop.time()
        if wait > 0:
            writer.write(b"".join(batch))
            await writer.drain()
            batch.clear()
            await asyncio.sleep(wait)
        batch.append(chunk(event.data))
    if not cut:
        batch.append(LAST_CHUNK)
    writer.write(b"".join(batch))
    await writer.drain()
    # After a cut the body stops mid-stream (no finish_reason, no [DONE], no
    # last chunk) and the connection is closed.
    return keep_alive and not cut
