"""A run whose start transaction is slow: the caller's deadline still counts from the request,
and the hooks before a model call see the messages first."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any, cast

import pytest

from agio_grpc.domain import Run, Session, Step, StopReason
from agio_grpc.engine import RunInput
from agio_grpc.engine.hooks import Hooks
from agio_grpc.store.records import HistoryMark, Journal, QueueRequest, RunStart
from agio_grpc.testing import FakeModelServer, Turn
from tests.engine.harness import Gate, Harness, build_runtime
from tests.roles import StoreRoles


class StartingStore:
    """The real store, except that a run's start first waits for `before_start` (and then
    raises `error`, if one is given)."""

    def __init__(
        self, store: StoreRoles, before_start: asyncio.Event, error: Exception | None = None
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
    sqlite_store: StoreRoles, fake_model: FakeModelServer
) -> AsyncIterator[tuple[Harness, StartingStore, asyncio.Event]]:
    release = asyncio.Event()
    store = StartingStore(sqlite_store, release)
    harness = build_runtime(cast(StoreRoles, store), fake_model, Gate())
    try:
        yield harness, store, release
    finally:
        release.set()
        await harness.runtime.shutdown(grace_s=0)


async def test_hooks_before_the_model_call_can_change_its_messages(
    sqlite_store: StoreRoles, fake_model: FakeModelServer
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
