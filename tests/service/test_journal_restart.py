"""A client's live cursor survives a server restart, on SQLite and PostgreSQL.

Real processes: `agio-grpc serve` subprocesses on one database, stopped by SIGTERM (the
drain interrupts the run and streams its end) or SIGKILL (nothing runs on the way out),
then a new one on the same database, and sometimes the same port. What the client saw
live is compared with what `WatchRun` replays from the journal: the same events under the
same seqs and contents, less the deltas of finished steps.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agio_grpc.client import AgioClient
from agio_grpc.store.records import TAKEOVER_SEQ_GAP
from agio_grpc.testing import FakeModelServer, ToolCallSpec, Turn
from agio_grpc.v1.events_pb2 import StepEvent
from agio_grpc.v1.resources_pb2 import RunStatus, StopReason
from tests.roles import open_roles
from tests.service.test_leases import kill, start_serve

# Real server processes started, killed and restarted (make test-slow).
pytestmark = pytest.mark.slow


@pytest.fixture
async def database_url(store_url: str) -> str:
    """The backend's database, migrated before any server starts (none races to create it)."""
    await (await open_roles(store_url)).close()
    return store_url


async def serve(
    tmp_path: Path, database_url: str, model_url: str, address: str = "127.0.0.1:0"
) -> tuple[asyncio.subprocess.Process, str]:
    return await start_serve(
        tmp_path,
        database_url,
        model_url,
        AGIO_LISTEN_ADDRESS=address,
        AGIO_SERVER__GRACE_PERIOD_S="1",
    )


async def stop(process: asyncio.subprocess.Process) -> None:
    process.send_signal(signal.SIGTERM)
    async with asyncio.timeout(30):
        await process.wait()


def kind(event: StepEvent) -> str:
    return str(event.WhichOneof("event"))


def journaled(events: list[StepEvent]) -> list[StepEvent]:
    """What a replay gives of a finished stream: every event but the finished steps' deltas."""
    return [event for event in events if kind(event) != "step_delta"]


async def drain(events: AsyncIterator[StepEvent]) -> list[StepEvent]:
    return [event async for event in events]


def tool_then_hang() -> tuple[Turn, Turn]:
    """A model step whose tool call streams in fragments (deltas), then one that hangs."""
    call = ToolCallSpec("calculate", '{"expression": "6 * 7"}', id="call_calc")
    return Turn.tool_calls([call], chunks_per_call=4), Turn.hanging()


async def test_a_cursor_survives_a_sigterm_mid_run(
    tmp_path: Path, database_url: str, fake_model: FakeModelServer
) -> None:
    fake_model.enqueue(*tool_then_hang())
    first, address = await serve(tmp_path, database_url, fake_model.base_url)
    try:
        async with AgioClient(address) as client:
            stream = client.run("What is 6 * 7?")
            live = [await anext(stream)]
            await fake_model.wait_for_requests(2)  # the second model call hangs
            await stop(first)  # the drain interrupts the run and streams its end
            live += await drain(stream)
    finally:
        await kill(first)
    assert kind(live[-1]) == "run_completed"
    assert live[-1].run_completed.run.status == RunStatus.RUN_STATUS_INTERRUPTED
    assert any(kind(event) == "step_delta" for event in live)
    run_id = live[0].run_id

    second, address = await serve(tmp_path, database_url, fake_model.base_url)
    try:
        async with AgioClient(address) as client:
            replay = await drain(client.watch_run(run_id))
            for cursor in {event.seq for event in live}:
                after = await drain(client.watch_run(run_id, after_seq=cursor))
                assert after == [e for e in journaled(live) if e.seq > cursor], cursor
    finally:
        await stop(second)
    assert replay == journaled(live)  # same seqs, times and contents, no finished deltas


async def test_a_cursor_survives_a_kill_after_the_run_ended(
    tmp_path: Path, database_url: str, fake_model: FakeModelServer
) -> None:
    fake_model.enqueue(Turn.text("Forty-two, in four parts.", chunks=4))
    first, address = await serve(tmp_path, database_url, fake_model.base_url)
    try:
        async with AgioClient(address) as client:
            live = await drain(client.run("Tell me."))
    finally:
        await kill(first)  # SIGKILL: nothing runs on the way out
    run_id, terminal = live[0].run_id, live[-1]
    assert kind(terminal) == "run_completed"

    second, address = await serve(tmp_path, database_url, fake_model.base_url)
    try:
        async with AgioClient(address) as client:
            assert await drain(client.watch_run(run_id)) == journaled(live)
            cursor = live[-2].seq  # the last delta the client saw before the end
            assert await drain(client.watch_run(run_id, after_seq=cursor)) == [terminal]
            assert await drain(client.watch_run(run_id, after_seq=terminal.seq)) == []
    finally:
        await stop(second)


async def test_a_cursor_survives_a_kill_mid_run_and_a_follower_reconnects(
    tmp_path: Path, database_url: str, fake_model: FakeModelServer
) -> None:
    fake_model.enqueue(*tool_then_hang())
    first, address = await serve(tmp_path, database_url, fake_model.base_url)
    second: asyncio.subprocess.Process | None = None
    try:
        async with AgioClient(address) as client:
            started = await client.start_run("What is 6 * 7?")
            follower = client.follow_run(started.id)
            seen = [await anext(follower), await anext(follower)]  # run_started, the input
            await fake_model.wait_for_requests(2)  # the second model call hangs
            await kill(first)
            # The same address again: the follower reconnects with the last seq it saw.
            second, _ = await serve(tmp_path, database_url, fake_model.base_url, address)
            async with asyncio.timeout(30):  # within the lease, not never
                seen += await drain(follower)
    finally:
        await kill(first)
        if second is not None:
            await stop(second)
    assert [event.seq for event in seen][:2] == [1, 2]
    terminal = seen[-1]
    assert kind(terminal) == "run_completed"
    ended = terminal.run_completed.run
    assert ended.status == RunStatus.RUN_STATUS_INTERRUPTED
    assert StopReason.Name(ended.stop_signal.reason) == "STOP_REASON_INTERRUPTED"
    assert ended.stop_signal.retryable
    # Past anything the killed server streamed and never stored.
    assert terminal.seq > TAKEOVER_SEQ_GAP
    assert [event.seq for event in seen] == sorted({event.seq for event in seen})
