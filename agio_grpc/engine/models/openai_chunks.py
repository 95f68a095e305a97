"""What an OpenAI-compatible Chat Completions server sends, read and checked: the stream's
chunks joined into a `ModelReply` (`ReplyBuilder`), and its error objects (in band, or as an
error answer's body).

- Deltas are joined per call; tool call fragments are joined by index (a fragment with a new
  id at a used index starts a new call, as Ollama sends them); `reasoning_content` (vLLM,
  DeepSeek) or `reasoning` (Ollama, OpenRouter) is kept.
- A chunk that is JSON but not the Chat Completions chunk shape fails at once, not
  retryable, naming the field (`model stream: choices[0].delta must be an object or null,
  got str`): a server that sends it once will send it again. Text that is not JSON at all is
  what a cut stream looks like, and is a transient failure.
- An error object sent inside a 200 stream (`data: {"error": {...}}`) is classified as its
  HTTP status would be (`is_transient`, one rule for both): authentication, unknown model
  and invalid request fail at once, rate limits and server errors are retried.
- Nothing the model sends can fail a later write: text (content, reasoning, tool call ids,
  names and arguments, the model name, error messages) is cleaned with `clean_text` (U+0000
  and lone surrogates become U+FFFD), and token counts are clamped to `MAX_TOKEN_COUNT`.

Chunks are parsed into plain data (msgspec through `json_codec.loads`: 1.2 µs for a content
chunk against the stdlib's 5.4) and only the fields a reply is made of are checked: the openai
client's typed chunks cost ~80 µs of CPU each in pydantic model construction, about 20x the
stdlib's parse. Never touches the transport.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any

from agio_grpc import json_codec
from agio_grpc.domain import StepMetrics, ToolCall, clean_text
from agio_grpc.engine.events import ToolCallDelta
from agio_grpc.engine.models import MAX_TOKEN_COUNT, ModelDelta, ModelReply
from agio_grpc.engine.models.retries import FinalFailure, TransientFailure, is_transient

_ERROR_TEXT_LIMIT = 500
_ERROR_CODE_LIMIT = 64


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
class ReplyBuilder:
    """Accumulates the chunks of one streamed reply, checking the shape of each.

    Only the fields a reply is made of are checked (others pass unread): a field of the wrong
    type raises `FinalFailure` naming it, which fails the call (so what the chunk's earlier fields
    changed here is never used).
    """

    model_name: str
    response_id: str = ""
    content: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    refusal: list[str] = field(default_factory=list)
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
        refusal = _text(delta, "refusal", "choices[0].delta.")
        if refusal:
            self.size += _utf8_len(refusal)
            self.refusal.append(refusal)
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
            refusal="".join(self.refusal),
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
        raise FinalFailure(f'model stream: {where}.type must be "function" or null, got {got}')
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
        raise FinalFailure(f"model stream: {prefix}{name} must not be negative")
    return min(value, MAX_TOKEN_COUNT)


def _malformed(path: str, expected: str, value: object) -> FinalFailure:
    """A chunk field of the wrong type. Names the type only: the value may be model output."""
    return FinalFailure(f"model stream: {path} must be {expected}, got {type(value).__name__}")


def chunk_of(data: str) -> object:
    """One parsed chunk (its shape is `ReplyBuilder.add`'s to check); an error object
    raises as `_in_band_failure` classifies it, text that is not JSON as a transient failure
    (what a stream cut mid-event looks like)."""
    try:
        chunk = json_codec.loads(data)
    except (ValueError, RecursionError):  # RecursionError: nested deeper than json can parse
        message = f"the model sent a malformed stream chunk: {data[:200]!r}"
        raise TransientFailure(message) from None
    if isinstance(chunk, dict):
        error = chunk.get("error")
        if error:
            raise _in_band_failure(error)
    return chunk


def _in_band_failure(error: object) -> FinalFailure | TransientFailure:
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
    failure = TransientFailure if is_transient(status, names) else FinalFailure
    return failure(f"{description}: {text}" if text else description, error_code=error_code)


def _status_in(value: object) -> int | None:
    """An HTTP error status given as an in-band `code` (400-599, a number or digits)."""
    if isinstance(value, str) and value.isdigit() and len(value) == 3:
        value = int(value)
    if type(value) is int and 400 <= value <= 599:
        return value
    return None


def error_message(body: bytes) -> str:
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


def error_code(body: bytes) -> str | None:
    """The `error.code` of an OpenAI-style error body, when it has a string one."""
    try:
        parsed = json.loads(body)
    except (ValueError, RecursionError):
        return None
    error = parsed.get("error") if isinstance(parsed, dict) else None
    code = error.get("code") if isinstance(error, dict) else None
    return clean_text(code)[:_ERROR_TEXT_LIMIT] if isinstance(code, str) and code else None
