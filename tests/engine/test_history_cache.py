"""Histories kept between runs (engine/history.py): a run on a session this runtime ran
reads only the steps stored since, and still sends the model exactly the stored
conversation — also when another runtime (another replica) ran, retried or deleted in
between. Real SQLite store, real openai client, fake model over HTTP."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from agio_grpc.domain import Role, Run, RunStatus, Step, ToolCall
from agio_grpc.engine import ClientTool, RunInput, ToolOutput
from agio_grpc.engine.context import build_context
from agio_grpc.engine.history import STEP_OVERHEAD_BYTES, HistoryCache, step_bytes
from agio_grpc.engine.hooks import Hooks
from agio_grpc.store.records import HistoryMark, HistoryRead, RunStart
from agio_grpc.testing import FakeModelServer, ToolCallSpec, Turn
from tests.engine.harness import INSTRUCTIONS, Gate, Harness, build_runtime
from tests.roles import StoreRoles


def recording(monkeypatch: pytest.MonkeyPatch, store: StoreRoles, method: str) -> list[Any]:
    """Every result the store's `method` returns from now on, in order."""
    recorded: list[Any] = []
    real = getattr(store, method)

    async def record(*args: Any, **kwargs: Any) -> Any:
        result = await real(*args, **kwargs)
        recorded.append(result)
        return result

    monkeypatch.setattr(store, method, record)
    return recorded


@pytest.fixture
def starts(sqlite_store: StoreRoles, monkeypatch: pytest.MonkeyPatch) -> list[RunStart]:
    """Every `RunStart` the store returns, in order."""
    return recording(monkeypatch, sqlite_store, "start_run")


@pytest.fixture
def reads(sqlite_store: StoreRoles, monkeypatch: pytest.MonkeyPatch) -> list[HistoryRead]:
    """Every `HistoryRead` the store returns (SubmitToolOutputs and Retry), in order."""
    return recording(monkeypatch, sqlite_store, "get_history_since")


async def sent_context_is_the_stored_one(harness: Harness, session_id: str) -> None:
    """The last run's two model calls carried the stored conversation: up to its input, then
    up to its tool result (the run ends with a final answer)."""
    stored = await harness.store.get_steps(session_id)
    last_input = max(index for index, step in enumerate(stored) if step.role is Role.USER)
    first_call, second_call = harness.model.requests[-2:]
    assert first_call["messages"] == build_context(INSTRUCTIONS, stored[: last_input + 1])
    assert second_call["messages"] == build_context(INSTRUCTIONS, stored[:-1])


async def a_third_run_sends_the_rewritten_log(harness: Harness, session_id: str) -> None:
    """A plain run on the session sends the stored log, whose step 3 was rewritten."""
    harness.model.enqueue(Turn.text("answer three"))
    await harness.run("three", session_id=session_id)
    stored = await harness.store.get_steps(session_id)
    assert stored[2].content == "replacement"
    assert harness.model.requests[-1]["messages"] == build_context(INSTRUCTIONS, stored[:-1])


async def tool_then_answer(harness: Harness, text: str, session_id: str = "") -> str:
    """A run that calls a tool, then answers: four steps. Returns the session id."""
    harness.model.enqueue(
        Turn.tool_calls([ToolCallSpec("echo", '{"text": "x"}')]), Turn.text(f"answer to {text}")
    )
    return (await harness.run(text, session_id=session_id)).session_id


async def test_a_second_run_reads_only_the_steps_after_the_first_runs_history(
    harness: Harness, starts: list[RunStart]
) -> None:
    session_id = await tool_then_answer(harness, "one")
    await tool_then_answer(harness, "two", session_id)

    assert starts[-1].history_start == 5
    assert [step.content for step in starts[-1].history] == ["two"]
    await sent_context_is_the_stored_one(harness, session_id)


@pytest.fixture
async def other(sqlite_store: StoreRoles, fake_model: FakeModelServer) -> AsyncIterator[Harness]:
    """A second runtime on the same store and model: another replica."""
    replica = build_runtime(sqlite_store, fake_model, Gate())
    try:
        yield replica
    finally:
        await replica.runtime.shutdown(grace_s=0)
        await replica.driver.close()


async def test_a_run_by_another_runtime_in_between_is_in_the_next_context(
    harness: Harness, other: Harness, starts: list[RunStart]
) -> None:
    session_id = await tool_then_answer(harness, "one")
    await tool_then_answer(other, "two", session_id)
    await tool_then_answer(harness, "three", session_id)

    assert starts[-1].history_start == 5  # what this runtime held is still the log's start
    assert starts[-1].history[0].content == "two"
    await sent_context_is_the_stored_one(harness, session_id)


async def test_a_retry_elsewhere_that_cut_the_held_history_is_read_whole(
    harness: Harness, other: Harness, starts: list[RunStart]
) -> None:
    session_id = await tool_then_answer(harness, "one")
    await tool_then_answer(harness, "two", session_id)
    # Regenerate run two's final answer on the other runtime: sequence 8 gets a new step.
    other.model.enqueue(Turn.text("a different answer"))
    await other.collect(await other.runtime.retry(session_id, 8))
    await tool_then_answer(harness, "three", session_id)

    assert starts[-1].history_start == 1
    sent = harness.model.requests[-1]["messages"]
    assert "a different answer" in [message["content"] for message in sent]
    await sent_context_is_the_stored_one(harness, session_id)


async def test_a_retry_regenerates_only_from_the_log_it_read(
    harness: Harness, other: Harness, sqlite_store: StoreRoles, monkeypatch: pytest.MonkeyPatch
) -> None:
    harness.model.enqueue(Turn.text("answer one"), Turn.text("answer two"))
    session_id = (await harness.run("one")).session_id  # 1, 2
    await harness.run("two", session_id=session_id)  # 3, 4
    write = sqlite_store.restart_run

    async def edited_first(*args: Any, **kwargs: Any) -> Any:
        # After Retry read the log, another client rewrites it: step 3 becomes
        # "replacement" (3', 4'), with the same sequences.
        monkeypatch.setattr(sqlite_store, "restart_run", write)
        await sqlite_store.delete_steps_from(session_id, 3)
        other.model.enqueue(Turn.text("answer replacement"))
        await other.run("replacement", session_id=session_id)
        harness.model.enqueue(Turn.text("regenerated"))  # one model: queued after other's
        return await write(*args, **kwargs)

    monkeypatch.setattr(sqlite_store, "restart_run", edited_first)
    # Its first write is refused (the log it read from its cache is gone); it reads the log
    # as stored and regenerates from there, and its history is kept for the next run.
    await harness.collect(await harness.runtime.retry(session_id, 4))
    stored = await harness.store.get_steps(session_id)
    assert [step.content for step in stored] == ["one", "answer one", "replacement", "regenerated"]
    assert harness.model.requests[-1]["messages"] == build_context(INSTRUCTIONS, stored[:3])
    await a_third_run_sends_the_rewritten_log(harness, session_id)


async def test_a_run_that_lost_its_session_does_not_keep_its_history(
    harness: Harness, sqlite_store: StoreRoles
) -> None:
    harness.model.enqueue(Turn.text("answer one"))
    session_id = (await harness.run("one")).session_id  # 1, 2
    harness.model.enqueue(
        Turn.tool_calls([ToolCallSpec("wait_for_gate", "{}")]), Turn.text("a late answer")
    )
    handle = await harness.runtime.start_run(RunInput("two", session_id=session_id))  # 3, 4
    await harness.gate.entered.wait()
    # The run's lease lapsed (its process stalled) and another client took the session over,
    # rewrote the log from step 3 and let go of it.
    await sqlite_store.release_session(session_id, handle.run_id)
    await sqlite_store.delete_steps_from(session_id, 3)
    await sqlite_store.take_session(session_id, "run_editor")
    await sqlite_store.append_steps(
        [
            Step(session_id, "run_editor", Role.USER, content="replacement"),
            Step(session_id, "run_editor", Role.ASSISTANT, content="another answer"),
        ]
    )
    await sqlite_store.release_session(session_id, "run_editor")
    harness.gate.release.set()  # the stalled run resumes and stores steps 5 and 6
    async for _ in handle.events():  # not `collect`: its steps 3 and 4 are gone
        pass
    await a_third_run_sends_the_rewritten_log(harness, session_id)


async def test_an_after_step_hook_cannot_change_the_kept_history(
    sqlite_store: StoreRoles, fake_model: FakeModelServer
) -> None:
    def scrub(run: Run, step: Step) -> None:
        step.content = "[scrubbed]"

    harness = build_runtime(sqlite_store, fake_model, Gate(), hooks=Hooks(after_step=[scrub]))
    try:
        fake_model.enqueue(Turn.text("the real answer"), Turn.text("answer two"))
        session_id = (await harness.run("one")).session_id
        await harness.run("two", session_id=session_id)
    finally:
        await harness.runtime.shutdown(grace_s=0)
        await harness.driver.close()

    sent = [message["content"] for message in fake_model.requests[-1]["messages"]]
    assert sent[1:] == ["one", "the real answer", "two"]


async def test_steps_deleted_since_the_last_run_are_not_sent(
    harness: Harness, starts: list[RunStart]
) -> None:
    session_id = await tool_then_answer(harness, "one")
    await tool_then_answer(harness, "two", session_id)
    await harness.store.delete_steps_from(session_id, 5)

    await tool_then_answer(harness, "three", session_id)

    assert starts[-1].history_start == 1
    assert "two" not in [message["content"] for message in harness.model.requests[-2]["messages"]]
    await sent_context_is_the_stored_one(harness, session_id)


async def test_with_the_cache_off_every_run_reads_its_whole_history(
    sqlite_store: StoreRoles, fake_model: FakeModelServer, starts: list[RunStart]
) -> None:
    harness = build_runtime(sqlite_store, fake_model, Gate(), history_cache_bytes=0)
    try:
        session_id = await tool_then_answer(harness, "one")
        await tool_then_answer(harness, "two", session_id)
    finally:
        await harness.runtime.shutdown(grace_s=0)
        await harness.driver.close()

    assert [started.history_start for started in starts] == [1, 1]
    await sent_context_is_the_stored_one(harness, session_id)


async def test_a_submit_on_the_cached_history_reads_none_of_it(
    harness: Harness, reads: list[HistoryRead]
) -> None:
    session_id = await tool_then_answer(harness, "one")  # 1-4, kept
    lookup = ClientTool("lookup", "Look it up.", '{"type": "object"}')
    harness.model.enqueue(Turn.tool_calls([ToolCallSpec("lookup", "{}", id="call_client")]))
    waiting = await harness.run("two", session_id=session_id, client_tools=[lookup])  # 5, 6
    assert waiting.run.status is RunStatus.REQUIRES_ACTION

    harness.model.enqueue(Turn.text("answer to two"))
    read_before = len(reads)
    handle = await harness.runtime.submit_tool_outputs(
        waiting.run_id, [ToolOutput("call_client", "found")]
    )
    await harness.collect(handle)  # 7, 8

    # The waiting run's history was kept; the write checked it is still the log.
    assert len(reads) == read_before
    await sent_context_is_the_stored_one(harness, session_id)
    harness.model.enqueue(Turn.text("answer three"))
    await harness.run("three", session_id=session_id)  # and the continuation's is kept too
    stored = await harness.store.get_steps(session_id)
    assert harness.model.requests[-1]["messages"] == build_context(INSTRUCTIONS, stored[:-1])


async def test_a_retry_regenerates_from_the_held_history_without_reading_it(
    harness: Harness, reads: list[HistoryRead], starts: list[RunStart]
) -> None:
    session_id = await tool_then_answer(harness, "one")  # 1 user, 2 call, 3 result, 4 answer
    harness.model.enqueue(Turn.text("a second answer"))
    read_before = len(reads)

    await harness.collect(await harness.runtime.retry(session_id, 4))

    assert len(reads) == read_before  # the cached 1..4, checked by the write
    stored = await harness.store.get_steps(session_id)
    assert [step.content for step in stored][-1] == "a second answer"
    assert harness.model.requests[-1]["messages"] == build_context(INSTRUCTIONS, stored[:3])
    await tool_then_answer(harness, "two", session_id)
    assert starts[-1].history_start == 5  # the retry's history was kept
    await sent_context_is_the_stored_one(harness, session_id)


# -- the cache on its own ------------------------------------------------------------------


def history(session_id: str, count: int) -> list[Step]:
    return [
        Step(session_id, "run_1", Role.USER, content=f"m{sequence}", sequence=sequence)
        for sequence in range(1, count + 1)
    ]


# Room for `steps` of `history`'s short steps (a little over, for the longer numbers).
def room_for(steps: int) -> int:
    return steps * step_bytes(history("x", 1)[0]) + steps


def test_the_cache_holds_whole_histories_only() -> None:
    cache = HistoryCache(room_for(100))
    cache.remember("a", history("a", 3)[1:])  # starts at 2
    cache.remember("b", [])
    gapped = history("c", 4)
    del gapped[1]
    cache.remember("c", gapped)

    assert len(cache) == 0
    assert cache.cached("a").mark is None


def test_a_session_is_held_for_its_tenants_calls_only() -> None:
    cache = HistoryCache(room_for(100))
    cache.remember("a", history("a", 3), tenant="tenant-a")

    assert cache.cached("a", tenant="tenant-b").steps == ()
    assert len(cache.cached("a", tenant="tenant-a").steps) == 3
    assert len(cache.cached("a").steps) == 3  # the engine's own: any tenant


def test_the_least_recently_used_sessions_go_first_past_the_bound() -> None:
    cache = HistoryCache(room_for(10))
    cache.remember("a", history("a", 4))
    cache.remember("b", history("b", 4))
    cache.cached("a")  # used: b is now the oldest
    cache.remember("c", history("c", 4))

    assert cache.cached("b").mark is None
    assert cache.cached("a").mark == HistoryMark(4, history_last_id(cache, "a"))
    assert len(cache) == 8
    cache.remember("d", history("d", 11))  # larger than the bound: not held
    assert cache.cached("d").mark is None


def test_what_a_run_holds_does_not_change_when_the_session_is_remembered_again() -> None:
    cache = HistoryCache(room_for(100))
    first = history("a", 3)
    cache.remember("a", first)
    cached = cache.cached("a")
    cache.remember("a", history("a", 6))

    assert cached.steps == tuple(first)
    assert len(cache) == 6


def test_joining_a_read_that_does_not_follow_the_held_history_fails() -> None:
    cache = HistoryCache(room_for(100))
    steps = history("a", 5)
    cache.remember("a", steps[:3])
    cached = cache.cached("a")
    after = RunStart(
        run=Run(session_id="a", agent="assistant"),
        steps=steps[4:],
        history=steps[4:],
        history_start=5,
    )

    with pytest.raises(ValueError, match="does not follow"):
        cached.join(after.history_start, after.history)
    follows = RunStart(
        run=Run(session_id="a", agent="assistant"),
        steps=steps[4:],
        history=steps[3:],
        history_start=4,
    )
    assert cached.join(follows.history_start, follows.history) == steps


def test_the_bound_is_memory_so_long_texts_count_for_what_they_take() -> None:
    cache = HistoryCache(100_000)
    short = history("short", 50)
    long = history("long", 2)
    long[1].tool_calls = [ToolCall("call_1", "fetch", '{"page": "' + "x" * 30_000 + '"}')]
    long[1].content = "y" * 30_000
    cache.remember("short", short)
    cache.remember("long", long)

    # 50 short steps and 2 long ones fit; the long ones take ~60 kB of it.
    assert cache.size == sum(map(step_bytes, short)) + sum(map(step_bytes, long))
    assert step_bytes(long[1]) > 60_000 + STEP_OVERHEAD_BYTES
    cache.remember("more", history("more", 20))  # no room for both: the oldest goes
    assert cache.cached("short").mark is None
    assert cache.cached("long").mark is not None
    huge = history("huge", 1)
    huge[0].content = "z" * 200_000  # more than the whole bound: never held
    cache.remember("huge", huge)
    assert cache.cached("huge").mark is None
    assert cache.size <= 100_000


def test_a_grown_history_is_measured_as_a_whole_one_is() -> None:
    cache = HistoryCache(room_for(100))
    steps = history("a", 9)
    cache.remember("a", steps[:3])
    grown = [*cache.cached("a").steps, *steps[3:]]  # what a run hands back: held, then new
    cache.remember("a", grown)
    assert cache.size == sum(map(step_bytes, steps))
    longer = history("a", 9)  # as long, other objects with other texts: measured afresh
    longer[0].content = "a much longer first message" * 10
    cache.remember("a", longer)
    assert cache.size == sum(map(step_bytes, longer)) > sum(map(step_bytes, steps))
    cache.forget("a")
    assert (cache.size, len(cache)) == (0, 0)


def history_last_id(cache: HistoryCache, session_id: str) -> str:
    return cache.cached(session_id).steps[-1].id
