"""A wait for approval survives `kill -9` of the server that ran the run: a new server on the
same store shows the same wait, and the approval submitted there runs the call and the run
goes on. Real `agio-grpc serve` processes, SQLite file and PostgreSQL (make test-slow)."""

from __future__ import annotations

from pathlib import Path

import pytest

from agio_grpc.client import AgioClient
from agio_grpc.testing import FakeModelServer
from agio_grpc.v1.resources_pb2 import RunStatus
from tests.service.test_leases import kill, start_serve

pytestmark = pytest.mark.slow


async def test_a_wait_for_approval_loses_nothing_to_a_kill_dash_9(
    tmp_path: Path, store_url: str, fake_model: FakeModelServer
) -> None:
    # The built-in fake model answers "What is 12 * 7?" with a call of `calculate`, then 84.
    first, address = await start_serve(tmp_path, store_url, fake_model.base_url)
    try:
        async with AgioClient(address) as client:
            waiting = await client.run_to_end("What is 12 * 7?", require_approval=["calculate"])
    finally:
        await kill(first)
    assert waiting.run.status == RunStatus.RUN_STATUS_REQUIRES_ACTION
    (held,) = waiting.run.required_action.approvals

    second, address = await start_serve(tmp_path, store_url, fake_model.base_url)
    try:
        async with AgioClient(address) as client:
            stored = await client.get_run(waiting.run.id)
            assert stored.status == RunStatus.RUN_STATUS_REQUIRES_ACTION
            assert stored.required_action == waiting.run.required_action
            events = [event async for event in client.approve(waiting.run.id, held.id)]
            done = events[-1].run_completed.run
            assert done.status == RunStatus.RUN_STATUS_COMPLETED
            steps = await client.list_steps(waiting.session_id)
    finally:
        await kill(second)
    (result,) = [step for step in steps if step.tool_call_id == held.id]
    assert result.content == "84"
    assert result.approval.approved
    assert "84" in steps[-1].content
