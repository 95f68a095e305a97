"""The real server with tracing on: SDK providers of the test's own (in-memory span exporter,
in-memory metric reader) injected into the app, never the global ones."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

import pytest
from opentelemetry.context import Context
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from agio_grpc.client import AgioClient
from agio_grpc.service.app import AgioApp
from agio_grpc.telemetry import Telemetry
from agio_grpc.testing import FakeModelServer
from tests.service.conftest import make_settings


class OpenSpans(SpanProcessor):
    """Tracks spans started and not yet ended; `all_ended` waits until there are none."""

    def __init__(self) -> None:
        self.open: dict[int, str] = {}
        self._none_open = asyncio.Event()
        self._none_open.set()

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        self.open[span.context.span_id] = span.name
        self._none_open.clear()

    def on_end(self, span: ReadableSpan) -> None:
        assert span.context is not None
        self.open.pop(span.context.span_id, None)
        if not self.open:
            self._none_open.set()

    async def all_ended(self, timeout_s: float = 5.0) -> None:
        """Wait until every started span has ended; fails naming the ones still open."""
        try:
            async with asyncio.timeout(timeout_s):
                await self._none_open.wait()
        except TimeoutError:
            pytest.fail(f"spans left open: {sorted(self.open.values())}")


@dataclass
class Traced:
    """The telemetry the app records with, and what it recorded."""

    telemetry: Telemetry
    exporter: InMemorySpanExporter
    metrics: InMemoryMetricReader
    open_spans: OpenSpans
    tracer_provider: TracerProvider

    def spans(self) -> list[ReadableSpan]:
        return list(self.exporter.get_finished_spans())

    def metric_names(self) -> set[str]:
        data = self.metrics.get_metrics_data()
        if data is None:
            return set()
        return {
            metric.name
            for resource in data.resource_metrics
            for scope in resource.scope_metrics
            for metric in scope.metrics
        }


def make_traced(capture_content: bool = False) -> Traced:
    exporter = InMemorySpanExporter()
    open_spans = OpenSpans()
    provider = TracerProvider()
    provider.add_span_processor(open_spans)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    telemetry = Telemetry(
        tracer_provider=provider,
        meter_provider=MeterProvider(metric_readers=[reader]),
        capture_content=capture_content,
    )
    return Traced(telemetry, exporter, reader, open_spans, provider)


@pytest.fixture
def traced() -> Iterator[Traced]:
    made = make_traced()
    yield made
    made.tracer_provider.shutdown()


@pytest.fixture
async def fake_model() -> AsyncIterator[FakeModelServer]:
    async with FakeModelServer() as server:
        yield server


@pytest.fixture
async def app(
    sqlite_url: str, fake_model: FakeModelServer, traced: Traced
) -> AsyncIterator[AgioApp]:
    settings = make_settings(sqlite_url, fake_model.base_url)
    started = await AgioApp.start(settings, traced.telemetry)
    try:
        yield started
    finally:
        await started.stop(grace=0)


@pytest.fixture
async def client(app: AgioApp) -> AsyncIterator[AgioClient]:
    async with AgioClient(app.address) as connected:
        yield connected
