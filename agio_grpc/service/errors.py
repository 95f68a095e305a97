"""One place that turns failures into gRPC statuses with rich details.

Every non-OK status the service sends is built here: a canonical code, a message with no
traceback, exactly one `google.rpc.ErrorInfo` with a stable `reason`, for bad input a
`google.rpc.BadRequest` listing the offending fields, and for a tenant's quota a
`google.rpc.QuotaFailure` with a `google.rpc.RetryInfo`. Handlers raise `ServiceError` (or let a
store/engine error escape); `error_status` maps it and the interceptor aborts the call.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import grpc
from google.protobuf import any_pb2, duration_pb2
from google.protobuf.message import Message
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

from agio_grpc.engine.errors import (
    AgentNotFoundError,
    CompactionFailedError,
    EngineError,
    InvalidInputError,
    RunStateError,
    RuntimeClosedError,
    ServerBusyError,
)
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

ERROR_DOMAIN = "agio-grpc"
MAX_REPORTED_VIOLATIONS = 8
MAX_SUMMARISED_VIOLATIONS = 3
MAX_FIELD_PATH_CHARS = 160
MAX_DESCRIPTION_CHARS = 240
log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class FieldViolation:
    """One invalid request field: its path (`page_size`, `overrides.max_steps`) and why."""

    field: str
    description: str


@dataclass(slots=True)
class ServiceError(Exception):
    """A call that cannot be served, with its status code and stable reason."""

    code: grpc.StatusCode
    reason: str
    message: str
    metadata: dict[str, str] = field(default_factory=dict)
    violations: list[FieldViolation] = field(default_factory=list)
    details: list[Message] = field(default_factory=list)
    """Further `google.rpc` details (QuotaFailure, RetryInfo), after ErrorInfo and
    BadRequest."""

    def __str__(self) -> str:
        return f"{self.code.name} {self.reason}: {self.message}"


def invalid_argument(violations: list[FieldViolation]) -> ServiceError:
    """INVALID_ARGUMENT naming the bad fields.

    Bounded so the status always fits in the 8 KiB of trailing metadata a gRPC client
    accepts by default: at most `MAX_REPORTED_VIOLATIONS` violations (the message names
    the first few), each field path and description cut to a fixed length.
    """
    shown = [
        FieldViolation(
            _cut(v.field, MAX_FIELD_PATH_CHARS), _cut(v.description, MAX_DESCRIPTION_CHARS)
        )
        for v in violations[:MAX_REPORTED_VIOLATIONS]
    ]
    summary = "; ".join(f"{v.field}: {v.description}" for v in shown[:MAX_SUMMARISED_VIOLATIONS])
    if len(violations) > MAX_SUMMARISED_VIOLATIONS:
        summary += f"; and {len(violations) - MAX_SUMMARISED_VIOLATIONS} more"
    return ServiceError(
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_ARGUMENT",
        f"invalid request: {summary}",
        violations=shown,
    )


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def malformed_request(method: str) -> ServiceError:
    """INVALID_ARGUMENT for request bytes that do not decode as the method's request message
    (malformed protobuf, or a string field that is not valid UTF-8)."""
    return ServiceError(
        grpc.StatusCode.INVALID_ARGUMENT,
        "MALFORMED_REQUEST",
        "the request could not be decoded: malformed protobuf, or a string field that is "
        "not valid UTF-8",
        metadata={"method": method},
    )


def deadline_too_short(remaining_s: float, minimum_s: float) -> ServiceError:
    """DEADLINE_EXCEEDED for a call whose deadline leaves too little time to start a run
    and still send its end: nothing was started or stored."""
    return ServiceError(
        grpc.StatusCode.DEADLINE_EXCEEDED,
        "DEADLINE_TOO_SHORT",
        f"the call's deadline leaves {max(remaining_s, 0.0):.3f} s: a run needs at least "
        f"{minimum_s:g} s to start and send its end (nothing was started)",
        metadata={"minimumSeconds": f"{minimum_s:g}"},
    )


CREDENTIALS_MISSING = "CREDENTIALS_MISSING"
CREDENTIALS_INVALID = "CREDENTIALS_INVALID"
CREDENTIALS_EXPIRED = "CREDENTIALS_EXPIRED"
KEY_REVOKED = "KEY_REVOKED"

_UNAUTHENTICATED_MESSAGES = {
    CREDENTIALS_MISSING: "no credential: send `authorization: Bearer <credential>` metadata",
    CREDENTIALS_INVALID: "the credential is not valid",
    CREDENTIALS_EXPIRED: "the credential has expired",
    KEY_REVOKED: "the API key was revoked",
}


def unauthenticated(reason: str, mode: str, detail: str = "") -> ServiceError:
    """UNAUTHENTICATED with one of the reasons above, the server's `auth.mode` in the
    metadata. `detail` says what was wrong with the credential (never any of it)."""
    message = _UNAUTHENTICATED_MESSAGES[reason]
    return ServiceError(
        grpc.StatusCode.UNAUTHENTICATED,
        reason,
        f"{message}: {detail}" if detail else message,
        metadata={"mode": mode},
    )


def authentication_unavailable(mode: str) -> ServiceError:
    """UNAVAILABLE: what verifies credentials cannot be reached (the identity provider's key
    set); the caller's credential may well be good, so it is worth trying again."""
    return ServiceError(
        grpc.StatusCode.UNAVAILABLE,
        "AUTHENTICATION_UNAVAILABLE",
        "credentials cannot be verified now; try again later",
        metadata={"mode": mode},
    )


def host_not_allowed(host: str) -> ServiceError:
    """PERMISSION_DENIED for a request naming a host the listener does not answer for (a
    page whose name was made to resolve to this server: DNS rebinding). The host is the
    request's own (at most 253 characters of it), never a secret."""
    return ServiceError(
        grpc.StatusCode.PERMISSION_DENIED,
        "HOST_NOT_ALLOWED",
        f"host {host[:253]!r} is not served here: name this server by one of its own names, "
        "or add the name to http.allowed_hosts",
        metadata={"host": host[:253]},
    )


def not_found(kind: str, key: str) -> ServiceError:
    """NOT_FOUND for a session, step, run or agent."""
    return ServiceError(
        grpc.StatusCode.NOT_FOUND,
        f"{kind.upper()}_NOT_FOUND",
        f"{kind} {key!r} not found",
        metadata={"kind": kind, "key": key},
    )


def from_store_error(error: StoreError) -> ServiceError:
    """The status for a store failure."""
    if isinstance(error, NotFoundError):
        return not_found(error.kind, error.key)
    if isinstance(error, RunRequiresActionError):
        return ServiceError(
            grpc.StatusCode.FAILED_PRECONDITION,
            "RUN_REQUIRES_ACTION",
            str(error),
            metadata={"run_id": error.active_run_id, "sessionId": error.session_id},
        )
    if isinstance(error, SessionBusyError):
        return ServiceError(
            grpc.StatusCode.FAILED_PRECONDITION,
            "SESSION_BUSY",
            str(error),
            metadata={"sessionId": error.session_id, "activeRunId": error.active_run_id},
        )
    if isinstance(error, InvalidRangeError):
        return ServiceError(
            grpc.StatusCode.OUT_OF_RANGE,
            "SEQUENCE_OUT_OF_RANGE",
            str(error),
            metadata={"lastSequence": str(error.last_sequence)},
            violations=[FieldViolation(error.field, str(error))],
        )
    if isinstance(error, QueueFullError):
        return ServiceError(
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            "QUEUE_FULL",
            str(error),
            metadata={"sessionId": error.session_id, "limit": str(error.limit)},
        )
    if isinstance(error, DuplicateRequestError):
        return ServiceError(
            grpc.StatusCode.ALREADY_EXISTS,
            "DUPLICATE_REQUEST",
            str(error),
            metadata={"requestId": error.request_id, "runId": error.run_id},
        )
    if isinstance(error, RunStateConflictError):
        return ServiceError(
            grpc.StatusCode.FAILED_PRECONDITION,
            "RUN_STATE_CONFLICT",
            str(error),
            metadata={"runId": error.run_id, "status": error.status},
        )
    if isinstance(error, HistoryChangedError):
        return ServiceError(
            grpc.StatusCode.ABORTED,
            "SESSION_CHANGED",
            str(error),
            metadata={"sessionId": error.session_id},
        )
    if isinstance(error, SequenceConflictError):
        return ServiceError(grpc.StatusCode.ABORTED, "SEQUENCE_CONFLICT", str(error))
    if isinstance(error, LeaseLostError):
        return ServiceError(
            grpc.StatusCode.ABORTED,
            "SESSION_LEASE_LOST",
            f"{error}: the call stalled past the session's lease and another call took "
            "the session; nothing was stored",
            metadata={"sessionId": error.session_id, "runId": error.run_id},
        )
    if isinstance(error, TenantQuotaError):
        return tenant_quota_exceeded(error)
    if isinstance(error, StoreUnavailableError):
        return ServiceError(
            grpc.StatusCode.UNAVAILABLE, "STORE_UNAVAILABLE", "the step store is unavailable"
        )
    # A write the database refused (or a bug): the caller is sent to the log, so it is there
    # (without the statement's parameters: store/database.py hides them).
    log.error("storage error in a handler", exc_info=error)
    return internal_error()


QUOTA_RETRY_DELAY_S = 1
"""The wait a refusal for a tenant's quota suggests (RetryInfo): about how soon one of its
runs may end, or a queued one start."""
_QUOTA_NAMES = {"RUNNING": "max_running_runs_per_tenant", "QUEUED": "max_queued_runs_per_tenant"}


def tenant_quota_exceeded(error: TenantQuotaError) -> ServiceError:
    """RESOURCE_EXHAUSTED `TENANT_QUOTA_EXCEEDED`: the caller's tenant is at a quota."""
    quota = _QUOTA_NAMES.get(error.status, error.status.lower())
    return ServiceError(
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        "TENANT_QUOTA_EXCEEDED",
        str(error),
        metadata={"tenant": error.tenant, "quota": quota, "limit": str(error.limit)},
        details=[
            error_details_pb2.QuotaFailure(
                violations=[
                    error_details_pb2.QuotaFailure.Violation(
                        subject=f"tenant:{error.tenant}",
                        description=f"{quota} is {error.limit}",
                    )
                ]
            ),
            error_details_pb2.RetryInfo(
                retry_delay=duration_pb2.Duration(seconds=QUOTA_RETRY_DELAY_S)
            ),
        ],
    )


def from_engine_error(error: EngineError) -> ServiceError:
    """The status for a request the engine refused before any run started."""
    if isinstance(error, AgentNotFoundError):
        found = not_found("agent", error.agent)
        found.message = str(error)
        return found
    if isinstance(error, InvalidInputError):
        return invalid_argument([FieldViolation(error.field, error.message)])
    if isinstance(error, RunStateError):
        return ServiceError(
            grpc.StatusCode.FAILED_PRECONDITION,
            "RUN_STATE_CONFLICT",
            str(error),
            metadata={"runId": error.run_id, "status": error.status},
        )
    if isinstance(error, RuntimeClosedError):
        return ServiceError(grpc.StatusCode.UNAVAILABLE, "SHUTTING_DOWN", str(error))
    if isinstance(error, CompactionFailedError):
        code = (
            grpc.StatusCode.UNAVAILABLE if error.retryable else grpc.StatusCode.FAILED_PRECONDITION
        )
        provider: dict[str, str] = {}
        if error.status_code is not None:
            provider["statusCode"] = str(error.status_code)
        if error.error_code is not None:
            provider["errorCode"] = error.error_code
        return ServiceError(code, "COMPACTION_FAILED", str(error), metadata=provider)
    if isinstance(error, ServerBusyError):
        return ServiceError(
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            "SERVER_BUSY",
            str(error),
            metadata={
                "runningRuns": str(error.running),
                "limit": str(error.limit),
                "waiting": str(error.waiting),
            },
        )
    return ServiceError(grpc.StatusCode.FAILED_PRECONDITION, "REQUEST_REFUSED", str(error))


def internal_error() -> ServiceError:
    """INTERNAL with a fixed message: details go to the log, never to the caller."""
    return ServiceError(grpc.StatusCode.INTERNAL, "INTERNAL", "internal error; see server log")


def to_status(error: ServiceError) -> grpc.Status:
    """The grpc-status with one ErrorInfo (and BadRequest when fields are named)."""
    details: list[any_pb2.Any] = []
    info = any_pb2.Any()
    info.Pack(
        error_details_pb2.ErrorInfo(
            reason=error.reason, domain=ERROR_DOMAIN, metadata=error.metadata
        )
    )
    details.append(info)
    if error.violations:
        bad_request = any_pb2.Any()
        bad_request.Pack(
            error_details_pb2.BadRequest(
                field_violations=[
                    error_details_pb2.BadRequest.FieldViolation(
                        field=v.field, description=v.description
                    )
                    for v in error.violations
                ]
            )
        )
        details.append(bad_request)
    for detail in error.details:
        packed = any_pb2.Any()
        packed.Pack(detail)
        details.append(packed)
    code: int = error.code.value[0]
    assert code_pb2.Code.Name(code)  # every grpc.StatusCode is a google.rpc.Code
    status: grpc.Status = rpc_status.to_status(
        status_pb2.Status(code=code, message=error.message, details=details)
    )
    return status


def as_service_error(error: BaseException) -> ServiceError:
    """Map any exception escaping a handler; unknown ones are logged and hidden."""
    if isinstance(error, ServiceError):
        return error
    if isinstance(error, StoreError):
        return from_store_error(error)
    if isinstance(error, EngineError):
        return from_engine_error(error)
    log.error("unhandled error in a handler", exc_info=error)
    return internal_error()
