"""The HTTP server span of each A2A call on the HTTP listener, continuing the caller's W3C
trace context, as `TracingInterceptor` makes one for each gRPC call.

`TracedHttp` wraps an ASGI application: per HTTP request it extracts `traceparent` (and
`baggage`) from the headers with the configured propagators, starts a SERVER span named
`METHOD ROUTE` (the route with the agent and task ids as `{agent}` and `{id}`) and makes it
current, so a run the request starts is its child. Attributes follow the HTTP semantic
conventions; a 5xx answer, or an exception, sets ERROR.
"""

from __future__ import annotations

import re
from collections.abc import MutableMapping
from typing import Any

from opentelemetry import propagate, trace
from opentelemetry.semconv.attributes import http_attributes as http
from opentelemetry.semconv.attributes import url_attributes as url
from opentelemetry.trace import SpanKind, Status, StatusCode

from agio_grpc.telemetry.instruments import INSTRUMENTATION_NAME

Scope = MutableMapping[str, Any]
_AGENT = re.compile(r"^/a2a/[^/]+")
_TASK = re.compile(r"/tasks/[^/:]+")


def route(path: str) -> str:
    """The route of an A2A path: `/a2a/{agent}/tasks/{id}:cancel`."""
    return _TASK.sub("/tasks/{id}", _AGENT.sub("/a2a/{agent}", path))


class TracedHttp:
    """A SERVER span around each HTTP request `app` serves."""

    def __init__(self, app: Any, tracer_provider: trace.TracerProvider) -> None:
        self._app = app
        self._tracer = tracer_provider.get_tracer(INSTRUMENTATION_NAME)

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        carrier = {
            name.decode("latin-1").lower(): value.decode("latin-1")
            for name, value in scope.get("headers", ())
        }
        method, path = scope["method"], scope["path"]
        template = route(path)
        with self._tracer.start_as_current_span(
            f"{method} {template}",
            context=propagate.extract(carrier),
            kind=SpanKind.SERVER,
            attributes={
                http.HTTP_REQUEST_METHOD: method,
                http.HTTP_ROUTE: template,
                url.URL_PATH: path,
            },
            record_exception=False,
            set_status_on_exception=False,
        ) as span:

            async def recorded(message: MutableMapping[str, Any]) -> None:
                if message["type"] == "http.response.start":
                    status = int(message["status"])
                    span.set_attribute(http.HTTP_RESPONSE_STATUS_CODE, status)
                    if status >= 500:
                        span.set_status(Status(StatusCode.ERROR, str(status)))
                await send(message)

            try:
                await self._app(scope, receive, recorded)
            except Exception as error:
                span.record_exception(error)
                span.set_status(Status(StatusCode.ERROR, type(error).__qualname__))
                raise
