"""`runs list|show|cancel|watch`, `watch` and `chat --background`, for people and as
JSON; an unknown run is one line and exit code 1."""

from __future__ import annotations

import json

import pytest

from agio_grpc.client import AgioClient, RunResult
from agio_grpc.testing import FakeModelServer, ToolCallSpec, Turn
from tests.cli.conftest import Cli

LOOKUP = {"name": "lookup", "description": "Look it up.", "parameters_json": '{"type": "object"}'}


async def waiting_run(client: AgioClient, fake_model: FakeModelServer) -> RunResult:
    """A run stopped REQUIRES_ACTION on a client tool call: it waits until answered."""
    fake_model.enqueue(Turn.tool_calls([ToolCallSpec("lookup", "{}", id="call_client")]))
    return await client.run_to_end("Where is it?", client_tools=[LOOKUP])


def header_ids(err: str) -> tuple[str, str]:
    """The session and run ids of a run's first line (`session S  run R  STATUS`)."""
    words = err.splitlines()[0].split()
    assert words[0::2][:2] == ["session", "run"], err
    return words[1], words[3]


async def test_runs_list_a_sessions_runs_or_the_newest_sessions_runs(
    cli: Cli, client: AgioClient
) -> None:
    first = await client.run_to_end("What is 12 * 7?")
    second = await client.run_to_end("And 2 * 3?", session_id=first.session_id)
    other = await client.run_to_end("hello")

    result = await cli("runs", "list", "--session", first.session_id)
    assert result.code == 0, result.err
    lines = result.out.splitlines()
    assert [line.split()[0] for line in lines] == [second.run.id, first.run.id]
    assert "COMPLETED" in lines[0]

    listing = ["runs", "list", "--session", first.session_id, "--json"]
    page = json.loads((await cli(*listing, "--limit", "1")).out)
    assert [run["id"] for run in page["runs"]] == [second.run.id]
    assert page["runs"][0]["status"] == "RUN_STATUS_COMPLETED"
    rest = await cli(*listing, "--page-token", page["next_page_token"])
    assert [run["id"] for run in json.loads(rest.out)["runs"]] == [first.run.id]

    everywhere = json.loads((await cli("runs", "list", "--json")).out)["runs"]
    assert {run["id"] for run in everywhere} == {first.run.id, second.run.id, other.run.id}
    assert len(json.loads((await cli("runs", "list", "--limit", "2", "--json")).out)["runs"]) == 2
    assert (await cli("runs", "list", "--page-token", "x")).code == 2  # only with --session


async def test_runs_list_is_newest_first_across_sessions(cli: Cli, client: AgioClient) -> None:
    older_session = await client.run_to_end("What is 1 + 1?")
    newer_session = await client.run_to_end("What is 2 + 2?")
    latest = await client.run_to_end("And 3 + 3?", session_id=older_session.session_id)

    result = await cli("runs", "list")
    assert result.code == 0, result.err
    listed = [line.split()[0] for line in result.out.splitlines()]
    assert listed == [latest.run.id, newer_session.run.id, older_session.run.id]
    newest_two = await cli("runs", "list", "--limit", "2", "--json")
    ids = [run["id"] for run in json.loads(newest_two.out)["runs"]]
    assert ids == [latest.run.id, newer_session.run.id]


async def test_runs_show_a_run_by_names(cli: Cli, client: AgioClient) -> None:
    done = await client.run_to_end("What is 12 * 7?")
    result = await cli("runs", "show", done.run.id)
    assert result.code == 0, result.err
    fields = dict(line.split(maxsplit=1) for line in result.out.splitlines())
    assert fields["run"] == done.run.id
    assert fields["status"] == "COMPLETED"
    assert fields["stop"].startswith("COMPLETED from ")
    assert fields["steps"].startswith("4 (#1..#4), tool calls 1")

    shown = json.loads((await cli("runs", "show", done.run.id, "--json")).out)["run"]
    assert shown["session_id"] == done.session_id
    assert shown["status"] == "RUN_STATUS_COMPLETED"
    assert shown["stop_signal"]["reason"] == "STOP_REASON_COMPLETED"


async def test_runs_cancel_a_waiting_run(
    cli: Cli, client: AgioClient, fake_model: FakeModelServer
) -> None:
    waiting = await waiting_run(client, fake_model)
    result = await cli("runs", "cancel", waiting.run.id, "--reason", "no answer")
    assert result.code == 0, result.err
    assert result.out == f"{waiting.run.id}  CANCELLED: no answer\n"

    again = json.loads((await cli("runs", "cancel", waiting.run.id, "--json")).out)["run"]
    assert again["status"] == "RUN_STATUS_CANCELLED"  # an ended run stays as it ended
    assert again["stop_signal"]["message"] == "no answer"


async def test_a_replay_of_an_ended_run_reads_like_the_live_run(cli: Cli) -> None:
    live = await cli("chat", "What is 12 * 7?")
    assert live.code == 0, live.err
    session_id, run_id = header_ids(live.err)

    for command in (["runs", "watch"], ["watch"]):
        replay = await cli(*command, run_id)
        assert replay.code == 0, replay.err
        assert replay.out == live.out  # the text too, though a replay has no deltas
        assert "The result is 84." in replay.out
        first, *_, last = replay.err.splitlines()
        assert first.startswith(f"session {session_id}  run {run_id}  COMPLETED (ended ")
        assert first.endswith("; replayed)")
        assert "RUNNING" not in replay.err
        assert last == live.err.splitlines()[-1]  # [COMPLETED] | tokens ... | steps 4


async def test_the_readme_flow_chat_in_the_background_then_watch_shows_the_answer(
    cli: Cli,
) -> None:
    started = await cli("chat", "What is 12 * 7?", "--background")
    assert started.code == 0, started.err
    run_id = started.last_line

    result = await cli("runs", "watch", run_id)
    assert result.code == 0, result.err
    assert result.out.splitlines() == [
        '  -> calculate({"expression": "12 * 7"})',
        "  <- calculate: 84",
        "The result is 84.",
    ]
    assert result.err.splitlines()[-1].startswith("[COMPLETED]")

    replayed = await cli("runs", "watch", run_id, "--json")
    events = [json.loads(line) for line in replayed.out.splitlines()]
    assert events[-1]["run_completed"]["run"]["status"] == "RUN_STATUS_COMPLETED"
    after = await cli("watch", run_id, "--after", str(events[-2]["seq"]), "--json")
    assert [json.loads(line)["seq"] for line in after.out.splitlines()] == [events[-1]["seq"]]


async def test_a_watch_after_the_terminal_event_ends_at_once_with_nothing_more(cli: Cli) -> None:
    started = await cli("chat", "What is 12 * 7?", "--background")
    run_id = started.last_line
    events = (await cli("watch", run_id, "--json")).out.splitlines()
    terminal_seq = json.loads(events[-1])["seq"]

    as_json = await cli("watch", run_id, "--after", str(terminal_seq), "--json")
    assert (as_json.code, as_json.out, as_json.err) == (0, "", "")
    for_people = await cli("watch", run_id, "--after", str(terminal_seq))
    assert (for_people.code, for_people.out) == (0, "")
    [line] = for_people.err.splitlines()
    assert "COMPLETED (ended " in line

    negative = await cli("watch", run_id, "--after", "-1")
    assert negative.code == 2
    assert "argument --after: must be at least 0, got -1" in negative.err


async def test_a_watched_run_that_waits_says_how_to_answer_each_call(
    cli: Cli, client: AgioClient, fake_model: FakeModelServer
) -> None:
    waiting = await waiting_run(client, fake_model)
    result = await cli("watch", waiting.run.id)
    assert result.code == 0, result.err
    assert "  -> lookup({})" in result.out
    assert result.err.splitlines()[-1] == (
        f"run {waiting.run.id} waits for its client tool outputs: "
        f"agio-grpc submit {waiting.run.id} call_client=OUTPUT"
    )


async def test_runs_show_lists_the_calls_a_waiting_run_waits_for(
    cli: Cli, client: AgioClient, fake_model: FakeModelServer
) -> None:
    waiting = await waiting_run(client, fake_model)
    result = await cli("runs", "show", waiting.run.id)
    assert result.code == 0, result.err
    lines = result.out.splitlines()
    assert "status   REQUIRES_ACTION" in lines
    assert "call     call_client  lookup({})" in lines
    assert f"answer   agio-grpc submit {waiting.run.id} call_client=OUTPUT" in lines


async def test_chat_in_the_background_as_json_is_the_started_run(cli: Cli) -> None:
    result = await cli("chat", "hello", "--background", "--json")
    assert result.code == 0, result.err
    run = json.loads(result.out)["run"]
    assert run["id"].startswith("run_")
    assert run["status"] in ("RUN_STATUS_RUNNING", "RUN_STATUS_COMPLETED")


@pytest.mark.parametrize(
    "command",
    [
        ["runs", "show"],
        ["runs", "cancel"],
        ["runs", "watch"],
        ["watch"],
        ["runs", "show", "--json"],
    ],
)
async def test_an_unknown_run_is_one_line_and_exit_code_1(cli: Cli, command: list[str]) -> None:
    result = await cli(*command, "run_missing")
    assert result.code == 1
    assert result.err.startswith("agio-grpc: NOT_FOUND [RUN_NOT_FOUND]: ")
    assert len(result.err.splitlines()) == 1
    assert "Traceback" not in result.err
    assert result.out == ""
