"""examples/a2a: two agio-grpc servers, one agent delegating to the other over A2A, with the
example's own configuration files (their addresses and databases moved to 127.0.0.1:0 and
a temporary directory). The helper asks for API keys; the front calls it with one."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from agio_grpc.client import AgioClient
from agio_grpc.config import Settings
from agio_grpc.service.app import AgioApp
from agio_grpc.testing import FakeModelServer, ToolCallSpec, Turn
from agio_grpc.v1.resources_pb2 import Role
from tests.a2a.test_remote_agents import offered_tool
from tests.roles import open_roles
from tests.sqlite import sqlite_at

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "a2a"


def example(name: str, tmp_path: Path, model_url: str, **overrides: Any) -> Settings:
    values = yaml.safe_load((EXAMPLES / name).read_text())
    values |= {
        "listen_address": "127.0.0.1:0",
        "database_url": sqlite_at(tmp_path / f"{name}.db"),
        "openai_base_url": model_url,
        "openai_api_key": "test-key",
    }
    return Settings(**(values | overrides))


@pytest.fixture
async def fake_model() -> AsyncIterator[FakeModelServer]:
    async with FakeModelServer() as server:
        yield server


async def test_the_front_agent_asks_the_helper_agent_over_a2a(
    tmp_path: Path, fake_model: FakeModelServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    helper_settings = example(
        "helper.yaml", tmp_path, fake_model.base_url, http_address="127.0.0.1:0"
    )
    helper = await AgioApp.start(helper_settings)
    try:
        store = await open_roles(helper_settings.database_url)
        try:
            issued = await store.keys().create("front-office")
        finally:
            await store.close()
        monkeypatch.setenv("RESEARCHER_KEY", issued.token)
        assert helper.http is not None
        front_values = yaml.safe_load((EXAMPLES / "front.yaml").read_text())
        [entry] = front_values["agents"][0]["a2a_agents"]
        entry["url"] = f"http://{helper.http.address}/a2a/researcher/"
        front = await AgioApp.start(
            example("front.yaml", tmp_path, fake_model.base_url, agents=front_values["agents"])
        )
        try:
            await offered_tool(front, "researcher")
            question = Turn.tool_calls(
                [ToolCallSpec("researcher", json.dumps({"input": "What is 6 * 7?"}))]
            )
            again = Turn.tool_calls(
                [ToolCallSpec("researcher", json.dumps({"input": "And doubled?"}))]
            )
            fake_model.enqueue(question, Turn.text("42."), Turn.text("The researcher says 42."))
            fake_model.enqueue(again, Turn.text("84."), Turn.text("Doubled: 84."))
            async with AgioClient(front.address) as client:
                first = await client.run_to_end("Ask the researcher what 6 * 7 is")
                second = await client.run_to_end("And doubled?", session_id=first.run.session_id)
            async with AgioClient(
                helper.address, metadata=[("authorization", f"Bearer {issued.token}")]
            ) as client:
                [session, *others] = await client.list_sessions()
                helper_runs = await client.list_runs(session.id)
        finally:
            await front.stop(grace=0)
    finally:
        await helper.stop(grace=0)
    [one] = [s for s in first.steps if s.role == Role.ROLE_TOOL]
    [two] = [s for s in second.steps if s.role == Role.ROLE_TOOL]
    assert json.loads(one.content)["answer"] == "42."
    assert json.loads(two.content)["answer"] == "84."
    # The helper's one context is the front's session's, and holds both tasks.
    assert (
        json.loads(one.content)["context_id"] == session.id == json.loads(two.content)["context_id"]
    )
    assert not others
    assert {r.id for r in helper_runs} == {
        json.loads(one.content)["task_id"],
        json.loads(two.content)["task_id"],
    }
    assert second.text == "Doubled: 84."
