"""`InstrumentedStepStore`: any StepStore, with its query latency, steps written and forks
recorded as metrics. A thin decorator: every call goes straight to the wrapped store."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Sequence
from datetime import datetime
from typing import TypeVar

from opentelemetry.semconv.attributes import error_attributes

from agio_grpc.domain import ContextSummary, Run, Session, Step
from agio_grpc.store.protocol import (
    HistoryMark,
    HistoryRead,
    IdleEnd,
    Journal,
    JournalRecord,
    QueueRequest,
    RunContinuation,
    RunEnd,
    RunStart,
    StepStore,
)
from agio_grpc.telemetry import attributes as agio
from agio_grpc.telemetry.instruments import Instruments

T = TypeVar("T")


class InstrumentedStepStore:
    """Records `agio.store.operation.duration` per operation, `agio.steps.written` by role
    and `agio.sessions.forks`."""

    def __init__(self, store: StepStore, instruments: Instruments) -> None:
        self.inner = store
        self._instruments = instruments

    async def _timed(self, operation: str, call: Awaitable[T]) -> T:
        started = time.perf_counter()
        attributes = {agio.STORE_OPERATION: operation}
        try:
            return await call
        except BaseException as error:
            attributes[error_attributes.ERROR_TYPE] = type(error).__qualname__
            raise
        finally:
            self._instruments.store_duration.record(time.perf_counter() - started, attributes)

    def _written(self, steps: Sequence[Step]) -> None:
        for step in steps:
            self._instruments.steps_written.add(1, {agio.STEP_ROLE: step.role.value})

    async def create_session(self, session: Session | None = None) -> Session:
        return await self._timed("create_session", self.inner.create_session(session))

    async def get_session(self, session_id: str, *, tenant: str | None = None) -> Session:
        return await self._timed("get_session", self.inner.get_session(session_id, tenant=tenant))

    async def list_sessions(
        self,
        limit: int,
        after: tuple[datetime, str] | None = None,
        *,
        tenant: str | None = None,
    ) -> list[Session]:
        return await self._timed(
            "list_sessions", self.inner.list_sessions(limit, after, tenant=tenant)
        )

    async def delete_session(self, session_id: str, *, tenant: str | None = None) -> int:
        return await self._timed(
            "delete_session", self.inner.delete_session(session_id, tenant=tenant)
        )

    async def append_steps(
        self, steps: Sequence[Step], *, held_by: str = "", journal: Journal | None = None
    ) -> list[Step]:
        stored = await self._timed(
            "append_steps", self.inner.append_steps(steps, held_by=held_by, journal=journal)
        )
        self._written(stored)
        return stored

    async def append_step(self, step: Step) -> Step:
        stored = await self._timed("append_step", self.inner.append_step(step))
        self._written([stored])
        return stored

    async def get_steps(
        self,
        session_id: str,
        start: int = 1,
        end: int | None = None,
        limit: int | None = None,
        *,
        tenant: str | None = None,
    ) -> list[Step]:
        return await self._timed(
            "get_steps", self.inner.get_steps(session_id, start, end, limit, tenant=tenant)
        )

    async def get_history(
        self, session_id: str, start: int = 1, end: int | None = None
    ) -> list[Step]:
        return await self._timed("get_history", self.inner.get_history(session_id, start, end))

    async def get_history_since(
        self,
        session_id: str,
        since: HistoryMark | None,
        end: int | None = None,
        *,
        tenant: str | None = None,
    ) -> HistoryRead:
        return await self._timed(
            "get_history_since",
            self.inner.get_history_since(session_id, since, end, tenant=tenant),
        )

    async def get_step(self, session_id: str, sequence: int, *, tenant: str | None = None) -> Step:
        return await self._timed(
            "get_step", self.inner.get_step(session_id, sequence, tenant=tenant)
        )

    async def get_last_step(self, session_id: str) -> Step | None:
        return await self._timed("get_last_step", self.inner.get_last_step(session_id))

    async def first_user_messages(self, session_ids: Sequence[str], chars: int) -> dict[str, str]:
        return await self._timed(
            "first_user_messages", self.inner.first_user_messages(session_ids, chars)
        )

    async def count_steps(self, session_id: str) -> int:
        return await self._timed("count_steps", self.inner.count_steps(session_id))

    async def append_to_idle_session(
        self, step: Step, *, after: HistoryMark | None, tenant: str | None = None
    ) -> Step:
        stored = await self._timed(
            "append_to_idle_session",
            self.inner.append_to_idle_session(step, after=after, tenant=tenant),
        )
        self._written([stored])
        return stored

    async def delete_steps_from(
        self, session_id: str, start_sequence: int, *, tenant: str | None = None
    ) -> int:
        return await self._timed(
            "delete_steps_from",
            self.inner.delete_steps_from(session_id, start_sequence, tenant=tenant),
        )

    async def fork_session(
        self, session_id: str, up_to_sequence: int, *, tenant: str | None = None
    ) -> Session:
        forked = await self._timed(
            "fork_session", self.inner.fork_session(session_id, up_to_sequence, tenant=tenant)
        )
        self._instruments.forks.add(1)
        return forked

    async def context_summary(
        self, session_id: str, *, tenant: str | None = None
    ) -> ContextSummary:
        return await self._timed(
            "context_summary", self.inner.context_summary(session_id, tenant=tenant)
        )

    async def create_run(self, run: Run) -> Run:
        return await self._timed("create_run", self.inner.create_run(run))

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
        started = await self._timed(
            "start_run",
            self.inner.start_run(
                run, steps, new_session=new_session, since=since, journal=journal, queue=queue
            ),
        )
        self._written(started.steps)
        return started

    async def start_queued_run(
        self,
        run: Run,
        steps: Sequence[Step],
        *,
        since: HistoryMark | None = None,
        journal: Journal | None = None,
    ) -> RunStart:
        started = await self._timed(
            "start_queued_run",
            self.inner.start_queued_run(run, steps, since=since, journal=journal),
        )
        self._written(started.steps)
        return started

    async def next_queued_run(self, session_id: str) -> Run | None:
        return await self._timed("next_queued_run", self.inner.next_queued_run(session_id))

    async def ready_queues(self, limit: int = 100) -> list[str]:
        return await self._timed("ready_queues", self.inner.ready_queues(limit))

    async def update_run(self, run: Run) -> Run:
        return await self._timed("update_run", self.inner.update_run(run))

    async def continue_run(
        self,
        run: Run,
        steps: Sequence[Step],
        *,
        expect: HistoryMark | None = None,
        journal: Journal | None = None,
    ) -> RunContinuation:
        continued = await self._timed(
            "continue_run", self.inner.continue_run(run, steps, expect=expect, journal=journal)
        )
        self._written(continued.steps)
        return continued

    async def end_run(self, run: Run, *, journal: Journal | None = None) -> RunEnd:
        return await self._timed("end_run", self.inner.end_run(run, journal=journal))

    async def restart_run(
        self,
        run: Run,
        delete_from: int,
        *,
        expect: HistoryMark | None = None,
        journal: Journal | None = None,
    ) -> Run:
        return await self._timed(
            "restart_run",
            self.inner.restart_run(run, delete_from, expect=expect, journal=journal),
        )

    async def end_idle_run(
        self,
        run: Run,
        steps: Sequence[Step],
        *,
        expect: HistoryMark | None = None,
        journal: Journal | None = None,
    ) -> IdleEnd | None:
        ended = await self._timed(
            "end_idle_run", self.inner.end_idle_run(run, steps, expect=expect, journal=journal)
        )
        self._written(steps if ended is not None else ())
        return ended

    async def read_journal(self, run_id: str, after_seq: int = 0) -> list[JournalRecord]:
        return await self._timed("read_journal", self.inner.read_journal(run_id, after_seq))

    async def get_run(self, run_id: str, *, tenant: str | None = None) -> Run:
        return await self._timed("get_run", self.inner.get_run(run_id, tenant=tenant))

    async def list_runs(
        self,
        session_id: str,
        limit: int,
        after: tuple[datetime, str] | None = None,
        *,
        tenant: str | None = None,
    ) -> list[Run]:
        return await self._timed(
            "list_runs", self.inner.list_runs(session_id, limit, after, tenant=tenant)
        )

    async def acquire_session(self, session_id: str, run_id: str) -> None:
        await self._timed("acquire_session", self.inner.acquire_session(session_id, run_id))

    async def release_session(self, session_id: str, run_id: str) -> bool:
        return await self._timed("release_session", self.inner.release_session(session_id, run_id))

    async def close(self) -> None:
        await self.inner.close()
