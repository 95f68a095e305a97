"""The one place a failure of an A2A call becomes an A2A error.

Every exception the request handler meets goes through `errors.as_service_error` (the
`agio.v1` mapping: store and engine errors, unknown ones logged and hidden) and then to the
A2A error of its status code, which the SDK's bindings send as a JSON-RPC error, an HTTP
status with `google.rpc` details, or a gRPC status with an `ErrorInfo`. The `agio.v1`
reason rides along as `agio_reason` in the error's data.

A2A has no error for an overloaded server or a quota: RESOURCE_EXHAUSTED and UNAVAILABLE
become `InternalError` with the reason and `retryable: true` in its data.
"""

from __future__ import annotations

import grpc
from a2a.utils import errors as a2a_errors

from agio_grpc.service.errors import as_service_error

A2AError = a2a_errors.A2AError

_BY_CODE: dict[grpc.StatusCode, type[A2AError]] = {
    grpc.StatusCode.NOT_FOUND: a2a_errors.TaskNotFoundError,
    grpc.StatusCode.INVALID_ARGUMENT: a2a_errors.InvalidParamsError,
    grpc.StatusCode.OUT_OF_RANGE: a2a_errors.InvalidParamsError,
    grpc.StatusCode.FAILED_PRECONDITION: a2a_errors.InvalidRequestError,
    grpc.StatusCode.ALREADY_EXISTS: a2a_errors.InvalidRequestError,
    grpc.StatusCode.UNIMPLEMENTED: a2a_errors.UnsupportedOperationError,
}
_RETRYABLE = frozenset(
    {
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.ABORTED,
    }
)


def to_a2a_error(error: BaseException) -> A2AError:
    """The A2A error `error` answers with (an A2A error as it is)."""
    if isinstance(error, A2AError):
        return error
    service = as_service_error(error)
    data: dict[str, object] = {"agio_reason": service.reason}
    if service.reason == "AGENT_NOT_FOUND":
        kind: type[A2AError] = a2a_errors.InvalidParamsError
    else:
        kind = _BY_CODE.get(service.code, a2a_errors.InternalError)
    if service.violations:
        data["errors"] = [{"field": v.field, "message": v.description} for v in service.violations]
    if service.code in _RETRYABLE:
        data["retryable"] = True
    return kind(service.message, data)


def invalid_params(field: str, message: str) -> A2AError:
    """InvalidParams naming one field of the request."""
    return a2a_errors.InvalidParamsError(
        f"{field}: {message}", {"errors": [{"field": field, "message": message}]}
    )
