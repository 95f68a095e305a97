"""Build the message list the model receives from a session's stored steps.

`build_context` = system prompt + the latest summary step, if compaction made one
(engine/compaction.py), + `Step.to_message()` of each step after the range it covers (all of
them without a summary), repaired so it is always valid to send to an OpenAI-compatible
endpoint:
- every assistant tool call is followed by exactly one result, in tool-call order; a call
  with no stored result (cancelled, crashed) gets a synthetic error result;
- a tool result that answers no call of the assistant step before it is dropped;
- `max_history_messages` drops the oldest messages, cutting only where a user message or a
  final assistant message (one without tool calls) begins, so a call is never separated
  from its results; the system prompt and the summary are always kept. When the latest
  exchange alone is longer than the cap, it is kept whole (validity wins over the cap).
Pure functions over steps: never reads the store, never mutates a step.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Sequence
from typing import Any, Final, TypeVar

from agio_grpc.domain import Role, Step, ToolCall

INTERRUPTED_RESULT = "Error: this tool call was interrupted before it returned a result."

T = TypeVar("T")

# The roles the repair tells apart, as module names (`domain._TOOL`'s comment says why).
_TOOL: Final = Role.TOOL
_ASSISTANT: Final = Role.ASSISTANT
_USER: Final = Role.USER


def build_context(
    instructions: str, steps: Sequence[Step], max_history_messages: int | None = None
) -> list[dict[str, Any]]:
    """The OpenAI messages for the next model call (see the module docstring): the messages
    of `context_steps`, each made in the repair's own pass."""
    return _context(instructions, steps, max_history_messages, Step.to_message)


def context_steps(
    instructions: str, steps: Sequence[Step], max_history_messages: int | None = None
) -> list[Step]:
    """`build_context` as steps: the system prompt and synthetic results have sequence 0."""
    return _context(instructions, steps, max_history_messages, _as_is)


def _context(
    instructions: str,
    steps: Sequence[Step],
    max_history_messages: int | None,
    convert: Callable[[Step], T],
) -> list[T]:
    summary = latest_summary(steps)
    history, starts = _repaired(
        steps if summary is None else after_summary(steps, summary), convert
    )
    del history[: _first_kept(len(history), starts, max_history_messages)]
    if summary is not None:
        history.insert(0, convert(summary))
    if not instructions:
        return history
    session_id = steps[0].session_id if steps else ""
    history.insert(0, convert(Step(session_id, "", Role.SYSTEM, content=instructions, id="")))
    return history


def _as_is(step: Step) -> Step:
    return step


def latest_summary(history: Sequence[Step]) -> Step | None:
    """The newest summary step of a history (its context starts from it)."""
    for step in reversed(history):
        if step.role is Role.SUMMARY:
            return step
    return None


def after_summary(history: Sequence[Step], summary: Step | None) -> list[Step]:
    """The steps the context goes on with after `summary`: those after its range, except
    summary steps."""
    covered = summary.summary_last_sequence if summary is not None else 0
    return [s for s in history if s.sequence > covered and s.role is not Role.SUMMARY]


def _repaired(steps: Sequence[Step], convert: Callable[[Step], T]) -> tuple[list[T], list[int]]:
    """The steps, each as `convert` makes it, with tool results laid out after their calls,
    and where history may start.

    One pass that allocates nothing per plain step but what `convert` makes: this runs over
    the whole session before every model call. The second list holds the indexes
    (ascending) of the user and final assistant steps, the only places a cut may fall.
    """
    history: list[T] = []
    starts: list[int] = []
    append = history.append
    caller: Step | None = None  # the assistant step whose results are being collected
    call_ids: set[str] = set()
    results: dict[str, Step] = {}
    for step in steps:
        role = step.role
        if role is _TOOL:
            # The first result of each of the caller's calls counts; orphans are dropped.
            call_id = step.tool_call_id
            if caller is not None and call_id in call_ids and call_id not in results:
                results[call_id] = step
            continue
        if caller is not None:
            _lay_out_results(append, caller, results, convert)
            caller = None
        if role is _ASSISTANT and step.tool_calls:
            caller = step
            call_ids = {call.id for call in step.tool_calls}
            results = {}
        elif role is _USER or role is _ASSISTANT:
            starts.append(len(history))
        append(convert(step))
    if caller is not None:
        _lay_out_results(append, caller, results, convert)
    return history, starts


def _lay_out_results(
    append: Callable[[T], None],
    caller: Step,
    results: dict[str, Step],
    convert: Callable[[Step], T],
) -> None:
    """Append the caller's results in call order, inventing the missing ones."""
    for call in caller.tool_calls:
        append(convert(results.get(call.id) or _interrupted_result(caller, call)))


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


def _first_kept(length: int, starts: list[int], max_messages: int | None) -> int:
    """Where the capped history begins: the oldest start that leaves at most `max_messages`
    from it on; when none does, the latest start (the newest exchange, kept whole); with no
    start at all, the beginning."""
    if max_messages is None or length <= max_messages:
        return 0
    index = bisect_left(starts, length - max_messages)
    if index < len(starts):
        return starts[index]
    return starts[-1] if starts else 0


def open_tool_calls(steps: Sequence[Step]) -> tuple[Step | None, list[ToolCall]]:
    """The last assistant step and its tool calls that no later tool step answers (summary
    steps, which stand for earlier steps, are passed over)."""
    for index in range(len(steps) - 1, -1, -1):
        step = steps[index]
        if step.role is Role.SUMMARY:
            continue
        if step.role is Role.ASSISTANT:
            answered = {
                later.tool_call_id for later in steps[index + 1 :] if later.role is Role.TOOL
            }
            return step, [call for call in step.tool_calls if call.id not in answered]
        if step.role is not Role.TOOL:
            return None, []
    return None, []
