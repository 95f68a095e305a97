"""Pages: cut by bytes as well as by count (no response can outgrow a message), GetContext a
page at a time, a run's replay with a step of the largest size, and page tokens signed with
the key every replica shares, on both backends."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import pytest

from agio_grpc.client import AgioClient, decode_error
from agio_grpc.config import AgentConfig, LimitsConfig, ServerConfig
from agio_grpc.service.app import AgioApp
from agio_grpc.service.errors import FieldViolation, ServiceError
from agio_grpc.service.validation import PageTokens
from agio_grpc.testing import FakeModelServer, Turn
from agio_grpc.v1 import agent_service_pb2, resources_pb2, session_service_pb2
from tests.service.conftest import make_settings

MESSAGE_BYTES = 8 * 1024  # pages hold at most 6 KiB
STEP_BYTES = 4096  # the largest step: half a message
TEXT = "x" * 1500  # each step about 1.5 KB


@pytest.fixture
async def small_pages(store_url: str, fake_model: FakeModelServer) -> AsyncIterator[AgioApp]:
    settings = make_settings(
        store_url,
        fake_model.base_url,
        server=ServerConfig(max_message_bytes=MESSAGE_BYTES),
        agents=[AgentConfig(name="assistant", limits=LimitsConfig(max_step_bytes=STEP_BYTES))],
    )
    app = await AgioApp.start(settings)
    try:
        yield app
    finally:
        await app.stop(grace=0)


async def long_session(client: AgioClient, fake_model: FakeModelServer, turns: int) -> str:
    """A session of `turns` turns, each step about 1.5 KB (user and assistant)."""
    session_id = ""
    for _ in range(turns):
        fake_model.enqueue(Turn.text(TEXT))
        run = await client.run_to_end(TEXT, session_id=session_id)
        session_id = run.session_id
    return session_id


async def test_list_steps_pages_are_cut_by_bytes_and_join_up(
    small_pages: AgioApp, fake_model: FakeModelServer
) -> None:
    async with AgioClient(small_pages.address) as client:
        session_id = await long_session(client, fake_model, 5)  # 10 steps, ~15 KB
        sequences: list[int] = []
        token = ""
        pages = 0
        while True:
            page = await client.sessions.ListSteps(
                session_service_pb2.ListStepsRequest(
                    session_id=session_id, page_size=100, page_token=token
                )
            )
            assert page.ByteSize() <= MESSAGE_BYTES * 3 // 4
            assert page.steps
            sequences += [step.sequence for step in page.steps]
            pages += 1
            token = page.next_page_token
            if not token:
                break
    assert sequences == list(range(1, 11))
    assert pages >= 3


async def test_list_runs_pages_are_cut_by_bytes_and_join_up(
    small_pages: AgioApp, fake_model: FakeModelServer
) -> None:
    async with AgioClient(small_pages.address) as client:
        session_id = ""
        run_ids: list[str] = []
        for _ in range(8):  # each run about 1.5 KB (its metadata), ~12 KB in all
            fake_model.enqueue(Turn.text("ok"))
            run = await client.run_to_end("hi", session_id=session_id, metadata={"note": TEXT})
            session_id = run.session_id
            run_ids.append(run.run.id)
        listed: list[str] = []
        token = ""
        pages = 0
        while True:
            page = await client.agents.ListRuns(
                agent_service_pb2.ListRunsRequest(
                    session_id=session_id, page_size=100, page_token=token
                )
            )
            assert page.ByteSize() <= MESSAGE_BYTES * 3 // 4
            assert page.runs
            listed += [run.id for run in page.runs]
            pages += 1
            token = page.next_page_token
            if not token:
                break
    assert sorted(listed) == sorted(run_ids)
    assert len(set(listed)) == len(run_ids)
    assert pages >= 3


async def test_watch_run_replays_a_run_holding_a_step_of_the_largest_size(
    small_pages: AgioApp, fake_model: FakeModelServer
) -> None:
    async with AgioClient(small_pages.address) as client:
        fake_model.enqueue(Turn.text("é✓" * STEP_BYTES, chunks=20))  # cut to the step limit
        ended = await client.run_to_end("write a lot")
        assert ended.run.stop_signal.reason == resources_pb2.STOP_REASON_MAX_TOKENS
        events = [event async for event in client.watch_run(ended.run.id)]
    replayed = [e.step_completed.step for e in events if e.WhichOneof("event") == "step_completed"]
    reply = replayed[-1]
    assert reply.role == resources_pb2.ROLE_ASSISTANT
    assert STEP_BYTES - 4 < len(reply.content.encode()) <= STEP_BYTES
    assert reply.content == ended.steps[-1].content
    assert all(event.ByteSize() <= MESSAGE_BYTES for event in events)
    assert events[-1].WhichOneof("event") == "run_completed"
    assert events[-1].run_completed.run == ended.run


async def test_get_context_comes_a_page_at_a_time(
    small_pages: AgioApp, fake_model: FakeModelServer
) -> None:
    async with AgioClient(small_pages.address) as client:
        session_id = await long_session(client, fake_model, 4)
        whole: list[int] = []
        token = ""
        while True:
            page = await client.sessions.GetContext(
                session_service_pb2.GetContextRequest(session_id=session_id, page_token=token)
            )
            assert page.ByteSize() <= MESSAGE_BYTES
            assert page.summary.total_steps == 8
            whole += [message.sequence for message in page.messages]
            token = page.next_page_token
            if not token:
                break
        assert whole == list(range(0, 9))  # the system prompt, then every step
        two = await client.sessions.GetContext(
            session_service_pb2.GetContextRequest(session_id=session_id, page_size=2)
        )
        assert [m.sequence for m in two.messages] == [0, 1]
        # The session changes: a token of the context before is refused.
        fake_model.enqueue(Turn.text("more"))
        await client.run_to_end("more", session_id=session_id)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await client.sessions.GetContext(
                session_service_pb2.GetContextRequest(
                    session_id=session_id, page_size=2, page_token=two.next_page_token
                )
            )
        whole_again = await client.get_context(session_id)  # the client joins the pages
    error = decode_error(refused.value)
    assert (error.code, error.reason) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT")
    assert error.field_violations[0][0] == "page_token"
    assert [m.sequence for m in whole_again.messages] == list(range(0, 11))


async def test_every_replica_accepts_the_page_tokens_of_every_other(
    store_url: str, fake_model: FakeModelServer
) -> None:
    first = await AgioApp.start(make_settings(store_url, fake_model.base_url))
    second = await AgioApp.start(make_settings(store_url, fake_model.base_url))
    try:
        async with (
            AgioClient(first.address) as one,
            AgioClient(second.address) as other,
        ):
            fake_model.enqueue(Turn.text("hi"))
            session_id = (await one.run_to_end("hello")).session_id
            page = await one.sessions.ListSteps(
                session_service_pb2.ListStepsRequest(session_id=session_id, page_size=1)
            )
            rest = await other.sessions.ListSteps(
                session_service_pb2.ListStepsRequest(
                    session_id=session_id, page_size=1, page_token=page.next_page_token
                )
            )
        assert [step.sequence for step in rest.steps] == [2]
    finally:
        await first.stop(grace=0)
        await second.stop(grace=0)


def test_a_page_token_is_its_tenants_and_the_default_tenants_is_the_shared_keys() -> None:
    pages = PageTokens(b"k" * 32)
    query: dict[str, object] = {"rpc": "ListSessions"}
    token = pages.for_tenant("tenant-a").encode(query, [1])

    assert pages.for_tenant("tenant-a").decode(token, query) == [1]
    for other in (pages.for_tenant("tenant-b"), pages.for_tenant("default"), pages):
        with pytest.raises(ServiceError) as refused:
            other.decode(token, query)
        assert refused.value.violations == [
            FieldViolation("page_token", "is not a valid page token")
        ]
    # Tokens issued before tenants existed are the default tenant's.
    assert pages.for_tenant("default").decode(pages.encode(query, [2]), query) == [2]
    assert pages.for_tenant("\ud800").encode(query, [3])  # any string names a tenant
