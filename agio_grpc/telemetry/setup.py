"""Tracer and meter providers, configured only by the standard `OTEL_*` environment variables.

Nothing is exported unless an exporter is configured, and each signal is turned on by its
own variables:

- traces: `OTEL_TRACES_EXPORTER` (`otlp` or `console`), or an OTLP endpoint
  (`OTEL_EXPORTER_OTLP_ENDPOINT` or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`);
- metrics: `OTEL_METRICS_EXPORTER` (`otlp` or `console`), or
  `OTEL_EXPORTER_OTLP_METRICS_ENDPOINT`. The shared `OTEL_EXPORTER_OTLP_ENDPOINT` alone does
  not turn them on: trace backends such as Jaeger take no metrics, and an exporter sending
  them there logs an ERROR at every export (every 60 s). `OTEL_METRICS_EXPORTER=otlp` sends
  them to the shared endpoint.

`none` turns a signal off whatever else is set; `OTEL_SDK_DISABLED=true` turns everything
off. When a signal is off its provider is the API's no-op one, so it costs next to nothing.
The exporters read their own endpoint, headers, timeout and protocol variables;
`TracerProvider` reads `OTEL_TRACES_SAMPLER(_ARG)`. The resource is what `OTEL_SERVICE_NAME`
and `OTEL_RESOURCE_ATTRIBUTES` say, with `service.name` `agio-grpc` and `service.version`
the installed package's version where they say nothing.

Tests build a `Telemetry` from their own SDK providers (in-memory exporter and reader).
"""

from __future__ import annotations

import importlib.metadata
import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider as SdkMeterProvider
from opentelemetry.sdk.metrics.export import (
    ConsoleMetricExporter,
    MetricExporter,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider as SdkTracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
from opentelemetry.semconv.attributes.service_attributes import SERVICE_NAME, SERVICE_VERSION

DEFAULT_SERVICE_NAME = "agio-grpc"
DISTRIBUTION_NAME = "agio-grpc"
"""The installed package whose version is the resource's `service.version`."""
CAPTURE_CONTENT_ENV = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
_CAPTURE_IN_SPANS = frozenset({"true", "1", "span_only", "span_and_event"})


@dataclass(slots=True)
class Telemetry:
    """The providers agio-grpc records with, and whether message content goes in spans."""

    tracer_provider: trace.TracerProvider = field(default_factory=trace.NoOpTracerProvider)
    meter_provider: metrics.MeterProvider = field(default_factory=metrics.NoOpMeterProvider)
    capture_content: bool = False
    """Put prompts, completions and tool arguments/results in spans (opt-in)."""
    owns_providers: bool = False
    """`shutdown` flushes and shuts the providers down (set for providers built here)."""

    @property
    def tracing(self) -> bool:
        """Whether spans are recorded at all."""
        return not isinstance(self.tracer_provider, trace.NoOpTracerProvider)

    def shutdown(self) -> None:
        """Flush and stop the exporters of providers this object built."""
        if not self.owns_providers:
            return
        if isinstance(self.tracer_provider, SdkTracerProvider):
            self.tracer_provider.shutdown()
        if isinstance(self.meter_provider, SdkMeterProvider):
            self.meter_provider.shutdown()

    def install_global(self) -> None:
        """Make the providers the process-wide ones, so libraries a tool uses join the trace."""
        if self.tracing:
            trace.set_tracer_provider(self.tracer_provider)
        if not isinstance(self.meter_provider, metrics.NoOpMeterProvider):
            metrics.set_meter_provider(self.meter_provider)


def capture_content_from_environment(environ: Mapping[str, str] | None = None) -> bool:
    """Whether content is opted in (`CAPTURE_CONTENT_ENV`): in spans, and in log lines."""
    env = os.environ if environ is None else environ
    return env.get(CAPTURE_CONTENT_ENV, "").strip().lower() in _CAPTURE_IN_SPANS


def telemetry_from_environment(environ: Mapping[str, str] | None = None) -> Telemetry:
    """The Telemetry the `OTEL_*` variables describe (see the module docstring)."""
    env = os.environ if environ is None else environ
    capture = capture_content_from_environment(env)
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return Telemetry(capture_content=capture)
    resource = _resource()
    telemetry = Telemetry(capture_content=capture, owns_providers=True)
    span_exporter = _span_exporter(env)
    if span_exporter is not None:
        tracer_provider = SdkTracerProvider(resource=resource)
        tracer_provider.add_span_processor(BatchSpanProcessor(span_exporter))
        telemetry.tracer_provider = tracer_provider
    metric_exporter = _metric_exporter(env)
    if metric_exporter is not None:
        reader = PeriodicExportingMetricReader(metric_exporter)
        telemetry.meter_provider = SdkMeterProvider(resource=resource, metric_readers=[reader])
    return telemetry


def _resource() -> Resource:
    """The detected resource (`OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`), with our
    service name and version where it names none: what the user set always wins."""
    detected = Resource.create()
    attributes = dict(detected.attributes)
    if str(attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        attributes[SERVICE_NAME] = DEFAULT_SERVICE_NAME
    version = package_version()
    if version and SERVICE_VERSION not in attributes:
        attributes[SERVICE_VERSION] = version
    return Resource(attributes, detected.schema_url)


def package_version() -> str:
    """The installed agio-grpc version ("" when run from a tree that is not installed)."""
    try:
        return importlib.metadata.version(DISTRIBUTION_NAME)
    except importlib.metadata.PackageNotFoundError:
        return ""


def _exporter_name(env: Mapping[str, str], signal: str) -> str | None:
    """`otlp`, `console` or None (off) for `signal` (`TRACES` or `METRICS`)."""
    configured = env.get(f"OTEL_{signal}_EXPORTER", "").strip().lower()
    if configured:
        names = [name.strip() for name in configured.split(",")]
        return next((name for name in names if name in ("otlp", "console")), None)
    if env.get(f"OTEL_EXPORTER_OTLP_{signal}_ENDPOINT"):
        return "otlp"
    # The shared endpoint turns on traces only (metrics: see the module docstring).
    if signal == "TRACES" and env.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        return "otlp"
    return None


def _protocol(env: Mapping[str, str], signal: str) -> str:
    return (
        env.get(f"OTEL_EXPORTER_OTLP_{signal}_PROTOCOL")
        or env.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        or "grpc"
    ).strip()


def _span_exporter(env: Mapping[str, str]) -> SpanExporter | None:
    name = _exporter_name(env, "TRACES")
    if name == "console":
        return ConsoleSpanExporter()
    if name != "otlp":
        return None
    if _protocol(env, "TRACES") == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter()
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
        OTLPSpanExporter as HttpSpanExporter,
    )

    return HttpSpanExporter()


def _metric_exporter(env: Mapping[str, str]) -> MetricExporter | None:
    name = _exporter_name(env, "METRICS")
    if name == "console":
        return ConsoleMetricExporter()
    if name != "otlp":
        return None
    if _protocol(env, "METRICS") == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter

        return OTLPMetricExporter()
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import (
        OTLPMetricExporter as HttpMetricExporter,
    )

    return HttpMetricExporter()
