"""Approvals in the telemetry: an `agio.approval` event per decision (on the approved call's
`execute_tool` span; on the span of the segment that stored a rejection) and the wait in
`agio.approval.wait.duration`, recorded by in-memory providers of the test's own."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from agio_grpc.client import AgioClient
from agio_grpc.testing import FakeModelServer, ToolCallSpec, Turn
from agio_grpc.v1 import agent_service_pb2, events_pb2, resources_pb2
from tests.telemetry.conftest import Traced

StepEvent = events_pb2.StepEvent


async def drain(events: AsyncIterator[StepEvent]) -> resources_pb2.Run:
    last = [event async for event in events][-1]
    run: resources_pb2.Run = getattr(last, str(last.WhichOneof("event"))).run
    return run


def echo(text: str, call_id: str) -> ToolCallSpec:
    return ToolCallSpec("echo", json.dumps({"text": text}), id=call_id)


def wait_points(traced: Traced) -> dict[str, Any]:
    """The approval wait histogram's points, by outcome."""
    data = traced.metrics.get_metrics_data()
    assert data is not None
    return {
        str((point.attributes or {})["agio.approval.outcome"]): point
        for resource in data.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
        if metric.name == "agio.approval.wait.duration"
        for point in metric.data.data_points
    }


async def test_each_decision_is_an_agio_approval_event_and_a_measured_wait(
    client: AgioClient, fake_model: FakeModelServer, traced: Traced
) -> None:
    fake_model.enqueue(Turn.tool_calls([echo("yes", "call_yes"), echo("no", "call_no")]))
    waiting = await drain(client.run("Do both.", require_approval=["echo"]))
    assert waiting.status == resources_pb2.RUN_STATUS_REQUIRES_ACTION
    fake_model.enqueue(Turn.text("One done, one refused."))
    decisions = [
        agent_service_pb2.ToolApproval(tool_call_id="call_yes", approved=True),
        agent_service_pb2.ToolApproval(tool_call_id="call_no", approved=False, reason="no"),
    ]
    done = await drain(client.submit_tool_outputs(waiting.id, [], approvals=decisions))
    assert done.status == resources_pb2.RUN_STATUS_COMPLETED
    await traced.open_spans.all_ended()

    spans = traced.spans()
    (tool,) = [s for s in spans if s.name == "execute_tool echo"]
    (approved,) = [e for e in tool.events if e.name == "agio.approval"]
    assert approved.attributes is not None
    assert approved.attributes["agio.approval.approved"] is True
    assert approved.attributes["agio.approval.outcome"] == "approved"
    assert approved.attributes["agio.approval.wait_s"] >= 0  # type: ignore[operator]
    segment = [s for s in spans if s.name == "invoke_agent assistant"][-1]
    (rejected,) = [e for e in segment.events if e.name == "agio.approval"]
    assert rejected.attributes is not None
    assert rejected.attributes["agio.approval.outcome"] == "rejected"
    assert rejected.attributes["gen_ai.tool.name"] == "echo"
    assert tool.parent is not None
    assert segment.context is not None
    assert tool.parent.span_id == segment.context.span_id

    points = wait_points(traced)
    assert {outcome: point.count for outcome, point in points.items()} == {
        "approved": 1,
        "rejected": 1,
    }
