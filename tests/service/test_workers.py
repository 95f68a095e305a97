"""`agio-grpc serve --workers N`: worker processes sharing one port under a supervisor."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import re
import signal
import socket
import sys
from pathlib import Path

import pytest

from agio_grpc.client import AgioClient, open_channel
from agio_grpc.config import MAX_WORKERS, Settings, available_cores
from agio_grpc.service.supervisor import reserve_port
from agio_grpc.service.worker import WORKER_HEADER
from agio_grpc.v1 import agent_service_pb2, agent_service_pb2_grpc
from tests.service.test_serve import LISTENING, read_until, spawn_serve

SUPERVISOR_LISTENING = re.compile(r"agio-grpc listening on (\S+) with 2 workers \(pids ([\d, ]+)\)")
RESTARTED = re.compile(r"worker \d+ restarted \(pid (\d+)\)")


def test_workers_default_to_one() -> None:
    assert Settings().server.workers == 1


def test_workers_auto_is_the_number_of_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGIO_SERVER__WORKERS", "auto")
    assert Settings().server.workers == available_cores()
    monkeypatch.setenv("AGIO_SERVER__WORKERS", "3")
    assert Settings().server.workers == 3


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("0", "greater than or equal to 1"),
        (str(MAX_WORKERS + 1), f"less than or equal to {MAX_WORKERS}"),
        ("many", "must be a number of worker processes (1..1024) or auto, got 'many'"),
        ("-2", "must be a number of worker processes"),
    ],
)
def test_workers_out_of_bounds_or_not_a_number_is_refused(
    monkeypatch: pytest.MonkeyPatch, value: str, message: str
) -> None:
    from pydantic import ValidationError

    monkeypatch.setenv("AGIO_SERVER__WORKERS", value)
    with pytest.raises(ValidationError, match=re.escape(message)) as caught:
        Settings()
    assert caught.value.errors()[0]["loc"] == ("server", "workers")


def test_the_workers_option_is_checked_like_the_setting() -> None:
    from agio_grpc.cli import build_parser

    parser = build_parser()
    assert parser.parse_args(["serve", "--workers", "auto"]).workers == available_cores()
    assert parser.parse_args(["serve", "--workers", "2"]).workers == 2
    for wrong in ("0", "many"):
        with pytest.raises(SystemExit):
            parser.parse_args(["serve", "--workers", wrong])


@pytest.mark.parametrize("debug", [False, True])
async def test_a_worker_names_its_process_in_responses_only_when_debugging(
    tmp_path: Path, debug: bool
) -> None:
    from agio_grpc.service.app import AgioApp
    from agio_grpc.service.worker import WorkerRole
    from tests.service.conftest import make_settings

    settings = make_settings(f"sqlite+aiosqlite:///{tmp_path / 'a.db'}", "http://127.0.0.1:9/v1")
    supervisor_end, worker_end = socket.socketpair()
    with supervisor_end, worker_end:
        role = WorkerRole(1, worker_end.fileno(), debug=debug)
        app = await AgioApp.start(settings, worker=role)
        try:
            async with open_channel(app.address) as channel:
                call = agent_service_pb2_grpc.AgentServiceStub(channel).ListAgents(
                    agent_service_pb2.ListAgentsRequest(), timeout=30
                )
                await call
                headers = dict(await call.initial_metadata())
        finally:
            await app.stop(grace=0)
    if debug:
        assert headers[WORKER_HEADER] == str(os.getpid())
    else:
        assert WORKER_HEADER not in headers


async def serving_pid(address: str) -> int:
    """The worker that answers ListAgents on a fresh channel (a new connection)."""
    async with open_channel(address) as channel:
        call = agent_service_pb2_grpc.AgentServiceStub(channel).ListAgents(
            agent_service_pb2.ListAgentsRequest(), timeout=30
        )
        await call
        return int(dict(await call.initial_metadata())[WORKER_HEADER])


async def pids_serving(address: str, until: set[int] | None = None, *, count: int = 2) -> set[int]:
    """Call on fresh channels until `count` distinct workers answered (or, with `until`,
    one of those pids did); the pids seen."""
    seen: set[int] = set()

    def enough() -> bool:
        return bool(seen & until) if until is not None else len(seen) >= count

    async with asyncio.timeout(120):
        while not enough():
            seen.add(await serving_pid(address))
    return seen


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.mark.slow  # three real processes, and a restart
async def test_two_workers_share_a_port_and_a_killed_one_is_replaced(
    tmp_path: Path, store_url: str
) -> None:
    """On SQLite (one file, several writers) and on PostgreSQL."""
    process = await spawn_serve(
        tmp_path,
        {
            "AGIO_DATABASE_URL": store_url,
            "AGIO_SERVER__WORKERS": "2",
            "AGIO_SERVER__GRACE_PERIOD_S": "2",
            "AGIO_LOG_LEVEL": "DEBUG",  # each response names its worker (x-agio-worker)
        },
    )
    assert process.stderr is not None
    stderr = process.stderr
    log = ""
    try:
        head, _ = await read_until(stderr, SUPERVISOR_LISTENING)
        found = SUPERVISOR_LISTENING.search(head)
        assert found is not None
        address, started = found.group(1), {int(p) for p in found.group(2).split(", ")}
        assert not address.endswith(":0")
        assert "built-in fake model" in head
        assert len(started) == 2

        assert await pids_serving(address) == started

        victim = min(started)
        os.kill(victim, signal.SIGKILL)
        restart_log, replacement_text = await read_until(stderr, RESTARTED)
        replacement = int(replacement_text)
        assert f"pid {victim}) was killed by SIGKILL" in restart_log
        # The survivor answered meanwhile, and the replacement serves calls once it listens.
        assert await serving_pid(address) in started | {replacement}
        await pids_serving(address, until={replacement})

        from agio_grpc.client import AgioClient

        async with AgioClient(address) as client:
            result = await client.run_to_end("What is 12 * 7?")
            assert "84" in result.text

        process.send_signal(signal.SIGTERM)
        async with asyncio.timeout(60):
            log = (await stderr.read()).decode()
            assert await process.wait() == 0
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert "stopped" in log
    assert all(gone(pid) for pid in started | {replacement})


def left_in_time_wait() -> int:
    """A port whose lone server (no SO_REUSEPORT) closed a connection first and stopped:
    the port's side of the connection waits out TIME_WAIT, as after a server stopped with
    clients connected."""
    with socket.socket() as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", 0))
        server.listen()
        port: int = server.getsockname()[1]
        client = socket.create_connection(("127.0.0.1", port))
        accepted, _ = server.accept()
        accepted.close()
        client.close()
    return port


def test_the_supervisor_holds_a_port_its_last_server_left_in_time_wait() -> None:
    port = left_in_time_wait()
    held, address = reserve_port(f"127.0.0.1:{port}")
    try:
        assert address == f"127.0.0.1:{port}"
        # Held all the same: no server of its own may take the port (a lone server binds
        # with SO_REUSEADDR)...
        with socket.socket() as intruder:
            intruder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            with pytest.raises(OSError, match="in use") as refused:
                intruder.bind(("127.0.0.1", port))
            assert refused.value.errno == errno.EADDRINUSE
        # ...and its workers bind it beside the supervisor (SO_REUSEPORT).
        with socket.socket() as worker:
            worker.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            worker.bind(("127.0.0.1", port))
            worker.listen()
    finally:
        for sock in held:
            sock.close()


@pytest.mark.slow  # two real servers, one after the other
async def test_workers_restart_at_once_on_the_port_a_server_left_with_clients_connected(
    tmp_path: Path,
) -> None:
    database = {"AGIO_DATABASE_URL": f"sqlite+aiosqlite:///{tmp_path / 'agio.db'}"}
    first = await spawn_serve(tmp_path, database | {"AGIO_SERVER__GRACE_PERIOD_S": "1"})
    assert first.stderr is not None
    try:
        head, _ = await read_until(first.stderr, LISTENING)
        found = LISTENING.search(head)
        assert found is not None
        address = found.group(1)
        async with AgioClient(address) as client:
            await client.list_agents()
        # Clients still connected when the server exits, which do not hang up first (a gRPC
        # client may close its idle connection on the server's GOAWAY): the server's side
        # of each connection closes first, and waits out TIME_WAIT on the port once the
        # client closes too (having read all: unread bytes would make its close a reset).
        host, _, port = address.rpartition(":")
        connected = [socket.create_connection((host, int(port)), timeout=60) for _ in range(4)]
        try:
            for connection in connected:
                # The server's SETTINGS frame, sent once it accepted the connection: one
                # still queued on the listening socket when the server closes it is reset.
                assert connection.recv(65536)
            first.send_signal(signal.SIGTERM)
            async with asyncio.timeout(60):
                await first.stderr.read()
                assert await first.wait() == 0
            for connection in connected:
                while connection.recv(65536):  # the server's frames, then its FIN
                    pass
        finally:
            for connection in connected:
                connection.close()
    finally:
        if first.returncode is None:
            first.kill()
            await first.wait()

    second = await spawn_serve(
        tmp_path,
        database | {"AGIO_LISTEN_ADDRESS": address, "AGIO_SERVER__WORKERS": "2"},
    )
    assert second.stderr is not None
    try:
        head, restarted_on = await read_until(second.stderr, SUPERVISOR_LISTENING)
        assert restarted_on == address, head
        async with AgioClient(address) as client:
            assert [agent.name for agent in await client.list_agents()] == ["assistant"]
        second.send_signal(signal.SIGTERM)
        async with asyncio.timeout(60):
            await second.stderr.read()
            assert await second.wait() == 0
    finally:
        if second.returncode is None:
            second.kill()
            await second.wait()


MAX_CLIENTS = 64
"""Clients opened at most before both workers answered: the kernel spreads connections
over the workers at random, so 64 connections all on one worker happen once in 2**63."""


@pytest.mark.slow  # three real processes
async def test_clients_of_one_address_spread_over_the_workers(tmp_path: Path) -> None:
    """Each client held open, as a service holds its clients: each has its own connection,
    and the connections go to both workers."""
    process = await spawn_serve(
        tmp_path,
        {
            "AGIO_DATABASE_URL": f"sqlite+aiosqlite:///{tmp_path / 'agio.db'}",
            "AGIO_SERVER__WORKERS": "2",
            "AGIO_SERVER__GRACE_PERIOD_S": "1",
            "AGIO_LOG_LEVEL": "DEBUG",  # each response names its worker (x-agio-worker)
        },
    )
    assert process.stderr is not None
    try:
        head, _ = await read_until(process.stderr, SUPERVISOR_LISTENING)
        found = SUPERVISOR_LISTENING.search(head)
        assert found is not None
        address, started = found.group(1), {int(p) for p in found.group(2).split(", ")}
        answered: list[int] = []
        async with contextlib.AsyncExitStack() as clients:
            while set(answered) != started and len(answered) < MAX_CLIENTS:
                client = await clients.enter_async_context(AgioClient(address))
                call = client.agents.ListAgents(agent_service_pb2.ListAgentsRequest(), timeout=30)
                await call
                answered.append(int(dict(await call.initial_metadata())[WORKER_HEADER]))
        assert set(answered) == started, f"{len(answered)} clients, all on one worker"
        process.send_signal(signal.SIGTERM)
        async with asyncio.timeout(60):
            await process.stderr.read()
            assert await process.wait() == 0
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


@pytest.mark.slow  # a real supervisor and worker process
async def test_a_worker_that_cannot_start_stops_the_supervisor_with_its_one_line(
    tmp_path: Path,
) -> None:
    process = await spawn_serve(
        tmp_path,
        {"AGIO_DATABASE_URL": "postgresql+asyncpg://nobody:wrong@127.0.0.1:9/none"},
        arguments=["--workers", "2"],
    )
    assert process.stderr is not None
    async with asyncio.timeout(120):
        stderr = (await process.stderr.read()).decode()
        assert await process.wait() == 2
    said = [line for line in stderr.splitlines() if line.startswith("agio-grpc:")]
    assert len(said) == 1
    assert said[0].startswith("agio-grpc: cannot start: ")
    assert "AGIO_DATABASE_URL" in said[0]
    assert "listening" not in stderr


@pytest.mark.slow  # a real `agio-grpc serve` process
async def test_workers_refuse_a_port_in_use_before_spawning(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        process = await spawn_serve(
            tmp_path,
            {"AGIO_LISTEN_ADDRESS": f"127.0.0.1:{port}", "AGIO_SERVER__WORKERS": "2"},
        )
        assert process.stderr is not None
        async with asyncio.timeout(60):
            stderr = (await process.stderr.read()).decode()
            assert await process.wait() == 2
    assert stderr.splitlines() == [
        f"agio-grpc: cannot start: cannot listen on 127.0.0.1:{port}: the port is in use "
        "[AGIO_LISTEN_ADDRESS]: stop what uses that port or choose another one "
        "(port 0: any free port)"
    ]


FLAKY_WORKER = """
import socket, sys
from pathlib import Path

slot = sys.argv[sys.argv.index("--worker") + 1]
fd = int(sys.argv[sys.argv.index("--supervisor-fd") + 1])
starts = Path(sys.argv[1]) / f"starts-{slot}"
starts.write_text(starts.read_text() + "x" if starts.exists() else "x")
if len(starts.read_text()) == 1:
    socket.socket(fileno=fd).sendall(b"ready\\n")  # listens, then dies
    sys.exit(1)
sys.exit(2)  # every restart fails to start
"""


async def test_a_worker_that_keeps_failing_to_restart_stops_the_supervisor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agio_grpc.service import supervisor

    monkeypatch.setattr(supervisor, "FIRST_RESTART_DELAY_S", 0.01)
    settings = Settings(
        listen_address="127.0.0.1:0",
        openai_base_url="http://127.0.0.1:9/v1",
        server={"workers": 2},
    )
    command = [sys.executable, "-c", FLAKY_WORKER, str(tmp_path)]
    async with asyncio.timeout(60):
        assert await supervisor.Supervisor(settings, command).run() == 2
    starts = [(tmp_path / f"starts-{slot}").read_text() for slot in (1, 2)]
    # One start that listened and died at once (a failed start too), then restarts until
    # one slot failed five in a row.
    assert supervisor.MAX_FAILED_STARTS in {len(count) for count in starts}
    assert all(len(count) <= supervisor.MAX_FAILED_STARTS for count in starts)


CRASH_LOOPING_WORKER = """
import socket, sys
from pathlib import Path

slot = sys.argv[sys.argv.index("--worker") + 1]
fd = int(sys.argv[sys.argv.index("--supervisor-fd") + 1])
starts = Path(sys.argv[1]) / f"starts-{slot}"
starts.write_text(starts.read_text() + "x" if starts.exists() else "x")
socket.socket(fileno=fd).sendall(b"ready\\n")  # listens, then dies: every time
sys.exit(1)
"""


async def test_a_worker_that_dies_each_time_it_listens_backs_off_then_stops_the_supervisor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from agio_grpc.service import supervisor

    monkeypatch.setattr(supervisor, "FIRST_RESTART_DELAY_S", 0.05)
    settings = Settings(
        listen_address="127.0.0.1:0",
        openai_base_url="http://127.0.0.1:9/v1",
        server={"workers": 1},
    )
    command = [sys.executable, "-c", CRASH_LOOPING_WORKER, str(tmp_path)]
    with caplog.at_level(logging.WARNING, logger=supervisor.__name__):
        async with asyncio.timeout(60):
            assert await supervisor.Supervisor(settings, command).run() == 2
    assert len((tmp_path / "starts-1").read_text()) == supervisor.MAX_FAILED_STARTS
    delays = [
        float(found.group(1))
        for record in caplog.records
        if (found := re.search(r"restarting it in ([\d.]+)s", record.getMessage()))
    ]
    assert delays == [0.1, 0.2, 0.4, 0.8]  # backs off, never reset by a start that listened
    assert "failed to start 5 times in a row" in caplog.text
