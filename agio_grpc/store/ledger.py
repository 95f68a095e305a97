"""`RunLedger`: the run transitions, each one transaction, and nothing else.

Only `engine.lifecycle.Lifecycle` holds a ledger (an import-linter contract keeps every
other module from importing this one), so "only the lifecycle changes a run" is something
the type checker holds: everyone else gets `RunRecords` (runs.py) to read runs.

    Lifecycle.begin         start_run             (take or create the session, or queue)
    Lifecycle.begin_queued  start_queued_run
    Lifecycle.resume        continue_run          (SubmitToolOutputs)
    Lifecycle.restart       restart_run           (Retry)
    Lifecycle.end           end_run
    Lifecycle.end_idle      end_idle_run          (a waiting or queued run nothing runs)
    Lifecycle.release       release_session       (a run that never started)
    Lifecycle.interrupt_abandoned / recover_expired / recover_own
                            interrupt_abandoned_run / recover_expired_runs / recover_own_runs

A run whose server is gone ends INTERRUPTED, retryable, by `abandoned_run_signal` with one
of the domain's messages (`LEASE_EXPIRED_MESSAGE`, `ABANDONED_MESSAGE`, `RESTARTED_MESSAGE`),
through one SQL function (store/sql/takes.py `interrupt_run`): inside any take of a session
held under an expired lease, and in the three sweeps above, which only the lifecycle calls.
Never imports SQLAlchemy or grpc.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Protocol

from agio_grpc.domain import Run, Session, Step
from agio_grpc.store.records import (
    HistoryMark,
    IdleEnd,
    Journal,
    QueueRequest,
    RunContinuation,
    RunEnd,
    RunStart,
)
from agio_grpc.store.runs import RunRecords


class RunLedger(RunRecords, Protocol):
    """The run transitions (module docstring), and the reads of runs they decide on."""

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
        """Start a run in ONE transaction: take the session (or create `new_session`,
        already taken by the run), append `steps`, store the run and what `journal` makes of
        them, read the history. A run with a `rollback_from` first deletes the steps of the
        run it supersedes from there on (none when another run's are among them: that run's
        steps are no longer the log's end).

        A session is busy when it is held by a live run, or has a run waiting in
        REQUIRES_ACTION or queued runs. Busy, the run is refused, or with `queue` stored
        QUEUED (its input on its row, no step stored, `RunStart.steps` empty) for
        `start_queued_run` to start when the session frees.

        `since` is the last step of the history the caller holds. When the session still
        stores a step with that id at that sequence, only the steps after it are read
        (`RunStart.history_start` says where the history starts): steps are never changed,
        a delete only cuts the end of the log and a step id is never reused, so every
        earlier step is still the one the caller holds. Otherwise the whole history is read.

        The session must be the run's tenant's (else NotFoundError, as for an unknown one);
        a new session is (ValueError otherwise).

        All or nothing. Raises NotFoundError (unknown session), SessionBusyError (another
        run is active or queued; nothing is written), RunRequiresActionError (a run of the
        session waits in REQUIRES_ACTION), DuplicateRequestError (a run of the session has
        the run's `request_id`), QueueFullError, TenantQuotaError, SequenceConflictError.
        """
        ...

    async def start_queued_run(
        self,
        run: Run,
        steps: Sequence[Step],
        *,
        since: HistoryMark | None = None,
        journal: Journal | None = None,
    ) -> RunStart:
        """Start a QUEUED run, in one transaction, as `start_run` starts one: when it heads
        its session's queue and the session is free (else SessionBusyError, or
        RunRequiresActionError), RUNNING with `steps` (its input) stored. Raises
        RunStateConflictError when it is no longer QUEUED, NotFoundError."""
        ...

    async def continue_run(
        self,
        run: Run,
        steps: Sequence[Step],
        *,
        expect: HistoryMark | None = None,
        journal: Journal | None = None,
    ) -> RunContinuation:
        """A continuation (SubmitToolOutputs), whole or not at all, in one transaction: take
        the session for the run, check that its last step is still `expect` (what the call
        read; None: no step) and that the run still waits, then store `steps` (the run's),
        `run` (RUNNING again, its counts extended by them) and what `journal` makes of them.
        Raises SessionBusyError, HistoryChangedError, RunStateConflictError, NotFoundError,
        TenantQuotaError, SequenceConflictError."""
        ...

    async def restart_run(
        self,
        run: Run,
        delete_from: int,
        *,
        expect: HistoryMark | None = None,
        journal: Journal | None = None,
    ) -> Run:
        """A Retry's write, in one transaction: take the session for `run`, check that its
        last step is still `expect` (what the call read), delete the steps from
        `delete_from` on (none when it is past the last), store the new run and what
        `journal` makes of it. Returns the run as stored. Raises NotFoundError (also for a
        session that is not the run's tenant's), SessionBusyError, HistoryChangedError,
        TenantQuotaError."""
        ...

    async def end_run(
        self, run: Run, *, steps: Sequence[Step] = (), journal: Journal | None = None
    ) -> RunEnd:
        """Store the run's last `steps` (appended while the run holds its session, else
        LeaseLostError), the run's end (status, stop signal, usage, counts, end time), release
        its session (`release_session(run.session_id, run.id)`) and store what `journal`
        makes of the run and the steps (their `step_completed`s, its terminal event), in one
        transaction: together or not at all. A run that is no longer RUNNING in the store was
        ended first by another server (a take-over after its lease ran out): that end stays,
        and is returned. Raises NotFoundError."""
        ...

    async def end_idle_run(
        self,
        run: Run,
        steps: Sequence[Step],
        *,
        expect: HistoryMark | None = None,
        journal: Journal | None = None,
    ) -> IdleEnd | None:
        """End a run nothing runs (waiting in REQUIRES_ACTION, or QUEUED), in one
        transaction: append `steps` (the results of a waiting run's open calls), store `run`
        (ended, its counts extended by them) and what `journal` makes of them; returns the
        run and the steps as stored. None, writing
        nothing, when the run is no longer idle. With steps to store: HistoryChangedError
        unless the session's last step is still `expect` (the log the caller read), and
        SessionBusyError while the session is held (a SubmitToolOutputs continuing the run).
        Raises NotFoundError."""
        ...

    async def release_session(self, session_id: str, run_id: str) -> bool:
        """Clear the active run and its lease if it is still `run_id` (a no-op otherwise).

        True when it was `run_id`'s to release: the run held the session to its end (no other
        holder took it over in between, or it would hold it now or have released it).
        """
        ...

    async def interrupt_abandoned_run(self, run_id: str) -> bool:
        """End the run INTERRUPTED (retryable; its counts from its stored steps) if its server
        is gone: it is RUNNING and either holds its session under an expired lease (the
        session is then released, as a take-over would) or no longer holds it at all (its
        server released the session but could not store the run's end). Returns whether it
        did. Never takes the session, so it cannot get in the way of the next run. Raises
        NotFoundError."""
        ...

    async def recover_expired_runs(self) -> list[str]:
        """Release every session whose holder's lease expired, finalising the holder's run
        as a take-over would (INTERRUPTED if still RUNNING). Returns the run ids finalised.

        Safe to call from any replica at any time: live leases are never touched.
        """
        ...

    async def queued_runs_called_here(self) -> list[Run]:
        """The QUEUED runs whose caller's stream this server instance held (`caller_instance`
        is the store's instance id): for a server starting, callers it no longer has. None
        without an instance id."""
        ...

    async def runs_past_approval_deadline(self, now: datetime, limit: int = 100) -> list[Run]:
        """REQUIRES_ACTION runs whose calls waiting for approval are past their deadline at
        `now` (`runs.approval_deadline`), earliest first: the server rejects those calls."""
        ...

    async def next_approval_deadline(self) -> datetime | None:
        """The earliest deadline of a REQUIRES_ACTION run's calls waiting for approval."""
        ...

    async def recover_own_runs(self) -> list[str]:
        """Release every session this server instance holds (by the store's instance id),
        finalising the holder's run as a take-over would, live lease or not, with the
        message that its server restarted (`RESTARTED_MESSAGE`); the run ids finalised. For
        a server starting (it runs nothing yet): the runs it left when it stopped need not
        wait for their leases. Nothing without an instance id."""
        ...
