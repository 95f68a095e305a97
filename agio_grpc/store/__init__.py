"""Storage of sessions, steps and runs: one protocol per role, and their SQL implementation.

    SessionLog       log.py     sessions and their step logs
    RunRecords       runs.py    reads of runs and of their event journal
    RunLedger        ledger.py  the run transitions (the engine's `Lifecycle` only)
    SessionLeases    leases.py  lease renewals and cancel requests across members
    MemberDirectory  leases.py  where the members take each other's calls
    records.py       the values they take and give; errors.py, what they raise

`agio_grpc.store.sql` implements every role on SQLAlchemy (SQLite, PostgreSQL). This
package's top level imports no database driver; `open_store` loads SQLAlchemy lazily.
"""

from agio_grpc.store.errors import (
    DuplicateRequestError,
    HistoryChangedError,
    InvalidRangeError,
    LeaseLostError,
    NotFoundError,
    QueueFullError,
    RunRequiresActionError,
    RunStateConflictError,
    SchemaTooNewError,
    SequenceConflictError,
    SessionBusyError,
    StoreError,
    StoreUnavailableError,
    TenantQuotaError,
)
from agio_grpc.store.log import SessionLog
from agio_grpc.store.records import TenantQuotas
from agio_grpc.store.runs import RunRecords

__all__ = [
    "DuplicateRequestError",
    "HistoryChangedError",
    "InvalidRangeError",
    "LeaseLostError",
    "NotFoundError",
    "QueueFullError",
    "RunRecords",
    "RunRequiresActionError",
    "RunStateConflictError",
    "SchemaTooNewError",
    "SequenceConflictError",
    "SessionBusyError",
    "SessionLog",
    "StoreError",
    "StoreUnavailableError",
    "TenantQuotaError",
    "TenantQuotas",
]
