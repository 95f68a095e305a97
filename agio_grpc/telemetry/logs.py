"""Log lines that carry the trace and the tenant: `trace_id`, `span_id` and `tenant` on
every record.

`TraceContextFilter` (on a handler) sets `record.trace_id` / `record.span_id` from the
current span ("" outside any trace), and `record.tenant`: the run's while a run segment's
code runs (its trace's context carries it, `with_log_tenant`), else the caller's (the
`tenant` function the service hands over: the current call's caller); `LOG_FORMAT` prints
them as `key=value` fields so a backend can join a line to its span and its tenant.

No log line, at any level, carries user or model content unless content capture is opted in
(the switch spans use, `OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT`): the code logs
ids, types and reasons, a traceback shows its frames and exception types but not the
exceptions' messages (a driver's, a tool's or a library's message may quote what it was
given), and the libraries' DEBUG lines, which quote what they send and receive (the MCP SDK
logs each message of a Streamable HTTP stream), are left out.
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Callable
from types import TracebackType

from opentelemetry import context as otel_context
from opentelemetry import trace

ExcInfo = tuple[type[BaseException], BaseException, TracebackType | None] | tuple[None, None, None]

LOG_FORMAT = (
    "%(asctime)s %(levelname)s %(name)s trace_id=%(trace_id)s span_id=%(span_id)s "
    "tenant=%(tenant)s %(message)s"
)

_LOG_TENANT = otel_context.create_key("agio.log_tenant")


def with_log_tenant(tenant: str, context: otel_context.Context) -> otel_context.Context:
    """`context` with `tenant` as the tenant of the log lines written under it."""
    return otel_context.set_value(_LOG_TENANT, tenant, context)


def _no_tenant() -> str:
    return ""


class TraceContextFilter(logging.Filter):
    """Adds the current trace and span ids and the tenant to each record (never drops one).
    `tenant` says the current caller's tenant, for lines written outside any run."""

    def __init__(self, tenant: Callable[[], str] = _no_tenant) -> None:
        super().__init__()
        self._caller_tenant = tenant

    def filter(self, record: logging.LogRecord) -> bool:
        context = trace.get_current_span().get_span_context()
        if context.is_valid:
            record.trace_id = trace.format_trace_id(context.trace_id)
            record.span_id = trace.format_span_id(context.span_id)
        else:
            record.trace_id = record.span_id = ""
        tenant = otel_context.get_value(_LOG_TENANT)
        record.tenant = tenant if isinstance(tenant, str) else self._caller_tenant()
        return True


class LibraryDebugFilter(logging.Filter):
    """Drops the DEBUG records of every logger outside agio_grpc (a library's)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno > logging.DEBUG or record.name.partition(".")[0] == "agio_grpc"


class ContentFreeFormatter(logging.Formatter):
    """Formats tracebacks without the exceptions' messages (each chained one included)."""

    def format(self, record: logging.LogRecord) -> str:
        # Another handler's formatter may have cached the traceback, messages and all.
        cached, record.exc_text = record.exc_text, None
        try:
            return super().format(record)
        finally:
            record.exc_text = cached

    def formatException(self, ei: ExcInfo) -> str:
        if ei[1] is None:
            return ""
        shown = traceback.TracebackException.from_exception(ei[1])
        chain: list[traceback.TracebackException] = []
        current: traceback.TracebackException | None = shown
        while current is not None:
            chain.append(current)
            cause = current.__cause__
            context = None if current.__suppress_context__ else current.__context__
            current = cause or context
        lines: list[str] = []
        for index, link in enumerate(reversed(chain)):
            if index:
                lines.append("\nThen, while handling it (or caused by it):\n")
            lines.append("Traceback (most recent call last):\n")
            lines.extend(link.stack.format())
            kind = link.exc_type
            name = f"{kind.__module__}.{kind.__qualname__}" if kind is not None else "?"
            lines.append(f"{name}: (message withheld: content capture is off)")
        return "".join(lines).rstrip("\n")


def trace_log_handler(
    handler: logging.Handler,
    *,
    capture_content: bool = False,
    tenant: Callable[[], str] = _no_tenant,
) -> logging.Handler:
    """`handler` with the trace filter and the `key=value` format; unless `capture_content`,
    tracebacks without the exceptions' messages and no library's DEBUG lines. `tenant` says
    the current caller's tenant (the service's `current_caller().tenant`)."""
    handler.addFilter(TraceContextFilter(tenant))
    if capture_content:
        handler.setFormatter(logging.Formatter(LOG_FORMAT))
        return handler
    handler.addFilter(LibraryDebugFilter())
    handler.setFormatter(ContentFreeFormatter(LOG_FORMAT))
    return handler
