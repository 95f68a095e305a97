"""A new session's first model call goes out ahead of its start (engine/model_call.py): its
request overlaps the start transaction, its events wait for the run's opening events, and a
start that fails cancels it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any, cast

import pytest

from agio_grpc.domain import Role, Run, Session, Step, StopReason
from agio_grpc.engine import RunInput, RunStarted, StepCompleted, StepDelta, StepStarted
from agio_grpc.engine.hooks import Hooks
from agio_grpc.store.errors import StoreUnavailableError
from agio_grpc.store.protocol import HistoryMark, Journal, QueueRequest, RunStart, StepStore
from agio_grpc.testing import FakeModelServer, Turn
from tests.engine.harness import INSTRUCTIONS, Gate, Harness, build_runtime


class StartingStore:
    """The real store, except that a run's start first waits for `before_start` (and then
    raises `error`, if one is given)."""

    def __init__(
        self, store: StepStore, before_start: asyncio.Event, error: Exception | None = None
    ) -> None:
        self._store = store
        self._before_start = before_start
        self._error = error
        self.started = asyncio.Event()

    async def start_run(
        self,
        run: Run,
        steps: Sequence[Step],
        *,
        new_session: Session | None = None,
        since: HistoryMark | None = None,
        journal: Journal | None = None,
        queue: QueueRequest | None = None,
    ) -> RunStart:
        self.started.set()
        await self._before_start.wait()
        if self._error is not None:
            raise self._error
        return await self._store.start_run(
            run, steps, new_session=new_session, since=since, journal=journal, queue=queue
        )

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


@pytest.fixture
async def held(
    sqlite_store: StepStore, fake_model: FakeModelServer
) -> AsyncIterator[tuple[Harness, StartingStore, asyncio.Event]]:
    release = asyncio.Event()
    store = StartingStore(sqlite_store, release)
    harness = build_runtime(cast(StepStore, store), fake_model, Gate())
    try:
        yield harness, store, release
    finally:
        release.set()
        await harness.runtime.shutdown(grace_s=0)


async def test_the_request_is_sent_while_the_start_is_being_written(
    held: tuple[Harness, StartingStore, asyncio.Event],
) -> None:
    harness, store, release = held
    harness.model.enqueue(Turn.words("one two three"))
    starting = asyncio.create_task(harness.runtime.start_run(RunInput("hi")))
    await store.started.wait()
    # The start has not been written, yet the model has the request.
    await asyncio.wait_for(harness.model.wait_for_requests(1), 30)
    assert [m["role"] for m in harness.model.requests[0]["messages"]] == ["system", "user"]
    assert harness.model.requests[0]["messages"][0]["content"] == INSTRUCTIONS
    release.set()
    outcome = await harness.collect(await starting)
    kinds = [type(sequenced.event) for sequenced in outcome.events]
    # Deltas that arrived before the start committed come after the run's opening events.
    assert kinds[:3] == [RunStarted, StepCompleted, StepStarted]
    assert kinds[3] is StepDelta
    assert outcome.reason is StopReason.COMPLETED
    reply = outcome.steps_of(Role.ASSISTANT)[0]
    assert (reply.content, reply.sequence) == ("one two three", 2)
    assert outcome.of(StepStarted)[0].step_id == reply.id
    assert len(harness.model.requests) == 1


async def test_a_start_that_fails_cancels_the_request(
    sqlite_store: StepStore, fake_model: FakeModelServer
) -> None:
    release = asyncio.Event()
    store = StartingStore(sqlite_store, release, StoreUnavailableError("database is locked"))
    harness = build_runtime(cast(StepStore, store), fake_model, Gate())
    fake_model.enqueue(Turn.hanging())
    try:
        starting = asyncio.create_task(harness.runtime.start_run(RunInput("hi")))
        await asyncio.wait_for(fake_model.wait_for_requests(1), 30)
        release.set()
        with pytest.raises(StoreUnavailableError):
            await starting
        # The call's task ends (its connection closed) without anyone awaiting it.
        for _ in range(10_000):
            if not _model_calls():
                break
            await asyncio.sleep(0)
        assert not _model_calls()
        assert await sqlite_store.list_sessions(10) == []
    finally:
        await harness.runtime.shutdown(grace_s=0)


async def test_a_cancel_before_the_reply_ends_the_call(harness: Harness) -> None:
    harness.model.enqueue(Turn.hanging())
    handle = await harness.runtime.start_run(RunInput("hi"))
    await asyncio.wait_for(harness.model.wait_for_requests(1), 30)
    await harness.runtime.cancel(handle.run_id, "changed my mind")
    outcome = await harness.collect(handle)
    assert outcome.reason is StopReason.CANCELLED
    assert not _model_calls()


async def test_hooks_before_the_model_call_see_it_first(
    sqlite_store: StepStore, fake_model: FakeModelServer
) -> None:
    def add_note(run: Run, messages: list[dict[str, Any]]) -> None:
        messages.append({"role": "user", "content": "a note from the hook"})

    harness = build_runtime(
        sqlite_store, fake_model, Gate(), hooks=Hooks(before_model_call=[add_note])
    )
    fake_model.enqueue(Turn.text("ok"))
    try:
        outcome = await harness.run("hi")
    finally:
        await harness.runtime.shutdown(grace_s=0)
    assert outcome.reason is StopReason.COMPLETED
    assert fake_model.requests[0]["messages"][-1]["content"] == "a note from the hook"


def _model_calls() -> list[asyncio.Task[Any]]:
    """The tasks of model calls sent ahead that are still running."""
    return [
        task
        for task in asyncio.all_tasks()
        if not task.done() and "ModelCall._call" in getattr(task.get_coro(), "__qualname__", "")
    ]


async def test_the_callers_deadline_counts_from_the_request_not_the_start(
    held: tuple[Harness, StartingStore, asyncio.Event],
) -> None:
    harness, store, release = held
    harness.model.enqueue(Turn.hanging())
    loop = asyncio.get_running_loop()
    deadline_at = loop.time() + 0.05
    starting = asyncio.create_task(
        harness.runtime.start_run(RunInput("hi", deadline_at=deadline_at))
    )
    await store.started.wait()
    await asyncio.sleep(max(0.0, deadline_at - loop.time()) + 0.01)  # the start outlasts it
    release.set()
    outcome = await harness.collect(await starting)
    signal = outcome.run.stop_signal
    assert signal is not None
    assert (signal.reason, signal.message) == (
        StopReason.TIMEOUT,
        "the run reached its caller's deadline",
    )
    assert not _model_calls()
