"""`context_steps` agrees with a plain block-by-block statement of the rules on random histories.

The reference below is the straightforward algorithm (group each step with its results into
a block, lay the results out in call order, cut the oldest blocks that can start a history);
the real one does the same in a single pass without per-step objects, because it runs over
the whole session before every model call. Random histories mix every awkward case: orphan,
duplicate and out-of-order results, calls left unanswered, stored system steps, caps of
every size.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field

import pytest

from agio_grpc.domain import Role, Step, ToolCall
from agio_grpc.engine.context import INTERRUPTED_RESULT, build_context, context_steps

SESSION = "sess_reference"


@dataclass
class _Block:
    steps: list[Step]
    can_start_history: bool
    results: dict[str, Step] = field(default_factory=dict)


def reference_context_steps(
    instructions: str, steps: Sequence[Step], max_history_messages: int | None
) -> list[Step]:
    blocks: list[_Block] = []
    open_block: _Block | None = None
    for step in steps:
        if step.role is Role.TOOL:
            if open_block is not None:
                call_ids = {call.id for call in open_block.steps[0].tool_calls}
                if step.tool_call_id in call_ids and step.tool_call_id not in open_block.results:
                    open_block.results[step.tool_call_id] = step
            continue
        if open_block is not None:
            _close(open_block)
            open_block = None
        if step.role is Role.ASSISTANT and step.tool_calls:
            open_block = _Block([step], can_start_history=False)
            blocks.append(open_block)
        else:
            starts = step.role in (Role.USER, Role.ASSISTANT)
            blocks.append(_Block([step], can_start_history=starts))
    if open_block is not None:
        _close(open_block)
    blocks = _cap(blocks, max_history_messages)
    session_id = steps[0].session_id if steps else ""
    system = (
        [Step(session_id, "", Role.SYSTEM, content=instructions, id="")] if instructions else []
    )
    return system + [step for block in blocks for step in block.steps]


def _close(block: _Block) -> None:
    assistant = block.steps[0]
    block.steps = [assistant] + [
        block.results.get(call.id)
        or Step(
            assistant.session_id,
            assistant.run_id,
            Role.TOOL,
            content=INTERRUPTED_RESULT,
            tool_call_id=call.id,
            name=call.name,
            is_error=True,
            id="",
        )
        for call in assistant.tool_calls
    ]


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
    if start == len(blocks):
        start = next((i for i in range(len(blocks) - 1, -1, -1) if blocks[i].can_start_history), 0)
    return blocks[start:]


def random_history(rng: random.Random, length: int) -> list[Step]:
    steps: list[Step] = []
    call_ids: list[str] = ["ghost"]
    for sequence in range(1, length + 1):
        kind = rng.choice(["user", "reply", "calls", "result", "result", "system"])
        if kind == "user":
            step = Step(SESSION, "run", Role.USER, content=f"u{sequence}")
        elif kind == "reply":
            step = Step(SESSION, "run", Role.ASSISTANT, content=f"r{sequence}")
        elif kind == "calls":
            ids = [f"c{sequence}_{n}" for n in range(rng.randint(1, 3))]
            if rng.random() < 0.1:
                ids.append(ids[0])  # a model may repeat a call id
            call_ids.extend(ids)
            calls = [ToolCall(call_id, f"tool_{call_id}", "{}") for call_id in ids]
            step = Step(SESSION, "run", Role.ASSISTANT, tool_calls=calls)
        elif kind == "result":
            # Mostly a recent call (maybe answered already), sometimes an old or unknown one.
            call_id = rng.choice(call_ids[-4:] if rng.random() < 0.8 else call_ids)
            step = Step(
                SESSION, "run", Role.TOOL, content=f"t{sequence}", tool_call_id=call_id, name="t"
            )
        else:
            step = Step(SESSION, "run", Role.SYSTEM, content=f"s{sequence}")
        step.sequence = sequence
        steps.append(step)
    return steps


def same_steps(actual: list[Step], expected: list[Step]) -> bool:
    """Stored steps must be the very same objects; invented ones equal field by field."""
    if len(actual) != len(expected):
        return False
    for got, want in zip(actual, expected, strict=True):
        if want.id:
            if got is not want:
                return False
        elif got != want:
            return False
    return True


@pytest.mark.parametrize("seed", range(40))
def test_context_steps_match_the_block_by_block_rules(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(25):
        steps = random_history(rng, rng.randint(0, 30))
        instructions = rng.choice(["", "sys"])
        for cap in [None, *range(0, len(steps) + 8)]:
            expected = reference_context_steps(instructions, steps, cap)
            assert same_steps(context_steps(instructions, steps, cap), expected), (seed, cap)


def test_messages_match_the_rules_on_a_long_history() -> None:
    steps = random_history(random.Random(7), 3000)
    for cap in (None, 1, 10, 999, 2999, 5000):
        expected = [step.to_message() for step in reference_context_steps("sys", steps, cap)]
        assert build_context("sys", steps, cap) == expected
