"""The script language of the fake model: what one chat.completions request gets back.

A `Turn` describes one reply of the fake model — text, reasoning, tool calls,
usage, finish reason — and the faults to inject while serving it (an HTTP
error, a cut connection, a missing finish_reason, delays, a hang). Turns are
plain frozen values: building one does no I/O, and one turn can be enqueued
many times. Nothing here knows about HTTP or SSE; `sse.py` and `completion.py`
turn a `Turn` into bytes.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal, TypedDict, Unpack

FinishReason = Literal["stop", "length", "content_filter", "tool_calls"]
"""The finish reasons an OpenAI-compatible model reports."""

_WORD = re.compile(r"\s*\S+")

# Short, distinct words so a benchmark stream of n tokens is n small chunks.
_TOKEN_WORDS = ("lorem", "ipsum", "dolor", "sit", "amet", "tempor", "magna", "aliqua")


def split_words(text: str) -> tuple[str, ...]:
    """Split `text` into one piece per word, each piece keeping the whitespace before it.

    The pieces concatenate back to `text` exactly: `"a b "` gives `("a", " b ")`.
    """
    pieces = _WORD.findall(text)
    if not pieces:
        return (text,) if text else ()
    rest = text[sum(len(piece) for piece in pieces) :]
    if rest:
        pieces[-1] += rest
    return tuple(pieces)


def split_even(text: str, count: int) -> tuple[str, ...]:
    """Split `text` into `count` roughly equal pieces (fewer if `text` is shorter).

    The pieces concatenate back to `text` exactly; empty text gives no pieces.
    """
    if not text:
        return ()
    count = max(1, min(count, len(text)))
    size, extra = divmod(len(text), count)
    pieces: list[str] = []
    start = 0
    for i in range(count):
        end = start + size + (1 if i < extra else 0)
        pieces.append(text[start:end])
        start = end
    return tuple(pieces)


def new_tool_call_id() -> str:
    """A fresh tool call id shaped like OpenAI's (`call_` + 24 hex digits)."""
    return "call_" + uuid.uuid4().hex[:24]


@dataclass(frozen=True)
class ToolCallSpec:
    """One tool call the fake model makes."""

    name: str
    """The function name, e.g. `"add"`."""
    arguments: str = "{}"
    """The arguments as JSON text, streamed in fragments. Not validated: malformed
    JSON is a legitimate script, for testing how the caller copes with it."""
    id: str | None = None
    """The tool call id; `None` gives a fresh `call_...` id on every request."""


@dataclass(frozen=True)
class UsageSpec:
    """Token counts to report instead of the fake model's rough estimates.

    Any field left `None` keeps its default: prompt tokens = words in the
    request's messages, completion tokens = streamed output chunks, reasoning
    tokens = reasoning chunks.
    """

    prompt_tokens: int | None = None
    """Reported as `usage.prompt_tokens`."""
    completion_tokens: int | None = None
    """Reported as `usage.completion_tokens`."""
    cached_tokens: int = 0
    """Reported as `usage.prompt_tokens_details.cached_tokens`."""
    reasoning_tokens: int | None = None
    """Reported as `usage.completion_tokens_details.reasoning_tokens`."""


class TurnOptions(TypedDict, total=False):
    """Keyword options shared by the `Turn` constructors; see the `Turn` fields."""

    finish_reason: FinishReason
    usage: UsageSpec
    cut_after: int
    omit_finish_reason: bool
    first_token_delay: float
    chunk_delay: float


@dataclass(frozen=True)
class Turn:
    """One scripted reply: served to exactly one chat.completions request.

    Prefer the constructors (`Turn.text`, `Turn.json`, `Turn.words`, `Turn.tokens`,
    `Turn.tool_calls`, `Turn.refusing`, `Turn.error`, `Turn.raw`, `Turn.hanging`);
    `dataclasses.replace` tweaks one field of a built turn.
    A streamed reply is: a role chunk, the reasoning pieces, the content
    pieces, the tool call fragments, a chunk with the finish reason, the usage
    chunk (when the request asks for it), then `[DONE]`.
    """

    content: tuple[str, ...] = ()
    """Content pieces, one chunk each; their concatenation is the reply text."""
    reasoning: tuple[str, ...] = ()
    """`reasoning_content` pieces (as vLLM and DeepSeek send), streamed before the content."""
    calls: tuple[ToolCallSpec, ...] = ()
    """Tool calls, streamed after the content with indexes 0, 1, ..."""
    chunks_per_call: int = 1
    """How many fragments each tool call's arguments are split into."""
    finish_reason: FinishReason | None = None
    """`None` picks `"tool_calls"` when there are tool calls, else `"stop"`."""
    usage: UsageSpec = field(default_factory=UsageSpec)
    """Token counts to report; unset fields are estimated."""
    http_status: int = 200
    """Anything but 200 answers with an OpenAI-style JSON error of this status."""
    retry_after: float | None = None
    """Sent as the `Retry-After` header (seconds) with an error status. The openai
    client ignores 0 and backs off on its own (~0.5 s); 0.01 makes a fast retry."""
    error_message: str | None = None
    """The error's `message`; `None` gives a stock message for the status."""
    cut_after: int | None = None
    """Stream this many SSE events (the role chunk counts), then close the
    connection with no finish_reason and no `[DONE]`. For a non-streaming
    request, close the connection without answering."""
    omit_finish_reason: bool = False
    """Send everything including `[DONE]`, but no finish_reason anywhere."""
    first_token_delay: float = 0.0
    """Seconds to wait after the role chunk, before the first output chunk."""
    chunk_delay: float = 0.0
    """Seconds to wait before each later output chunk (0.1 is 10 chunks/s)."""
    hang: bool = False
    """Never answer: hold the request until the client leaves or the server stops."""
    refusal: str = ""
    """A refusal (`delta.refusal`, as OpenAI sends when it declines a structured answer),
    streamed after the content."""
    raw_data: tuple[str, ...] = ()
    """When set, a streamed answer is these SSE `data` payloads, one event each, written
    verbatim (`data: {payload}\\n\\n`), then `[DONE]`: nothing of the scripted reply, no
    role chunk, no usage chunk. For chunks no well-behaved model sends (wrong types, an
    in-band `{"error": ...}`). `cut_after` still applies; a non-streamed request gets an
    empty reply."""

    @classmethod
    def text(
        cls,
        text: str,
        *,
        chunks: int = 1,
        reasoning: str = "",
        **options: Unpack[TurnOptions],
    ) -> Turn:
        """A text reply split into `chunks` roughly equal content chunks.

        `reasoning` is streamed word by word as `reasoning_content` first.
        """
        return cls(
            content=split_even(text, chunks),
            reasoning=split_words(reasoning),
            **options,
        )

    @classmethod
    def json(cls, value: object, *, chunks: int = 3, **options: Unpack[TurnOptions]) -> Turn:
        """A text reply that is `value` as JSON text (a structured answer; for an invalid
        one, pass text to `Turn.text`), split into `chunks` content chunks."""
        return cls(content=split_even(json.dumps(value), chunks), **options)

    @classmethod
    def refusing(cls, refusal: str, **options: Unpack[TurnOptions]) -> Turn:
        """A reply declining to answer: no content, `refusal` streamed as `delta.refusal`."""
        return cls(refusal=refusal, **options)

    @classmethod
    def words(cls, text: str, *, reasoning: str = "", **options: Unpack[TurnOptions]) -> Turn:
        """A text reply streamed one word per chunk."""
        return cls(content=split_words(text), reasoning=split_words(reasoning), **options)

    @classmethod
    def tokens(cls, n: int, **options: Unpack[TurnOptions]) -> Turn:
        """A reply of `n` chunks of one short word each, for benchmarks."""
        pieces = (
            (" " if i else "") + _TOKEN_WORDS[i % len(_TOKEN_WORDS)] for i in range(max(0, n))
        )
        return cls(content=tuple(pieces), **options)

    @classmethod
    def tool_calls(
        cls,
        calls: Iterable[ToolCallSpec],
        *,
        chunks_per_call: int = 1,
        content: str = "",
        reasoning: str = "",
        **options: Unpack[TurnOptions],
    ) -> Turn:
        """Tool calls (indexes 0, 1, ...), each call's arguments split into
        `chunks_per_call` fragments; optional `content` text is streamed first.
        """
        return cls(
            content=split_words(content),
            reasoning=split_words(reasoning),
            calls=tuple(calls),
            chunks_per_call=chunks_per_call,
            **options,
        )

    @classmethod
    def error(
        cls,
        status: int,
        *,
        retry_after: float | None = None,
        message: str | None = None,
    ) -> Turn:
        """An HTTP error answer, e.g. `Turn.error(429, retry_after=1)` or `Turn.error(500)`."""
        return cls(http_status=status, retry_after=retry_after, error_message=message)

    @classmethod
    def raw(cls, *data: str) -> Turn:
        """A stream of exactly these `data` payloads (usually JSON text), then `[DONE]`.

        `Turn.raw('{"choices": "oops"}')`, or an error inside a 200 stream:
        `Turn.raw(json.dumps({"error": {"message": "slow down", "code": "rate_limit_exceeded"}}))`.
        """
        return cls(raw_data=data)

    @classmethod
    def hanging(cls) -> Turn:
        """A request that is never answered (until the client leaves or the server stops)."""
        return cls(hang=True)

    def resolved_finish_reason(self) -> FinishReason:
        """The finish reason to report: the override, else from the content."""
        if self.finish_reason is not None:
            return self.finish_reason
        return "tool_calls" if self.calls else "stop"
