"""Just enough HTTP/1.1 for the fake model: read requests, frame responses.

Requests: a request line, headers, and a `Content-Length` body (what httpx
and every OpenAI client send); keep-alive unless the client says
`Connection: close` or speaks HTTP/1.0. Responses: a JSON document with a
`Content-Length`, or a `Transfer-Encoding: chunked` event stream so the
connection can be reused after it. This module parses and formats bytes; it
never decides what to answer.
"""

from __future__ import annotations

import asyncio
import http
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

MAX_BODY_BYTES = 64 * 1024 * 1024
"""Bodies larger than this are refused with 413 (a runaway client, not a test)."""

LAST_CHUNK = b"0\r\n\r\n"
"""Ends a chunked response body."""


class HttpError(Exception):
    """A request that cannot be parsed; answered with `status` and the connection closed."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True, slots=True)
class Request:
    """One parsed HTTP request."""

    method: str
    path: str
    """The target without its query string, e.g. `/v1/chat/completions`."""
    headers: dict[str, str]
    """Header names lower-cased; a repeated header keeps its last value."""
    body: bytes
    keep_alive: bool
    """Whether the connection stays open after the response."""


async def read_request(reader: asyncio.StreamReader) -> Request | None:
    """Read the next request, or `None` when the client closed the connection between requests.

    Raises `HttpError` for a malformed or unsupported request, and
    `asyncio.IncompleteReadError` when the client leaves mid-request.
    """
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as exc:
        if not exc.partial.strip():
            return None
        raise
    except asyncio.LimitOverrunError as exc:
        raise HttpError(431, "request headers too large") from exc
    request_line, *header_lines = head.decode("latin-1").split("\r\n")
    method, path, version = _parse_request_line(request_line)
    headers = _parse_headers(header_lines)
    if "chunked" in headers.get("transfer-encoding", "").lower():
        raise HttpError(411, "chunked request bodies are not supported; send Content-Length")
    body = await reader.readexactly(_content_length(headers))
    connection = headers.get("connection", "").lower()
    keep_alive = connection != "close" if version == "HTTP/1.1" else connection == "keep-alive"
    return Request(method, path, headers, body, keep_alive)


def _parse_request_line(line: str) -> tuple[str, str, str]:
    parts = line.split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise HttpError(400, f"malformed request line: {line[:100]!r}")
    method, target, version = parts
    return method.upper(), target.split("?", 1)[0], version


def _parse_headers(lines: list[str]) -> dict[str, str]:
    headers: dict[str, str] = {}
    for line in lines:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep:
            raise HttpError(400, f"malformed header line: {line[:100]!r}")
        headers[name.strip().lower()] = value.strip()
    return headers


def _content_length(headers: Mapping[str, str]) -> int:
    raw = headers.get("content-length", "0")
    try:
        length = int(raw)
    except ValueError:
        raise HttpError(400, f"bad Content-Length: {raw[:40]!r}") from None
    if length < 0:
        raise HttpError(400, f"bad Content-Length: {raw[:40]!r}")
    if length > MAX_BODY_BYTES:
        raise HttpError(413, "request body too large")
    return length


def _status_line(status: int) -> str:
    try:
        phrase = http.HTTPStatus(status).phrase
    except ValueError:
        phrase = "Status"
    return f"HTTP/1.1 {status} {phrase}\r\n"


def _connection_header(keep_alive: bool) -> str:
    return "Connection: keep-alive\r\n" if keep_alive else "Connection: close\r\n"


def json_response(
    status: int,
    payload: Any,
    *,
    keep_alive: bool,
    headers: Mapping[str, str] | None = None,
) -> bytes:
    """A complete response carrying `payload` as JSON."""
    body = json.dumps(payload, separators=(",", ":")).encode()
    extra = "".join(f"{name}: {value}\r\n" for name, value in (headers or {}).items())
    head = (
        _status_line(status)
        + "Content-Type: application/json\r\n"
        + f"Content-Length: {len(body)}\r\n"
        + _connection_header(keep_alive)
        + extra
        + "\r\n"
    )
    return head.encode() + body


def event_stream_head(*, keep_alive: bool) -> bytes:
    """The head of a 200 `text/event-stream` response with a chunked body."""
    return (
        _status_line(200)
        + "Content-Type: text/event-stream; charset=utf-8\r\n"
        + "Cache-Control: no-cache\r\n"
        + "Transfer-Encoding: chunked\r\n"
        + _connection_header(keep_alive)
        + "\r\n"
    ).encode()


def chunk(data: bytes) -> bytes:
    """`data` framed as one chunk of a chunked body."""
    return b"%x\r\n%b\r\n" % (len(data), data)
