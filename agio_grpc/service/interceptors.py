"""Server interceptors: the one boundary where requests are admitted and handler failures
become rich statuses.

`ErrorInterceptor` wraps every `agio.v1` and A2A handler. Before the handler runs it refuses what
no handler should see: request bytes that do not decode (INVALID_ARGUMENT
`MALFORMED_REQUEST`, one WARNING line, no traceback) and U+0000 in any string field of the
request (INVALID_ARGUMENT naming each field). Then a `ServiceError`, a store error or an
unexpected exception escaping the handler aborts the call with the status built by
`errors.to_status` (not sent once the call is over: its caller left, or its deadline passed).
Streaming handlers are written with `context.write` (not `yield`), so
cancellation reaches them as `CancelledError` and their cleanup runs in the handler's own
task. Cancellation and aborts raised by the handler itself pass through untouched.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, NoReturn

import grpc
from google.protobuf.message import DecodeError

from agio_grpc.handlers import (
    AGIO_METHODS,
    AgioMethodInterceptor,
    Behavior,
    Deserializer,
    rewrap_handler,
    takes_one_request,
)
from agio_grpc.service.errors import as_service_error, malformed_request, to_status
from agio_grpc.service.validation import nul_violations, raise_if_any

log = logging.getLogger(__name__)

Metadata = tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class Undecodable:
    """Stands in for a request whose bytes did not decode, so the handler wrapper, not
    grpc, answers it (grpc would answer UNKNOWN and log a traceback). The HTTP listener
    (service/connect.py) hands one in for a JSON body that does not parse."""

    error: str


def _tolerant(deserialize: Deserializer) -> Deserializer:
    def decode(data: bytes) -> Any:
        try:
            return deserialize(data)
        except DecodeError as error:
            return Undecodable(type(error).__name__)

    return decode


def _admit(method: str, request: Any) -> None:
    """Raise the ServiceError for a request no handler may see."""
    if isinstance(request, Undecodable):
        # The client's fault: one line, no traceback and none of the request's bytes.
        log.warning("refused an undecodable %s request (%s)", method, request.error)
        raise malformed_request(method)
    if method.startswith(AGIO_METHODS):
        # A2A's text is kept as its HTTP bindings keep it: as the store keeps all text
        # (domain.clean_text).
        raise_if_any(*nul_violations(request))


def _guard(
    method: str, behavior: Behavior, response_metadata: Metadata
) -> Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]]:
    """Wrap a unary handler or a streaming handler written with `context.write`."""

    async def handler(request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            if response_metadata:
                await context.send_initial_metadata(response_metadata)
            _admit(method, request)
            return await behavior(request, context)
        except (asyncio.CancelledError, grpc.aio.AbortError):
            raise
        except Exception as error:
            await abort_call(method, context, to_status(as_service_error(error)))

    return handler


async def abort_call(
    method: str, context: grpc.aio.ServicerContext, status: grpc.Status
) -> NoReturn:
    """End the call with `status`; quietly when the call is over already (its caller left
    or its deadline passed: the caller has its status, and grpc would log a traceback for
    a status it can no longer send)."""
    remaining = context.time_remaining()
    if not (context.done() or (remaining is not None and remaining <= 0)):
        try:
            await context.abort_with_status(status)
        except grpc.aio.AbortError:
            raise
        except Exception as error:  # grpc's own: the call ended while the status went out
            log.info("%s: %s not sent (%s: the call was over)", method, status.code.name, error)
    else:
        log.info("%s: %s not sent (the call was over)", method, status.code.name)
    raise asyncio.CancelledError


class ErrorInterceptor(AgioMethodInterceptor):
    """Admits each request and maps every exception escaping a handler to one status with
    an ErrorInfo; with `response_metadata` (a debugging worker's `x-agio-worker`), every
    response starts with it."""

    def __init__(self, response_metadata: Metadata = ()) -> None:
        self._response_metadata = response_metadata

    def rewrap(
        self, handler: grpc.RpcMethodHandler, details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler:
        if not takes_one_request(handler):
            return handler
        return rewrap_handler(
            handler,
            lambda behavior: _guard(details.method, behavior, self._response_metadata),
            request_deserializer=_tolerant(handler.request_deserializer),
        )
