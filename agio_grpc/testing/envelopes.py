"""The enveloped framing of Connect streams and gRPC-Web: what a client of the HTTP listener
writes and reads (tests and benchmarks speak it over a plain HTTP client).

Each message is one flags byte, a four-byte big-endian length and the payload. Connect ends a
stream with an envelope flagged END_STREAM (a JSON EndStreamResponse), gRPC-Web with one
flagged TRAILERS (the status as `key: value` lines). Never imports the service layer.
"""

from __future__ import annotations

import struct
from collections.abc import AsyncIterable, AsyncIterator

END_STREAM = 0x02
"""Connect: the flag of the envelope that ends a stream."""
TRAILERS = 0x80
"""gRPC-Web: the flag of the envelope that holds the trailers."""
_HEADER = struct.Struct(">BI")


def envelope(payload: bytes, flags: int = 0) -> bytes:
    return _HEADER.pack(flags, len(payload)) + payload


def envelopes(data: bytes) -> list[tuple[int, bytes]]:
    """Every (flags, payload) of a whole enveloped body; ValueError when the body ends
    inside an envelope."""
    found = []
    at = 0
    while at < len(data):
        if len(data) - at < _HEADER.size:
            raise ValueError("the body ends inside an envelope's header")
        flags, size = _HEADER.unpack_from(data, at)
        if len(data) - at - _HEADER.size < size:
            raise ValueError("the body ends inside an envelope")
        found.append((flags, data[at + _HEADER.size : at + _HEADER.size + size]))
        at += _HEADER.size + size
    return found


async def read_envelopes(chunks: AsyncIterable[bytes]) -> AsyncIterator[tuple[int, bytes]]:
    """The envelopes of a streamed body, each as soon as it is whole."""
    buffer = b""
    async for chunk in chunks:
        buffer += chunk
        while len(buffer) >= _HEADER.size:
            flags, size = _HEADER.unpack_from(buffer)
            if len(buffer) < _HEADER.size + size:
                break
            yield flags, buffer[_HEADER.size : _HEADER.size + size]
            buffer = buffer[_HEADER.size + size :]
