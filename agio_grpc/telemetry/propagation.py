"""Outgoing trace context for the Python client: the current span as gRPC metadata.

Uses the configured propagators (`OTEL_PROPAGATORS`, W3C `traceparent` and `baggage` by
default); with no span current it adds nothing.
"""

from __future__ import annotations

from opentelemetry import propagate


def trace_metadata() -> tuple[tuple[str, str], ...]:
    """`(key, value)` pairs carrying the current trace context, e.g. `traceparent`."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return tuple(carrier.items())
