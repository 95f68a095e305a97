"""The model port: what the engine asks of a model, and the words it is answered in.

`ModelDriver` is the protocol the loop depends on: one call streams one `ModelReply` for a
`ModelRequest`, reporting `ModelEvent`s (deltas, retries, restarts) as they happen, or raises
`ModelError`. Every adapter speaks these types and raises only `ModelError`; its retries
follow `retries.py` (the policy, the kinds of a failed attempt, the retry loop), and the
provider's text it puts in a `ModelError`, `ModelRetry` or `ModelRestart` is first redacted
of credentials by `redaction.py`, so nothing past the adapter holds one.

The adapters live beside this module, one per provider API: `openai_chat.py` for any
OpenAI-compatible Chat Completions endpoint. A second provider is a new module here, and
only the place that builds the driver from settings (`service/app.py`) names an adapter.

This module never imports an adapter, a transport (aiohttp, openai) or grpc, and knows
nothing of steps, the store or the event channel.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from agio_grpc.domain import StepMetrics, StopReason, ToolCall
from agio_grpc.engine.events import ToolCallDelta

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
    response_format: dict[str, Any] | None = None
    """The OpenAI `response_format` (a run with an output schema, engine/output.py)."""
    tool_choice: str | None = None
    """The OpenAI `tool_choice` (`required` in the output schema's tool mode); None: auto."""
    output_type: Literal["text", "json"] = "text"
    """What the reply is asked to be: `json` for a run with an output schema."""


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
    refusal: str = ""
    """The model's refusal to answer (`delta.refusal`, sent instead of content)."""

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
ModelListener = Callable[[ModelEvent], bool | None]
"""Told of each event of a model call as it comes. Its answer to a delta: True once the
call's first delta is out to whoever follows the run (its reader came back for more), so
the driver may report the deltas it has already read without yielding to the event loop
after each, and they go out merged; False or None: yield after each, so the next one goes
out as soon as it can (engine/models/openai_chat.py)."""


class ModelError(Exception):
    """The model call failed for good; `retryable` says whether trying later may work.

    `message` may quote the provider, its credentials redacted (`redaction.py`);
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


class ModelDriver(Protocol):
    """What the loop needs from a model."""

    async def complete(self, request: ModelRequest, on_event: ModelListener) -> ModelReply:
        """Stream one reply, reporting events; raise ModelError when it cannot be had."""
        ...

    async def close(self) -> None:
        """Release connections."""
        ...
