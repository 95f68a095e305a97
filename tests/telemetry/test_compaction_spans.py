"""A run that compacts, traced end to end: the summary call is a `chat` span of the run's
`invoke_agent` span, producing the summary step; the run span records a `context_compacted`
event; the compaction metrics are recorded by trigger and stage."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agio_grpc.client import AgioClient
from agio_grpc.config import AgentConfig, CompactionConfig, LimitsConfig
from agio_grpc.service.app import AgioApp
from agio_grpc.testing import FakeModelServer
from agio_grpc.v1 import resources_pb2
from tests.service.conftest import make_settings
from tests.sqlite import sqlite_at
from tests.telemetry.conftest import Traced
from tests.telemetry.test_span_tree import attrs, children, drain, hex_span, one

WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa " * 20


@pytest.fixture
async def compacting_client(
    tmp_path: Path, fake_model: FakeModelServer, traced: Traced
) -> AsyncIterator[AgioClient]:
    agent = AgentConfig(
        name="assistant",
        model="fake-model",
        instructions="You are a test assistant.",
        tools=[],
        limits=LimitsConfig(max_steps=5),
        context_window_tokens=1_000,
        compaction=CompactionConfig(trigger_ratio=0.5, keep_recent_steps=1),
    )
    settings = make_settings(sqlite_at(tmp_path / "agio.db"), fake_model.base_url, agents=[agent])
    app = await AgioApp.start(settings, traced.telemetry)
    try:
        async with AgioClient(app.address) as client:
            yield client
    finally:
        await app.stop(grace=0)


async def test_the_summary_call_is_a_chat_span_of_the_run(
    compacting_client: AgioClient, traced: Traced
) -> None:
    first = await compacting_client.run_to_end(WORDS)
    traced.exporter.clear()
    events = await drain(compacting_client.run(WORDS, session_id=first.session_id))
    await traced.open_spans.all_ended()

    (compacted,) = [e.context_compacted for e in events if e.HasField("context_compacted")]
    summary = next(
        e.step_completed.step
        for e in events
        if e.HasField("step_completed") and e.step_completed.step.role == resources_pb2.ROLE_SUMMARY
    )
    spans = traced.spans()
    agent = one(spans, "invoke_agent assistant")
    chats = children(spans, agent)
    assert [span.name for span in chats] == ["chat fake-model", "chat fake-model"]
    summary_chat, reply_chat = chats
    assert attrs(summary_chat)["agio.step.id"] == summary.id
    assert summary.span_id == hex_span(summary_chat)
    assert attrs(reply_chat)["agio.step.id"] != summary.id
    (event,) = [e for e in agent.events if e.name == "context_compacted"]
    assert dict(event.attributes or {}) == {
        "agio.compaction.trigger": "threshold",
        "agio.compaction.tokens_before": compacted.tokens_before,
        "agio.compaction.tokens_after": compacted.tokens_after,
    }
    assert {"agio.context.compactions", "agio.context.compaction.tokens"} <= (traced.metric_names())
