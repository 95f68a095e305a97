"""Compaction on both backends: the trigger, the cut, the summary step and its event, what
the next model request holds, fork and retry around a summary, recovery from the provider's
context_length_exceeded, the stop when nothing fits, CompactSession, and a long session.

The real runtime on a real store, the openai client talking HTTP to the fake model, whose
`context_window` refuses prompts over it exactly as OpenAI does.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from dataclasses import replace

import pytest

from agio_grpc.domain import SUMMARY_PREFIX, Role, Step, StepMetrics, StopReason, ToolCall
from agio_grpc.engine import AgentSpec, Runtime, RuntimeOptions
from agio_grpc.engine.agents import Compaction, Limits
from agio_grpc.engine.compaction import (
    ESTIMATE,
    plan_compaction,
)
from agio_grpc.engine.context import context_steps
from agio_grpc.engine.context_window import LEARNED_WINDOWS
from agio_grpc.engine.errors import CompactionFailedError
from agio_grpc.engine.events import ContextCompacted
from agio_grpc.engine.models.openai_chat import OpenAIModelDriver
from agio_grpc.engine.session_compaction import SessionCompactor
from agio_grpc.engine.tracing import NO_TRACER
from agio_grpc.store.errors import RunRequiresActionError, SessionBusyError
from agio_grpc.testing import FakeModelServer, ToolCallSpec, Turn
from agio_grpc.testing.chat_request import estimate_prompt_tokens
from tests.engine.harness import (
    FAST_RETRIES,
    INSTRUCTIONS,
    LOOKUP,
    Gate,
    Harness,
    make_registry,
    storage_of,
)
from tests.engine.test_runtime import segment_task_done, without_deltas
from tests.roles import StoreRoles

WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa "
FRENCH = "le café crème est déjà prêt à côté "
"""Accented text: the estimate counts it a token a character, four times the tokens the fake
model reports for it (its words)."""
ASSUMED_WINDOW = 128_000
"""The window assumed for a model of no known family, such as the fake model."""


def compacting_agent(window: int, keep: int = 2, ratio: float = 0.5) -> AgentSpec:
    return AgentSpec(
        name="assistant",
        model="fake-model",
        instructions=INSTRUCTIONS,
        tools=["calculate"],
        limits=Limits(max_steps=20),
        compaction=Compaction(
            context_window_tokens=window, trigger_ratio=ratio, keep_recent_steps=keep
        ),
    )


@pytest.fixture
async def fake() -> AsyncIterator[FakeModelServer]:
    async with FakeModelServer() as server:
        yield server


async def running(
    store: StoreRoles, fake: FakeModelServer, agent: AgentSpec, history_cache_bytes: int = 0
) -> Harness:
    """A runtime with `agent`; by default it reads every history from the store, where
    steps carry no token reports (the estimates count everything)."""
    driver = OpenAIModelDriver(base_url=fake.base_url, api_key="k", retry=FAST_RETRIES)
    runtime = Runtime(
        storage_of(store),
        {"assistant": agent},
        "assistant",
        make_registry(Gate()),
        driver,
        options=RuntimeOptions(history_cache_bytes=history_cache_bytes),
    )
    return Harness(runtime, store, fake, Gate(), driver)


@pytest.fixture
async def small(store: StoreRoles, fake: FakeModelServer) -> AsyncIterator[Harness]:
    """A window of 1,000 tokens, compacting above half of it, keeping 2 steps."""
    built = await running(store, fake, compacting_agent(1_000))
    try:
        yield built
    finally:
        await built.runtime.shutdown(grace_s=0)
        await built.driver.close()


def compactor_of(harness: Harness, store: StoreRoles) -> SessionCompactor:
    """CompactSession's engine side, on the harness's runtime, model and store."""
    return SessionCompactor(
        store, harness.driver, make_registry(Gate()), NO_TRACER, harness.runtime.agent
    )


async def two_turns(harness: Harness) -> str:
    """A session of two short turns; its id."""
    first = await harness.run(WORDS)
    await harness.run(WORDS, session_id=first.session_id)
    return first.session_id


async def backlog(store: StoreRoles, steps: int) -> str:
    """A session holding `steps` steps of earlier runs, user and assistant by turns, of 51
    words (about 78 tokens estimated) each; its id."""
    session = await store.new_session()
    roles = (Role.USER, Role.ASSISTANT)
    await store.append_steps(
        [
            Step(session.id, "run_old", roles[n % 2], content=f"{n}: {WORDS * 5}")
            for n in range(steps)
        ]
    )
    return session.id


def prompt_sizes(fake: FakeModelServer, since: int = 0) -> list[int]:
    """The size of each request the fake model got from the `since`th on, as it measures
    them against its window."""
    return [estimate_prompt_tokens(body) for body in fake.requests[since:]]


def chat_messages(fake: FakeModelServer) -> list[list[dict[str, object]]]:
    """The messages of each agent request the fake model got (summary requests left out)."""
    return [
        body["messages"]
        for body in fake.requests
        if "compact the conversation" not in str(body["messages"][0]["content"])
    ]


async def test_the_trigger_fires_at_the_ratio_and_the_next_request_is_summary_plus_recent(
    small: Harness,
) -> None:
    first = await small.run(WORDS * 10)  # ~140 tokens estimated, ~280 with the reply
    assert not first.of(ContextCompacted)
    session = first.session_id
    second = await small.run(WORDS * 3, session_id=session)  # ~340: under the trigger of 500
    assert not second.of(ContextCompacted)
    third = await small.run(WORDS * 10, session_id=session)  # past 500: compacts first

    (compacted,) = third.of(ContextCompacted)
    assert compacted.trigger == "threshold"
    assert compacted.tokens_before > 500 > compacted.tokens_after
    (summary,) = third.steps_of(Role.SUMMARY)
    assert (compacted.step_id, compacted.sequence) == (summary.id, summary.sequence)
    # Keeping 2 steps (4, 5) of 1..5: the cut falls before 4, an assistant step.
    assert (summary.summary_first_sequence, summary.summary_last_sequence) == (1, 3)
    assert (compacted.first_sequence, compacted.last_sequence) == (1, 3)
    assert summary.content.startswith("Summary: ")
    assert summary.metrics.model_name  # the summary call's own metrics
    # The log keeps everything; the summary is stored after the steps it covers.
    log = await small.history(session)
    assert [s.role for s in log] == [
        Role.USER, Role.ASSISTANT, Role.USER, Role.ASSISTANT, Role.USER, Role.SUMMARY,
        Role.ASSISTANT,
    ]  # fmt: skip
    # The model then got: system, the summary, the kept steps (4, 5) only.
    last = chat_messages(small.model)[-1]
    assert [m["role"] for m in last] == ["system", "user", "assistant", "user"]
    assert str(last[1]["content"]).startswith(SUMMARY_PREFIX)
    assert last[3]["content"] == WORDS * 10
    # GetContext shows exactly that, and the reply after it.
    context = await small.runtime.next_context(session)
    assert [s.sequence for s in context] == [0, 6, 4, 5, 7]


async def test_a_compaction_measures_its_tokens_after_as_its_tokens_before(
    store: StoreRoles, fake: FakeModelServer
) -> None:
    # Histories kept between runs carry the model's reports: the estimate before a call is
    # the provider's count of the last one plus the estimate of what came since.
    built = await running(store, fake, compacting_agent(1_000), history_cache_bytes=64_000_000)
    outcomes = []
    try:
        session = None
        for turn in range(5):
            outcome = await built.run(f"{turn}: " + FRENCH * 4, session_id=session)
            session = outcome.session_id
            outcomes.append(outcome)
    finally:
        await built.runtime.shutdown(grace_s=0)
        await built.driver.close()

    assert [len(outcome.of(ContextCompacted)) for outcome in outcomes] == [0, 0, 0, 0, 1]
    # The fifth turn passes the trigger of 500. The part summarized brings it under, measured
    # as before was (the count of the rest alone, ~1,100, is over): no second part follows.
    (compacted,) = outcomes[4].of(ContextCompacted)
    assert compacted.trigger == "threshold"
    assert compacted.tokens_before > 500 >= compacted.tokens_after
    # And the provider's count of the call after it is within the estimate.
    (reply,) = outcomes[4].steps_of(Role.ASSISTANT)
    assert 0 < reply.metrics.input_tokens <= compacted.tokens_after


async def test_the_compaction_event_replays_from_the_journal_as_it_was_streamed(
    small: Harness,
) -> None:
    first = await small.run(WORDS * 20)
    outcome = await small.run(WORDS * 20, session_id=first.session_id)
    assert outcome.of(ContextCompacted)
    await segment_task_done(small, outcome.run_id)
    replay = [e async for e in small.follow(outcome.run_id)]
    assert replay == without_deltas(outcome.events)
    kinds = [e.event.type for e in replay]
    at = kinds.index("context_compacted")
    assert kinds[at - 1] == "step_completed"  # the summary step, then its event


async def test_a_cut_never_splits_a_tool_call_from_its_result(
    store: StoreRoles, fake: FakeModelServer
) -> None:
    built = await running(store, fake, compacting_agent(1_000, keep=1))
    try:
        first = await built.run("What is 12 * 7? " + WORDS * 20)  # user, call, result, reply
        session = first.session_id
        outcome = await built.run("And 3 + 4? " + WORDS * 30, session_id=session)
    finally:
        await built.runtime.shutdown(grace_s=0)
        await built.driver.close()
    (summary,) = outcome.steps_of(Role.SUMMARY)
    log = await store.get_steps(session)
    covered = [s for s in log if s.sequence <= summary.summary_last_sequence]
    kept = [s for s in log if s.sequence > summary.summary_last_sequence]
    call_ids = {c.id for s in covered for c in s.tool_calls}
    assert {s.tool_call_id for s in covered if s.role is Role.TOOL} == call_ids
    assert kept[0].role in (Role.USER, Role.ASSISTANT)
    for messages in chat_messages(fake):
        for index, message in enumerate(messages):
            if message["role"] == "tool":
                assert messages[index - 1]["role"] in ("assistant", "tool")


async def test_fork_and_retry_before_a_summary_use_the_original_steps(small: Harness) -> None:
    first = await small.run(WORDS * 20)
    session = first.session_id
    await small.run(WORDS * 40, session_id=session)
    log = await small.history(session)
    (summary,) = [s for s in log if s.role is Role.SUMMARY]

    before = await small.store.fork_session(session, summary.sequence - 1)
    assert [s.role for s in await small.runtime.next_context(before.id)][:2] == [
        Role.SYSTEM,
        Role.USER,
    ]
    assert Role.SUMMARY not in {s.role for s in await small.runtime.next_context(before.id)}
    after = await small.store.fork_session(session, summary.sequence)
    forked = await small.runtime.next_context(after.id)
    assert forked[1].role is Role.SUMMARY
    assert forked[1].content == summary.content
    # A retry from the summary deletes it: the run starts from the original steps (and,
    # still over the trigger, compacts them afresh).
    retried = await small.runtime.retry(session, summary.sequence)
    outcome = await small.collect(retried)
    assert outcome.reason is StopReason.COMPLETED
    assert summary.id not in {s.id for s in await small.history(session)}


async def test_a_provider_overflow_compacts_and_calls_again(
    store: StoreRoles, fake: FakeModelServer
) -> None:
    # A window the service's own estimate never nears: only the provider refuses.
    built = await running(store, fake, compacting_agent(100_000))
    try:
        first = await built.run(WORDS * 5)
        session = first.session_id
        await built.run(WORDS * 5, session_id=session)
        # ~410 words with the new input: refused until the earlier turns are summarized.
        fake.context_window = 300
        outcome = await built.run(WORDS * 20, session_id=session)
    finally:
        await built.runtime.shutdown(grace_s=0)
        await built.driver.close()

    assert outcome.reason is StopReason.COMPLETED
    compactions = outcome.of(ContextCompacted)
    assert {compacted.trigger for compacted in compactions} == {"overflow"}
    # Everything but the latest exchange is summarized, the last summary taking it all in.
    assert (compactions[-1].first_sequence, compactions[-1].last_sequence) == (1, 3)
    prompts = [estimate_prompt_tokens(body) for body in fake.requests[2:]]
    assert prompts[0] > 300 >= max(prompts[1:])  # refused; the summaries and the call fit


async def test_a_context_that_cannot_fit_stops_context_window(small: Harness) -> None:
    small.model.context_window = 5
    outcome = await small.run(WORDS)  # one turn: nothing older to summarize
    assert outcome.reason is StopReason.CONTEXT_WINDOW
    assert outcome.run.stop_signal is not None
    assert "maximum context length" in outcome.run.stop_signal.message
    assert not outcome.of(ContextCompacted)


async def test_a_backlog_over_the_window_a_refusal_states_is_summarized_a_part_at_a_time(
    store: StoreRoles, fake: FakeModelServer, caplog: pytest.LogCaptureFixture
) -> None:
    # The model is of no known family: its window is assumed to be 128,000 tokens, and the
    # provider's is 1,000 (a session moved to a smaller model is the same case).
    built = await running(store, fake, compacting_agent(ASSUMED_WINDOW, ratio=0.8))
    fake.context_window = 1_000
    try:
        session = await backlog(store, 30)  # ~1,530 words
        with caplog.at_level(logging.WARNING, logger="agio_grpc.engine.context_window"):
            outcome = await built.run("What now?", session_id=session)
        sent = len(fake.requests)
        # Another session of the same size, on the same model, once the window is known.
        later = await built.run("What now?", session_id=await backlog(store, 30))
    finally:
        await built.runtime.shutdown(grace_s=0)
        await built.driver.close()

    assert outcome.reason is StopReason.COMPLETED
    compactions = outcome.of(ContextCompacted)
    assert len(compactions) > 1
    assert {compacted.trigger for compacted in compactions} == {"overflow"}
    assert (compactions[-1].first_sequence, compactions[-1].last_sequence) == (1, 29)
    # Only the first call was refused: each summary request held what fits half the window.
    sizes = prompt_sizes(fake)[:sent]
    assert sizes[0] > 1_000 >= max(sizes[1:])
    context = await built.runtime.next_context(session)
    assert [step.sequence for step in context][2:4] == [30, 31]  # the latest exchange
    assert [step.role for step in context][:2] == [Role.SYSTEM, Role.SUMMARY]
    assert LEARNED_WINDOWS.window("fake-model", ASSUMED_WINDOW) == 1_000
    (record,) = [r for r in caplog.records if r.name == "agio_grpc.engine.context_window"]
    assert "fake-model" in record.getMessage()
    assert "1000 tokens" in record.getMessage()
    # The learned window holds from then on: the threshold compacts before any refusal.
    assert later.reason is StopReason.COMPLETED
    assert {compacted.trigger for compacted in later.of(ContextCompacted)} == {"threshold"}
    assert max(prompt_sizes(fake, since=sent)) <= 1_000


async def test_a_summary_request_refused_without_a_stated_window_is_made_on_a_smaller_part(
    store: StoreRoles, fake: FakeModelServer
) -> None:
    built = await running(store, fake, compacting_agent(ASSUMED_WINDOW, ratio=0.8))
    fake.context_window = 1_000
    fake.refusal_states_window = False  # as llama.cpp's: "exceeds the available context size"
    try:
        session = await backlog(store, 30)
        outcome = await built.run("What now?", session_id=session)
    finally:
        await built.runtime.shutdown(grace_s=0)
        await built.driver.close()

    assert outcome.reason is StopReason.COMPLETED
    compactions = outcome.of(ContextCompacted)
    assert {compacted.trigger for compacted in compactions} == {"overflow"}
    assert (compactions[-1].first_sequence, compactions[-1].last_sequence) == (1, 29)
    # Refused: the call, then the summary request of the whole backlog; its halves fit.
    sizes = prompt_sizes(fake)
    assert min(sizes[:2]) > 1_000 >= max(sizes[2:])
    assert LEARNED_WINDOWS.window("fake-model", ASSUMED_WINDOW) == ASSUMED_WINDOW


async def test_a_turn_too_long_for_any_summary_request_stops_context_window(
    store: StoreRoles, fake: FakeModelServer
) -> None:
    built = await running(store, fake, compacting_agent(ASSUMED_WINDOW, ratio=0.8))
    fake.context_window = 200
    session = await store.new_session()
    await store.append_steps(
        [
            Step(session.id, "run_old", Role.USER, content=WORDS * 40),  # 400 words
            Step(session.id, "run_old", Role.ASSISTANT, content="Noted."),
        ]
    )
    try:
        outcome = await built.run("What now?", session_id=session.id)
    finally:
        await built.runtime.shutdown(grace_s=0)
        await built.driver.close()

    # Not a model error: the first turn alone is longer than a summary request may be.
    assert outcome.reason is StopReason.CONTEXT_WINDOW
    signal = outcome.run.stop_signal
    assert signal is not None
    assert "maximum context length is 200 tokens" in signal.message
    assert signal.context == {"status_code": 400, "error_code": "context_length_exceeded"}
    assert not outcome.of(ContextCompacted)
    assert Role.SUMMARY not in {step.role for step in await store.get_steps(session.id)}
    assert [size > 200 for size in prompt_sizes(fake)] == [True, True]  # the call, the summary


async def test_compact_session_between_runs(small: Harness, store: StoreRoles) -> None:
    small.model.context_window = None
    first = await small.run(WORDS * 2)
    session = first.session_id
    await small.run(WORDS * 2, session_id=session)
    await small.run(WORDS * 2, session_id=session)
    compactor = compactor_of(small, store)
    done = await compactor.compact(session, keep_recent_steps=2)
    assert done.summary is not None
    assert (done.summary.summary_first_sequence, done.summary.summary_last_sequence) == (1, 4)
    assert done.tokens_after < done.tokens_before
    context = await small.runtime.next_context(session)
    assert [s.sequence for s in context] == [0, 7, 5, 6]
    # Nothing left to summarize: no new summary.
    again = await compactor.compact(session, keep_recent_steps=2)
    assert again.summary is None
    assert again.tokens_before == again.tokens_after


async def test_compact_session_summarizes_a_long_backlog_a_part_at_a_time(
    small: Harness, store: StoreRoles
) -> None:
    # ~3,000 tokens: six times the 500 one summary request may hold
    session = await backlog(store, 40)
    compactor = compactor_of(small, store)
    done = await compactor.compact(session, keep_recent_steps=2)
    assert done.summary is not None
    assert (done.summary.summary_first_sequence, done.summary.summary_last_sequence) == (1, 38)
    summaries = [s for s in await store.get_steps(session) if s.role is Role.SUMMARY]
    assert len(summaries) > 1
    assert [s.summary_first_sequence for s in summaries] == [1] * len(summaries)
    context = await small.runtime.next_context(session)
    assert [s.sequence for s in context] == [0, done.summary.sequence, 39, 40]
    assert done.tokens_after < done.tokens_before / 5


async def test_compact_session_makes_a_refused_summary_request_on_a_smaller_part(
    small: Harness, store: StoreRoles
) -> None:
    small.model.context_window = 200
    small.model.refusal_states_window = False
    session = await backlog(store, 12)
    done = await compactor_of(small, store).compact(session, keep_recent_steps=2)
    assert done.summary is not None
    assert (done.summary.summary_first_sequence, done.summary.summary_last_sequence) == (1, 10)
    summaries = [s for s in await store.get_steps(session) if s.role is Role.SUMMARY]
    assert [s.summary_first_sequence for s in summaries] == [1] * len(summaries)
    # Refused until the part was small enough; every part after it was made that small.
    fits = [size <= 200 for size in prompt_sizes(small.model)]
    refused = fits.index(True)
    assert refused > 0
    assert all(fits[refused:])
    assert len(fits) - refused == len(summaries)


async def test_compact_session_refuses_a_session_waiting_for_tool_outputs(
    small: Harness, store: StoreRoles
) -> None:
    small.model.enqueue(Turn.tool_calls([ToolCallSpec("lookup", "{}")]))
    first = await small.run(WORDS, client_tools=[LOOKUP])
    assert first.reason is StopReason.REQUIRES_ACTION
    compactor = compactor_of(small, store)
    with pytest.raises(RunRequiresActionError):
        await compactor.compact(first.session_id, keep_recent_steps=0)


async def test_compact_session_refuses_a_held_session_and_writes_nothing(
    small: Harness, store: StoreRoles
) -> None:
    session_id = await two_turns(small)
    await store.take_session(session_id, "run_holding")
    with pytest.raises(SessionBusyError):
        await compactor_of(small, store).compact(session_id, keep_recent_steps=0)
    assert Role.SUMMARY not in {s.role for s in await small.history(session_id)}


async def test_a_failing_summary_call_is_a_compaction_failed_error(
    small: Harness, store: StoreRoles
) -> None:
    session_id = await two_turns(small)
    small.model.enqueue(Turn.error(400, message="bad summary request"))
    with pytest.raises(CompactionFailedError):
        await compactor_of(small, store).compact(session_id, keep_recent_steps=1)
    assert Role.SUMMARY not in {s.role for s in await small.history(session_id)}


async def test_a_2000_step_session_keeps_every_request_under_the_window(
    store: StoreRoles, fake: FakeModelServer
) -> None:
    session = await store.new_session()
    for start in range(0, 2000, 200):
        await store.append_steps(
            [
                Step(
                    session.id,
                    "run_old",
                    Role.USER if n % 2 == 0 else Role.ASSISTANT,
                    content=f"step {start + n}: " + WORDS,
                )
                for n in range(200)
            ]
        )
    window = 4_000
    fake.context_window = window
    built = await running(store, fake, compacting_agent(window, keep=20, ratio=0.8))
    try:
        for turn in range(5):
            outcome = await built.run(f"turn {turn}: " + WORDS, session_id=session.id)
            assert outcome.reason is StopReason.COMPLETED
    finally:
        await built.runtime.shutdown(grace_s=0)
        await built.driver.close()
    assert all(estimate_prompt_tokens(body) <= window for body in fake.requests)
    log = await store.get_steps(session.id)
    assert len(log) > 2010  # every original step is still there
    summaries = [s for s in log if s.role is Role.SUMMARY]
    assert summaries
    assert summaries[-1].summary_first_sequence == 1


def test_a_plan_keeps_the_recent_steps_and_the_latest_turn() -> None:
    steps = [
        Step("s", "r", role, content="x", sequence=n, tool_call_id=call_id, tool_calls=calls)
        for n, (role, call_id, calls) in enumerate(
            [
                (Role.USER, "", []),
                (Role.ASSISTANT, "", [_call("a")]),
                (Role.TOOL, "a", []),
                (Role.ASSISTANT, "", []),
                (Role.USER, "", []),
                (Role.ASSISTANT, "", [_call("b")]),
                (Role.TOOL, "b", []),
            ],
            start=1,
        )
    ]
    plan = plan_compaction(steps, keep_recent_steps=0)
    assert plan is not None
    assert plan.last_sequence == 5  # the latest turn (6, 7) is kept
    plan = plan_compaction(steps, keep_recent_steps=3)
    assert plan is not None
    assert plan.last_sequence == 4  # never between a call and its result
    assert plan_compaction(steps, keep_recent_steps=7) is None
    summary = Step("s", "r", Role.SUMMARY, content="sum", sequence=8,
                   summary_first_sequence=1, summary_last_sequence=4)  # fmt: skip
    context = context_steps("sys", [*steps, summary])
    assert [s.sequence for s in context] == [0, 8, 5, 6, 7]
    again = plan_compaction([*steps, replace(summary)], keep_recent_steps=0)
    assert again is not None
    assert (again.first_sequence, again.last_sequence) == (1, 5)


def _call(call_id: str) -> ToolCall:
    return ToolCall(call_id, "calculate", "{}")


def test_the_estimate_read_off_the_history_equals_the_built_contexts() -> None:
    history = [
        Step("s", "r", role, content=f"{WORDS * n} é", sequence=n, tool_call_id=call_id,
             tool_calls=calls)
        for n, (role, call_id, calls) in enumerate(
            [
                (Role.USER, "", []),
                (Role.ASSISTANT, "", [_call("a")]),
                (Role.TOOL, "a", []),
                (Role.ASSISTANT, "", []),
                (Role.USER, "", []),
            ],
            start=1,
        )
    ]  # fmt: skip
    tools = [{"type": "function", "function": {"name": "calculate", "parameters": {}}}]
    summary = Step("s", "r", Role.SUMMARY, content="sum", sequence=6,
                   summary_first_sequence=1, summary_last_sequence=3)  # fmt: skip
    for steps in (history, [*history, summary]):
        built = context_steps("be brief", steps)
        assert ESTIMATE.history("be brief", steps, tools) == ESTIMATE.prompt(built, tools)
    # With the model's report for the last call, only what came after it is estimated.
    reported = replace(history[3], metrics=StepMetrics(input_tokens=1_000))
    steps = [*history[:3], reported, history[4]]
    expected = 1_000 + ESTIMATE.step(reported) + ESTIMATE.step(history[4])
    assert ESTIMATE.history("be brief", steps, tools) == expected
