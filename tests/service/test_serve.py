"""`agio-grpc serve` as a user runs it: a real process, configured by environment only."""

from __future__ import annotations

import asyncio
import gc
import os
import re
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from agio_grpc.client import AgioClient, AgioError, open_channel
from agio_grpc.service.app import COLLECTOR_THRESHOLDS, tune_collector
from agio_grpc.testing import FakeModelServer, Turn

LISTENING = re.compile(r"agio-grpc listening on (\S+)")


async def read_until(stream: asyncio.StreamReader, pattern: re.Pattern[str]) -> tuple[str, str]:
    """Lines up to and including the first match; returns (all lines, match group 1)."""
    seen: list[str] = []
    async with asyncio.timeout(60):
        while True:
            line = (await stream.readline()).decode()
            if not line:
                raise AssertionError("the server exited early:\n" + "".join(seen))
            seen.append(line)
            found = pattern.search(line)
            if found:
                return "".join(seen), found.group(1)


async def spawn_serve(
    tmp_path: Path, settings: dict[str, str], arguments: Sequence[str] = ()
) -> asyncio.subprocess.Process:
    """`agio-grpc serve [arguments]` in `tmp_path` on 127.0.0.1:0, configured by `settings`
    (environment variables) over an environment cleared of AGIO_* and OPENAI_*; its stderr
    is piped."""
    env = {
        key: value for key, value in os.environ.items() if not key.startswith(("AGIO_", "OPENAI_"))
    }
    env |= {"AGIO_LISTEN_ADDRESS": "127.0.0.1:0"} | settings
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "agio_grpc.cli",
        "serve",
        *arguments,
        env=env,
        cwd=tmp_path,
        stderr=asyncio.subprocess.PIPE,
    )


@pytest.mark.slow  # a real `agio-grpc serve` process
async def test_serve_starts_answers_and_drains_on_sigterm(tmp_path: Path) -> None:
    process = await spawn_serve(
        tmp_path,
        {
            "AGIO_DATABASE_URL": f"sqlite+aiosqlite:///{tmp_path / 'agio.db'}",
            "AGIO_SERVER__GRACE_PERIOD_S": "2",
        },
    )
    assert process.stderr is not None
    try:
        log, address = await read_until(process.stderr, LISTENING)
        assert "built-in fake model" in log
        assert not address.endswith(":0")
        async with AgioClient(address) as client:
            assert await client.health() == "SERVING"
            assert await client.list_sessions() == []
            result = await client.run_to_end("What is 12 * 7?")
            assert "84" in result.text
            steps = await client.list_steps(result.session_id)
            assert [s.sequence for s in steps] == [1, 2, 3, 4]
        process.send_signal(signal.SIGTERM)
        async with asyncio.timeout(30):
            rest = (await process.stderr.read()).decode()
            assert await process.wait() == 0
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert (tmp_path / "agio.db").exists()
    # Model calls are not logged one line each at INFO (the HTTP client would).
    assert "HTTP Request" not in log + rest
    assert "stopped" in rest
    assert "OPENAI_API_KEY" not in log  # the built-in fake model needs no key


@pytest.mark.slow  # a real `agio-grpc serve` process
async def test_serve_warns_at_start_of_a_model_url_without_openai_api_key(tmp_path: Path) -> None:
    process = await spawn_serve(
        tmp_path,
        {
            "AGIO_DATABASE_URL": f"sqlite+aiosqlite:///{tmp_path / 'agio.db'}",
            "OPENAI_BASE_URL": "http://192.0.2.1:8000/v1",  # TEST-NET-1: never called here
        },
    )
    assert process.stderr is not None
    try:
        log, _ = await read_until(process.stderr, LISTENING)
        process.send_signal(signal.SIGTERM)
        async with asyncio.timeout(30):
            await process.wait()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    [warning] = [line for line in log.splitlines() if "OPENAI_API_KEY" in line]
    assert " WARNING " in warning
    assert warning.endswith(
        "OPENAI_BASE_URL is set (http://192.0.2.1:8000) but OPENAI_API_KEY is not: model calls "
        "carry the placeholder key `unused`, which a provider refuses (401 Incorrect API key); "
        "set OPENAI_API_KEY"
    )


@pytest.mark.slow  # a real `agio-grpc serve` process
async def test_serve_refuses_an_invalid_configuration(tmp_path: Path) -> None:
    env = dict(os.environ) | {"AGIO_LISTEN_ADDRESS": "nonsense"}
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "agio_grpc.cli",
        "serve",
        env=env,
        cwd=tmp_path,
        stderr=asyncio.subprocess.PIPE,
    )
    _, stderr = await process.communicate()
    assert process.returncode == 2
    assert stderr.decode().splitlines() == [
        "agio-grpc: invalid configuration: listen_address [AGIO_LISTEN_ADDRESS]: "
        "must be host:port with a port in 0..65535"
    ]


async def test_a_second_server_on_the_same_port_fails_to_bind(tmp_path: Path) -> None:
    from agio_grpc.service.app import AgioApp
    from agio_grpc.service.startup import StartupError
    from tests.service.conftest import make_settings

    first = await AgioApp.start(
        make_settings(f"sqlite+aiosqlite:///{tmp_path / 'a.db'}", "http://127.0.0.1:9/v1")
    )
    try:
        with pytest.raises(StartupError, match=r"cannot listen on .*: the port is in use"):
            await AgioApp.start(
                make_settings(
                    f"sqlite+aiosqlite:///{tmp_path / 'b.db'}",
                    "http://127.0.0.1:9/v1",
                    listen_address=first.address,
                )
            )
    finally:
        await first.stop(grace=0)


async def test_health_turns_not_serving_while_draining(tmp_path: Path) -> None:
    from agio_grpc.service.app import AgioApp
    from tests.service.conftest import make_settings

    app = await AgioApp.start(
        make_settings(f"sqlite+aiosqlite:///{tmp_path / 'a.db'}", "http://127.0.0.1:9/v1")
    )
    async with AgioClient(app.address) as client:
        await app.bound.health.enter_graceful_shutdown()
        assert await client.health() == "NOT_SERVING"
    await app.stop(grace=0)
    async with AgioClient(app.address) as client:
        with pytest.raises(AgioError) as caught:
            await client.health()
        assert caught.value.code == grpc.StatusCode.UNAVAILABLE


async def test_while_draining_only_an_open_health_watch_sees_not_serving(
    tmp_path: Path, fake_model: FakeModelServer
) -> None:
    """What docs/deploy.md says of SIGTERM: a new health Check is refused, not answered
    NOT_SERVING; a Watch opened before sees NOT_SERVING."""
    from agio_grpc.service.app import AgioApp
    from tests.service.conftest import make_settings

    settings = make_settings(f"sqlite+aiosqlite:///{tmp_path / 'a.db'}", fake_model.base_url)
    app = await AgioApp.start(settings)
    fake_model.enqueue(Turn.hanging())  # a run still going when the drain starts
    async with AgioClient(app.address) as client, open_channel(app.address) as channel:
        watch = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest())
        assert (await watch.read()).status == health_pb2.HealthCheckResponse.SERVING
        run = client.run("Take your time")
        assert (await anext(run)).WhichOneof("event") == "run_started"

        stopping = asyncio.create_task(app.stop(grace=1.0))
        assert (await watch.read()).status == health_pb2.HealthCheckResponse.NOT_SERVING
        # The run is interrupted within the grace period: by then the server refuses calls.
        ends = [event.WhichOneof("event") async for event in run]
        assert ends[-1] == "run_completed"
        with pytest.raises(AgioError) as refused:
            await client.health()
        assert refused.value.code == grpc.StatusCode.UNAVAILABLE
        async with AgioClient(app.address) as newcomer:
            with pytest.raises(AgioError) as refused:
                await newcomer.health()
            assert refused.value.code == grpc.StatusCode.UNAVAILABLE
        await stopping


def test_the_collector_is_tuned_as_serve_tunes_it_once_up() -> None:
    thresholds = gc.get_threshold()
    try:
        tune_collector()
        assert gc.get_freeze_count() > 0  # what was loaded is out of the collector's reach
        assert gc.get_threshold() == COLLECTOR_THRESHOLDS
    finally:
        gc.unfreeze()
        gc.set_threshold(*thresholds)
