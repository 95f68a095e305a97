"""`approvals list`, `approve RUN CALL [--reject --reason TEXT]` and `chat` stopping at a
call waiting for approval, for people and as JSON, against the real server."""

from __future__ import annotations

import json

from agio_grpc.client import AgioClient, RunResult
from agio_grpc.testing import FakeModelServer, ToolCallSpec, Turn
from tests.cli.conftest import Cli


async def waiting_for_approval(
    client: AgioClient, fake_model: FakeModelServer, call_id: str = "call_mail"
) -> RunResult:
    """A run whose `echo` call waits for a decision (`require_approval`)."""
    fake_model.enqueue(Turn.tool_calls([ToolCallSpec("echo", '{"text": "sent"}', id=call_id)]))
    return await client.run_to_end("Send it.", require_approval=["echo"])


async def test_approvals_list_shows_each_waiting_call_and_nothing_else(
    cli: Cli, client: AgioClient, fake_model: FakeModelServer
) -> None:
    waiting = await waiting_for_approval(client, fake_model)
    await client.run_to_end("hello")  # a run with nothing to decide

    result = await cli("approvals", "list")
    assert result.code == 0, result.err
    (line,) = result.out.splitlines()
    assert line.split()[:2] == [waiting.run.id, "call_mail"]
    assert 'echo({"text": "sent"})' in line

    as_json = json.loads((await cli("approvals", "list", "--json")).out)
    (run,) = as_json["runs"]
    assert run["id"] == waiting.run.id
    assert run["required_action"]["approvals"][0]["id"] == "call_mail"
    by_session = await cli("approvals", "list", "--session", waiting.session_id, "--json")
    assert [r["id"] for r in json.loads(by_session.out)["runs"]] == [waiting.run.id]


async def test_approve_runs_the_call_and_follows_the_run_to_its_end(
    cli: Cli, client: AgioClient, fake_model: FakeModelServer
) -> None:
    waiting = await waiting_for_approval(client, fake_model)
    fake_model.enqueue(Turn.text("Sent."))
    result = await cli("approve", waiting.run.id, "call_mail", "--reason", "ok by me")
    assert result.code == 0, result.err
    assert "<- echo: sent" in result.out
    assert "Sent." in result.out
    shown = await cli("steps", waiting.session_id)
    assert "[approved by none at " in shown.out  # no credential: the auth mode's name
    assert ": ok by me]" in shown.out
    assert (await cli("approvals", "list")).out == ""


async def test_reject_with_a_reason_the_model_then_sees(
    cli: Cli, client: AgioClient, fake_model: FakeModelServer
) -> None:
    waiting = await waiting_for_approval(client, fake_model)
    fake_model.enqueue(Turn.text("I did not send it."))
    result = await cli(
        "approve", waiting.run.id, "call_mail", "--reject", "--reason", "wrong person"
    )
    assert result.code == 0, result.err
    assert "I did not send it." in result.out
    seen = [m for m in fake_model.requests[-1]["messages"] if m["role"] == "tool"]
    assert "wrong person" in seen[0]["content"]


async def test_a_decision_on_an_unknown_call_is_one_line_and_exit_code_1(
    cli: Cli, client: AgioClient, fake_model: FakeModelServer
) -> None:
    waiting = await waiting_for_approval(client, fake_model)
    result = await cli("approve", waiting.run.id, "call_nope")
    assert result.code == 1
    assert result.err.startswith("agio-grpc: INVALID_ARGUMENT")
    assert "call_mail" in result.err  # the missing decision is named


async def test_chat_stopping_at_a_call_waiting_for_approval_says_how_to_decide(
    cli: Cli, fake_model: FakeModelServer
) -> None:
    fake_model.enqueue(Turn.tool_calls([ToolCallSpec("echo", '{"text": "x"}', id="call_x")]))
    result = await cli("chat", "Do it.", "--require-approval", "echo", stdin="never read\n")
    assert result.code == 0, result.err
    run_id = result.err.split()[3]  # "session S  run R  RUNNING"
    assert f"waits for a decision on echo: agio-grpc approve {run_id} call_x" in result.err
    fake_model.enqueue(Turn.text("Done."))
    decided = await cli("approve", run_id, "call_x")
    assert decided.code == 0, decided.err
    assert "Done." in decided.out
