"""The run channel: gapless seqs, replay then live, and delta coalescing only while behind."""

from __future__ import annotations

import asyncio

import pytest

from agio_grpc.domain import Role, Run
from agio_grpc.engine.channel import ChannelClosedError, RunChannel
from agio_grpc.engine.events import (
    ErrorNotice,
    RunCompleted,
    SequencedEvent,
    StepDelta,
    StepStarted,
    ToolCallDelta,
    ToolProgress,
)
from agio_grpc.engine.model_call import streamed_to
from agio_grpc.engine.models import ModelDelta, ModelRetry

RUN = Run(session_id="sess", agent="a", id="run")


def delta(text: str, step: str = "s1", *calls: ToolCallDelta) -> StepDelta:
    return StepDelta(step_id=step, content=text, tool_calls=calls)


async def drain(channel: RunChannel, after_seq: int = 0) -> list[SequencedEvent]:
    return [event async for event in channel.subscribe(after_seq)]


async def test_a_client_that_is_behind_gets_the_deltas_merged() -> None:
    channel = RunChannel("run", "sess")
    channel.publish(StepStarted(step_id="s1", role=Role.ASSISTANT))
    for word in ["The ", "quick ", "fox"]:
        channel.publish(delta(word))
    channel.publish(RunCompleted(RUN))
    events = await drain(channel)
    assert [e.seq for e in events] == [1, 2, 3]
    merged = events[1].event
    assert isinstance(merged, StepDelta)
    assert merged.content == "The quick fox"


async def test_a_client_that_keeps_up_gets_every_delta_at_once() -> None:
    channel = RunChannel("run", "sess")
    subscription = channel.subscribe()
    channel.publish(StepStarted(step_id="s1", role=Role.ASSISTANT))
    assert (await anext(subscription)).seq == 1
    received = []
    for word in ["a", "b", "c"]:
        channel.publish(delta(word))
        event = await anext(subscription)  # delivered before the next delta exists
        assert isinstance(event.event, StepDelta)
        received.append((event.seq, event.event.content))
    assert received == [(2, "a"), (3, "b"), (4, "c")]


async def test_every_subscriber_sees_the_same_seqs_whatever_its_pace() -> None:
    channel = RunChannel("run", "sess")
    fast = channel.subscribe()
    channel.publish(StepStarted(step_id="s1", role=Role.ASSISTANT))
    channel.publish(delta("a"))
    assert [(await anext(fast)).seq, (await anext(fast)).seq] == [1, 2]
    channel.publish(delta("b"))
    channel.publish(delta("c"))  # merged into "b": the fast client has not taken it yet
    channel.publish(RunCompleted(RUN))
    rest = [e async for e in fast]
    slow = await drain(channel)
    assert [(e.seq, getattr(e.event, "content", None)) for e in slow] == [
        (1, None),
        (2, "a"),
        (3, "bc"),
        (4, None),
    ]
    assert [e.seq for e in rest] == [3, 4]
    assert rest[0] is slow[2]


async def test_a_delta_merged_into_an_untaken_one_wakes_no_one() -> None:
    """A merge publishes no new seq: a waiter for an event past the tail waits on, and the
    next read takes the tail merged."""
    channel = RunChannel("run", "sess")
    channel.publish(StepStarted(step_id="s1", role=Role.ASSISTANT))
    assert [e.seq for e in channel.events_after(0)] == [1]
    tail = channel.publish(delta("a"))
    waiter = asyncio.create_task(channel.wait_beyond(tail.seq, timeout=60.0))
    for _ in range(3):
        await asyncio.sleep(0)
    assert channel.publish(delta("b")).seq == tail.seq
    for _ in range(3):
        await asyncio.sleep(0)
    assert not waiter.done()
    channel.publish(delta("c", "s2"))
    await asyncio.wait_for(waiter, 5.0)
    assert [(e.seq, e.event) for e in channel.events_after(1)] == [
        (2, delta("ab")),
        (3, delta("c", "s2")),
    ]


async def test_deltas_of_different_steps_or_split_by_other_events_are_not_merged() -> None:
    channel = RunChannel("run", "sess")
    channel.publish(delta("a", "s1"))
    channel.publish(delta("b", "s2"))
    channel.publish(ErrorNotice("MODEL_STREAM_RESTART", "discard", "model"))
    channel.publish(delta("c", "s2"))
    channel.publish(RunCompleted(RUN))
    contents = [getattr(e.event, "content", "-") for e in await drain(channel)]
    assert contents == ["a", "b", "-", "c", "-"]


async def test_tool_call_fragments_merge_by_index() -> None:
    channel = RunChannel("run", "sess")
    channel.publish(delta("", "s1", ToolCallDelta(0, "call_a", "calc", '{"x"')))
    channel.publish(delta("", "s1", ToolCallDelta(0, "", "", ": 1}"), ToolCallDelta(1, "b", "e")))
    channel.publish(delta("", "s1", ToolCallDelta(1, "", "", "{}")))
    channel.publish(RunCompleted(RUN))
    first = (await drain(channel))[0].event
    assert isinstance(first, StepDelta)
    assert first.tool_calls == (
        ToolCallDelta(0, "call_a", "calc", '{"x": 1}'),
        ToolCallDelta(1, "b", "e", "{}"),
    )


def test_a_merge_keeps_text_reasoning_and_calls_of_either_side_in_order() -> None:
    text = StepDelta("s1", "The ", "think ", (), sequence=4)
    more = StepDelta("s1", "fox", "hard", (), sequence=4)
    call = StepDelta("s1", "", "", (ToolCallDelta(0, "call_a", "calc", "{"),), sequence=4)

    assert text.merged(more) == StepDelta("s1", "The fox", "think hard", (), sequence=4)
    assert text.merged(call) == StepDelta("s1", "The ", "think ", call.tool_calls, sequence=4)
    assert call.merged(text) == StepDelta("s1", "The ", "think ", call.tool_calls, sequence=4)


async def test_replay_starts_after_the_given_seq_and_follows_live() -> None:
    channel = RunChannel("run", "sess")
    for i in range(3):
        channel.publish(StepStarted(step_id=f"s{i}", role=Role.TOOL))
    follower = asyncio.create_task(drain(channel, after_seq=2))
    await asyncio.sleep(0)
    channel.publish(RunCompleted(RUN))
    assert [e.seq for e in await follower] == [3, 4]
    assert await drain(channel, after_seq=4) == []


async def test_a_continuation_keeps_counting_from_the_last_seq() -> None:
    channel = RunChannel("run", "sess", start_after_seq=7)
    channel.publish(StepStarted(step_id="s", role=Role.ASSISTANT))
    channel.publish(RunCompleted(RUN))
    assert [e.seq for e in await drain(channel)] == [8, 9]
    assert [e.seq for e in await drain(channel, after_seq=3)] == [8, 9]
    assert channel.last_seq == 9


async def test_nothing_is_published_after_the_terminal_event() -> None:
    channel = RunChannel("run", "sess")
    channel.publish(RunCompleted(RUN))
    assert channel.closed
    with pytest.raises(ChannelClosedError):
        channel.publish(delta("late"))


async def test_tool_progress_is_streamed_live_but_never_journaled() -> None:
    channel = RunChannel("run", "sess")
    channel.publish(StepStarted(step_id="s1", role=Role.TOOL, tool_call_id="c1", name="t"))
    channel.publish(ToolProgress("s1", "c1", "t", "half way", "TASK_STATE_WORKING"))
    channel.publish(ToolProgress("s1", "c1", "t", "nearly", "TASK_STATE_WORKING"))
    journal = channel.journal_for(lambda run, steps: [RunCompleted(RUN)])
    records = journal(RUN, [])
    channel.publish_journaled()
    events = await drain(channel)
    assert [type(e.event) for e in events] == [
        StepStarted,
        ToolProgress,
        ToolProgress,  # never merged: each says something of its own
        RunCompleted,
    ]
    assert [(r.seq, r.kind) for r in records] == [(1, "step_started"), (4, "run_completed")]


async def test_a_model_call_is_told_once_its_first_delta_is_out() -> None:
    """`streamed_to` answers each delta with whether a subscriber came back for an event
    past the call's first delta (it was sent): until then the driver yields after each."""
    channel = RunChannel("run", "sess")
    channel.publish(StepStarted(step_id="s1", role=Role.ASSISTANT))
    on_event = streamed_to(channel, "s1")
    reader = channel.subscribe()
    assert (await anext(reader)).event == StepStarted(step_id="s1", role=Role.ASSISTANT)
    assert on_event(ModelDelta("The ")) is False  # nobody has it yet
    first = await anext(reader)
    assert first.event == delta("The ")
    assert on_event(ModelDelta("quick ")) is False  # taken, but its reader not back yet
    assert on_event(ModelDelta("fox")) is False  # merged into the untaken one
    second = await anext(reader)
    assert second.event == delta("quick fox")
    assert on_event(ModelDelta(".")) is True
    assert on_event(ModelRetry(1, 0.5, "slow")) is False  # not a delta: nothing to say


async def test_a_model_call_nobody_follows_is_never_told_its_first_delta_is_out() -> None:
    channel = RunChannel("run", "sess")
    on_event = streamed_to(channel, "s1")
    assert [on_event(ModelDelta(word)) for word in ["a", "b", "c"]] == [False, False, False]
