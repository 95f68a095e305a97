"""Real export: the service's OTLP/gRPC exporter, configured only by `OTEL_*` variables,
sends the whole span tree and the metrics to a receiver this test starts."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from agio_grpc.client import AgioClient
from agio_grpc.service.app import AgioApp
from agio_grpc.telemetry import telemetry_from_environment
from agio_grpc.testing import FakeModelServer, ToolCallSpec, Turn
from agio_grpc.testing.otlp import OtlpReceiver
from tests.service.conftest import make_settings


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
    monkeypatch.setenv("OTEL_SERVICE_NAME", "agio-e2e")
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=test")
    telemetry = telemetry_from_environment()
    assert telemetry.tracing
    assert telemetry.owns_providers
    settings = make_settings(f"sqlite+aiosqlite:///{tmp_path / 'agio.db'}", fake_model.base_url)
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
