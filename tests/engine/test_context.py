"""Building the model's message list from stored steps: always valid to re-send."""

from __future__ import annotations

from agio_grpc.domain import SUMMARY_PREFIX, Role, Step, ToolCall
from agio_grpc.engine.context import (
    INTERRUPTED_RESULT,
    build_context,
    context_steps,
    open_tool_calls,
)
from tests.engine.harness import assert_valid_messages

SESSION = "sess_test"


def user(text: str) -> Step:
    return Step(SESSION, "run", Role.USER, content=text)


def reply(text: str) -> Step:
    return Step(SESSION, "run", Role.ASSISTANT, content=text)


def calls(*ids: str) -> Step:
    return Step(
        SESSION,
        "run",
        Role.ASSISTANT,
        tool_calls=[ToolCall(call_id, "echo", '{"text": "x"}') for call_id in ids],
    )


def result(call_id: str, text: str = "ok") -> Step:
    return Step(SESSION, "run", Role.TOOL, content=text, tool_call_id=call_id, name="echo")


def numbered(*steps: Step) -> list[Step]:
    for sequence, step in enumerate(steps, start=1):
        step.sequence = sequence
    return list(steps)


def test_context_is_system_prompt_then_each_step_message() -> None:
    steps = numbered(user("hi"), calls("a"), result("a"), reply("done"))
    messages = build_context("Be brief.", steps)
    assert messages[0] == {"role": "system", "content": "Be brief."}
    assert messages[1:] == [step.to_message() for step in steps]


def test_each_role_becomes_the_openai_message_it_is() -> None:
    summary = Step(SESSION, "run", Role.SUMMARY, content="earlier: hi")
    spoken = Step(
        SESSION, "run", Role.ASSISTANT, content="I'll check.", tool_calls=calls("b").tool_calls
    )
    steps = numbered(user("hi"), calls("a"), result("a", "4"), spoken, result("b"), reply(""))
    assert build_context("sys", [summary, *steps]) == [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": SUMMARY_PREFIX + "earlier: hi"},
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "content": None,  # a call without text: null, as the API sends it
            "tool_calls": [
                {
                    "id": "a",
                    "type": "function",
                    "function": {"name": "echo", "arguments": '{"text": "x"}'},
                }
            ],
        },
        {"role": "tool", "content": "4", "tool_call_id": "a"},
        {
            "role": "assistant",
            "content": "I'll check.",
            "tool_calls": [
                {
                    "id": "b",
                    "type": "function",
                    "function": {"name": "echo", "arguments": '{"text": "x"}'},
                }
            ],
        },
        {"role": "tool", "content": "ok", "tool_call_id": "b"},
        {"role": "assistant", "content": ""},  # a final answer keeps its (empty) text
    ]


def test_call_without_result_gets_synthetic_error_result_right_after_it() -> None:
    steps = numbered(user("hi"), calls("a", "b"), result("a"), user("again"))
    messages = build_context("sys", steps)
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "tool", "user"]
    assert messages[4] == {"role": "tool", "content": INTERRUPTED_RESULT, "tool_call_id": "b"}
    assert_valid_messages(messages)


def test_call_at_the_end_of_history_gets_synthetic_result() -> None:
    messages = build_context("sys", numbered(user("hi"), calls("a")))
    assert messages[-1]["tool_call_id"] == "a"
    assert messages[-1]["content"] == INTERRUPTED_RESULT
    assert_valid_messages(messages)


def test_orphan_and_duplicate_tool_results_are_dropped() -> None:
    steps = numbered(
        result("ghost"), user("hi"), calls("a"), result("a"), result("a", "again"), result("x")
    )
    messages = build_context("sys", steps)
    tool_messages = [m for m in messages if m["role"] == "tool"]
    assert tool_messages == [{"role": "tool", "content": "ok", "tool_call_id": "a"}]
    assert_valid_messages(messages)


def test_results_are_laid_out_in_call_order() -> None:
    steps = numbered(user("hi"), calls("a", "b"), result("b", "B"), result("a", "A"))
    messages = build_context("sys", steps)
    assert [m["tool_call_id"] for m in messages if m["role"] == "tool"] == ["a", "b"]


def test_history_cap_keeps_system_prompt_and_newest_whole_exchanges() -> None:
    steps = numbered(
        user("one"),
        reply("r1"),
        user("two"),
        calls("a", "b"),
        result("a"),
        result("b"),
        reply("r2"),
    )
    messages = build_context("sys", steps, max_history_messages=4)
    # The cut may not fall inside the call and its results: the newest start that fits is r2.
    assert messages == [{"role": "system", "content": "sys"}, steps[-1].to_message()]
    messages = build_context("sys", steps, max_history_messages=5)
    assert [m["role"] for m in messages] == [
        "system",
        "user",
        "assistant",
        "tool",
        "tool",
        "assistant",
    ]
    assert messages[1]["content"] == "two"
    assert_valid_messages(messages)


def test_history_cap_never_separates_a_call_from_its_results() -> None:
    steps = numbered(user("q"), calls("a", "b", "c"), result("a"), result("b"), result("c"))
    for cap in range(1, 7):
        messages = build_context("sys", steps, max_history_messages=cap)
        assert_valid_messages(messages)
        assert messages[0]["role"] == "system"
        assert messages[1]["role"] == "user"  # too big to cut: kept whole


def test_history_under_the_cap_is_kept_whole() -> None:
    steps = numbered(calls("a"), result("a"), reply("r"))
    assert len(build_context("sys", steps, max_history_messages=10)) == 4


def test_context_steps_mark_invented_steps_with_sequence_zero() -> None:
    steps = numbered(user("hi"), calls("a"))
    built = context_steps("sys", steps)
    assert [(s.role, s.sequence) for s in built] == [
        (Role.SYSTEM, 0),
        (Role.USER, 1),
        (Role.ASSISTANT, 2),
        (Role.TOOL, 0),
    ]
    assert built[-1].is_error


def test_no_instructions_means_no_system_message() -> None:
    assert build_context("", numbered(user("hi")))[0]["role"] == "user"


def test_open_tool_calls_are_the_last_assistant_steps_unanswered_calls() -> None:
    steps = numbered(user("hi"), calls("a", "b", "c"), result("b"))
    assistant, open_calls = open_tool_calls(steps)
    assert assistant is steps[1]
    assert [call.id for call in open_calls] == ["a", "c"]
    assert open_tool_calls(numbered(user("hi"))) == (None, [])
    assert open_tool_calls(numbered(calls("a"), result("a"), user("x"))) == (None, [])
