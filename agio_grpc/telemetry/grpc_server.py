"""The gRPC server span of each agio call, continuing the caller's W3C trace context.

`TracingInterceptor` goes first in the interceptor list: it extracts `traceparent` (and
`baggage`) from the call's metadata with the configured propagators, starts a SERVER span
named `agio.v1.AgentService/Run` and makes it current for the handler. A run the handler
starts becomes its child (the runtime starts the run's span from the current context).
Status follows the gRPC conventions: OK, CANCELLED, NOT_FOUND and the like leave the span
unset; UNKNOWN, DEADLINE_EXCEEDED, UNIMPLEMENTED, INTERNAL, UNAVAILABLE, DATA_LOSS set ERROR.
Only `/agio.v1.*` calls are traced (not health checks or reflection).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import grpc
from opentelemetry import propagate, trace
from opentelemetry.semconv._incubating.attributes import rpc_attributes as rpc
from opentelemetry.trace import SpanKind, Status, StatusCode

from agio_grpc.handlers import AgioMethodInterceptor, Behavior, rewrap_handler, takes_one_request
from agio_grpc.telemetry.instruments import INSTRUMENTATION_NAME

_ERROR_CODES = frozenset(
    {
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.UNIMPLEMENTED,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DATA_LOSS,
    }
)


def _carrier(details: grpc.HandlerCallDetails) -> dict[str, str]:
    return {
        key: value for key, value in details.invocation_metadata or () if isinstance(value, str)
    }


def _set_code(span: trace.Span, code: grpc.StatusCode, message: str = "") -> None:
    span.set_attribute(rpc.RPC_GRPC_STATUS_CODE, code.value[0])
    if code in _ERROR_CODES:
        span.set_status(
            Status(StatusCode.ERROR, f"{code.name}: {message}" if message else code.name)
        )


class TracingInterceptor(AgioMethodInterceptor):
    """Starts a SERVER span per agio call, as a child of the caller's trace context."""

    def __init__(self, tracer_provider: trace.TracerProvider) -> None:
        self._tracer = tracer_provider.get_tracer(INSTRUMENTATION_NAME)

    def rewrap(
        self, handler: grpc.RpcMethodHandler, details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler:
        if not takes_one_request(handler):
            return handler
        return rewrap_handler(handler, self._traced(details))

    def _traced(self, details: grpc.HandlerCallDetails) -> Callable[[Behavior], Behavior]:
        service, _, name = details.method.lstrip("/").partition("/")
        attributes = {rpc.RPC_SYSTEM: "grpc", rpc.RPC_SERVICE: service, rpc.RPC_METHOD: name}
        carrier = _carrier(details)

        def wrap(behavior: Behavior) -> Behavior:
            async def handler(request: Any, context: grpc.aio.ServicerContext) -> Any:
                parent = propagate.extract(carrier)
                with self._tracer.start_as_current_span(
                    f"{service}/{name}",
                    context=parent,
                    kind=SpanKind.SERVER,
                    attributes=attributes,
                    record_exception=False,
                    set_status_on_exception=False,
                ) as span:
                    try:
                        result = await behavior(request, context)
                    except asyncio.CancelledError:
                        _set_code(span, grpc.StatusCode.CANCELLED)
                        raise
                    except grpc.aio.AbortError:
                        _set_code(
                            span, context.code() or grpc.StatusCode.UNKNOWN, context.details() or ""
                        )
                        raise
                    except Exception as error:
                        span.record_exception(error)
                        _set_code(span, grpc.StatusCode.UNKNOWN, type(error).__qualname__)
                        raise
                    _set_code(span, context.code() or grpc.StatusCode.OK)
                    return result

            return handler

        return wrap
