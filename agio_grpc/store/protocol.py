"""The StepStore protocol: every read and write of sessions, steps and runs.

The engine and the service depend on this protocol only; `agio_grpc.store.sql` implements it
on SQLAlchemy (SQLite and PostgreSQL). Never imports SQLAlchemy or grpc.

Invariants every implementation keeps:
- `(session_id, sequence)` is unique, and a session's sequences are exactly 1..N with no
  gap, whatever mix of appends, deletes and forks happened; a collision raises
  `SequenceConflictError` and writes nothing.
- Each operation is atomic: on any error nothing is written.
- A session has at most one active run, held under a LEASE (see below).

Session leases (one active run per session that survives a crashed server):
- Taking a session (`acquire_session`, `start_run`) makes the run its holder until
  `now + session_lease_s` (the store's setting). The take succeeds when the session is free
  OR its holder's lease has expired; otherwise SessionBusyError.
- The process running a run keeps its lease alive with `SessionLeases.renew_leases` (well
  before it expires: the runtime renews every third of the lease); `release_session` clears
  holder and lease when the run ends.
- A lease only expires when its process stopped renewing, i.e. is presumed dead. A take over
  an expired lease finalises the previous holder's run in the same transaction if it is
  still RUNNING: INTERRUPTED, retryable, source `server`, resume_from_sequence = the
  session's last sequence + 1 (steps are stored whole, so everything before it is complete;
  `Retry` from there continues, running any tool call left without a result).
- A holder whose server only stalled past its lease finds the session gone when it wakes:
  the run's own writes name it (`append_steps(held_by=...)`) and fail with LeaseLostError
  once it no longer holds the session, and `end_run` keeps the end the take-over stored, so
  a late writer never adds steps to a session another run holds.
- `now` is the store process's UTC wall clock (as for every other time the store writes):
  replicas sharing a database need clocks in sync well within the lease (NTP is plenty).

Tenants (revision 0006): every session belongs to one (`Session.tenant`), and a run to its
session's (`Run.tenant`); a session's steps and journal are its. The lookups a caller makes
take `tenant=`, filtered in the same statement or transaction: another tenant's session or
run raises NotFoundError exactly as a missing one (same kind, key and message), before
anything else is decided (a busy session of another tenant is missing, not busy), so
nothing tells a caller whether another tenant's id exists. `tenant=None` is any tenant's:
for the engine's own reads of the ids it runs. Writes that start a run (`start_run`,
`restart_run`) only take a session of the run's tenant. Creating is the caller's tenant's:
`create_session` and `start_run(new_session=)` store the session's `tenant`, a fork its
parent's.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from agio_grpc.domain import ContextSummary, Run, Session, Step, StopSignal


@dataclass(frozen=True, slots=True)
class JournalRecord:
    """One stored run event, in domain terms: its live `seq` and time, its kind (the
    `StepEvent` oneof field it becomes) and its content. The store keeps it as it is given
    and never interprets it, except for the terminal event it writes itself when it ends a
    run whose server is gone."""

    seq: int
    time: datetime
    kind: str
    run: Run | None = None
    step: Step | None = None
    data: Mapping[str, Any] = field(default_factory=dict)


Journal = Callable[[Run | None, Sequence[Step]], Sequence[JournalRecord]]
"""What a write journals, built inside its transaction from what it stored: the run as
stored (None for a plain append) and the steps with their sequences and create times. Pure
and quick: it runs while the transaction holds its locks."""

TAKEOVER_SEQ_GAP = 1 << 20
"""How far past the last journaled event a run ended by a take-over (its server is gone)
puts its terminal event: past anything that server can have streamed and not stored (the
step in progress's deltas), so a client's live cursor is still before it. A cursor past
it anyway gets it all the same (engine/watching.py)."""

TERMINAL_KINDS = frozenset({"run_completed", "run_failed"})
"""The kinds of journal record that end a run's event stream."""


def terminal_kind(run: Run) -> str:
    """The kind of the event that ends the stream of `run` (its stop signal set)."""
    failed = run.stop_signal is not None and run.stop_signal.reason.is_error
    return "run_failed" if failed else "run_completed"


@dataclass(frozen=True, slots=True)
class Member:
    """A server instance as the other members reach it (`MemberDirectory`)."""

    instance_id: str
    address: str
    """Where its member listener takes calls from the other members (`host:port`)."""


@dataclass(frozen=True, slots=True)
class HistoryMark:
    """The last step of a session's history a caller already holds."""

    sequence: int
    step_id: str


@dataclass(frozen=True, slots=True)
class HistoryRead:
    """What `StepStore.get_history_since` read."""

    steps: list[Step]
    """The session's steps from `start` on, as `get_history` reads them."""
    start: int = 1
    """The sequence `steps` starts at: 1 (every step), or just after the caller's `since`
    mark when that mark still holds."""


@dataclass(frozen=True, slots=True)
class RunStart:
    """What `StepStore.start_run` stored, and the session's history after it."""

    run: Run
    """The run as stored: first/last sequence and step count cover `steps`."""
    steps: list[Step]
    """The run's first steps as stored (sequences and create times set)."""
    history: list[Step]
    """The session's steps from `history_start` on, in sequence order, ending with `steps`;
    the earlier ones as `get_history` reads them (message fields only)."""
    history_start: int = 1
    """The sequence `history` starts at: 1 (every step), or just after the caller's
    `since` mark when that mark still holds."""
    interrupted: str = ""
    """A run queued ahead (INTERRUPT, ROLLBACK): the session's running run, asked to stop."""
    holder: str = ""
    """A queued run: the run holding the session ("" when it is free: the queue may start)."""


@dataclass(frozen=True, slots=True)
class QueueRequest:
    """How `start_run` queues its run when the session is busy: held by a live run, or with
    a run waiting for its client or queued (BUSY_POLICY_ENQUEUE, INTERRUPT, ROLLBACK)."""

    max_queued: int
    """How many runs the session's queue may hold (QueueFullError beyond)."""
    ahead: bool = False
    """INTERRUPT, ROLLBACK: at the head of the queue, the running run asked to stop with
    `supersede`. A run waiting for its client is refused (RunRequiresActionError): the caller
    ends it first."""
    supersede: StopSignal | None = None
    rollback: bool = False
    """ROLLBACK: the interrupted run's steps are deleted when this run starts."""


@dataclass(frozen=True, slots=True)
class TenantQuotas:
    """How many runs of one tenant may be RUNNING, and QUEUED, at once, over every server
    sharing the store (0: no limit). A write that would make one more (`start_run`, a
    `restart_run`, a `continue_run`; queued: `start_run` with a queue) raises
    TenantQuotaError and writes nothing. A queued run starts whatever the running count:
    it was accepted when it was queued. An implementation takes them when it is made."""

    max_running_runs: int = 0
    max_queued_runs: int = 0


@dataclass(frozen=True, slots=True)
class RunContinuation:
    """What `StepStore.continue_run` stored."""

    run: Run
    """The run as stored: RUNNING, step_count and last_sequence covering `steps`."""
    steps: list[Step]
    """The steps as stored (sequences and create times set)."""


@dataclass(frozen=True, slots=True)
class IdleEnd:
    """What `StepStore.end_idle_run` stored."""

    run: Run
    """The run as ended: its counts extended by `steps`."""
    steps: list[Step]
    """The results of its open calls, as stored."""
    queued: bool = False
    """The session has queued runs, which the ended run may have held up."""


@dataclass(frozen=True, slots=True)
class RunEnd:
    """What `StepStore.end_run` did."""

    released: bool
    """The session was the run's and is now free (what `release_session` returns)."""
    earlier_end: Run | None = None
    """The run as another server ended it first (then the given end was not stored)."""
    queued: bool = False
    """The session it released has queued runs: the next one may start."""


class StepStore(Protocol):
    """Storage of sessions, their step logs and runs."""

    async def create_session(self, session: Session | None = None) -> Session:
        """Store a new, empty session (a fresh one when `session` is None)."""
        ...

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

    async def append_step(self, step: Step) -> Step:
        """`append_steps` for one step."""
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

    async def get_last_step(self, session_id: str) -> Step | None:
        """The step with the highest sequence, or None for an empty session."""
        ...

    async def first_user_messages(self, session_ids: Sequence[str], chars: int) -> dict[str, str]:
        """Session id -> the first `chars` characters of its step 1, for each of these
        sessions whose step 1 is a user step (the others are left out), in one read. No
        tenant check: the caller passes sessions it has already read as the tenant's."""
        ...

    async def count_steps(self, session_id: str) -> int:
        """How many steps the session holds."""
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

    async def create_run(self, run: Run) -> Run:
        """Store a new run. Raises NotFoundError for an unknown session (or one that is not
        the run's tenant's)."""
        ...

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

    async def next_queued_run(self, session_id: str) -> Run | None:
        """The run heading the session's queue, if any."""
        ...

    async def ready_queues(self, limit: int = 100) -> list[str]:
        """Sessions with queued runs and nothing else in their way: free (or held under an
        expired lease) and no run waiting for its client. For the member that sweeps them
        after a crash ended a queue's run with no one to start the next."""
        ...

    async def update_run(self, run: Run) -> Run:
        """Overwrite a run's mutable fields (status, stop signal, usage, counts, end time)."""
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

    async def end_run(self, run: Run, *, journal: Journal | None = None) -> RunEnd:
        """`update_run`, `release_session(run.session_id, run.id)` and what `journal` makes
        of the run (its terminal event) in one transaction, as a run ends: stored together or
        not at all. A run that is no longer RUNNING in the store was ended first by another
        server (a take-over after its lease ran out): that end stays, and is returned.
        Raises NotFoundError."""
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

    async def read_journal(self, run_id: str, after_seq: int = 0) -> list[JournalRecord]:
        """The run's journal records with a seq above `after_seq`, in seq order (none for
        an unknown run)."""
        ...

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

    async def acquire_session(self, session_id: str, run_id: str) -> None:
        """Make `run_id` the session's one active run, under a fresh lease.

        Succeeds over a free session or an expired lease (interrupting the previous holder's
        run, see the module docstring). Raises NotFoundError, SessionBusyError.
        """
        ...

    async def release_session(self, session_id: str, run_id: str) -> bool:
        """Clear the active run and its lease if it is still `run_id` (a no-op otherwise).

        True when it was `run_id`'s to release: the run held the session to its end (no other
        holder took it over in between, or it would hold it now or have released it).
        """
        ...

    async def close(self) -> None:
        """Release connections."""
        ...


class SessionLeases(Protocol):
    """Keeping session leases alive, cleaning up after the holders that died, and passing
    cancel requests to the process running a run.

    Separate from StepStore because only processes running runs need it (the runtime
    renews and polls for cancel requests; the app recovers at start-up); see the module
    docstring for the lease semantics.
    """

    @property
    def session_lease_s(self) -> float:
        """How long a take or a renewal holds a session, in seconds."""
        ...

    async def renew_leases(self, holders: Mapping[str, str]) -> set[str]:
        """Extend to `now + session_lease_s` the lease of each session (key) still held by
        its run (value), in one transaction; returns the session ids renewed. A session not
        returned was released or taken over: its run no longer holds it.
        """
        ...

    async def request_cancel(self, run_id: str, signal: StopSignal) -> bool:
        """Ask the process running the run to stop it with `signal`: recorded on the run
        when it is RUNNING (a first request stands; later ones change nothing). Returns
        whether the run is RUNNING, i.e. whether a request now stands. Raises
        NotFoundError."""
        ...

    async def cancel_requests(self, run_ids: Collection[str]) -> dict[str, StopSignal]:
        """The cancel requests standing on those of `run_ids` still RUNNING, by run id."""
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

    async def recover_own_runs(self) -> list[str]:
        """Release every session this server instance holds (by the store's instance id),
        finalising the holder's run as a take-over would, live lease or not; the run ids
        finalised. For a server starting (it runs nothing yet): the runs it left when it
        stopped need not wait for their leases. Nothing without an instance id."""
        ...


class MemberDirectory(Protocol):
    """Where the server instances sharing the store take calls from each other: how a
    `WatchRun` follows, and a `CancelRun` reaches, a run another member runs."""

    async def register_member(self, address: str) -> None:
        """Record `address` as this server instance's member address (its instance id's
        row, made or overwritten). Raises ValueError without an instance id."""
        ...

    async def member_running(self, run_id: str) -> Member | None:
        """The member holding the run's session for it (`lease_owner`), with the address it
        registered; None when no instance holds the session for this run (it is not
        running, or ran where leases have no owner) or that instance registered none."""
        ...
