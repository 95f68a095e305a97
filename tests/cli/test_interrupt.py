"""Ctrl-C, as a user presses it: a real `agio-grpc` process sent SIGINT. It says what became
of the run: `chat` cancelled it (a run stops when its caller leaves), `watch` left it
running."""

from __future__ import annotations

import asyncio
import os
import signal
import sys

from agio_grpc.client import AgioClient
from agio_grpc.service.app import AgioApp
from agio_grpc.testing import FakeModelServer, Turn
from agio_grpc.v1 import resources_pb2


async def interrupted(address: str, *args: str) -> tuple[str, int, str]:
    """Run `agio-grpc ARGS --address ADDRESS`, wait for its first line on stderr (the run's
    `session S  run R  STATUS`), press Ctrl-C: that first line, the exit code and the rest
    of stderr."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("AGIO_")}
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "agio_grpc.cli",
        *args,
        "--address",
        address,
        env=env,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    assert process.stderr is not None
    try:
        async with asyncio.timeout(60):
            first = (await process.stderr.readline()).decode()
            process.send_signal(signal.SIGINT)
            rest = (await process.stderr.read()).decode()
            code = await process.wait()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    return first, code, rest


async def end_of(client: AgioClient, run_id: str) -> resources_pb2.Run:
    """The run as its terminal event has it, once it has ended."""
    async with asyncio.timeout(30):
        async for event in client.follow_run(run_id):
            kind = event.WhichOneof("event")
            if kind in ("run_completed", "run_failed"):
                run: resources_pb2.Run = getattr(event, kind).run
                return run
    raise AssertionError(f"run {run_id} never ended")


async def test_ctrl_c_in_chat_cancels_the_run_and_says_so(
    app: AgioApp, client: AgioClient, fake_model: FakeModelServer
) -> None:
    fake_model.enqueue(Turn.hanging())
    first, code, rest = await interrupted(app.address, "chat", "Take your time")
    run_id = first.split()[3]
    assert first.rstrip().endswith("RUNNING")
    assert code == 130
    assert rest.splitlines() == [
        f"agio-grpc: interrupted: run {run_id} is cancelled (a run stops when its caller "
        "leaves; `chat --background` starts one that goes on without it)"
    ]
    ended = await end_of(client, run_id)
    assert ended.status == resources_pb2.RUN_STATUS_CANCELLED


async def test_ctrl_c_in_watch_leaves_the_run_running_and_says_so(
    app: AgioApp, client: AgioClient, fake_model: FakeModelServer
) -> None:
    fake_model.enqueue(Turn.hanging())
    running = await client.start_run("Take your time")
    try:
        first, code, rest = await interrupted(app.address, "watch", running.id)
        assert first.split()[3] == running.id
        assert code == 130
        assert rest.splitlines()[-1] == (
            f"agio-grpc: stopped watching run {running.id}, which goes on "
            f"(`agio-grpc runs cancel {running.id}` stops it)"
        )
        assert (await client.get_run(running.id)).status == resources_pb2.RUN_STATUS_RUNNING
    finally:
        await client.cancel_run(running.id)
