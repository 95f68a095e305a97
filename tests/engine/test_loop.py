"""The run loop end to end: real openai client -> fake model over HTTP, real SQLite store.

Each test reads like a specification of one behaviour of DESIGN.md section 3. The harness
checks on every stream that seqs are gapless, that exactly one terminal event ends it, and
that each StepCompleted step is in the store when it is published.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import Any, cast

import pytest

from agio_grpc.domain import Role, RunStatus, Step, StopReason, StopSignal
from agio_grpc.engine import (
    AgentNotFoundError,
    AgentSpec,
    ErrorNotice,
    InvalidInputError,
    RunFailed,
    RunInput,
    RunOverrides,
    RunStarted,
    Runtime,
    SequencedEvent,
    StepCompleted,
    StepDelta,
    StepStarted,
    StopRun,
    ToolProgress,
)
from agio_grpc.engine.hooks import Hooks
from agio_grpc.engine.progress import MAX_PROGRESS_PER_CALL
from agio_grpc.store.errors import (
    DuplicateRequestError,
    NotFoundError,
    SessionBusyError,
    StoreUnavailableError,
)
from agio_grpc.store.records import Journal
from agio_grpc.testing import FakeModelServer, ToolCallSpec, Turn, UsageSpec
from tests.engine.harness import (
    INSTRUCTIONS,
    TEST_TOOLS,
    Gate,
    Harness,
    assert_valid_messages,
    build_runtime,
    own,
    storage_of,
)
from tests.roles import StoreRoles


async def test_plain_reply_completes_with_one_stored_assistant_step(harness: Harness) -> None:
    harness.model.enqueue(Turn.text("Hello, human.", chunks=3))
    outcome = await harness.run("hi")

    kinds = [type(e.event).__name__ for e in outcome.events]
    assert kinds[:4] == ["RunStarted", "StepCompleted", "StepStarted", "StepDelta"]
    assert kinds[-2:] == ["StepCompleted", "RunCompleted"]
    assert [s.role for s in outcome.steps] == [Role.USER, Role.ASSISTANT]
    user, assistant = outcome.steps
    assert (user.content, user.sequence, assistant.sequence) == ("hi", 1, 2)
    assert assistant.content == "Hello, human."
    started = outcome.of(StepStarted)[0]
    assert started.step_id == assistant.id
    assert all(d.step_id == assistant.id for d in outcome.of(StepDelta))

    run = outcome.run
    assert run.status is RunStatus.COMPLETED
    assert run.stop_signal == StopSignal(StopReason.COMPLETED, "", "model")
    assert (run.step_count, run.tool_call_count) == (2, 0)
    assert (run.first_sequence, run.last_sequence) == (1, 2)
    metrics = assistant.metrics
    assert run.usage.total_tokens == metrics.total_tokens > 0
    assert metrics.total_tokens == metrics.input_tokens + metrics.output_tokens
    assert (metrics.model_name, metrics.provider, metrics.retries) == (
        "fake-model",
        "openai_compatible",
        0,
    )
    assert metrics.duration_ms >= metrics.first_token_latency_ms >= 0
    assert run.end_time is not None
    assert run.last_event_seq == outcome.events[-1].seq
    stored = await harness.store.get_run(run.id)
    assert (stored.status, stored.stop_signal, stored.last_sequence) == (
        run.status,
        run.stop_signal,
        2,
    )
    assert (await harness.store.get_session(outcome.session_id)).active_run_id == ""
    # The run_started event still shows the run as it started: the loop's later changes to
    # its run do not reach the snapshot an event carries.
    (opening,) = outcome.of(RunStarted)
    assert (opening.run.status, opening.run.step_count, opening.run.last_sequence) == (
        RunStatus.RUNNING,
        1,
        1,
    )
    assert (opening.run.usage.total_tokens, opening.run.stop_signal) == (0, None)


async def test_the_model_receives_system_prompt_history_and_tools(harness: Harness) -> None:
    harness.model.enqueue(Turn.text("one"), Turn.text("two"))
    first = await harness.run("first")
    await harness.run("second", session_id=first.session_id)
    request = harness.model.requests[-1]
    assert request["messages"] == [
        {"role": "system", "content": INSTRUCTIONS},
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "one"},
        {"role": "user", "content": "second"},
    ]
    assert {tool["function"]["name"] for tool in request["tools"]} == set(TEST_TOOLS)


async def test_a_tool_call_is_executed_stored_and_answered(harness: Harness) -> None:
    outcome = await harness.run("What is 12 * 7?")  # the fake's default: calls calculate

    assert [s.role for s in outcome.steps] == [Role.USER, Role.ASSISTANT, Role.TOOL, Role.ASSISTANT]
    _, call_step, tool_step, answer = outcome.steps
    (call,) = call_step.tool_calls
    assert call.name == "calculate"
    assert (tool_step.tool_call_id, tool_step.name, tool_step.content) == (
        call.id,
        "calculate",
        "84",
    )
    assert not tool_step.is_error
    assert answer.content == "The result is 84."
    tool_started = [s for s in outcome.of(StepStarted) if s.role is Role.TOOL]
    assert [(s.step_id, s.tool_call_id, s.name) for s in tool_started] == [
        (tool_step.id, call.id, "calculate")
    ]
    assert outcome.reason is StopReason.COMPLETED
    assert outcome.run.tool_call_count == 1
    assert outcome.run.usage.total_tokens == sum(
        s.metrics.total_tokens for s in outcome.steps_of(Role.ASSISTANT)
    )


async def test_a_sync_tool_s_progress_streams_from_its_thread_and_stops_with_the_call(
    harness: Harness,
) -> None:
    call = ToolCallSpec("report", '{"steps": 3}', id="call_r")
    harness.model.enqueue(Turn.tool_calls([call]), Turn.text("Done."))

    outcome = await harness.run("Report")

    kinds = [event.event.type for event in outcome.events]
    progress = outcome.of(ToolProgress)
    [tool_step] = outcome.steps_of(Role.TOOL)
    assert [p.message for p in progress] == ["step 1 of 3", "step 2 of 3", "step 3 of 3"]
    assert {(p.step_id, p.tool_call_id, p.name, p.state) for p in progress} == {
        (tool_step.id, "call_r", "report", "WORKING")
    }
    tool_started = next(
        i
        for i, e in enumerate(outcome.events)
        if isinstance(e.event, StepStarted) and e.event.role is Role.TOOL
    )
    assert kinds[tool_started + 1 : tool_started + 4] == ["tool_progress"] * 3
    assert tool_step.content == "reported"
    [kept] = harness.gate.contexts
    # Once the call is over its context reports to nobody: the run's stream has ended.
    kept.report_progress("after the call")


async def test_a_call_publishes_at_most_its_share_of_progress(harness: Harness) -> None:
    flood = MAX_PROGRESS_PER_CALL + 5
    harness.model.enqueue(
        Turn.tool_calls([ToolCallSpec("report", json.dumps({"steps": flood}))]),
        Turn.text("Done."),
    )
    outcome = await harness.run("Report a lot")
    progress = outcome.of(ToolProgress)
    assert len(progress) == MAX_PROGRESS_PER_CALL
    assert progress[-1].message == f"step {MAX_PROGRESS_PER_CALL} of {flood}"
    assert outcome.reason is StopReason.COMPLETED


async def test_parallel_tool_calls_are_stored_in_call_order(harness: Harness) -> None:
    harness.model.enqueue(
        Turn.tool_calls(
            [
                ToolCallSpec("wait_for_gate", '{"label": "slow"}', id="call_slow"),
                ToolCallSpec("echo", '{"text": "quick"}', id="call_quick"),
            ]
        ),
        Turn.text("both done"),
    )

    async def release_when_waiting() -> None:
        await harness.gate.entered.wait()
        harness.gate.release.set()

    releaser = asyncio.create_task(release_when_waiting())
    outcome = await harness.run("go")
    await releaser
    tools = outcome.steps_of(Role.TOOL)
    assert [(t.tool_call_id, t.content) for t in tools] == [
        ("call_slow", "released slow"),
        ("call_quick", "quick"),
    ]
    assert tools[0].sequence + 1 == tools[1].sequence
    assert all(t.metrics.tool_exec_time_ms >= 0 for t in tools)
    assert outcome.reason is StopReason.COMPLETED


async def test_a_failing_tool_is_an_error_step_the_model_sees(harness: Harness) -> None:
    harness.model.enqueue(
        Turn.tool_calls([ToolCallSpec("explode", '{"reason": "no disk"}')]), Turn.text("sorry")
    )
    outcome = await harness.run("try it")
    (tool,) = outcome.steps_of(Role.TOOL)
    assert tool.is_error
    assert tool.content == "Error: tool 'explode' failed: RuntimeError: no disk"
    (notice,) = outcome.of(ErrorNotice)
    assert (notice.reason, notice.source) == ("TOOL_FAILED", "tool:explode")
    assert harness.model.requests[-1]["messages"][-1]["content"] == tool.content
    assert outcome.reason is StopReason.COMPLETED


async def test_max_steps_stops_after_the_last_allowed_calls_tools(harness: Harness) -> None:
    echo = Turn.tool_calls([ToolCallSpec("echo", '{"text": "again"}')])
    harness.model.enqueue(echo, echo, echo)
    outcome = await harness.run("loop forever", overrides=RunOverrides(max_steps=2))
    assert outcome.reason is StopReason.MAX_STEPS
    assert outcome.run.status is RunStatus.COMPLETED
    assert [s.role for s in outcome.steps] == [Role.USER] + [Role.ASSISTANT, Role.TOOL] * 2
    assert len(harness.model.requests) == 2
    assert_valid_messages([s.to_message() for s in await harness.history(outcome.session_id)])


async def test_length_finish_stops_with_max_tokens_and_keeps_the_reply(harness: Harness) -> None:
    harness.model.enqueue(Turn.text("The answer is", finish_reason="length"))
    outcome = await harness.run("long question", overrides=RunOverrides(max_tokens=3))
    assert outcome.reason is StopReason.MAX_TOKENS
    assert outcome.run.status is RunStatus.COMPLETED
    assert outcome.steps[-1].content == "The answer is"
    assert harness.model.requests[-1]["max_tokens"] == 3


async def test_a_cut_off_tool_call_is_not_run_but_answered(harness: Harness) -> None:
    harness.model.enqueue(
        Turn.tool_calls([ToolCallSpec("echo", '{"text": "ha')], finish_reason="length")
    )
    outcome = await harness.run("x")
    assert outcome.reason is StopReason.MAX_TOKENS
    (tool,) = outcome.steps_of(Role.TOOL)
    assert tool.is_error
    assert "cut off" in tool.content
    assert_valid_messages([s.to_message() for s in await harness.history(outcome.session_id)])


async def test_content_filter_stops_the_run(harness: Harness) -> None:
    harness.model.enqueue(Turn.text("I can", finish_reason="content_filter"))
    outcome = await harness.run("something bad")
    assert outcome.reason is StopReason.CONTENT_FILTER
    assert outcome.run.status is RunStatus.COMPLETED
    assert outcome.run.stop_signal is not None
    assert outcome.run.stop_signal.source == "model"


async def test_rate_limit_then_success_is_one_step_with_one_retry(harness: Harness) -> None:
    harness.model.enqueue(Turn.error(429, retry_after=0), Turn.text("finally"))
    outcome = await harness.run("hi")
    assert outcome.reason is StopReason.COMPLETED
    (assistant,) = outcome.steps_of(Role.ASSISTANT)
    assert (assistant.content, assistant.metrics.retries) == ("finally", 1)
    (notice,) = outcome.of(ErrorNotice)
    assert (notice.reason, notice.source, notice.retryable) == ("MODEL_RETRY", "model", True)


async def second_turn_session(harness: Harness) -> str:
    """A session with one turn done (the cut stream tests run their second turn)."""
    harness.model.enqueue(Turn.text("first"))
    return (await harness.run("first")).session_id


async def test_a_stream_cut_after_deltas_restarts_and_stores_only_the_whole_reply(
    harness: Harness,
) -> None:
    session_id = await second_turn_session(harness)
    harness.model.enqueue(Turn.text("garbage garbage", chunks=4, cut_after=3), Turn.text("clean"))
    outcome = await harness.run("hi", session_id=session_id)
    kinds = [type(e.event).__name__ for e in outcome.events]
    restart = next(i for i, e in enumerate(outcome.events) if isinstance(e.event, ErrorNotice))
    assert "StepDelta" in kinds[:restart]
    notice = outcome.events[restart].event
    assert isinstance(notice, ErrorNotice)
    assert notice.reason == "MODEL_STREAM_RESTART"
    (assistant,) = outcome.steps_of(Role.ASSISTANT)
    assert assistant.content == "clean"
    assert assistant.metrics.retries == 1
    assert outcome.reason is StopReason.COMPLETED


async def test_a_stream_that_keeps_breaking_fails_retryable_and_stores_nothing(
    harness: Harness,
) -> None:
    session_id = await second_turn_session(harness)
    harness.model.enqueue(*[Turn.text("garbage garbage", chunks=4, cut_after=3)] * 2)
    outcome = await harness.run("hi", session_id=session_id)
    assert outcome.of(RunFailed)
    assert outcome.run.status is RunStatus.FAILED
    signal = outcome.run.stop_signal
    assert signal is not None
    assert (signal.reason, signal.source, signal.retryable) == (
        StopReason.MODEL_ERROR,
        "model",
        True,
    )
    assert signal.resume_from_sequence == 4
    roles = [s.role for s in await harness.history(outcome.session_id)]
    assert roles == [Role.USER, Role.ASSISTANT, Role.USER]

    harness.model.enqueue(Turn.text("recovered"))
    retried = await harness.collect(
        await harness.runtime.retry(outcome.session_id, signal.resume_from_sequence)
    )
    assert retried.reason is StopReason.COMPLETED
    contents = [s.content for s in await harness.history(outcome.session_id)]
    assert contents == ["first", "first", "hi", "recovered"]


async def test_a_stream_without_finish_reason_is_a_model_error(harness: Harness) -> None:
    harness.model.enqueue(*[Turn.text("looks fine", omit_finish_reason=True)] * 2)
    outcome = await harness.run("hi")
    assert outcome.reason is StopReason.MODEL_ERROR
    assert outcome.run.stop_signal is not None
    assert "finish_reason" in outcome.run.stop_signal.message
    assert outcome.steps_of(Role.ASSISTANT) == []


async def test_a_client_error_from_the_model_fails_the_run_not_retryable(
    harness: Harness,
) -> None:
    harness.model.enqueue(Turn.error(404, message="The model `nope` does not exist"))
    outcome = await harness.run("hi", overrides=RunOverrides(model="nope"))
    signal = outcome.run.stop_signal
    assert signal is not None
    assert signal.reason is StopReason.MODEL_ERROR
    assert not signal.retryable
    assert signal.message == "HTTP 404: The model `nope` does not exist"
    assert signal.context == {"status_code": 404, "error_code": "not_found"}
    assert isinstance(outcome.events[-1].event, RunFailed)


async def test_cancel_during_the_model_stream_stores_no_partial_step(harness: Harness) -> None:
    harness.model.enqueue(Turn.words("one two three four five six seven", chunk_delay=0.05))
    handle = await harness.runtime.start_run(RunInput("count"))

    async def cancel_on_first_delta(event: SequencedEvent) -> None:
        if isinstance(event.event, StepDelta):
            await harness.runtime.cancel(handle.run_id, "user pressed stop")

    outcome = await harness.collect(handle, on_event=cancel_on_first_delta)
    assert outcome.reason is StopReason.CANCELLED
    assert outcome.run.status is RunStatus.CANCELLED
    assert outcome.run.stop_signal == StopSignal(
        StopReason.CANCELLED, "user pressed stop", "client"
    )
    assert [s.role for s in await harness.history(handle.session_id)] == [Role.USER]

    harness.model.enqueue(Turn.text("still here"))
    after = await harness.run("hello again", session_id=handle.session_id)
    assert after.reason is StopReason.COMPLETED
    assert_valid_messages(harness.model.requests[-1]["messages"])


async def test_cancel_during_a_tool_leaves_valid_history(harness: Harness) -> None:
    harness.model.enqueue(
        Turn.tool_calls(
            [
                ToolCallSpec("note", '{"text": "fast"}', id="call_fast"),
                ToolCallSpec("wait_for_gate", "{}", id="call_stuck"),
            ]
        )
    )
    handle = await harness.runtime.start_run(RunInput("work"))
    await harness.gate.entered.wait()
    cancelled = await harness.runtime.cancel(handle.run_id, "client disconnected")
    assert cancelled.status is RunStatus.CANCELLED
    outcome = await harness.collect(handle)
    assert outcome.run.stop_signal == cancelled.stop_signal

    tools = outcome.steps_of(Role.TOOL)
    assert [(t.tool_call_id, t.is_error) for t in tools] == [
        ("call_fast", False),
        ("call_stuck", True),
    ]
    assert tools[0].content == "fast"
    assert "cancelled (client disconnected)" in tools[1].content
    announced = {s.tool_call_id: s.step_id for s in outcome.of(StepStarted) if s.role is Role.TOOL}
    assert {t.tool_call_id: t.id for t in tools} == announced

    harness.model.enqueue(Turn.text("ok"))
    await harness.run("and now?", session_id=handle.session_id)
    messages = harness.model.requests[-1]["messages"]
    assert_valid_messages(messages)
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "tool", "user"]


async def test_run_timeout_cuts_a_hanging_model_call(harness: Harness) -> None:
    harness.model.enqueue(Turn.hanging())
    outcome = await harness.run("hi", overrides=RunOverrides(timeout_s=0.2))
    signal = outcome.run.stop_signal
    assert signal is not None
    assert (signal.reason, signal.source) == (StopReason.TIMEOUT, "loop")
    assert "0.2s" in signal.message
    assert outcome.run.status is RunStatus.CANCELLED
    assert outcome.steps_of(Role.ASSISTANT) == []


async def test_the_callers_deadline_wins_when_shorter(harness: Harness) -> None:
    harness.model.enqueue(Turn.hanging())
    outcome = await harness.run("hi", deadline_at=asyncio.get_running_loop().time() + 0.1)
    assert outcome.reason is StopReason.TIMEOUT
    assert outcome.run.stop_signal is not None
    assert outcome.run.stop_signal.message == "the run reached its caller's deadline"


async def test_a_slow_tool_times_out_into_an_error_result(harness: Harness) -> None:
    harness.model.enqueue(
        Turn.tool_calls([ToolCallSpec("wait_for_gate", "{}")]), Turn.text("gave up")
    )
    outcome = await harness.run("wait", agent="impatient")
    (tool,) = outcome.steps_of(Role.TOOL)
    assert tool.is_error
    assert tool.content == "Error: tool 'wait_for_gate' timed out after 0.2s."
    assert outcome.reason is StopReason.COMPLETED


async def test_token_budget_stops_after_the_steps_tools(harness: Harness) -> None:
    harness.model.enqueue(
        Turn.tool_calls(
            [ToolCallSpec("echo", '{"text": "x"}')],
            usage=UsageSpec(prompt_tokens=40, completion_tokens=10),
        )
    )
    outcome = await harness.run("spend", overrides=RunOverrides(token_budget=30))
    signal = outcome.run.stop_signal
    assert signal is not None
    assert signal.reason is StopReason.TOKEN_BUDGET
    assert signal.context == {"used_tokens": 50, "token_budget": 30}
    assert outcome.steps[-1].role is Role.TOOL
    assert outcome.run.status is RunStatus.COMPLETED


async def test_a_tool_can_stop_the_run(harness: Harness) -> None:
    harness.model.enqueue(
        Turn.tool_calls(
            [
                ToolCallSpec("finish", '{"summary": "all done"}'),
                ToolCallSpec("echo", '{"text": "x"}'),
            ]
        )
    )
    outcome = await harness.run("finish up")
    signal = outcome.run.stop_signal
    assert signal is not None
    assert (signal.reason, signal.source, signal.message) == (
        StopReason.TOOL_STOP,
        "tool:finish",
        "finished: all done",
    )
    assert [t.content for t in outcome.steps_of(Role.TOOL)] == ["finished: all done", "x"]
    assert len(harness.model.requests) == 1


async def test_a_busy_session_is_refused_before_anything_is_written(harness: Harness) -> None:
    harness.model.enqueue(Turn.hanging())
    handle = await harness.runtime.start_run(RunInput("first"))
    await harness.model.wait_for_requests(1)
    with pytest.raises(SessionBusyError):
        await harness.runtime.start_run(RunInput("second", session_id=handle.session_id))
    assert [s.content for s in await harness.history(handle.session_id)] == ["first"]
    assert len(await harness.store.list_runs(handle.session_id, limit=10)) == 1
    await harness.runtime.cancel(handle.run_id, "done")


async def test_bad_requests_are_refused_before_anything_is_written(
    harness: Harness,
) -> None:
    with pytest.raises(InvalidInputError) as empty:
        await harness.runtime.start_run(RunInput("   "))
    assert empty.value.field == "input"
    with pytest.raises(AgentNotFoundError):
        await harness.runtime.start_run(RunInput("hi", agent="nobody"))
    with pytest.raises(NotFoundError):
        await harness.runtime.start_run(RunInput("hi", session_id="sess_missing"))
    with pytest.raises(InvalidInputError) as tools:
        await harness.runtime.start_run(RunInput("hi", overrides=RunOverrides(tools=["rm_rf"])))
    assert tools.value.field == "overrides.tools"
    assert await harness.store.list_sessions(limit=10) == []


async def test_tool_selection_override_offers_only_the_named_tools(harness: Harness) -> None:
    harness.model.enqueue(Turn.text("ok"))
    await harness.run("hi", overrides=RunOverrides(tools=["echo"]))
    assert [t["function"]["name"] for t in harness.model.requests[-1]["tools"]] == ["echo"]


async def test_hooks_see_the_run_and_can_stop_it(
    sqlite_store: StoreRoles, fake_model: FakeModelServer
) -> None:
    seen: list[str] = []

    def on_start(run: object) -> None:
        seen.append("start")

    async def before_model(run: object, messages: list[dict[str, object]]) -> None:
        seen.append(f"model:{len(messages)}")
        if len(messages) > 3:
            raise StopRun(StopSignal(StopReason.CANCELLED, "policy says no"))

    def after_step(run: object, step: object) -> None:
        seen.append("step")

    def broken(run: object) -> None:
        raise KeyError("oops")

    hooks = Hooks(
        on_run_start=[on_start, broken],
        before_model_call=[before_model],
        after_step=[after_step],
        on_run_end=[lambda run: seen.append("end")],
    )
    harness = build_runtime(sqlite_store, fake_model, Gate(), hooks=hooks)
    try:
        fake_model.enqueue(Turn.tool_calls([ToolCallSpec("echo", '{"text": "x"}')]))
        outcome = await harness.run("go")
    finally:
        await harness.driver.close()
    assert seen == ["start", "model:2", "step", "step", "model:4", "end"]
    signal = outcome.run.stop_signal
    assert signal is not None
    assert (signal.reason, signal.source, signal.message) == (
        StopReason.CANCELLED,
        "hook",
        "policy says no",
    )
    (notice,) = outcome.of(ErrorNotice)
    assert notice.reason == "HOOK_FAILED"
    assert "KeyError" in notice.message


async def test_run_started_carries_the_stored_user_step_sequence(harness: Harness) -> None:
    harness.model.enqueue(Turn.text("x"))
    outcome = await harness.run("hi", metadata={"team": "a"}, request_id="req-1")
    (started,) = outcome.of(RunStarted)
    assert started.run.first_sequence == 1
    assert started.run.status is RunStatus.RUNNING
    assert started.run.metadata == {"team": "a"}
    first_completed = outcome.of(StepCompleted)[0]
    assert first_completed.step.role is Role.USER


async def test_a_reused_request_id_is_refused(harness: Harness) -> None:
    harness.model.enqueue(Turn.text("x"))
    first = await harness.run("hi", request_id="req-1")
    with pytest.raises(DuplicateRequestError):
        await harness.run("hi", request_id="req-1", session_id=first.session_id)
    session = await harness.store.get_session(first.session_id)
    assert (session.step_count, session.active_run_id) == (2, "")


class FailingStore:
    """The real store, except that storing an assistant step raises `error` (one stored
    alone: a reply that stops the run is stored with its end, below)."""

    def __init__(self, store: StoreRoles, error: Exception) -> None:
        self._store = store
        self._error = error

    async def append_steps(
        self, steps: Sequence[Step], *, held_by: str = "", journal: Journal | None = None
    ) -> list[Step]:
        if any(step.role is Role.ASSISTANT for step in steps):
            raise self._error
        return await self._store.append_steps(steps, held_by=held_by, journal=journal)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


@pytest.mark.parametrize(
    ("error", "message", "retryable"),
    [
        (
            StoreUnavailableError("database is locked"),
            "storage error: StoreUnavailableError: database is locked",
            True,
        ),
        (
            RuntimeError("boom\nTraceback"),
            "internal error (RuntimeError); see the server log",
            False,
        ),
    ],
)
async def test_an_unexpected_error_fails_the_run_with_a_clean_message(
    sqlite_store: StoreRoles,
    fake_model: FakeModelServer,
    error: Exception,
    message: str,
    retryable: bool,
) -> None:
    store = cast(StoreRoles, FailingStore(sqlite_store, error))
    harness = build_runtime(store, fake_model, Gate())
    try:
        fake_model.enqueue(Turn.tool_calls([ToolCallSpec("note", '{"text": "never stored"}')]))
        handle = await harness.runtime.start_run(RunInput("hi"))
        events = [e async for e in own(handle.events())]
    finally:
        await harness.driver.close()
    terminal = events[-1].event
    assert isinstance(terminal, RunFailed)
    signal = terminal.run.stop_signal
    assert signal is not None
    assert (signal.reason, signal.message, signal.retryable, signal.source) == (
        StopReason.INTERNAL_ERROR,
        message,
        retryable,
        "server",
    )
    stored = await sqlite_store.get_run(handle.run_id)
    assert stored.status is RunStatus.FAILED
    assert (await sqlite_store.get_session(handle.session_id)).active_run_id == ""


async def test_next_context_is_what_the_model_would_receive(harness: Harness) -> None:
    harness.model.enqueue(Turn.tool_calls([ToolCallSpec("wait_for_gate", "{}", id="call_x")]))
    handle = await harness.runtime.start_run(RunInput("go"))
    await harness.gate.entered.wait()
    await harness.runtime.cancel(handle.run_id, "stop")
    context = await harness.runtime.next_context(handle.session_id)
    assert [(s.role, s.sequence) for s in context] == [
        (Role.SYSTEM, 0),
        (Role.USER, 1),
        (Role.ASSISTANT, 2),
        (Role.TOOL, 3),
    ]
    assert context[0].content == INSTRUCTIONS


def test_agents_may_only_name_registered_tools(
    sqlite_store: StoreRoles, fake_model: FakeModelServer
) -> None:
    harness = build_runtime(sqlite_store, fake_model, Gate())
    agents = {"a": AgentSpec("a", "m", tools=["no_such_tool"])}
    with pytest.raises(ValueError, match="unknown tools"):
        Runtime(storage_of(sqlite_store), agents, "a", harness.runtime.registry, harness.driver)
    with pytest.raises(ValueError, match="default agent"):
        Runtime(storage_of(sqlite_store), {}, "a", harness.runtime.registry, harness.driver)
