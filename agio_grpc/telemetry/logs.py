"""Log lines that carry the trace: `trace_id` and `span_id` on every record.

`TraceContextFilter` (on a handler) sets `record.trace_id` / `record.span_id` from the
current span ("" outside any trace); `LOG_FORMAT` prints them as `key=value` fields so a
backend can join a line to its span. The engine logs ids and reasons, never prompt or
completion text, at INFO and above.
"""

from __future__ import annotations

import logging

from opentelemetry import trace

LOG_FORMAT = (
    "%(asctime)s %(levelname)s %(name)s trace_id=%(trace_id)s span_id=%(span_id)s %(message)s"
)


class TraceContextFilter(logging.Filter):
    """Adds the current trace and span ids to each record (never drops one)."""

    def filter(self, record: logging.LogRecord) -> bool:
        context = trace.get_current_span().get_span_context()
        if context.is_valid:
            record.trace_id = trace.format_trace_id(context.trace_id)
            record.span_id = trace.format_span_id(context.span_id)
        else:
            record.trace_id = record.span_id = ""
        return True


def trace_log_handler(handler: logging.Handler) -> logging.Handler:
    """`handler` with the trace filter and the `key=value` format."""
    handler.addFilter(TraceContextFilter())
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    return handler
