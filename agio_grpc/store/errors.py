"""Errors raised by every implementation of the store's roles.

The service layer maps each to one gRPC status and `ErrorInfo` reason; the engine catches
them by type. Never imports SQLAlchemy, so callers can catch them without a driver.
"""

from __future__ import annotations


class StoreError(Exception):
    """Base of all store errors."""


class NotFoundError(StoreError):
    """A session, step or run does not exist."""

    def __init__(self, kind: str, key: str) -> None:
        super().__init__(f"{kind} {key!r} not found")
        self.kind = kind
        self.key = key


class SequenceConflictError(StoreError):
    """A write would reuse a (session_id, sequence) pair; nothing was written."""


class SessionBusyError(StoreError):
    """The session already has an active run."""

    def __init__(self, session_id: str, active_run_id: str) -> None:
        super().__init__(f"session {session_id!r} already has an active run {active_run_id!r}")
        self.session_id = session_id
        self.active_run_id = active_run_id


class RunRequiresActionError(SessionBusyError):
    """The session has a run waiting in REQUIRES_ACTION for its client tool outputs: a new
    run would leave its tool calls without results. Answer them (SubmitToolOutputs) or
    cancel that run first."""

    def __init__(self, session_id: str, waiting_run_id: str) -> None:
        super().__init__(session_id, waiting_run_id)
        self.args = (
            f"session {session_id!r} has run {waiting_run_id!r} waiting for client tool "
            "outputs: submit them (SubmitToolOutputs) or cancel that run first",
        )


class DuplicateRequestError(StoreError):
    """A run with the same `request_id` already exists on the session."""

    def __init__(self, request_id: str, run_id: str) -> None:
        super().__init__(f"request_id {request_id!r} was already used by run {run_id!r}")
        self.request_id = request_id
        self.run_id = run_id


class RunStateConflictError(StoreError):
    """The run is no longer in the state the write expected (a waiting run cancelled or
    continued meanwhile, a queued run started or cancelled): nothing was written."""

    def __init__(self, run_id: str, status: str, expected: str = "REQUIRES_ACTION") -> None:
        super().__init__(f"run {run_id!r} is {status}, not {expected}")
        self.run_id = run_id
        self.status = status


class QueueFullError(StoreError):
    """The session's queue holds as many runs as it may: nothing was written."""

    def __init__(self, session_id: str, limit: int) -> None:
        super().__init__(
            f"session {session_id!r} already has {limit} queued run(s), the most it may hold"
        )
        self.session_id = session_id
        self.limit = limit


class HistoryChangedError(StoreError):
    """The session's log changed between the read a write was decided on and the write (a
    Retry, DeleteSteps or another run raced it): nothing was written."""

    def __init__(self, session_id: str) -> None:
        super().__init__(f"session {session_id!r} changed while the call was deciding; try again")
        self.session_id = session_id


class LeaseLostError(StoreError):
    """A run wrote as its session's holder, but no longer holds it: its lease ran out (its
    server stalled past it) and the session was taken over or released. Nothing was written;
    the run must stop writing to the session."""

    def __init__(self, session_id: str, run_id: str) -> None:
        super().__init__(f"run {run_id!r} no longer holds session {session_id!r}")
        self.session_id = session_id
        self.run_id = run_id


class InvalidRangeError(StoreError):
    """A sequence argument is outside the session's steps (e.g. a fork past the last step)."""

    def __init__(self, message: str, *, field: str, last_sequence: int) -> None:
        super().__init__(message)
        self.field = field
        self.last_sequence = last_sequence


class StoreUnavailableError(StoreError):
    """The database cannot be reached or refused the operation for a transient reason."""


class SchemaTooNewError(StoreError):
    """The database's schema is at a revision this version of the store does not have: a
    newer version migrated it. Nothing was changed; this version cannot use it."""

    def __init__(self, revisions: tuple[str, ...], head: str) -> None:
        named = ", ".join(repr(revision) for revision in revisions)
        super().__init__(
            f"the database's schema is at revision {named}, which this version of agio-grpc "
            f"does not have (its newest is {head!r}): a newer version migrated it"
        )
        self.revisions = revisions
        self.head = head


class TenantQuotaError(StoreError):
    """The run would take its tenant past a quota (`TenantQuotas`): as many of its runs as
    the quota allows are `status` (RUNNING or QUEUED) already. Nothing was written."""

    def __init__(self, tenant: str, status: str, limit: int) -> None:
        super().__init__(
            f"tenant {tenant!r} has {limit} {status.lower()} run(s) already, the most its "
            "quota allows: try again once one has ended"
        )
        self.tenant = tenant
        self.status = status
        self.limit = limit
