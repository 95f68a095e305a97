"""`Storage`: the store's roles a runtime is given. Never imports SQLAlchemy or grpc."""

from __future__ import annotations

from dataclasses import dataclass

from agio_grpc.engine.lifecycle import Lifecycle
from agio_grpc.store.leases import SessionLeases
from agio_grpc.store.log import SessionLog
from agio_grpc.store.runs import RunRecords


@dataclass(frozen=True, slots=True)
class Storage:
    """The store's roles a runtime uses. Runs change only through `lifecycle`, the one holder
    of the store's `RunLedger`."""

    log: SessionLog
    runs: RunRecords
    lifecycle: Lifecycle
    leases: SessionLeases | None = None
    """Renews the session leases of this process's live runs (its `session_lease_s` long);
    without it nothing renews them: only for runs shorter than a lease."""
