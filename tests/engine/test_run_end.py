"""A run's end that fails to be stored (engine/lifecycle.py `Lifecycle.end`): tried again,
reduced to what any store takes when what was written failed, and when nothing works the
session stays held so that its lease's take-over (or a restart) ends the run: never a run
left RUNNING on a released session. On SQLite and PostgreSQL."""

from __future__ import annotations

from typing import Any, cast

import pytest

from agio_grpc.domain import RunStatus, StopReason
from agio_grpc.engine import ClientTool
from agio_grpc.engine import lifecycle as lifecycle_module
from agio_grpc.store.errors import LeaseLostError, StoreError, StoreUnavailableError
from agio_grpc.store.records import terminal_kind
from agio_grpc.testing import FakeModelServer, ToolCallSpec, Turn
from tests.engine.harness import Gate, Outcome, build_runtime
from tests.roles import StoreRoles, open_roles


class FailingEnds:
    """The real store, except that its next `failures` ends raise (each error in turn)."""

    def __init__(self, store: StoreRoles, *failures: Exception) -> None:
        self._store = store
        self.failures = list(failures)
        self.ends: list[Any] = []

    async def end_run(self, run: Any, **kwargs: Any) -> Any:
        self.ends.append(run.stop_signal)
        if self.failures:
            raise self.failures.pop(0)
        return await self._store.end_run(run, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


LOOKUP = ClientTool("lookup_order", "Look an order up.", '{"type": "object"}')


@pytest.fixture(autouse=True)
def no_pauses(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lifecycle_module, "END_RETRY_PAUSES_S", (0.0, 0.0, 0.0))


async def test_an_unavailable_store_is_tried_again_with_the_same_end(
    store: StoreRoles, fake_model: FakeModelServer
) -> None:
    failing = FailingEnds(store, StoreUnavailableError("locked"), StoreUnavailableError("x"))
    harness = build_runtime(cast(StoreRoles, failing), fake_model, Gate())
    fake_model.enqueue(
        Turn.tool_calls([ToolCallSpec("lookup_order", '{"order_id": "A1"}', id="call_1")])
    )
    try:
        outcome = await harness.run("where is my order?", client_tools=[LOOKUP])
    finally:
        await harness.runtime.shutdown(grace_s=0)
        await harness.driver.close()
    assert outcome.reason is StopReason.REQUIRES_ACTION
    assert len(failing.ends) == 3
    stored = await store.get_run(outcome.run_id)
    assert stored.status is RunStatus.REQUIRES_ACTION
    assert stored.stop_signal is not None
    assert stored.stop_signal.context["tool_calls"][0]["id"] == "call_1"  # kept whole
    assert (await store.get_session(outcome.session_id)).active_run_id == ""


async def test_an_end_the_store_refuses_is_stored_reduced(
    store: StoreRoles, fake_model: FakeModelServer
) -> None:
    failing = FailingEnds(store, StoreError("value out of range"))
    harness = build_runtime(cast(StoreRoles, failing), fake_model, Gate())
    fake_model.enqueue(Turn.error(400, message="bad \x00 request " + "x" * 10_000))
    try:
        outcome = await harness.run("hi")
    finally:
        await harness.runtime.shutdown(grace_s=0)
        await harness.driver.close()
    assert outcome.reason is StopReason.MODEL_ERROR
    stored = await store.get_run(outcome.run_id)
    assert stored.status is RunStatus.FAILED
    assert stored.stop_signal is not None
    assert stored.stop_signal.reason is StopReason.MODEL_ERROR
    assert stored.stop_signal.context == {}
    assert "\x00" not in stored.stop_signal.message
    assert len(stored.stop_signal.message) <= lifecycle_module.STORABLE_MESSAGE_CHARS
    assert outcome.run == stored  # the stream was told what was stored


async def test_an_end_never_stored_keeps_the_session_until_a_restart_ends_the_run(
    store_url: str, fake_model: FakeModelServer
) -> None:
    real = await open_roles(store_url, instance_id="host/127.0.0.1:50051")
    failing = FailingEnds(real, *[StoreUnavailableError("gone")] * 3)
    harness = build_runtime(cast(StoreRoles, failing), fake_model, Gate())
    fake_model.enqueue(Turn.text("done"))
    try:
        outcome = await harness.run("hi")
    finally:
        await harness.runtime.shutdown(grace_s=0)
        await harness.driver.close()
        await real.close()
    # Told what the take-over will store: INTERRUPTED, retryable from the reply, which was
    # to be stored with the end.
    signal = outcome.run.stop_signal
    assert signal is not None
    assert (signal.reason, signal.retryable, signal.resume_from_sequence) == (
        StopReason.INTERRUPTED,
        True,
        2,
    )
    restarted = await open_roles(store_url, instance_id="host/127.0.0.1:50051")
    try:
        held = await restarted.get_session(outcome.session_id)
        assert held.active_run_id == outcome.run_id  # not released while RUNNING
        assert (await restarted.get_run(outcome.run_id)).status is RunStatus.RUNNING
        assert await restarted.recover_own_runs() == [outcome.run_id]
        ended = await restarted.get_run(outcome.run_id)
        assert ended.status is RunStatus.INTERRUPTED
        assert ended.stop_signal is not None
        assert ended.stop_signal.resume_from_sequence == 2
        assert [step.content for step in await restarted.get_steps(outcome.session_id)] == ["hi"]
        assert (await restarted.get_session(outcome.session_id)).active_run_id == ""
        kinds = [record.kind for record in await restarted.read_journal(outcome.run_id)]
        assert kinds[-1] == terminal_kind(ended)
    finally:
        await restarted.close()


async def run_once(store: Any, fake_model: FakeModelServer, turn: Turn, text: str) -> Outcome:
    """One run on a runtime over `store` (a wrapper of the real one), the model answering
    `turn`."""
    harness = build_runtime(cast(StoreRoles, store), fake_model, Gate())
    fake_model.enqueue(turn)
    try:
        return await harness.run(text)
    finally:
        await harness.runtime.shutdown(grace_s=0)
        await harness.driver.close()


class CountingWrites:
    """The real store, counting its step writes and its ends."""

    def __init__(self, store: StoreRoles) -> None:
        self._store = store
        self.appends = 0
        self.ended_with: list[int] = []

    async def append_steps(self, steps: Any, **kwargs: Any) -> Any:
        self.appends += 1
        return await self._store.append_steps(steps, **kwargs)

    async def end_run(self, run: Any, **kwargs: Any) -> Any:
        self.ended_with.append(len(kwargs.get("steps", ())))
        return await self._store.end_run(run, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


async def test_the_reply_that_ends_a_run_is_stored_with_its_end(
    store: StoreRoles, fake_model: FakeModelServer
) -> None:
    counting = CountingWrites(store)
    outcome = await run_once(counting, fake_model, Turn.text("done"), "hi")
    assert (counting.appends, counting.ended_with) == (0, [1])
    kinds = [event.event.type for event in outcome.events]
    assert kinds[-2:] == ["step_completed", "run_completed"]
    stored = await store.get_run(outcome.run_id)
    assert (stored.step_count, stored.first_sequence, stored.last_sequence) == (2, 1, 2)
    assert outcome.run == stored
    steps = await store.get_steps(outcome.session_id)
    assert [(step.role.value, step.content) for step in steps] == [
        ("user", "hi"),
        ("assistant", "done"),
    ]
    journal = await store.read_journal(outcome.run_id)
    assert [record.seq for record in journal][-2:] == [e.seq for e in outcome.events][-2:]


@pytest.mark.parametrize(
    ("error", "reason", "message"),
    [
        (StoreError("value out of range"), StopReason.INTERNAL_ERROR, "storage error"),
        (LeaseLostError("sess", "run"), StopReason.INTERRUPTED, "lost its session lease"),
    ],
)
async def test_a_reply_its_end_cannot_store_ends_the_run_without_it(
    store: StoreRoles,
    fake_model: FakeModelServer,
    error: Exception,
    reason: StopReason,
    message: str,
) -> None:
    outcome = await run_once(FailingEnds(store, error), fake_model, Turn.text("done"), "hi")
    signal = outcome.run.stop_signal
    assert signal is not None
    assert (signal.reason, signal.retryable, signal.resume_from_sequence) == (reason, True, 2)
    assert message in signal.message
    assert outcome.run == await store.get_run(outcome.run_id)
    assert [step.content for step in await store.get_steps(outcome.session_id)] == ["hi"]
    assert (await store.get_session(outcome.session_id)).active_run_id == ""
    assert "step_completed" not in [e.event.type for e in outcome.events[2:]]
