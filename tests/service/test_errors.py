"""Every store error becomes one status and one stable ErrorInfo reason (service/errors.py)."""

from __future__ import annotations

import grpc
import pytest
from google.rpc import error_details_pb2, status_pb2

from agio_grpc.service.errors import from_store_error, to_status
from agio_grpc.store.errors import (
    InvalidRangeError,
    LeaseLostError,
    NotFoundError,
    SequenceConflictError,
    SessionBusyError,
    StoreError,
    StoreUnavailableError,
)


@pytest.mark.parametrize(
    ("error", "code", "reason", "metadata"),
    [
        (
            NotFoundError("session", "sess_x"),
            grpc.StatusCode.NOT_FOUND,
            "SESSION_NOT_FOUND",
            {"kind": "session", "key": "sess_x"},
        ),
        (
            SessionBusyError("sess_x", "run_a"),
            grpc.StatusCode.FAILED_PRECONDITION,
            "SESSION_BUSY",
            {"sessionId": "sess_x", "activeRunId": "run_a"},
        ),
        (
            InvalidRangeError("past the end", field="sequence", last_sequence=4),
            grpc.StatusCode.OUT_OF_RANGE,
            "SEQUENCE_OUT_OF_RANGE",
            {"lastSequence": "4"},
        ),
        (
            SequenceConflictError("sequence 3 is taken"),
            grpc.StatusCode.ABORTED,
            "SEQUENCE_CONFLICT",
            {},
        ),
        (
            LeaseLostError("sess_x", "run_a"),
            grpc.StatusCode.ABORTED,
            "SESSION_LEASE_LOST",
            {"sessionId": "sess_x", "runId": "run_a"},
        ),
        (
            StoreUnavailableError("database is locked"),
            grpc.StatusCode.UNAVAILABLE,
            "STORE_UNAVAILABLE",
            {},
        ),
        (StoreError("unexpected"), grpc.StatusCode.INTERNAL, "INTERNAL", {}),
    ],
)
def test_each_store_error_has_its_status_and_reason(
    error: StoreError, code: grpc.StatusCode, reason: str, metadata: dict[str, str]
) -> None:
    mapped = from_store_error(error)
    assert (mapped.code, mapped.reason, mapped.metadata) == (code, reason, metadata)

    status = to_status(mapped)
    assert status.code is code
    (details,) = [v for k, v in status.trailing_metadata if k == "grpc-status-details-bin"]
    infos = []
    for detail in status_pb2.Status.FromString(details).details:
        info = error_details_pb2.ErrorInfo()
        if detail.Unpack(info):
            infos.append(info)
    (info,) = infos
    assert (info.reason, info.domain, dict(info.metadata)) == (reason, "agio-grpc", metadata)
