"""Responders: what the fake model answers when no scripted turn is queued.

A responder is a plain function from the request body to a `Turn`. The
default one makes the fake model a tiny, deterministic agent — it calls a
`calculate` or `current_time` tool when offered and asked, any offered tool
when told to "use the NAME tool", and echoes otherwise, or answers a requested
output schema with the smallest JSON it accepts — which is what the demo
(`agio-grpc serve` with no `OPENAI_BASE_URL`) runs on. `paced_responder`
shapes load for benchmarks. Responders never do I/O: delays are described in
the returned `Turn`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from agio_grpc.testing.chat_request import message_text, messages, offered_tool_names
from agio_grpc.testing.schema_answers import (
    FINAL_OUTPUT_TOOL,
    example_instance,
    final_output_schema,
    requested_schema,
)
from agio_grpc.testing.script import ToolCallSpec, Turn

Responder = Callable[[dict[str, Any]], Turn]
"""Answers a chat.completions request body (parsed JSON) with the `Turn` to serve."""

CALCULATOR_TOOL = "calculate"
CLOCK_TOOL = "current_time"

BENCHMARK_TOOL_CALL = ToolCallSpec(CALCULATOR_TOOL, '{"expression": "2 + 2"}')
"""The tool call `paced_responder` makes by default."""

# Runs of digits, operators, parentheses and spaces; an expression is a run
# with an operator between two operands.
_ARITHMETIC_RUN = re.compile(r"[\d.()+\-*/ ]+")
_BINARY_OPERATION = re.compile(r"\d\s*[-+*/]\s*[\d(]")
_TIME_WORD = re.compile(r"\btime\b", re.IGNORECASE)
_SUMMARY_REQUEST = re.compile(r"\bsummar(?:y|ize|ise)\b", re.IGNORECASE)
SUMMARY_WORDS = 12
"""How many words of the conversation the fake model's summary quotes."""
_USE_TOOL = re.compile(r"\buse the ([A-Za-z0-9_-]+) tool\b", re.IGNORECASE)


def default_responder(body: dict[str, Any]) -> Turn:
    """`text_responder`, honouring a request for structured output: a reply that would be
    text is instead the smallest answer the requested schema accepts
    (`schema_answers.example_instance`), as JSON text for `response_format: json_schema`,
    or as a call of the offered `final_output` tool."""
    turn = text_responder(body)
    if turn.calls:
        return turn
    schema = requested_schema(body)
    if schema is not None:
        return Turn.json(example_instance(schema))
    schema = final_output_schema(body)
    if schema is not None:
        answer = json.dumps(example_instance(schema))
        return Turn.tool_calls([ToolCallSpec(FINAL_OUTPUT_TOOL, answer)])
    return turn


def text_responder(body: dict[str, Any]) -> Turn:
    """The fake model's built-in behaviour, applied to the request in this order.

    1. The last message is a tool result: reply `"The result is <content>."`
       (several trailing tool results are joined with `", "`).
    2. Take the last user message's text. If the request offers a
       `calculate` tool and the text holds an arithmetic expression such as
       `12 * 7` or `(2+3)/4`: call `calculate` with `{"expression": "12 * 7"}`.
    3. Else, if it offers `current_time` and the text mentions "time": call
       `current_time` with `{}`.
    4. Else, if the text says "use the NAME tool" and the request offers NAME
       (a client tool, say): call it with `{}`.
    5. Else reply `"You said: <text>"`, one word per chunk.

    Before all these: a request whose system prompt asks for a summary (compaction's)
    gets a short one, `"Summary: "` and the first words of the conversation it was given.
    """
    if _SUMMARY_REQUEST.search(system_text(body)):
        words = last_user_text(body).split()
        return Turn.text("Summary: " + " ".join(words[:SUMMARY_WORDS]))
    tool_results = trailing_tool_results(body)
    if tool_results:
        return Turn.words(f"The result is {', '.join(tool_results)}.")
    text = last_user_text(body)
    tools = offered_tool_names(body)
    expression = find_arithmetic(text)
    if CALCULATOR_TOOL in tools and expression is not None:
        arguments = json.dumps({"expression": expression})
        return Turn.tool_calls([ToolCallSpec(CALCULATOR_TOOL, arguments)], chunks_per_call=3)
    if CLOCK_TOOL in tools and _TIME_WORD.search(text):
        return Turn.tool_calls([ToolCallSpec(CLOCK_TOOL, "{}")])
    named = _USE_TOOL.search(text)
    if named is not None and named.group(1) in tools:
        return Turn.tool_calls([ToolCallSpec(named.group(1), "{}")])
    return Turn.words(f"You said: {text}")


def paced_responder(
    tokens: int = 100,
    tokens_per_second: float = 0.0,
    *,
    tool_first: bool = True,
    tool: ToolCallSpec = BENCHMARK_TOOL_CALL,
) -> Responder:
    """A benchmark responder: one tool call, then `tokens` words at a steady rate.

    With `tool_first`, a request whose last message is not a tool result and
    that offers `tool.name` gets that tool call; every other request gets
    `tokens` one-word chunks, one every `1 / tokens_per_second` seconds
    (`0` streams them as fast as possible).
    """
    delay = 1.0 / tokens_per_second if tokens_per_second > 0 else 0.0

    def respond(body: dict[str, Any]) -> Turn:
        if tool_first and not trailing_tool_results(body) and tool.name in offered_tool_names(body):
            return Turn.tool_calls([tool])
        return Turn.tokens(tokens, first_token_delay=delay, chunk_delay=delay)

    return respond


def trailing_tool_results(body: dict[str, Any]) -> list[str]:
    """The texts of the tool messages at the end of the conversation, in order."""
    results: list[str] = []
    for message in reversed(messages(body)):
        if message.get("role") != "tool":
            break
        results.append(message_text(message))
    return results[::-1]


def system_text(body: dict[str, Any]) -> str:
    """The text of the first message when it is a system message, or `""`."""
    first = messages(body)[:1]
    return message_text(first[0]) if first and first[0].get("role") == "system" else ""


def last_user_text(body: dict[str, Any]) -> str:
    """The text of the last user message, or `""` when there is none."""
    for message in reversed(messages(body)):
        if message.get("role") == "user":
            return message_text(message)
    return ""


def find_arithmetic(text: str) -> str | None:
    """The first arithmetic expression in `text` (`"What is 12 * 7?"` → `"12 * 7"`)."""
    for run in _ARITHMETIC_RUN.finditer(text):
        expression = run.group().strip().rstrip(".+-*/ ")
        if _BINARY_OPERATION.search(expression):
            return expression
    return None
