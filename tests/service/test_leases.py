"""A server killed mid-run does not brick its session: the session lease runs out, and the
next server finalises the run and serves the session again. A cancel or a watch sent to the
server not running the run reaches it.

The crash is real: two `agio-grpc serve` subprocesses share one SQLite file (two replicas,
with the fake model of this test process as their model endpoint); one gets SIGKILL while
its run waits on the model, so no shutdown path, `finally` or release runs, and the other
serves the session once the dead one's lease has run out. The other tests play a crash's
aftermath (a held session nobody renews) and a server stalled past its lease through the
database, and say so.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import grpc
import pytest
from sqlalchemy import Select, select, update
from sqlalchemy.ext.asyncio import create_async_engine

from agio_grpc.client import AgioClient, AgioError, collect
from agio_grpc.config import ServerConfig
from agio_grpc.domain import Role, Run, Session, Step, utc_now
from agio_grpc.service.app import AgioApp
from agio_grpc.store.tables import runs, sessions
from agio_grpc.testing import FakeModelServer, Turn
from agio_grpc.v1.agent_service_pb2 import (
    BUSY_POLICY_ENQUEUE,
    DISCONNECT_POLICY_CANCEL,
    DISCONNECT_POLICY_CONTINUE,
)
from agio_grpc.v1.events_pb2 import StepEvent
from agio_grpc.v1.resources_pb2 import RunStatus, StopReason
from tests.roles import open_roles
from tests.service.conftest import make_settings
from tests.service.test_serve import LISTENING, read_until, spawn_serve
from tests.sqlite import sqlite_at

# Real server processes killed mid-run, and leases left to expire (make test-slow).
pytestmark = pytest.mark.slow

LEASE_S = 1.0
LATE_DEADLINE_S = 3.0  # a caller's deadline that passes while its server is down


async def start_serve(
    tmp_path: Path, database_url: str, model_url: str, **settings: str
) -> tuple[asyncio.subprocess.Process, str]:
    """`agio-grpc serve` in a subprocess (more `settings` as environment variables); returns
    the process and the address it bound."""
    process = await spawn_serve(
        tmp_path,
        {
            "AGIO_DATABASE_URL": database_url,
            "OPENAI_BASE_URL": model_url,
            "OPENAI_API_KEY": "test-key",
            "AGIO_SERVER__SESSION_LEASE_S": str(LEASE_S),
            **settings,
        },
    )
    assert process.stderr is not None
    try:
        _, address = await read_until(process.stderr, LISTENING)
    except BaseException:
        await kill(process)
        raise
    return process, address


async def kill(process: asyncio.subprocess.Process | None) -> None:
    if process is not None and process.returncode is None:
        process.send_signal(signal.SIGKILL)
        await process.wait()


@asynccontextmanager
async def two_servers(
    tmp_path: Path, fake_model: FakeModelServer
) -> AsyncIterator[tuple[AgioClient, AgioClient]]:
    """Two `agio-grpc serve` replicas on one SQLite file, and a client of each."""
    database_url = sqlite_at(tmp_path / "agio.db")
    # Migrated beforehand, so the two servers do not race to create the file.
    await (await open_roles(database_url)).close()
    started = await asyncio.gather(
        start_serve(tmp_path, database_url, fake_model.base_url),
        start_serve(tmp_path, database_url, fake_model.base_url),
        return_exceptions=True,
    )
    servers = [each for each in started if not isinstance(each, BaseException)]
    try:
        for each in started:
            if isinstance(each, BaseException):
                raise each  # the one that did start is killed all the same
        (_, first_address), (_, second_address) = servers
        async with AgioClient(first_address) as one, AgioClient(second_address) as other:
            yield one, other
    finally:
        for process, _ in servers:
            await kill(process)


async def start_hanging_run(
    client: AgioClient, fake_model: FakeModelServer
) -> tuple[str, AsyncIterator[StepEvent]]:
    """A run that waits on the model for ever: its id and the rest of its stream."""
    fake_model.enqueue(Turn.hanging())
    events = client.run("Think forever.")
    run_id = (await anext(events)).run_id
    await fake_model.wait_for_requests(1)
    return run_id, events


async def read_column(database_url: str, query: Select[Any]) -> Any:
    """One value read straight from the database file, as another process would."""
    engine = create_async_engine(database_url)
    try:
        async with engine.connect() as conn:
            return (await conn.execute(query)).scalar_one()
    finally:
        await engine.dispose()


async def wait_for_lease_expiry(database_url: str, session_id: str) -> None:
    """Return once the session's lease as stored now has run out (or it has none)."""
    query = select(sessions.c.lease_expires_at).where(sessions.c.id == session_id)
    expires = await read_column(database_url, query)
    if expires is not None:
        await asyncio.sleep(max((expires - utc_now()).total_seconds(), 0) + 0.01)
        assert utc_now() > expires


async def test_a_session_survives_its_server_being_killed_mid_run(
    tmp_path: Path, fake_model: FakeModelServer
) -> None:
    database_url = sqlite_at(tmp_path / "agio.db")
    # Migrated beforehand, so the two servers do not race to create the file.
    await (await open_roles(database_url)).close()
    fake_model.enqueue(Turn.hanging(), Turn.text("Back again."))
    doomed: asyncio.subprocess.Process | None = None
    survivor: asyncio.subprocess.Process | None = None
    try:
        (doomed, doomed_address), (survivor, survivor_address) = await asyncio.gather(
            start_serve(tmp_path, database_url, fake_model.base_url),
            start_serve(tmp_path, database_url, fake_model.base_url),
        )
        async with AgioClient(doomed_address) as doomed_client:
            events = doomed_client.run("Think forever.")
            started = await anext(events)
            run_id, session_id = started.run_id, started.session_id
            await fake_model.wait_for_requests(1)  # the run now waits on the model

            async with AgioClient(survivor_address) as client:
                # The live server renews its lease: past the first expiry the session is
                # still busy, for the other server too.
                await wait_for_lease_expiry(database_url, session_id)
                with pytest.raises(AgioError) as busy:
                    await client.run_to_end("Me too.", session_id=session_id)
                assert busy.value.code == grpc.StatusCode.FAILED_PRECONDITION

                await kill(doomed)
                with pytest.raises(AgioError) as broken:
                    async for _ in events:
                        pass
                assert broken.value.code == grpc.StatusCode.UNAVAILABLE
                query = select(runs.c.status).where(runs.c.id == run_id)
                assert await read_column(database_url, query) == "RUNNING"  # as left

                # Nobody renews the dead server's lease; once it has run out, the next Run
                # takes the session over and finalises the dead run in the same transaction.
                await wait_for_lease_expiry(database_url, session_id)
                result = await client.run_to_end("Are you there?", session_id=session_id)
                crashed = await client.get_run(run_id)
                steps = await client.list_steps(session_id)
    finally:
        await kill(doomed)
        await kill(survivor)

    assert result.text == "Back again."
    assert crashed.status == RunStatus.RUN_STATUS_INTERRUPTED
    stop = crashed.stop_signal
    assert StopReason.Name(stop.reason) == "STOP_REASON_INTERRUPTED"
    assert (stop.source, stop.retryable, stop.resume_from_sequence) == ("server", True, 2)
    assert "lease expired" in stop.message
    assert crashed.end_time.seconds > 0
    assert [step.content for step in steps] == ["Think forever.", "Are you there?", "Back again."]


async def test_a_cancel_sent_to_another_server_stops_the_run(
    tmp_path: Path, fake_model: FakeModelServer
) -> None:
    async with two_servers(tmp_path, fake_model) as (client, elsewhere):
        run_id, events = await start_hanging_run(client, fake_model)

        async with asyncio.timeout(30):  # a lost cancel fails here, not at the test timeout
            cancelled = await elsewhere.cancel_run(run_id, "no longer needed")
            rest = [event async for event in events]

    assert cancelled.status == RunStatus.RUN_STATUS_CANCELLED
    stop = cancelled.stop_signal
    assert (StopReason.Name(stop.reason), stop.message, stop.source) == (
        "STOP_REASON_CANCELLED",
        "no longer needed",
        "client",
    )
    terminal = rest[-1]
    assert terminal.WhichOneof("event") == "run_completed"
    assert terminal.run_completed.run.stop_signal == stop


async def test_a_watch_on_another_server_follows_the_run_to_its_terminal_event(
    tmp_path: Path, fake_model: FakeModelServer
) -> None:
    async with two_servers(tmp_path, fake_model) as (client, elsewhere):
        # The run's own stream stays open: a caller that left would cancel the run.
        run_id, _stream = await start_hanging_run(client, fake_model)

        async with asyncio.timeout(30):  # a watch that never ends fails here
            watch = elsewhere.watch_run(run_id)
            first = [await anext(watch), await anext(watch)]  # what is stored so far
            await client.cancel_run(run_id, "enough")
            rest = [event async for event in watch]

    watched = first + rest
    # As the journal stored them: the deltas of the reply in progress are not replayed.
    assert [event.seq for event in watched][:3] == [1, 2, 3]
    assert [event.seq for event in watched] == sorted({event.seq for event in watched})
    assert [event.WhichOneof("event") for event in watched] == [
        "run_started",
        "step_completed",  # the input
        "step_started",  # the reply the cancel cut off
        "run_completed",
    ]
    final = watched[-1].run_completed.run
    assert final.status == RunStatus.RUN_STATUS_CANCELLED
    assert final.stop_signal.message == "enough"


async def test_a_restarted_server_finalises_the_runs_its_crashed_predecessor_left(
    tmp_path: Path, fake_model: FakeModelServer
) -> None:
    """The embedded case: the database as a killed server leaves it (a session held by a
    RUNNING run under a lease nobody renews; the test above shows a real kill leaves
    exactly that), then a server starting after the lease ran out. GetRun tells the truth
    at once, before any Run touches the session."""
    database_url = sqlite_at(tmp_path / "agio.db")
    fake_model.enqueue(Turn.text("Yes."))
    dead = await open_roles(database_url, session_lease_s=0.05)
    try:
        session = Session()
        run = Run(session_id=session.id, agent="assistant")
        await dead.start_run(
            run,
            [Step(session.id, run.id, Role.USER, content="Think forever.")],
            new_session=session,
        )
    finally:
        await dead.close()  # without releasing: the process is gone
    await wait_for_lease_expiry(database_url, session.id)

    restarted = await AgioApp.start(make_settings(database_url, fake_model.base_url))
    try:
        async with AgioClient(restarted.address) as client:
            crashed = await client.get_run(run.id)
            follow_up = await client.run_to_end("Hello?", session_id=session.id)
    finally:
        await restarted.stop(grace=0)

    assert crashed.status == RunStatus.RUN_STATUS_INTERRUPTED
    assert crashed.stop_signal.resume_from_sequence == 2
    assert follow_up.text == "Yes."


async def test_a_run_whose_session_was_taken_over_is_stopped_by_its_next_renewal(
    tmp_path: Path, fake_model: FakeModelServer
) -> None:
    """A server that stalled past its lease while another replica took the session over:
    played by rewriting the session's holder in the database, as the other replica's take
    would. The stalled server's next renewal finds the session gone and stops its run."""
    database_url = sqlite_at(tmp_path / "agio.db")
    fake_model.enqueue(Turn.hanging())
    settings = make_settings(
        database_url, fake_model.base_url, server=ServerConfig(session_lease_s=0.3)
    )
    app = await AgioApp.start(settings)
    try:
        async with AgioClient(app.address) as client:
            events = client.run("Think forever.")
            started = await anext(events)
            await fake_model.wait_for_requests(1)
            engine = create_async_engine(database_url)
            try:
                async with engine.begin() as conn:
                    await conn.execute(
                        update(sessions)
                        .where(sessions.c.id == started.session_id)
                        .values(
                            active_run_id="run_elsewhere",
                            lease_expires_at=utc_now() + timedelta(seconds=60),
                        )
                    )
            finally:
                await engine.dispose()
            async with asyncio.timeout(10):
                rest = [event async for event in events]
    finally:
        await app.stop(grace=0)

    final = rest[-1].run_completed.run
    assert final.status == RunStatus.RUN_STATUS_INTERRUPTED
    assert "lost its session lease" in final.stop_signal.message
    query = select(sessions.c.active_run_id).where(sessions.c.id == started.session_id)
    assert await read_column(database_url, query) == "run_elsewhere"


async def test_a_kill_dash_9_ends_the_queued_runs_whose_callers_died_with_it(
    tmp_path: Path, fake_model: FakeModelServer, store_url: str
) -> None:
    """Queued runs whose callers' streams died with their server (kill -9) are not started
    for no one after its restart: past the caller's deadline they end TIMEOUT, else as the
    caller's disconnect policy says (CANCEL by default); a run whose caller asked it to go
    on runs when its turn comes."""
    await (await open_roles(store_url)).close()  # migrated before the servers race to it
    same = {"AGIO_SERVER__INSTANCE_ID": "kill-test/one"}
    process, address = await start_serve(tmp_path, store_url, fake_model.base_url, **same)
    streams: list[AsyncIterator[StepEvent]] = []
    try:
        async with AgioClient(address) as client:
            holder, rest = await start_hanging_run(client, fake_model)
            streams.append(rest)
            session_id = (await client.get_run(holder)).session_id
            queued: dict[str, str] = {}
            late_deadline = utc_now() + timedelta(seconds=LATE_DEADLINE_S)
            for name, timeout, disconnect in (
                ("late", LATE_DEADLINE_S, DISCONNECT_POLICY_CANCEL),
                ("waiting", 300.0, DISCONNECT_POLICY_CANCEL),
                ("background", None, DISCONNECT_POLICY_CONTINUE),
            ):
                events = client.run(
                    name,
                    session_id=session_id,
                    on_busy=BUSY_POLICY_ENQUEUE,
                    on_disconnect=disconnect,
                    timeout=timeout,
                )
                queued[name] = (await anext(events)).run_id
                streams.append(events)
            await kill(process)  # callers' streams, their deadline timers and all
    finally:
        await kill(process)
    await asyncio.sleep(max((late_deadline - utc_now()).total_seconds(), 0) + 0.05)

    fake_model.enqueue(Turn.text("Done in the background."))
    process, address = await start_serve(tmp_path, store_url, fake_model.base_url, **same)
    try:
        async with AgioClient(address) as client:
            background = await collect(client.follow_run(queued["background"]))
            ended = {name: await client.get_run(run_id) for name, run_id in queued.items()}
            interrupted = await client.get_run(holder)
    finally:
        await kill(process)

    assert interrupted.status == RunStatus.RUN_STATUS_INTERRUPTED
    assert "restarted" in interrupted.stop_signal.message
    reasons = {name: run.stop_signal.reason for name, run in ended.items()}
    assert reasons == {
        "late": StopReason.STOP_REASON_TIMEOUT,
        "waiting": StopReason.STOP_REASON_CANCELLED,
        "background": StopReason.STOP_REASON_COMPLETED,
    }
    assert background.text == "Done in the background."
    assert len(fake_model.requests) == 2  # the hanging run's and the background run's
