"""Storage of sessions, steps and runs: the StepStore protocol and its SQL implementation.

This package's top level imports no database driver; `open_store` loads SQLAlchemy lazily.
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
    SequenceConflictError,
    SessionBusyError,
    StoreError,
    StoreUnavailableError,
    TenantQuotaError,
)
from agio_grpc.store.protocol import StepStore, TenantQuotas

__all__ = [
    "DuplicateRequestError",
    "HistoryChangedError",
    "InvalidRangeError",
    "LeaseLostError",
    "NotFoundError",
    "QueueFullError",
    "RunRequiresActionError",
    "RunStateConflictError",
    "SequenceConflictError",
    "SessionBusyError",
    "StepStore",
    "StoreError",
    "StoreUnavailableError",
    "TenantQuotaError",
    "TenantQuotas",
]
