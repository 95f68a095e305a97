"""Reading a server-sent-event stream from an aiohttp response body, and the idle watchdog
that bounds each wait for it.

The wait for the model is bounded by `IdleWatchdog`, not by a read timeout in the transport:
one timer per call, re-armed only when it fires, instead of one per chunk; and it also ends
a stream the transport stopped delivering without an error (aiohttp stalls on a garbled
chunk header after valid data).

Knows nothing of what the events carry but the `[DONE]` that ends an OpenAI-style stream;
never imports an adapter.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from types import TracebackType

import aiohttp
from aiohttp.http_exceptions import HttpProcessingError


class IdleWatchdog:
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

    async def __aenter__(self) -> IdleWatchdog:
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


async def body_lines(body: aiohttp.StreamReader) -> AsyncGenerator[str, None]:
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


async def finish_body(body: aiohttp.StreamReader, wait_s: float) -> None:
    """Read what follows `[DONE]` (the chunked body's end, usually already here) so HTTP/1.1
    can reuse the connection. A server that keeps the body open past `wait_s`, or breaks it
    off, costs the connection (closed with the response), never the reply."""
    try:
        async with asyncio.timeout(wait_s):
            while await body.readany():
                pass
    except (TimeoutError, aiohttp.ClientError, HttpProcessingError, OSError):
        pass


async def sse_data(
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
