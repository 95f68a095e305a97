"""Real export: the service's OTLP/gRPC exporter, configured only by `OTEL_*` variables,
sends the whole span tree and the metrics to a receiver this test starts; the docs' recipes
(one shared endpoint, as for Jaeger, which takes no metrics) export spans and never metrics."""

from __future__ import annotations

import importlib.metadata
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry import metrics
from opentelemetry.sdk.trace import TracerProvider

from agio_grpc.client import AgioClient
from agio_grpc.service.app import AgioApp
from agio_grpc.telemetry import Telemetry, telemetry_from_environment
from agio_grpc.testing import FakeModelServer, ToolCallSpec, Turn
from agio_grpc.testing.otlp import OtlpReceiver
from tests.service.conftest import make_settings
from tests.sqlite import sqlite_at


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as started:
        yield started


async def test_a_run_is_exported_over_otlp_grpc_as_one_tree(
    tmp_path: Path,
    fake_model: FakeModelServer,
    receiver: OtlpReceiver,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "otlp")  # the shared endpoint takes metrics
    monkeypatch.setenv("OTEL_SERVICE_NAME", "agio-e2e")
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=test")
    telemetry = telemetry_from_environment()
    assert telemetry.tracing
    assert telemetry.owns_providers
    settings = make_settings(sqlite_at(tmp_path / "agio.db"), fake_model.base_url)
    app = await AgioApp.start(settings, telemetry)
    try:
        fake_model.enqueue(
            Turn.tool_calls([ToolCallSpec("calculate", '{"expression": "6 * 7"}')]),
            Turn.text("42"),
        )
        async with AgioClient(app.address) as client:
            result = await client.run_to_end("What is 6 * 7?")
    finally:
        await app.stop(grace=0)  # flushes the batch exporter
    spans = receiver.wait_for_spans(lambda spans: len(spans) >= 5)
    by_name = {span.name: span for span in spans}
    assert sorted(by_name) == [
        "agio.v1.AgentService/Run",
        "chat fake-model",
        "execute_tool calculate",
        "invoke_agent assistant",
    ]
    assert len(spans) == 5  # two chat spans
    server, agent = by_name["agio.v1.AgentService/Run"], by_name["invoke_agent assistant"]
    assert server.parent_span_id == b""  # the client sent no trace: the server span is the root
    assert agent.parent_span_id == server.span_id
    for span in spans:
        if span.name.startswith(("chat", "execute_tool")):
            assert span.parent_span_id == agent.span_id
        assert span.trace_id.hex() == result.run.trace_id
    resource = receiver.trace_requests[0].resource_spans[0].resource
    resource_attrs = {kv.key: kv.value.string_value for kv in resource.attributes}
    assert resource_attrs["service.name"] == "agio-e2e"
    assert resource_attrs["deployment.environment"] == "test"
    assert resource_attrs["service.version"] == importlib.metadata.version("agio-grpc")
    assert {"gen_ai.client.token.usage", "gen_ai.client.operation.duration"} <= (
        receiver.metric_names()
    )


def test_nothing_configured_means_nothing_recorded(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_TRACES_EXPORTER", "OTEL_METRICS_EXPORTER"):
        monkeypatch.delenv(name, raising=False)
    telemetry = telemetry_from_environment({})
    assert not telemetry.tracing
    off = telemetry_from_environment(
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317", "OTEL_SDK_DISABLED": "true"}
    )
    assert not off.tracing
    none = telemetry_from_environment({"OTEL_TRACES_EXPORTER": "none"})
    assert not none.tracing


def test_content_capture_is_opt_in() -> None:
    assert not telemetry_from_environment({}).capture_content
    for value in ("true", "SPAN_ONLY", "span_and_event"):
        env = {"OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": value}
        assert telemetry_from_environment(env).capture_content
    no = {"OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "NO_CONTENT"}
    assert not telemetry_from_environment(no).capture_content


OTEL_VARIABLES = (
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
    "OTEL_TRACES_EXPORTER",
    "OTEL_METRICS_EXPORTER",
    "OTEL_SERVICE_NAME",
    "OTEL_RESOURCE_ATTRIBUTES",
    "OTEL_SDK_DISABLED",
)


@pytest.fixture
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in OTEL_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def exports_metrics(telemetry: Telemetry) -> bool:
    return not isinstance(telemetry.meter_provider, metrics.NoOpMeterProvider)


@pytest.mark.parametrize(
    "endpoint_variable", ["OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"]
)
async def test_the_jaeger_recipe_exports_spans_and_no_metrics_and_logs_no_error(
    tmp_path: Path,
    fake_model: FakeModelServer,
    receiver: OtlpReceiver,
    clean_environment: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    endpoint_variable: str,
) -> None:
    clean_environment.setenv(endpoint_variable, receiver.endpoint)
    clean_environment.setenv("OTEL_SERVICE_NAME", "agio-grpc")
    telemetry = telemetry_from_environment()
    assert telemetry.tracing
    assert not exports_metrics(telemetry)  # no metrics exporter, no reader thread
    settings = make_settings(sqlite_at(tmp_path / "agio.db"), fake_model.base_url)
    caplog.set_level(logging.WARNING)
    app = await AgioApp.start(settings, telemetry)
    try:
        fake_model.enqueue(Turn.text("hello"))
        async with AgioClient(app.address) as client:
            await client.run_to_end("Hi")
    finally:
        await app.stop(grace=0)  # shutting a metric reader down would export once more
    assert receiver.wait_for_spans(lambda spans: len(spans) >= 3)
    assert receiver.metric_requests == []
    assert [r for r in caplog.records if r.name.startswith("opentelemetry")] == []


def test_metrics_are_exported_only_when_a_variable_asks_for_them(
    receiver: OtlpReceiver, clean_environment: pytest.MonkeyPatch
) -> None:
    clean_environment.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
    cases = {
        (): False,
        (("OTEL_METRICS_EXPORTER", "otlp"),): True,
        (("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", receiver.endpoint),): True,
        (
            ("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", receiver.endpoint),
            ("OTEL_METRICS_EXPORTER", "none"),
        ): False,
    }
    for variables, exported in cases.items():
        with pytest.MonkeyPatch.context() as patch:
            for name, value in variables:
                patch.setenv(name, value)
            telemetry = telemetry_from_environment()
            try:
                assert exports_metrics(telemetry) is exported, variables
                assert telemetry.tracing
            finally:
                telemetry.shutdown()


def test_the_resource_names_the_version_unless_the_user_does(
    clean_environment: pytest.MonkeyPatch,
) -> None:
    def resource_of(**variables: str) -> dict[str, object]:
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("OTEL_TRACES_EXPORTER", "console")  # a provider, exporting nothing
            for name, value in variables.items():
                patch.setenv(name, value)
            telemetry = telemetry_from_environment()
        provider = telemetry.tracer_provider
        assert isinstance(provider, TracerProvider)
        telemetry.shutdown()
        return dict(provider.resource.attributes)

    version = importlib.metadata.version("agio-grpc")
    plain = resource_of()
    assert (plain["service.name"], plain["service.version"]) == ("agio-grpc", version)
    named = resource_of(
        OTEL_SERVICE_NAME="checkout-agents",
        OTEL_RESOURCE_ATTRIBUTES="service.version=2026.11,deployment.environment=prod",
    )
    assert (named["service.name"], named["service.version"]) == ("checkout-agents", "2026.11")
    assert named["deployment.environment"] == "prod"
