"""A structured run, traced: its chat spans say `gen_ai.output.type: json`, each answer that
fails its schema is an `output_invalid` event on the run's span, and the
`agio.output.validation_failures` counter counts them by agent."""

from __future__ import annotations

from opentelemetry.sdk.metrics.export import Sum

from agio_grpc.client import AgioClient
from agio_grpc.testing import FakeModelServer, Turn
from agio_grpc.v1 import resources_pb2
from tests.telemetry.conftest import Traced
from tests.telemetry.test_span_tree import attrs

SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}


def failures_counted(traced: Traced) -> dict[str, int]:
    """`agio.output.validation_failures` by agent."""
    data = traced.metrics.get_metrics_data()
    assert data is not None
    counted: dict[str, int] = {}
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name != "agio.output.validation_failures":
                    continue
                assert isinstance(metric.data, Sum)
                for point in metric.data.data_points:
                    agent = str((point.attributes or {})["gen_ai.agent.name"])
                    counted[agent] = counted.get(agent, 0) + int(point.value)
    return counted


async def test_a_repaired_answer_is_traced_as_json_output_with_one_invalid_event(
    client: AgioClient, fake_model: FakeModelServer, traced: Traced
) -> None:
    fake_model.enqueue(Turn.json({"n": "seven"}), Turn.json({"n": 7}))

    result = await client.run_to_end("Seven?", output_schema=SCHEMA)
    await traced.open_spans.all_ended()

    assert result.stop_signal.reason == resources_pb2.STOP_REASON_COMPLETED
    spans = traced.spans()
    chats = [span for span in spans if span.name.startswith("chat ")]
    assert len(chats) == 2
    assert all(attrs(chat)["gen_ai.output.type"] == "json" for chat in chats)
    (agent_span,) = [span for span in spans if span.name.startswith("invoke_agent")]
    (invalid,) = [event for event in agent_span.events if event.name == "output_invalid"]
    assert dict(invalid.attributes or {}) == {
        "agio.output.errors": ("$.n: type",),  # no content: capture is off
        "agio.output.repairs": 0,
    }
    assert failures_counted(traced) == {"assistant": 1}


async def test_a_text_run_says_no_output_type_and_counts_no_failure(
    client: AgioClient, fake_model: FakeModelServer, traced: Traced
) -> None:
    fake_model.enqueue(Turn.text("plain words"))

    await client.run_to_end("Hello")
    await traced.open_spans.all_ended()

    (chat,) = [span for span in traced.spans() if span.name.startswith("chat ")]
    assert "gen_ai.output.type" not in attrs(chat)
    assert failures_counted(traced) == {}
