"""`SessionLeases` and `MemberDirectory`: keeping the sessions of live runs held, passing
cancel requests to the process running a run, and where the members sharing the store take
each other's calls. Never imports SQLAlchemy or grpc.

Session leases (one active run per session that survives a crashed server):
- Taking a session (`RunLedger.start_run`, `restart_run`, `continue_run`) makes the run
  its holder until `now + session_lease_s` (the store's setting). The take succeeds when
  the session is free OR its holder's lease has expired; otherwise SessionBusyError.
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
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Protocol

from agio_grpc.domain import StopSignal
from agio_grpc.store.records import Member


class SessionLeases(Protocol):
    """Renewing the leases of this process's live runs, and cancel requests across members.
    Only processes running runs need it (the runtime renews and polls for cancel requests)."""

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
