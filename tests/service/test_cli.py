"""The terminal commands against a live server: `chat`, `steps` and `agents`."""

from __future__ import annotations

import asyncio
import sys

from agio_grpc.service.app import AgioApp


async def run_cli(*args: str) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "agio_grpc.cli",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    stdout, stderr = await process.communicate()
    assert process.returncode is not None
    return process.returncode, stdout.decode(), stderr.decode()


async def test_chat_streams_a_run_with_its_tool_call_and_stop_reason(app: AgioApp) -> None:
    # The fake model's default responder calls `calculate` for arithmetic, then answers.
    code, out, err = await run_cli("chat", "What is 12 * 7?", "--address", app.address)
    assert code == 0, err
    assert "-> calculate(" in out
    assert "<- calculate: 84" in out
    assert "The result is 84." in out
    assert "[COMPLETED]" in err
    session_id = err.split("session ", 1)[1].split()[0]

    code, out, err = await run_cli("steps", session_id, "--address", app.address)
    assert code == 0, err
    lines = out.splitlines()
    assert len(lines) == 4
    assert lines[0].startswith("#1")
    assert "What is 12 * 7?" in lines[0]
    assert "calculate" in lines[2]
    assert "84" in lines[2]


async def test_agents_lists_tools_and_unknown_sessions_fail_cleanly(app: AgioApp) -> None:
    code, out, _ = await run_cli("agents", "--address", app.address)
    assert code == 0
    assert out.startswith("assistant  model=fake-model")
    code, out, err = await run_cli("steps", "sess_missing", "--address", app.address)
    assert code == 1
    assert "NOT_FOUND [SESSION_NOT_FOUND]" in err
    assert "Traceback" not in err


async def test_chat_in_the_background_then_watch_it_and_queue_behind_it(app: AgioApp) -> None:
    code, out, err = await run_cli(
        "chat", "What is 12 * 7?", "--background", "--address", app.address
    )
    assert code == 0, err
    run_id = out.splitlines()[-1]
    assert run_id.startswith("run_")
    session_id = err.split("session ", 1)[1].split()[0]

    code, out, err = await run_cli("watch", run_id, "--address", app.address)
    assert code == 0, err
    assert "<- calculate: 84" in out  # replayed (or followed live) to its end
    assert "[COMPLETED]" in err
    code, out, err = await run_cli("watch", run_id, "--after", "1000000", "--address", app.address)
    assert code == 0, err
    assert out == ""

    code, _, err = await run_cli(
        "chat", "And 2 * 3?", "--session", session_id, "--on-busy", "enqueue",
        "--address", app.address,
    )  # fmt: skip
    assert code == 0, err
    assert "[COMPLETED]" in err
    code, _, err = await run_cli("chat", "x", "--on-busy", "sometimes", "--address", app.address)
    assert code == 2
    assert "invalid choice" in err
