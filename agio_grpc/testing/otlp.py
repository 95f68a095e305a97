"""A minimal OTLP/gRPC receiver (traces and metrics) that keeps what it gets in memory.

For tests and benchmarks that check what really leaves the process: point
`OTEL_EXPORTER_OTLP_ENDPOINT` at `receiver.endpoint` and read `receiver.spans()`.
It runs a synchronous gRPC server on its own threads, so an exporter that blocks the
caller's event loop (a flush at shutdown) is still answered.

    with OtlpReceiver() as receiver:
        os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = receiver.endpoint
        ...
        spans = receiver.wait_for_spans(lambda spans: len(spans) >= 3)

Uses the collector service definitions of `opentelemetry-proto`; never imports the service
layer.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent import futures
from types import TracebackType

import grpc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.trace.v1.trace_pb2 import Span


class _Traces(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, receiver: OtlpReceiver) -> None:
        self._receiver = receiver

    def Export(
        self, request: trace_service_pb2.ExportTraceServiceRequest, context: grpc.ServicerContext
    ) -> trace_service_pb2.ExportTraceServiceResponse:
        self._receiver._add_traces(request)
        return trace_service_pb2.ExportTraceServiceResponse()


class _Metrics(metrics_service_pb2_grpc.MetricsServiceServicer):
    def __init__(self, receiver: OtlpReceiver) -> None:
        self._receiver = receiver

    def Export(
        self,
        request: metrics_service_pb2.ExportMetricsServiceRequest,
        context: grpc.ServicerContext,
    ) -> metrics_service_pb2.ExportMetricsServiceResponse:
        self._receiver._add_metrics(request)
        return metrics_service_pb2.ExportMetricsServiceResponse()


class OtlpReceiver:
    """Receives OTLP/gRPC exports on 127.0.0.1 (port 0: a free one)."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self._address = f"{host}:{port}"
        self._changed = threading.Condition()
        self.trace_requests: list[trace_service_pb2.ExportTraceServiceRequest] = []
        self.metric_requests: list[metrics_service_pb2.ExportMetricsServiceRequest] = []
        self._server: grpc.Server | None = None
        self.port = 0

    @property
    def endpoint(self) -> str:
        """The URL for `OTEL_EXPORTER_OTLP_ENDPOINT`."""
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(_Traces(self), server)  # type: ignore[no-untyped-call]
        metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(_Metrics(self), server)  # type: ignore[no-untyped-call]
        self.port = server.add_insecure_port(self._address)
        if self.port == 0:
            raise OSError(f"could not bind {self._address}")
        server.start()
        self._server = server

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(grace=None)
            self._server = None

    def __enter__(self) -> OtlpReceiver:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _add_traces(self, request: trace_service_pb2.ExportTraceServiceRequest) -> None:
        with self._changed:
            self.trace_requests.append(request)
            self._changed.notify_all()

    def _add_metrics(self, request: metrics_service_pb2.ExportMetricsServiceRequest) -> None:
        with self._changed:
            self.metric_requests.append(request)
            self._changed.notify_all()

    def spans(self) -> list[Span]:
        """Every span received so far."""
        with self._changed:
            return self._spans_locked()

    def metric_names(self) -> set[str]:
        """The names of every metric received so far."""
        with self._changed:
            return {
                metric.name
                for request in self.metric_requests
                for resource_metrics in request.resource_metrics
                for scope_metrics in resource_metrics.scope_metrics
                for metric in scope_metrics.metrics
            }

    def wait_for_spans(
        self, done: Callable[[list[Span]], bool], timeout_s: float = 10.0
    ) -> list[Span]:
        """Block until `done(spans)` holds (TimeoutError after `timeout_s`)."""
        with self._changed:
            if not self._changed.wait_for(lambda: done(self._spans_locked()), timeout_s):
                raise TimeoutError(f"spans did not arrive in {timeout_s}s")
            return self._spans_locked()

    def _spans_locked(self) -> list[Span]:
        return [
            span
            for request in self.trace_requests
            for resource_spans in request.resource_spans
            for scope_spans in resource_spans.scope_spans
            for span in scope_spans.spans
        ]
