"""The values the store's roles take and give: journal records, history marks, what a
transition stored. Plain frozen dataclasses; never imports SQLAlchemy or grpc."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from agio_grpc.domain import Run, Step, StopSignal


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
    """What `SessionLog.get_history_since` read."""

    steps: list[Step]
    """The session's steps from `start` on, as `get_history` reads them."""
    start: int = 1
    """The sequence `steps` starts at: 1 (every step), or just after the caller's `since`
    mark when that mark still holds."""


@dataclass(frozen=True, slots=True)
class RunStart:
    """What `RunLedger.start_run` stored, and the session's history after it."""

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
    followed: bool = False
    """The caller's stream owns the run (its end cancels it): the run is stored with this
    server's instance id as its `caller_instance`."""
    deadline: datetime | None = None
    """The caller's deadline, stored as the run's `caller_deadline`."""


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
    """What `RunLedger.continue_run` stored."""

    run: Run
    """The run as stored: RUNNING, step_count and last_sequence covering `steps`."""
    steps: list[Step]
    """The steps as stored (sequences and create times set)."""


@dataclass(frozen=True, slots=True)
class IdleEnd:
    """What `RunLedger.end_idle_run` stored."""

    run: Run
    """The run as ended: its counts extended by `steps`."""
    steps: list[Step]
    """The results of its open calls, as stored."""
    queued: bool = False
    """The session has queued runs, which the ended run may have held up."""


@dataclass(frozen=True, slots=True)
class RunEnd:
    """What `RunLedger.end_run` did."""

    released: bool
    """The session was the run's and is now free (what `release_session` returns)."""
    earlier_end: Run | None = None
    """The run as another server ended it first (then the given end was not stored)."""
    queued: bool = False
    """The session it released has queued runs: the next one may start."""
    steps: list[Step] = field(default_factory=list)
    """The steps it stored with the end, as stored."""
