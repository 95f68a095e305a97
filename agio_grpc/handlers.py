"""What the server's interceptors share: an interceptor of the `agio.v1` methods that wraps
each one's behaviour (authentication, tracing, error mapping: service/auth.py,
telemetry/grpc_server.py, service/interceptors.py), and the rewrapping of a method handler
of any kind. Other services (health, reflection) pass through as they are."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Any, cast

import grpc

Behavior = Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]]
"""A method handler's behaviour: the request (or its iterator) and the call's context."""
Deserializer = Callable[[bytes], Any]

AGIO_METHODS = "/agio.v1."
A2A_METHODS = "/lf.a2a.v1."
SERVED_METHODS = (AGIO_METHODS, A2A_METHODS)
"""The methods the service's interceptors wrap: `agio.v1`'s and A2A's (the same callers,
tenants and quotas)."""


def rewrap_handler(
    handler: grpc.RpcMethodHandler,
    wrap: Callable[[Behavior], Behavior],
    *,
    request_deserializer: Deserializer | None = None,
) -> grpc.RpcMethodHandler:
    """`handler` with its behaviour wrapped, whatever its kind, and its request deserializer
    replaced when one is given."""
    codecs = {
        "request_deserializer": request_deserializer or handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }
    if handler.unary_unary is not None:
        return grpc.unary_unary_rpc_method_handler(wrap(handler.unary_unary), **codecs)
    if handler.unary_stream is not None:
        return grpc.unary_stream_rpc_method_handler(wrap(_written(handler.unary_stream)), **codecs)
    if handler.stream_unary is not None:
        return grpc.stream_unary_rpc_method_handler(wrap(handler.stream_unary), **codecs)
    return grpc.stream_stream_rpc_method_handler(wrap(handler.stream_stream), **codecs)


def _written(behavior: Any) -> Behavior:
    """A streaming behaviour written as an async generator (the A2A SDK's) as one that writes
    with `context.write`, as the wrappers await it."""
    if not inspect.isasyncgenfunction(behavior):
        return cast(Behavior, behavior)

    async def written(request: Any, context: grpc.aio.ServicerContext) -> None:
        async for message in behavior(request, context):
            await context.write(message)

    return written


def takes_one_request(handler: grpc.RpcMethodHandler) -> bool:
    """Whether the method takes one request message (unary or server streaming), as every
    `agio.v1` method does."""
    return handler.unary_unary is not None or handler.unary_stream is not None


class AgioMethodInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Hands each `agio.v1` method's handler to `rewrap`; every other one passes."""

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None or not handler_call_details.method.startswith(SERVED_METHODS):
            return handler
        return self.rewrap(handler, handler_call_details)

    def rewrap(
        self, handler: grpc.RpcMethodHandler, details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler:
        """The handler to serve the method with."""
        raise NotImplementedError
