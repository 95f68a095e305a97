"""Turn a `Turn` into the server-sent events of a streamed chat.completions answer.

The events are byte-for-byte what OpenAI sends: `data: {chunk}\\n\\n` lines of
`chat.completion.chunk` objects, then `data: [DONE]`. All of them are built
up front, before the first byte is written, so serving a stream is just
writes and (scripted) sleeps. Chunks share one JSON prefix per answer and
only the small delta is serialised per chunk: a benchmark streams a thousand
answers at once through this code.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from agio_grpc.testing.chat_request import requested_model, wants_usage_chunk
from agio_grpc.testing.payloads import argument_fragments, new_completion_id, usage
from agio_grpc.testing.script import FinishReason, Turn, new_tool_call_id

DONE = b"data: [DONE]\n\n"
"""The event that ends every complete stream."""

_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode
# A JSON string literal without the encoder's per-call overhead: most chunks are one word.
_quote = json.encoder.encode_basestring


@dataclass(frozen=True, slots=True)
class StreamEvent:
    """One SSE event to write, after waiting `delay` seconds."""

    delay: float
    data: bytes


class ChunkEncoder:
    """Encodes the chunks of one streamed answer (same id, created and model)."""

    def __init__(self, model: str) -> None:
        self._prefix = (
            f'data: {{"id":{_dumps(new_completion_id())},"object":"chat.completion.chunk",'
            f'"created":{int(time.time())},"model":{_dumps(model)},"choices":['
        )

    def delta(self, delta_json: str) -> bytes:
        """A chunk carrying the delta object `delta_json`, with `finish_reason: null`."""
        return self._choice(delta_json, "null")

    def finish(self, reason: FinishReason) -> bytes:
        """The last choice chunk: an empty delta and the finish reason."""
        return self._choice("{}", _dumps(reason))

    def usage(self, usage: dict[str, Any]) -> bytes:
        """The usage chunk sent after the choices when `include_usage` is on."""
        return f'{self._prefix}],"usage":{_dumps(usage)}}}\n\n'.encode()

    def _choice(self, delta_json: str, finish_json: str) -> bytes:
        return (
            f'{self._prefix}{{"index":0,"delta":{delta_json},"logprobs":null,'
            f'"finish_reason":{finish_json}}}],"usage":null}}\n\n'
        ).encode()


def output_deltas(turn: Turn) -> Iterator[str]:
    """The deltas (as JSON text) that carry generated output: reasoning, content, then
    tool call fragments.

    A tool call opens with a fragment holding its index, id, type and name
    (arguments `""`), then fragments holding only its index and a piece of the
    arguments.
    """
    for piece in turn.reasoning:
        yield f'{{"reasoning_content":{_quote(piece)}}}'
    for piece in turn.content:
        yield f'{{"content":{_quote(piece)}}}'
    if turn.refusal:
        yield f'{{"refusal":{_quote(turn.refusal)}}}'
    for index, call in enumerate(turn.calls):
        opening = {
            "index": index,
            "id": call.id or new_tool_call_id(),
            "type": "function",
            "function": {"name": call.name, "arguments": ""},
        }
        yield _dumps({"tool_calls": [opening]})
        fragment_prefix = f'{{"tool_calls":[{{"index":{index},"function":{{"arguments":'
        for piece in argument_fragments(turn, call.arguments):
            yield f"{fragment_prefix}{_quote(piece)}}}}}]}}"


def stream_events(turn: Turn, body: dict[str, Any]) -> list[StreamEvent]:
    """Every event of the streamed answer to `body` scripted by `turn`, with its delay.

    Honours `omit_finish_reason`, `raw_data` and the pacing delays; `cut_after`
    and the HTTP faults are the server's business.
    """
    if turn.raw_data:
        raw = [StreamEvent(0.0, f"data: {data}\n\n".encode()) for data in turn.raw_data]
        return [*raw, StreamEvent(0.0, DONE)]
    encoder = ChunkEncoder(requested_model(body))
    events = [StreamEvent(0.0, encoder.delta('{"role":"assistant","content":""}'))]
    for i, delta in enumerate(output_deltas(turn)):
        delay = turn.first_token_delay if i == 0 else turn.chunk_delay
        events.append(StreamEvent(delay, encoder.delta(delta)))
    if not turn.omit_finish_reason:
        events.append(StreamEvent(0.0, encoder.finish(turn.resolved_finish_reason())))
    if wants_usage_chunk(body):
        events.append(StreamEvent(0.0, encoder.usage(usage(turn, body))))
    events.append(StreamEvent(0.0, DONE))
    return events
