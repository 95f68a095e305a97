"""Ctrl-C, as a user presses it: a real `agio-grpc` process sent SIGINT. It says what became
of the run: `chat` cancelled it (a run stops when its caller leaves), `watch` left it
running."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

from google.protobuf import json_format

from agio_grpc.client import AgioClient
from agio_grpc.service.app import AgioApp
from agio_grpc.testing import FakeModelServer, Turn
from agio_grpc.v1 import resources_pb2

PATIENCE_S = 30
"""How long a stage may take before the test fails with the process's own stacks (well
inside pytest-timeout's 60 s, which would report only this process's)."""

AS_A_TERMINAL_STARTS_IT = (
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
    "os.execv(sys.executable, [sys.executable, '-m', 'agio_grpc.cli', *sys.argv[1:]])"
)
"""`python -m agio_grpc.cli ARGS` with SIGINT at its default, as a shell starts a foreground
command. An ignored SIGINT is inherited through fork and exec: from a suite launched as a
background job (`nohup make test &`), or anywhere else SIGINT is ignored, the process would
ignore Ctrl-C, as a background job should, and never end."""


async def interrupted(address: str, *args: str, until: str = "") -> tuple[str, int, str]:
    """Run `agio-grpc ARGS --address ADDRESS` (its stdin open, empty), wait for the first
    line on stderr (the run's `session S  run R  STATUS`) and the first with `until` in it,
    press Ctrl-C: that first line, the exit code and the rest of stderr."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("AGIO_")}
    env["PYTHONFAULTHANDLER"] = "1"  # SIGABRT prints every thread's stack
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        AS_A_TERMINAL_STARTS_IT,
        *args,
        "--address",
        address,
        env=env,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    assert process.stderr is not None
    stage, seen = "waiting for the first line", ""
    try:
        async with asyncio.timeout(PATIENCE_S):
            first = line = (await process.stderr.readline()).decode()
            seen = first
            stage = f"waiting for {until!r}"
            while until not in line:
                line = (await process.stderr.readline()).decode()
                assert line, f"stderr ended before {until!r}"
                seen += line
            stage = "waiting for the process to end after SIGINT"
            process.send_signal(signal.SIGINT)
            rest = seen[len(first) :] + (await process.stderr.read()).decode()
            code = await process.wait()
    except TimeoutError:
        process.send_signal(signal.SIGABRT)
        async with asyncio.timeout(10):
            dumped = (await process.stderr.read()).decode()
        raise AssertionError(
            f"agio-grpc {args[0]} stuck {stage} for {PATIENCE_S} s; its stderr:\n{seen}{dumped}"
        ) from None
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


async def test_ctrl_c_while_outputs_are_awaited_leaves_the_run_waiting_and_says_how_to_answer(
    app: AgioApp, client: AgioClient
) -> None:
    weather = str(Path(__file__).parents[2] / "examples" / "weather.json")
    first, code, rest = await interrupted(
        app.address, "chat", "--client-tool", weather, "Use the weather tool", until="[REQUIRES_"
    )
    run_id = first.split()[3]
    assert code == 130
    assert rest.splitlines()[-1].startswith("agio-grpc: interrupted")
    run = await client.get_run(run_id)
    assert run.status == resources_pb2.RUN_STATUS_REQUIRES_ACTION
    [call] = json_format.MessageToDict(run.stop_signal.context)["tool_calls"]
    assert rest.count(f"agio-grpc submit {run_id} {call['id']}=OUTPUT") == 1
