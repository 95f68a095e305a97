"""CompactSession over the real server, on SQLite and PostgreSQL: the summary step and what
GetContext shows after it, bad requests, unknown sessions and agents (a busy session:
tests/engine/test_compaction.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import pytest

from agio_grpc.client import AgioClient, AgioError
from agio_grpc.service.app import AgioApp
from agio_grpc.testing import FakeModelServer
from agio_grpc.v1 import resources_pb2
from tests.service.conftest import make_settings


@pytest.fixture
async def client(store_url: str, fake_model: FakeModelServer) -> AsyncIterator[AgioClient]:
    app = await AgioApp.start(make_settings(store_url, fake_model.base_url))
    try:
        async with AgioClient(app.address) as connected:
            yield connected
    finally:
        await app.stop(grace=0)


LONG = "a turn long enough for its summary to be shorter than it is " * 8


async def two_turns(client: AgioClient) -> str:
    first = await client.run_to_end("the first turn: " + LONG)
    await client.run_to_end("the second turn: " + LONG, session_id=first.session_id)
    return first.session_id


async def test_a_session_is_compacted_and_its_context_starts_from_the_summary(
    client: AgioClient,
) -> None:
    session_id = await two_turns(client)
    done = await client.compact_session(session_id, keep_recent_steps=2)
    summary = done.summary
    assert summary.role == resources_pb2.ROLE_SUMMARY
    assert (summary.summary_first_sequence, summary.summary_last_sequence) == (1, 2)
    assert summary.sequence == 5
    assert done.tokens_after < done.tokens_before
    context = await client.get_context(session_id)
    assert [m.sequence for m in context.messages] == [0, 5, 3, 4]
    steps = await client.list_steps(session_id)
    assert [s.sequence for s in steps] == [1, 2, 3, 4, 5]  # nothing left the log


@pytest.mark.parametrize(
    ("session_id", "keep", "field"),
    [("", 0, "session_id"), ("sess\x00x", 0, "session_id"), ("sess_a", -1, "keep_recent_steps")],
)
async def test_bad_requests_are_invalid_arguments(
    client: AgioClient, session_id: str, keep: int, field: str
) -> None:
    with pytest.raises(AgioError) as refused:
        await client.compact_session(session_id, keep_recent_steps=keep)
    assert refused.value.code is grpc.StatusCode.INVALID_ARGUMENT
    assert field in str(refused.value)


async def test_unknown_sessions_and_agents_are_not_found(client: AgioClient) -> None:
    with pytest.raises(AgioError) as missing:
        await client.compact_session("sess_missing")
    assert missing.value.code is grpc.StatusCode.NOT_FOUND
    session_id = await two_turns(client)
    with pytest.raises(AgioError) as no_agent:
        await client.compact_session(session_id, agent="nobody")
    assert no_agent.value.code is grpc.StatusCode.NOT_FOUND
