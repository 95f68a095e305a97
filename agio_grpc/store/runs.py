"""`RunRecords`: reads of runs and of their event journal, for anyone (the service's
GetRun and ListRuns, a watch's replay, the queues). Changing a run is the `RunLedger`'s
(ledger.py), which only the lifecycle holds. Never imports SQLAlchemy or grpc."""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime
from typing import Protocol

from agio_grpc.domain import Run, RunStatus
from agio_grpc.store.records import JournalRecord


class RunRecords(Protocol):
    """Runs as stored, and their journals."""

    async def get_run(self, run_id: str, *, tenant: str | None = None) -> Run:
        """The run. Raises NotFoundError (also for another tenant's)."""
        ...

    async def list_runs(
        self,
        session_id: str,
        limit: int,
        after: tuple[datetime, str] | None = None,
        *,
        tenant: str | None = None,
    ) -> list[Run]:
        """A session's runs newest first, `(create_time, id)` strictly after `after`.
        Raises NotFoundError for an unknown session."""
        ...

    async def list_agent_runs(
        self,
        agent: str,
        limit: int,
        after: tuple[datetime, str] | None = None,
        *,
        tenant: str,
        session_id: str | None = None,
        statuses: Collection[RunStatus] = (),
        changed_since: datetime | None = None,
    ) -> list[Run]:
        """A tenant's runs of `agent` newest first, `(create_time, id)` strictly after
        `after`; only `session_id`'s if given, only those in one of `statuses` if any are,
        and only those whose status last changed (`end_time`, else `create_time`) at or
        after `changed_since`. Nothing (never NotFoundError) for an unknown session."""
        ...

    async def read_journal(self, run_id: str, after_seq: int = 0) -> list[JournalRecord]:
        """The run's journal records with a seq above `after_seq`, in seq order (none for
        an unknown run)."""
        ...

    async def next_queued_run(self, session_id: str) -> Run | None:
        """The run heading the session's queue, if any."""
        ...

    async def ready_queues(self, limit: int = 100) -> list[str]:
        """Sessions with queued runs and nothing else in their way: free (or held under an
        expired lease) and no run waiting for its client. For the member that sweeps them
        after a crash ended a queue's run with no one to start the next."""
        ...
