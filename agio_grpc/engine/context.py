"""Build the message list the model receives from a session's stored steps.

`build_context` = system prompt + `Step.to_message()` of each step, repaired so it is always
valid to send to an OpenAI-compatible endpoint:
- every assistant tool call is followed by exactly one result, in tool-call order; a call
  with no stored result (cancelled, crashed) gets a synthetic error result;
- a tool result that answers no call of the assistant step before it is dropped;
- `max_history_messages` drops the oldest messages, cutting only where a user message or a
  final assistant message (one without tool calls) begins, so a call is never separated
  from its results; the system prompt is always kept. When the latest exchange alone is
  longer than the cap, it is kept whole (validity wins over the cap).
Pure functions over steps: never reads the store, never mutates a step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from agio_grpc.domain import Role, Step, ToolCall

INTERRUPTED_RESULT = "Error: this tool call was interrupted before it returned a result."


@dataclass(slots=True)
class _Block:
    """Messages that must stay together: one step, or a tool-calling step with its results."""

    steps: list[Step]
    can_start_history: bool
    results: dict[str, Step] = field(default_factory=dict)


def build_context(
    instructions: str, steps: Sequence[Step], max_history_messages: int | None = None
) -> list[dict[str, Any]]:
    """The OpenAI messages for the next model call (see the module docstring)."""
    return [step.to_message() for step in context_steps(instructions, steps, max_history_messages)]


def context_steps(
    instructions: str, steps: Sequence[Step], max_history_messages: int | None = None
) -> list[Step]:
    """`build_context` as steps: the system prompt and synthetic results have sequence 0."""
    blocks = _cap(_blocks(steps), max_history_messages)
    session_id = steps[0].session_id if steps else ""
    system = (
        [Step(session_id, "", Role.SYSTEM, content=instructions, id="")] if instructions else []
    )
    return system + [step for block in blocks for step in block.steps]


def _blocks(steps: Sequence[Step]) -> list[_Block]:
    blocks: list[_Block] = []
    open_block: _Block | None = None
    for step in steps:
        if step.role is Role.TOOL:
            if open_block is not None and _answers(open_block, step):
                open_block.results[step.tool_call_id] = step
            continue  # an orphan result: no call to attach it to
        if open_block is not None:
            _close(open_block)
            open_block = None
        if step.role is Role.ASSISTANT and step.tool_calls:
            open_block = _Block([step], can_start_history=False)
            blocks.append(open_block)
        else:
            starts = step.role is Role.USER or step.role is Role.ASSISTANT
            blocks.append(_Block([step], can_start_history=starts))
    if open_block is not None:
        _close(open_block)
    return blocks


def _answers(block: _Block, step: Step) -> bool:
    call_ids = {call.id for call in block.steps[0].tool_calls}
    return step.tool_call_id in call_ids and step.tool_call_id not in block.results


def _close(block: _Block) -> None:
    """Lay out the block's results in call order, inventing the missing ones."""
    assistant = block.steps[0]
    block.steps = [assistant] + [
        block.results.get(call.id) or _interrupted_result(assistant, call)
        for call in assistant.tool_calls
    ]


def _interrupted_result(assistant: Step, call: ToolCall) -> Step:
    """The synthetic error result of a call that has none."""
    return Step(
        session_id=assistant.session_id,
        run_id=assistant.run_id,
        role=Role.TOOL,
        content=INTERRUPTED_RESULT,
        tool_call_id=call.id,
        name=call.name,
        is_error=True,
        id="",
    )


def _cap(blocks: list[_Block], max_messages: int | None) -> list[_Block]:
    if max_messages is None or sum(len(block.steps) for block in blocks) <= max_messages:
        return blocks
    start = len(blocks)
    kept = 0
    for index in range(len(blocks) - 1, -1, -1):
        kept += len(blocks[index].steps)
        if kept > max_messages:
            break
        if blocks[index].can_start_history:
            start = index
    if start == len(blocks):  # even the latest exchange is over the cap: keep it whole
        start = next((i for i in range(len(blocks) - 1, -1, -1) if blocks[i].can_start_history), 0)
    return blocks[start:]


def open_tool_calls(steps: Sequence[Step]) -> tuple[Step | None, list[ToolCall]]:
    """The last assistant step and its tool calls that no later tool step answers."""
    for index in range(len(steps) - 1, -1, -1):
        step = steps[index]
        if step.role is Role.ASSISTANT:
            answered = {
                later.tool_call_id for later in steps[index + 1 :] if later.role is Role.TOOL
            }
            return step, [call for call in step.tool_calls if call.id not in answered]
        if step.role is not Role.TOOL:
            return None, []
    return None, []
