"""The OpenAI Agents SDK (`agents`) as a baseline: the same agent shape, in-process.

`Runner.run_streamed` on an `OpenAIChatCompletionsModel` pointed at the same fake model.
The SDK's own tracing is turned off: it would export to OpenAI's servers.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import openai
from agents import (
    Agent,
    OpenAIChatCompletionsModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)

set_tracing_disabled(True)


@function_tool
def calculate(expression: str) -> str:
    """Evaluate an arithmetic expression (the fake model asks for `2 + 2`)."""
    return "4" if expression.replace(" ", "") == "2+2" else "unsupported"


def make_agent(client: openai.AsyncOpenAI, *, tools: bool) -> Agent[None]:
    return Agent(
        name="bench",
        instructions="You are a helpful assistant.",
        model=OpenAIChatCompletionsModel(model="fake-model", openai_client=client),
        tools=[calculate] if tools else [],
    )


@dataclass(slots=True)
class SdkRun:
    """What one streamed SDK run looked like to its caller."""

    ttft_s: float
    duration_s: float
    text_deltas: int
    gaps_s: list[float]


async def sdk_run(agent: Agent[None], text: str = "stream please") -> SdkRun:
    """One `Runner.run_streamed`; times the text deltas as the caller sees them."""
    started = time.perf_counter()
    last = 0.0
    first = 0.0
    deltas = 0
    gaps: list[float] = []
    result = Runner.run_streamed(agent, text)
    async for event in result.stream_events():
        if event.type != "raw_response_event":
            continue
        if getattr(event.data, "type", "") != "response.output_text.delta":
            continue
        now = time.perf_counter()
        if not first:
            first = now
        else:
            gaps.append(now - last)
        last = now
        deltas += 1
    ended = time.perf_counter()
    return SdkRun(first - started if first else 0.0, ended - started, deltas, gaps)
