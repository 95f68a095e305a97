"""`RemoteRuns`: the engine's port to the runs other members run.

Every server sharing the database is a member, and a run is owned by the member running it.
The engine reaches another member's run through this port, which the service implements
over its member calls (service/members.py): following the owner's live stream (with the
deltas of the step in progress, which the journal never has), and telling the owner of a
cancel request it recorded. Both may fail quietly: the engine then goes on from the store
(the journal, the polled cancel request).

A relayed event stays as the owner streamed it: the engine reads its seq and whether it ends
the run, and the service writes it on unchanged, so a relay costs no conversion. Never
imports grpc.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Protocol

from agio_grpc.engine.events import SequencedEvent


# Not frozen: a frozen dataclass takes twice as long to build, and one is built for every
# relayed delta. Never mutated all the same.
@dataclass(slots=True)
class RelayedEvent:
    """An event of a run another member runs, as that member streamed it."""

    seq: int
    is_terminal: bool
    """Whether it ends the run's stream (as `SequencedEvent.is_terminal`)."""
    message: object
    """The event as the owner sent it, opaque to the engine: the service writes it as it
    came."""


FollowedEvent = SequencedEvent | RelayedEvent
"""An event as a follow yields it: this process's own, or relayed from the run's owner."""


class RemoteRuns(Protocol):
    """The runs other members run (service/members.py)."""

    def follow(self, run_id: str, after_seq: int) -> AsyncIterator[RelayedEvent]:
        """The run's events after `after_seq` as the member running it streams them, up to
        its next terminal event; nothing when no other member runs it. Ends early (the
        caller goes on from the journal) when that member cannot be followed to the end."""
        ...

    async def tell_owner(self, run_id: str, timeout_s: float) -> None:
        """Tell the member running the run that a cancel request stands for it, and wait up
        to `timeout_s` for it to act; never raises (the request stands either way)."""
        ...
