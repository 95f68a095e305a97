"""Read the fields the fake model cares about from a chat.completions request body.

The body is the parsed JSON the client sent, untyped and untrusted: every
reader here tolerates missing or oddly shaped fields and never raises.
"""

from __future__ import annotations

from typing import Any

DEFAULT_MODEL = "fake-model"
"""The model id reported when a request names none (and listed by `GET /v1/models`)."""


def requested_model(body: dict[str, Any]) -> str:
    """The request's `model`, echoed back in every chunk."""
    model = body.get("model")
    return model if isinstance(model, str) and model else DEFAULT_MODEL


def wants_stream(body: dict[str, Any]) -> bool:
    """Whether the request asked for an SSE stream (`"stream": true`)."""
    return body.get("stream") is True


def wants_usage_chunk(body: dict[str, Any]) -> bool:
    """Whether the request set `stream_options.include_usage`."""
    options = body.get("stream_options")
    return isinstance(options, dict) and options.get("include_usage") is True


def messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The request's messages that are JSON objects, in order."""
    raw = body.get("messages")
    if not isinstance(raw, list):
        return []
    return [message for message in raw if isinstance(message, dict)]


def message_text(message: dict[str, Any]) -> str:
    """The text of a message: its string content, or its text parts joined."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            part["text"]
            for part in content
            if isinstance(part, dict) and isinstance(part.get("text"), str)
        )
    return ""


def offered_tool_names(body: dict[str, Any]) -> set[str]:
    """The names of the function tools the request offers."""
    tools = body.get("tools")
    if not isinstance(tools, list):
        return set()
    names: set[str] = set()
    for tool in tools:
        function = tool.get("function") if isinstance(tool, dict) else None
        name = function.get("name") if isinstance(function, dict) else None
        if isinstance(name, str):
            names.add(name)
    return names


def estimate_prompt_tokens(body: dict[str, Any]) -> int:
    """A rough prompt size: the words in every message's text and tool call arguments."""
    words = 0
    for message in messages(body):
        words += len(message_text(message).split())
        calls = message.get("tool_calls")
        for call in calls if isinstance(calls, list) else []:
            function = call.get("function") if isinstance(call, dict) else None
            arguments = function.get("arguments") if isinstance(function, dict) else None
            if isinstance(arguments, str):
                words += len(arguments.split())
    return words
