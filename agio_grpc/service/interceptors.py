"""Server interceptors: the one boundary where handler failures become rich statuses.

`ErrorInterceptor` wraps every handler: a `ServiceError`, a store error or an unexpected
exception aborts the call with the status built by `errors.to_status`. Streaming handlers
are written with `context.write` (not `yield`), so cancellation reaches them as
`CancelledError` and their cleanup runs in the handler's own task. Cancellation and
aborts raised by the handler itself pass through untouched.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from agio_grpc.service.errors import as_service_error, to_status

Behavior = Callable[[Any, grpc.aio.ServicerContext], Any]


def _guard(behavior: Behavior) -> Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]]:
    """Wrap a unary handler or a streaming handler written with `context.write`."""

    async def handler(request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            return await behavior(request, context)
        except (asyncio.CancelledError, grpc.aio.AbortError):
            raise
        except Exception as error:
            await context.abort_with_status(to_status(as_service_error(error)))

    return handler


class ErrorInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Maps every exception escaping a handler to one status with an ErrorInfo."""

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None or not handler_call_details.method.startswith("/agio.v1."):
            return handler
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(
                _guard(handler.unary_unary),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(
                _guard(handler.unary_stream),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        return handler
