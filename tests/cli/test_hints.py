"""What the CLI says when the server refuses a call: the status and reason, then the way out
in the CLI's own options and commands, never the protocol's (`authorization` metadata, RPC
names)."""

from __future__ import annotations

from pathlib import Path

import pytest

from agio_grpc.client import AgioClient
from agio_grpc.testing import FakeModelServer, Turn
from tests.cli.conftest import Cli
from tests.cli.test_runs import waiting_run
from tests.service.auth_helpers import auth_settings, serving


async def test_a_missing_credential_names_the_token_option_not_the_metadata(
    tmp_path: Path,
    fake_model: FakeModelServer,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("AGIO_TOKEN", raising=False)
    store_url = f"sqlite+aiosqlite:///{tmp_path / 'agio.db'}"
    settings = auth_settings(store_url, fake_model.base_url, auth={"mode": "api_key"})
    async with serving(settings) as app:
        cli = Cli(app.address, capsys, monkeypatch)
        missing = await cli("agents")
        wrong = await cli("agents", "--token", "agio_000000000000_nonsense")
    assert missing.code == 1
    assert missing.err == (
        "agio-grpc: UNAUTHENTICATED [CREDENTIALS_MISSING]: the server wants a credential: "
        "give it with --token or AGIO_TOKEN (an API key: `agio-grpc keys create`)\n"
    )
    assert wrong.code == 1
    [line] = wrong.err.splitlines()
    assert line.startswith("agio-grpc: UNAUTHENTICATED [CREDENTIALS_INVALID]: ")
    assert line.endswith("(the credential of --token or AGIO_TOKEN)")
    assert "nonsense" not in line


async def test_a_session_waiting_for_client_tools_says_which_commands_answer_it(
    cli: Cli, client: AgioClient, fake_model: FakeModelServer
) -> None:
    waiting = await waiting_run(client, fake_model)
    result = await cli("chat", "Something else", "--session", waiting.session_id)
    assert result.code == 1
    [line] = result.err.splitlines()
    run_id = waiting.run.id
    assert line == (
        "agio-grpc: FAILED_PRECONDITION [RUN_REQUIRES_ACTION]: the session's run "
        f"{run_id} waits for its client tool outputs: answer them (`agio-grpc runs show "
        f"{run_id}` lists the calls, `agio-grpc submit {run_id} CALL_ID=OUTPUT...`) or "
        f"cancel it (`agio-grpc runs cancel {run_id}`)"
    )
    assert "SubmitToolOutputs" not in line


async def test_a_busy_session_points_at_on_busy(
    cli: Cli, client: AgioClient, fake_model: FakeModelServer
) -> None:
    fake_model.enqueue(Turn.hanging())
    running = await client.start_run("Take your time")
    try:
        result = await cli("chat", "Me too", "--session", running.session_id)
    finally:
        await client.cancel_run(running.id)
    assert result.code == 1
    [line] = result.err.splitlines()
    assert line.startswith("agio-grpc: FAILED_PRECONDITION [SESSION_BUSY]: ")
    assert line.endswith("(`chat --on-busy enqueue` queues behind it)")
