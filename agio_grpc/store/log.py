"""`SessionLog`: sessions and their step logs, read and edited outside any run's
transitions (the service's SessionService, the engine's reads of history, a run's own
steps as it stores them, a compaction's summary).

The roles of the store: `SessionLog` (this module), `RunRecords` (runs.py, reads of runs and
their journal), `RunLedger` (ledger.py, the run transitions: only the lifecycle holds one),
`SessionLeases` and `MemberDirectory` (leases.py). `agio_grpc.store.sql` implements each on
SQLAlchemy (SQLite and PostgreSQL). Never imports SQLAlchemy or grpc.

Invariants every implementation keeps:
- `(session_id, sequence)` is unique, and a session's sequences are exactly 1..N with no
  gap, whatever mix of appends, deletes and forks happened; a collision raises
  `SequenceConflictError` and writes nothing.
- Each operation is atomic: on any error nothing is written.
- A session has at most one active run, held under a LEASE (see below).

Tenants (revision 0006): every session belongs to one (`Session.tenant`), and a run to its
session's (`Run.tenant`); a session's steps and journal are its. The lookups a caller makes
take `tenant=`, filtered in the same statement or transaction: another tenant's session or
run raises NotFoundError exactly as a missing one (same kind, key and message), before
anything else is decided (a busy session of another tenant is missing, not busy), so
nothing tells a caller whether another tenant's id exists. `tenant=None` is any tenant's:
for the engine's own reads of the ids it runs. Writes that start a run (`start_run`,
`restart_run`) only take a session of the run's tenant. Creating is the caller's tenant's:
`RunLedger.start_run(new_session=)` stores the session's `tenant`, a fork its
parent's.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Protocol

from agio_grpc.domain import ContextSummary, Session, Step
from agio_grpc.store.records import HistoryMark, HistoryRead, Journal


class SessionLog(Protocol):
    """Sessions and their step logs."""

    async def get_session(self, session_id: str, *, tenant: str | None = None) -> Session:
        """The session with its current step count. Raises NotFoundError (also for another
        tenant's, see the module docstring)."""
        ...

    async def list_sessions(
        self,
        limit: int,
        after: tuple[datetime, str] | None = None,
        *,
        tenant: str | None = None,
    ) -> list[Session]:
        """The tenant's sessions (every one: None) newest first, `(create_time, id)`
        strictly after the `after` key."""
        ...

    async def delete_session(self, session_id: str, *, tenant: str | None = None) -> int:
        """Delete a session with its steps and runs; returns the steps deleted. Raises
        NotFoundError, and SessionBusyError while a run holds the session (one transaction:
        over an expired lease, the run that held it is interrupted first)."""
        ...

    async def append_steps(
        self, steps: Sequence[Step], *, held_by: str = "", journal: Journal | None = None
    ) -> list[Step]:
        """Store steps of one session in one transaction, allocating consecutive sequences,
        with what `journal` makes of them in the journal of run `held_by` (required then).

        With `held_by` (a run id), only while that run holds the session: else nothing is
        written and LeaseLostError is raised (see the module docstring). Returns the stored
        steps (sequence and create_time set). Raises NotFoundError for an unknown session and
        SequenceConflictError on a collision.
        """
        ...

    async def get_steps(
        self,
        session_id: str,
        start: int = 1,
        end: int | None = None,
        limit: int | None = None,
        *,
        tenant: str | None = None,
    ) -> list[Step]:
        """Steps with start <= sequence <= end (end None = to the last), in sequence order.
        Raises NotFoundError for an unknown session."""
        ...

    async def get_history(
        self, session_id: str, start: int = 1, end: int | None = None
    ) -> list[Step]:
        """Steps as `get_steps` returns them, with only what a conversation needs: id, run_id,
        sequence and the message fields (role, content, reasoning_content, tool_calls,
        tool_call_id, name, is_error). create_time and trace ids keep their defaults; the
        steps share one empty `StepMetrics`, which must not be changed (replace a step's
        metrics instead). What the engine reads to build a model's context: about half the
        columns, so about half the cost of reading a long session. Raises NotFoundError."""
        ...

    async def get_history_since(
        self,
        session_id: str,
        since: HistoryMark | None,
        end: int | None = None,
        *,
        tenant: str | None = None,
    ) -> HistoryRead:
        """`get_history(session_id, 1, end)`, less what the caller holds: when the step at
        `since.sequence` (<= `end`) is still the one with `since.step_id`, only the steps
        after it, in the same read. That check is enough to know the held steps are still
        stored: stored steps never change, deletes only cut the end of a session and step
        ids are never reused. Raises NotFoundError."""
        ...

    async def get_step(self, session_id: str, sequence: int, *, tenant: str | None = None) -> Step:
        """The step at `sequence`. Raises NotFoundError (the session's first)."""
        ...

    async def first_user_messages(self, session_ids: Sequence[str], chars: int) -> dict[str, str]:
        """Session id -> the first `chars` characters of its step 1, for each of these
        sessions whose step 1 is a user step (the others are left out), in one read. No
        tenant check: the caller passes sessions it has already read as the tenant's."""
        ...

    async def append_to_idle_session(
        self, step: Step, *, after: HistoryMark | None, tenant: str | None = None
    ) -> Step:
        """Store `step` at the end of its session, in one transaction, only while no run holds
        the session and its log still ends at `after` (None: no step). Raises NotFoundError,
        SessionBusyError and HistoryChangedError (nothing written then)."""
        ...

    async def delete_steps_from(
        self, session_id: str, start_sequence: int, *, tenant: str | None = None
    ) -> int:
        """Delete steps with sequence >= start_sequence; returns how many were deleted.
        Raises NotFoundError, InvalidRangeError, and SessionBusyError while a run holds the
        session (one transaction, which takes the session and lets it go again: a call
        cancelled at any moment leaves it as it was or edited, never held)."""
        ...

    async def fork_session(
        self, session_id: str, up_to_sequence: int, *, tenant: str | None = None
    ) -> Session:
        """Copy steps 1..up_to_sequence into a new session with new step ids.

        The new session records `parent_session_id` and `fork_sequence`, and belongs to the
        parent's tenant. Raises NotFoundError, InvalidRangeError when up_to_sequence exceeds
        the last sequence.
        """
        ...

    async def context_summary(
        self, session_id: str, *, tenant: str | None = None
    ) -> ContextSummary:
        """Counts per role, tool calls, sequence range and tokens of the session's steps."""
        ...
