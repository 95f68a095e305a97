"""Three servers on one PostgreSQL database act as one service: a run is followed live (its
deltas included) and cancelled from any member, and when the member running it is killed
with SIGKILL, watchers on the other two follow it to its INTERRUPTED end and the session
takes a new run. The two workers of `serve --workers 2` on SQLite do the same for each
other.

The members are real `agio-grpc serve` processes; the model is the fake model of this
test process. A reply streams its first piece and then waits an hour for the next, so the
run is mid-step for as long as a test needs, with no timing in any assertion.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path

import grpc
import pytest

from agio_grpc.client import AgioClient
from agio_grpc.service.members import FOLLOW, TOKEN_HEADER
from agio_grpc.service.worker import WORKER_HEADER
from agio_grpc.testing import FakeModelServer, Turn
from agio_grpc.v1 import agent_service_pb2 as pb
from agio_grpc.v1 import events_pb2
from agio_grpc.v1.events_pb2 import StepEvent
from agio_grpc.v1.resources_pb2 import RunStatus, StopReason
from tests.postgres import TestDatabases
from tests.roles import open_roles
from tests.service.test_leases import kill, start_serve
from tests.service.test_serve import read_until, spawn_serve
from tests.service.test_workers import SUPERVISOR_LISTENING
from tests.sqlite import sqlite_at

# Real server processes, one of them killed (make test-slow).
pytestmark = pytest.mark.slow

LEASE_S = "1.0"
OWN_CONNECTION = [("grpc.use_local_subchannel_pool", 1)]
MID_STEP = Turn.text("Hello world", chunks=2, chunk_delay=3600)
"""Streams "Hello " at once, then holds the rest for an hour."""


class Members:
    """The three members' processes and a client of each."""

    def __init__(
        self, url: str, processes: list[asyncio.subprocess.Process], clients: list[AgioClient]
    ) -> None:
        self.url = url
        self.processes = processes
        self.clients = clients


@pytest.fixture
async def members(
    tmp_path: Path, fake_model: FakeModelServer, postgres_databases: TestDatabases
) -> AsyncIterator[Members]:
    url = await postgres_databases.create()
    await (await open_roles(url)).close()  # migrated before the members race to do it
    started = await asyncio.gather(
        *[
            start_serve(tmp_path, url, fake_model.base_url, AGIO_SERVER__SESSION_LEASE_S=LEASE_S)
            for _ in range(3)
        ],
        return_exceptions=True,
    )
    processes = [each[0] for each in started if not isinstance(each, BaseException)]
    clients: list[AgioClient] = []
    try:
        for each in started:
            if isinstance(each, BaseException):
                raise each
        clients = [AgioClient(address) for _, address in started]  # type: ignore[misc]
        yield Members(url, processes, clients)
    finally:
        for client in clients:
            await client.close()
        for process in processes:
            await kill(process)
        await postgres_databases.drop(url)


async def until(events: AsyncIterator[StepEvent], kind: str) -> list[StepEvent]:
    """The events up to and including the first of `kind`."""
    seen: list[StepEvent] = []
    async for event in events:
        seen.append(event)
        if event.WhichOneof("event") == kind:
            return seen
    raise AssertionError(f"the stream ended before a {kind}: {kinds(seen)}")


def kinds(events: list[StepEvent]) -> list[str]:
    return [str(event.WhichOneof("event")) for event in events]


async def start_mid_step(owner: AgioClient, fake_model: FakeModelServer) -> tuple[str, str]:
    """A run on `owner` that has streamed its first delta and holds there: (run, session)."""
    fake_model.enqueue(MID_STEP)
    events = owner.run("Say hello.")
    seen = await until(events, "step_delta")
    # The stream stays open: the caller leaving would cancel the run.
    asyncio.get_running_loop().create_task(drain(events))
    return seen[0].run_id, seen[0].session_id


async def drain(events: AsyncIterator[StepEvent]) -> None:
    async for _ in events:
        pass


async def test_a_watch_on_another_member_gets_the_live_deltas_and_a_cancel_from_a_third_ends_it(
    members: Members, fake_model: FakeModelServer
) -> None:
    owner, watcher, canceller = members.clients
    run_id, _ = await start_mid_step(owner, fake_model)

    async with asyncio.timeout(30):  # a lost event fails here, not at the test timeout
        watch = watcher.watch_run(run_id)
        before = await until(watch, "step_delta")  # only the live stream has deltas
        cancelled = await canceller.cancel_run(run_id, "stop it")
        rest = [event async for event in watch]

    watched = before + rest
    assert kinds(watched) == [
        "run_started",
        "step_completed",  # the input
        "step_started",
        "step_delta",
        "run_completed",  # the reply cut off is not stored
    ]
    assert before[-1].step_delta.content == "Hello "
    assert [event.seq for event in watched] == list(range(1, len(watched) + 1))
    assert cancelled.status == RunStatus.RUN_STATUS_CANCELLED
    assert (cancelled.stop_signal.message, cancelled.stop_signal.source) == ("stop it", "client")
    assert watched[-1].run_completed.run.status == RunStatus.RUN_STATUS_CANCELLED


async def test_watchers_follow_a_killed_owner_s_run_to_its_interrupted_end(
    members: Members, fake_model: FakeModelServer
) -> None:
    owner, first, second = members.clients
    run_id, session_id = await start_mid_step(owner, fake_model)

    async with asyncio.timeout(60):
        watches = [client.watch_run(run_id) for client in (first, second)]
        for watch in watches:
            await until(watch, "step_delta")
        await kill(members.processes[0])
        ends = await asyncio.gather(*[until(watch, "run_completed") for watch in watches])
        fake_model.enqueue(Turn.text("Back again."))
        result = await first.run_to_end("Are you there?", session_id=session_id)

    for seen in ends:
        end = seen[-1].run_completed.run
        assert end.id == run_id
        assert end.status == RunStatus.RUN_STATUS_INTERRUPTED
        stop = end.stop_signal
        assert (stop.reason, stop.retryable) == (StopReason.STOP_REASON_INTERRUPTED, True)
        assert stop.resume_from_sequence == 2  # the reply never stored: from there
    assert result.text == "Back again."
    steps = await second.list_steps(session_id)
    assert [step.content for step in steps] == ["Say hello.", "Are you there?", "Back again."]


async def test_the_member_listener_refuses_a_caller_without_the_members_token(
    members: Members, fake_model: FakeModelServer
) -> None:
    owner = members.clients[0]
    run_id, _ = await start_mid_step(owner, fake_model)
    address = await member_address_of(members, run_id)
    async with grpc.aio.insecure_channel(address) as channel:
        follow = channel.unary_stream(
            FOLLOW,
            request_serializer=pb.WatchRunRequest.SerializeToString,
            response_deserializer=events_pb2.StepEvent.FromString,
        )
        for metadata in [(), ((TOKEN_HEADER, "forged"),), ((TOKEN_HEADER, ""),)]:
            call = follow(pb.WatchRunRequest(run_id=run_id), metadata=metadata)
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await anext(aiter(call))
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED


async def member_address_of(members: Members, run_id: str) -> str:
    """The member address of the server running the run, as the store has it."""
    store = await open_roles(members.url)
    try:
        member = await store.member_running(run_id)
    finally:
        await store.close()
    assert member is not None
    return member.address


async def test_the_workers_of_one_port_follow_and_cancel_each_other_s_runs(
    tmp_path: Path, fake_model: FakeModelServer
) -> None:
    """`serve --workers 2` on SQLite: a run on one worker, watched and cancelled through a
    connection the other worker serves."""
    process = await spawn_serve(
        tmp_path,
        {
            "AGIO_DATABASE_URL": sqlite_at(tmp_path / "agio.db"),
            "OPENAI_BASE_URL": fake_model.base_url,
            "OPENAI_API_KEY": "test-key",
            "AGIO_SERVER__WORKERS": "2",
            "AGIO_LOG_LEVEL": "DEBUG",  # each response names its worker (x-agio-worker)
        },
    )
    assert process.stderr is not None
    try:
        head, _ = await read_until(process.stderr, SUPERVISOR_LISTENING)
        found = SUPERVISOR_LISTENING.search(head)
        assert found is not None
        address = found.group(1)
        async with AsyncExitStack() as stack:
            by_worker: dict[int, AgioClient] = {}
            async with asyncio.timeout(120):
                while len(by_worker) < 2:  # fresh connections until both workers answered
                    # A subchannel pool of its own: a connection of its own.
                    channel = grpc.aio.insecure_channel(address, options=OWN_CONNECTION)
                    client = await stack.enter_async_context(AgioClient(address, channel=channel))
                    by_worker.setdefault(await worker_of(client), client)
            owner, other = by_worker.values()
            run_id, _ = await start_mid_step(owner, fake_model)
            async with asyncio.timeout(30):
                watch = other.watch_run(run_id)
                before = await until(watch, "step_delta")  # live, from the other worker
                cancelled = await other.cancel_run(run_id, "from the other worker")
                rest = [event async for event in watch]
    finally:
        await kill(process)
    assert before[-1].step_delta.content == "Hello "
    assert cancelled.status == RunStatus.RUN_STATUS_CANCELLED
    assert kinds(rest) == ["run_completed"]


async def worker_of(client: AgioClient) -> int:
    """The pid of the worker serving the client's connection."""
    call = client.agents.ListAgents(pb.ListAgentsRequest(), timeout=30)
    await call
    return int(dict(await call.initial_metadata())[WORKER_HEADER])
