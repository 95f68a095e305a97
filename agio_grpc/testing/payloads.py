"""The JSON documents the fake model answers with, shaped exactly like OpenAI's.

A non-streamed `chat.completion`, the `usage` object (also used by the
streamed usage chunk), the `GET /v1/models` list, and the `{"error": ...}`
body of an HTTP error. Pure functions of a `Turn` and the request body: no I/O.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from agio_grpc.testing.chat_request import estimate_prompt_tokens, requested_model
from agio_grpc.testing.script import Turn, new_tool_call_id, split_even

# OpenAI's `type` and `code` for the statuses a test is likely to script.
_ERROR_KINDS: dict[int, tuple[str, str | None]] = {
    400: ("invalid_request_error", None),
    401: ("invalid_request_error", "invalid_api_key"),
    403: ("invalid_request_error", "unsupported_country_region_territory"),
    404: ("invalid_request_error", "not_found"),
    408: ("timeout", None),
    409: ("invalid_request_error", "conflict"),
    429: ("requests", "rate_limit_exceeded"),
    503: ("server_error", "service_unavailable"),
}


def new_completion_id() -> str:
    """A fresh completion id shaped like OpenAI's (`chatcmpl-` + 24 hex digits)."""
    return "chatcmpl-" + uuid.uuid4().hex[:24]


def argument_fragments(turn: Turn, arguments: str) -> tuple[str, ...]:
    """A tool call's arguments split into the turn's `chunks_per_call` fragments."""
    return split_even(arguments, turn.chunks_per_call)


def usage(turn: Turn, body: dict[str, Any]) -> dict[str, Any]:
    """The `usage` object for `turn`: the scripted counts, else the rough estimates."""
    spec = turn.usage
    output_chunks = (
        len(turn.reasoning)
        + len(turn.content)
        + sum(len(argument_fragments(turn, call.arguments)) for call in turn.calls)
    )
    prompt = spec.prompt_tokens if spec.prompt_tokens is not None else estimate_prompt_tokens(body)
    completion = spec.completion_tokens if spec.completion_tokens is not None else output_chunks
    reasoning = spec.reasoning_tokens if spec.reasoning_tokens is not None else len(turn.reasoning)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": spec.cached_tokens},
        "completion_tokens_details": {"reasoning_tokens": reasoning},
    }


def chat_completion(turn: Turn, body: dict[str, Any]) -> dict[str, Any]:
    """The non-streamed `chat.completion` answer to `body` scripted by `turn`."""
    message: dict[str, Any] = {
        "role": "assistant",
        "content": "".join(turn.content) if turn.content or not turn.calls else None,
        "refusal": turn.refusal or None,
    }
    if turn.reasoning:
        message["reasoning_content"] = "".join(turn.reasoning)
    if turn.calls:
        message["tool_calls"] = [
            {
                "id": call.id or new_tool_call_id(),
                "type": "function",
                "function": {"name": call.name, "arguments": call.arguments},
            }
            for call in turn.calls
        ]
    finish_reason = None if turn.omit_finish_reason else turn.resolved_finish_reason()
    return {
        "id": new_completion_id(),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": requested_model(body),
        "choices": [
            {"index": 0, "message": message, "logprobs": None, "finish_reason": finish_reason}
        ],
        "usage": usage(turn, body),
    }


def model_list(model_ids: list[str]) -> dict[str, Any]:
    """The `GET /v1/models` answer listing `model_ids`."""
    created = int(time.time())
    return {
        "object": "list",
        "data": [
            {"id": model_id, "object": "model", "created": created, "owned_by": "agio-grpc"}
            for model_id in model_ids
        ],
    }


def error(status: int, message: str | None = None) -> dict[str, Any]:
    """An OpenAI-style `{"error": {...}}` body for an HTTP error `status`."""
    kind, code = _ERROR_KINDS.get(
        status, ("server_error" if status >= 500 else "invalid_request_error", None)
    )
    return {
        "error": {
            "message": message or f"The fake model answered with HTTP {status} as scripted.",
            "type": kind,
            "param": None,
            "code": code,
        }
    }


def context_length_exceeded(window: int, prompt_tokens: int) -> dict[str, Any]:
    """OpenAI's refusal of a prompt longer than the model's context window."""
    return {
        "error": {
            "message": (
                f"This model's maximum context length is {window} tokens. However, your "
                f"messages resulted in {prompt_tokens} tokens. Please reduce the length of "
                "the messages."
            ),
            "type": "invalid_request_error",
            "param": "messages",
            "code": "context_length_exceeded",
        }
    }


def context_size_exceeded() -> dict[str, Any]:
    """A refusal of a prompt longer than the context window that states no window, as
    llama.cpp's server sends one (an HTTP status as its code)."""
    return {
        "error": {
            "message": "the request exceeds the available context size, try increasing it",
            "type": "exceed_context_size_error",
            "code": 400,
        }
    }
