"""OpenTelemetry for agio-grpc: the only package that imports it (DESIGN.md section 6).

- `telemetry_from_environment()` builds the tracer and meter providers from the standard
  `OTEL_*` variables (nothing exported when no exporter is configured); tests build a
  `Telemetry` from their own SDK providers.
- `OtelRunTracer` is the engine's `RunTracer`: `invoke_agent` / `chat` / `execute_tool`
  spans with GenAI semantic-convention attributes, and the GenAI and agio metrics.
- `TracingInterceptor` starts the gRPC server span from the caller's `traceparent`;
  `TracedHttp` the HTTP server span of an A2A call on the HTTP listener.
- `instrumented(role, instruments)` records a store role's latency, steps written and forks.
- `trace_metadata()` (client side) and `trace_log_handler()` (log lines with trace ids).

Message content is recorded only when `OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT`
asks for it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agio_grpc.telemetry.grpc_server import TracingInterceptor
    from agio_grpc.telemetry.http_server import TracedHttp
    from agio_grpc.telemetry.instruments import Instruments
    from agio_grpc.telemetry.logs import TraceContextFilter, trace_log_handler
    from agio_grpc.telemetry.propagation import trace_metadata
    from agio_grpc.telemetry.runs import OtelRunTracer
    from agio_grpc.telemetry.setup import Telemetry, telemetry_from_environment
    from agio_grpc.telemetry.store import instrumented

# Imported on first use, so the Python client (which needs only `propagation`, on the
# OpenTelemetry API) does not load the SDK, the engine or the store.
_HOMES = {
    "Instruments": "instruments",
    "OtelRunTracer": "runs",
    "Telemetry": "setup",
    "TraceContextFilter": "logs",
    "TracedHttp": "http_server",
    "TracingInterceptor": "grpc_server",
    "instrumented": "store",
    "telemetry_from_environment": "setup",
    "trace_log_handler": "logs",
    "trace_metadata": "propagation",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{home}"), name)


__all__ = [
    "Instruments",
    "OtelRunTracer",
    "Telemetry",
    "TraceContextFilter",
    "TracedHttp",
    "TracingInterceptor",
    "instrumented",
    "telemetry_from_environment",
    "trace_log_handler",
    "trace_metadata",
]
