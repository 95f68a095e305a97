"""`sessions list|show|delete`, `steps` and `fork`, for people and as JSON."""

from __future__ import annotations

import json

from agio_grpc.client import AgioClient
from tests.cli.conftest import Cli


async def new_session(client: AgioClient, text: str = "What is 12 * 7?") -> str:
    return (await client.run_to_end(text)).session_id


async def test_sessions_list_pages_with_limit_and_page_token(cli: Cli, client: AgioClient) -> None:
    made = {await new_session(client, f"hello {n}") for n in range(3)}

    everything = await cli("sessions", "list")
    assert everything.code == 0, everything.err
    assert {line.split()[0] for line in everything.out.splitlines()} == made
    assert "steps 2" in everything.out

    first = await cli("sessions", "list", "--limit", "2", "--json")
    page = json.loads(first.out)
    assert len(page["sessions"]) == 2
    assert page["next_page_token"]
    rest = await cli("sessions", "list", "--page-token", page["next_page_token"], "--json")
    last = json.loads(rest.out)
    assert last["next_page_token"] == ""
    assert {s["id"] for s in page["sessions"] + last["sessions"]} == made

    human = await cli("sessions", "list", "--limit", "1")
    assert human.err.startswith("more: --page-token ")
    assert (await cli("sessions", "list", "--limit", "0")).code == 2


async def test_sessions_show_prints_the_session_and_its_steps(cli: Cli, client: AgioClient) -> None:
    session_id = await new_session(client)
    result = await cli("sessions", "show", session_id)
    assert result.code == 0, result.err
    head, *steps = result.out.splitlines()
    assert head.startswith(f"session {session_id}  steps 4")
    assert steps[0].startswith("#1    user")
    assert "What is 12 * 7?" in steps[0]
    assert "-> calculate(" in steps[1]
    assert steps[2].startswith("#3    tool")

    as_json = json.loads((await cli("sessions", "show", session_id, "--json")).out)
    assert as_json["session"]["id"] == session_id
    assert as_json["session"]["step_count"] == 4
    roles = [step["role"] for step in as_json["steps"]]
    assert roles == ["ROLE_USER", "ROLE_ASSISTANT", "ROLE_TOOL", "ROLE_ASSISTANT"]


async def test_steps_prints_only_the_steps(cli: Cli, client: AgioClient) -> None:
    session_id = await new_session(client)
    result = await cli("steps", session_id)
    assert result.code == 0, result.err
    assert len(result.out.splitlines()) == 4
    as_json = json.loads((await cli("steps", session_id, "--json")).out)
    assert [step["sequence"] for step in as_json["steps"]] == [1, 2, 3, 4]


async def test_sessions_delete_says_what_went_and_the_session_is_gone(
    cli: Cli, client: AgioClient
) -> None:
    first, second = await new_session(client), await new_session(client)
    result = await cli("sessions", "delete", first)
    assert result.code == 0, result.err
    assert result.out == f"deleted session {first} (4 steps)\n"
    as_json = await cli("sessions", "delete", second, "--json")
    assert json.loads(as_json.out) == {"session_id": second, "deleted_steps": 4}

    gone = await cli("sessions", "show", first)
    assert gone.code == 1
    assert gone.err.startswith("agio-grpc: NOT_FOUND [SESSION_NOT_FOUND]: ")
    assert len(gone.err.splitlines()) == 1
    assert "Traceback" not in gone.err


async def test_fork_prints_the_new_session_last(cli: Cli, client: AgioClient) -> None:
    session_id = await new_session(client)
    result = await cli("fork", session_id, "--at", "3")  # the calculator's call, answered
    assert result.code == 0, result.err
    fork_id = result.last_line
    assert fork_id.startswith("sess_")
    assert fork_id != session_id
    assert f"forked {session_id} at #3: 3 steps" in result.err
    assert [step.sequence for step in await client.list_steps(fork_id)] == [1, 2, 3]

    split = await cli("fork", session_id, "--at", "2")  # the call, not its result
    assert split.code == 1
    assert split.err.startswith("agio-grpc: INVALID_ARGUMENT [INVALID_ARGUMENT]: ")
    assert "would leave the tool calls of step 2 without results" in split.err

    as_json = json.loads((await cli("fork", session_id, "--json")).out)["session"]
    assert (as_json["parent_session_id"], as_json["fork_sequence"]) == (session_id, 4)
    assert as_json["step_count"] == 4


async def test_fork_help_says_step_n_is_kept_and_it_is(cli: Cli, client: AgioClient) -> None:
    help_text = await cli("fork", "--help", address=False)
    assert "the new session holds steps #1..#N, step #N kept" in " ".join(help_text.out.split())

    session_id = await new_session(client)
    kept = (await client.list_steps(session_id))[:3]
    fork_id = (await cli("fork", session_id, "--at", "3")).last_line
    copied = await client.list_steps(fork_id)
    assert [(step.sequence, step.content) for step in copied] == [
        (step.sequence, step.content) for step in kept
    ]
    negative = await cli("fork", session_id, "--at", "-1")
    assert negative.code == 2
    assert "argument --at: must be at least 0, got -1" in negative.err


async def test_sessions_compact_summarizes_older_steps(cli: Cli, client: AgioClient) -> None:
    session_id = await new_session(client)
    await client.run_to_end("And 3 + 4?", session_id=session_id)
    result = await cli("sessions", "compact", session_id, "--keep", "2")
    assert result.code == 0, result.err
    assert result.out.startswith("summarized #1-#")
    shown = await cli("sessions", "show", session_id)
    assert "summary   (of #1-#" in shown.out

    as_json = json.loads((await cli("sessions", "compact", session_id, "--json")).out)
    assert "summary" not in as_json  # nothing older than the 20 steps kept by default
    assert int(as_json["tokens_before"]) == int(as_json["tokens_after"]) > 0

    refused = await cli("sessions", "compact", session_id, "--keep", "-1")
    assert refused.code == 1
    assert "INVALID_ARGUMENT" in refused.err
