"""`chat`, `retry`, `submit` and `agents`: streamed runs for people and as JSON Lines, client
tools answered on stdin, and the usage errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agio_grpc.client import AgioClient
from agio_grpc.service.app import AgioApp
from agio_grpc.testing import FakeModelServer, ToolCallSpec, Turn
from tests.cli.conftest import Cli

WEATHER = {
    "name": "weather",
    "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}


ROLES = ["ROLE_USER", "ROLE_ASSISTANT", "ROLE_TOOL", "ROLE_ASSISTANT"]


def json_lines(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines()]


@pytest.fixture
def weather_file(tmp_path: Path) -> str:
    path = tmp_path / "weather.json"
    path.write_text(json.dumps(WEATHER))
    return str(path)


def ask_weather(fake_model: FakeModelServer, *cities: str) -> None:
    """The model's next turn calls the client tool `weather` once per city."""
    calls = [
        ToolCallSpec("weather", json.dumps({"city": city}), id=f"call_{city.lower()}")
        for city in cities
    ]
    fake_model.enqueue(Turn.tool_calls(calls))


async def test_chat_streams_text_tool_calls_and_the_stop_reason_by_name(cli: Cli) -> None:
    result = await cli("chat", "What is 12 * 7?")
    assert result.code == 0, result.err
    assert "-> calculate(" in result.out
    assert "<- calculate: 84" in result.out
    assert "The result is 84." in result.out
    assert "[COMPLETED]" in result.err
    assert "RUNNING" in result.err  # the run's status by name, as it started


async def test_chat_json_is_one_step_event_a_line_with_enum_names(cli: Cli) -> None:
    result = await cli("chat", "What is 12 * 7?", "--json")
    assert result.code == 0, result.err
    events = json_lines(result.out)
    assert "run_started" in events[0]
    assert [event["seq"] for event in events] == list(range(1, len(events) + 1))
    steps = [event["step_completed"]["step"] for event in events if "step_completed" in event]
    assert [step["role"] for step in steps] == ROLES
    run = events[-1]["run_completed"]["run"]
    assert run["status"] == "RUN_STATUS_COMPLETED"
    assert run["stop_signal"]["reason"] == "STOP_REASON_COMPLETED"
    assert result.err == ""


async def test_chat_answers_client_tool_calls_from_stdin_in_order_until_the_run_ends(
    cli: Cli, fake_model: FakeModelServer, weather_file: str
) -> None:
    ask_weather(fake_model, "Paris", "Oslo")
    result = await cli(
        "chat", "Weather in Paris and Oslo?", "--client-tool", weather_file, stdin="sunny\nsnow\n"
    )
    assert result.code == 0, result.err
    assert '-> weather({"city": "Paris"})' in result.out
    assert "<- weather: sunny" in result.out
    assert "<- weather: snow" in result.out
    assert "The result is sunny, snow." in result.out
    assert "[REQUIRES_ACTION]" in result.err
    assert result.err.splitlines()[-1].startswith("[COMPLETED]")  # the continued run's end
    offered = [tool["function"]["name"] for tool in fake_model.requests[0]["tools"]]
    assert "weather" in offered


async def test_the_readme_client_tool_example_runs_on_the_built_in_fake_model(cli: Cli) -> None:
    weather = str(Path(__file__).parents[2] / "examples" / "weather.json")
    result = await cli("chat", "--client-tool", weather, "Use the weather tool", stdin="sunny\n")
    assert result.code == 0, result.err
    assert result.out.splitlines() == [
        "  -> weather({})",
        "  <- weather: sunny",
        "The result is sunny.",
    ]


async def test_on_a_terminal_each_client_tool_call_is_shown_and_prompted_for(
    cli: Cli, fake_model: FakeModelServer, weather_file: str
) -> None:
    ask_weather(fake_model, "Paris")
    result = await cli(
        "chat", "Weather?", "--client-tool", weather_file, stdin="sunny\n", terminal=True
    )
    assert result.code == 0, result.err
    assert '  ? weather({"city": "Paris"})  [call_paris]\n  output> ' in result.err
    assert "The result is sunny." in result.out


async def test_chat_json_leaves_the_run_waiting_when_stdin_ends_then_submit_answers_it(
    cli: Cli, fake_model: FakeModelServer, weather_file: str, tmp_path: Path
) -> None:
    ask_weather(fake_model, "Paris")
    waiting = await cli("chat", "Weather in Paris?", "--client-tool", weather_file, "--json")
    assert waiting.code == 0, waiting.err
    run = json_lines(waiting.out)[-1]["run_completed"]["run"]
    assert run["status"] == "RUN_STATUS_REQUIRES_ACTION"
    assert run["stop_signal"]["context"]["tool_calls"][0]["id"] == "call_paris"
    assert waiting.err.splitlines()[-1] == (
        f"run {run['id']} waits for its client tool outputs: "
        f"agio-grpc submit {run['id']} call_paris=OUTPUT"
    )

    answer = tmp_path / "answer.txt"
    answer.write_text("rain")
    submitted = await cli("submit", run["id"], "call_paris=@" + str(answer), "--json")
    assert submitted.code == 0, submitted.err
    events = json_lines(submitted.out)
    assert events[0]["run_id"] == run["id"]
    assert events[0]["seq"] > 1  # the same run, counting on
    tool = next(e["step_completed"]["step"] for e in events if "step_completed" in e)
    assert (tool["role"], tool["content"]) == ("ROLE_TOOL", "rain")
    assert events[-1]["run_completed"]["run"]["status"] == "RUN_STATUS_COMPLETED"


async def test_submit_streams_the_continued_run_for_people(
    cli: Cli, fake_model: FakeModelServer, weather_file: str
) -> None:
    ask_weather(fake_model, "Oslo")
    waiting = await cli("chat", "Weather in Oslo?", "--client-tool", weather_file, "--json")
    run_id = json_lines(waiting.out)[-1]["run_id"]
    result = await cli("submit", run_id, "call_oslo=snow, -3 C")
    assert result.code == 0, result.err
    assert "<- weather: snow, -3 C" in result.out
    assert "The result is snow, -3 C." in result.out
    assert "[COMPLETED]" in result.err


async def test_submit_needs_call_id_equals_output_and_a_known_run(cli: Cli) -> None:
    bad = await cli("submit", "run_x", "call_1")
    assert bad.code == 2
    assert "expected CALL_ID=OUTPUT" in bad.err
    missing_file = await cli("submit", "run_x", "call_1=@/nonexistent/answer.txt")
    assert missing_file.code == 2
    assert "cannot read /nonexistent/answer.txt" in missing_file.err

    unknown = await cli("submit", "run_missing", "call_1=x")
    assert unknown.code == 1
    assert unknown.err.startswith("agio-grpc: NOT_FOUND [RUN_NOT_FOUND]: ")
    assert len(unknown.err.splitlines()) == 1
    assert unknown.out == ""


@pytest.mark.parametrize(
    ("content", "complaint"),
    [
        ("{not json", "is not JSON"),
        ('{"description": "no name"}', "`name` must be a non-empty string"),
        ('{"name": "t", "schema": {}}', "unknown fields ['schema']"),
        ('{"name": "t", "parameters": []}', "must be a JSON object"),
    ],
)
async def test_a_bad_client_tool_file_is_a_usage_error(
    cli: Cli, tmp_path: Path, content: str, complaint: str
) -> None:
    path = tmp_path / "tool.json"
    path.write_text(content)
    result = await cli("chat", "hi", "--client-tool", str(path))
    assert result.code == 2
    assert f"argument --client-tool: {path}" in result.err
    assert complaint in result.err
    assert "Traceback" not in result.err


async def test_retry_regenerates_from_a_step_and_streams_like_chat(cli: Cli) -> None:
    chat = await cli("chat", "What is 12 * 7?")
    session_id = chat.err.split("session ", 1)[1].split()[0]

    result = await cli("retry", session_id, "--from", "4")
    assert result.code == 0, result.err
    assert result.out.strip() == "The result is 84."
    assert "[COMPLETED]" in result.err

    as_json = await cli("retry", session_id, "--from", "2", "--json")
    assert as_json.code == 0, as_json.err
    events = json_lines(as_json.out)
    steps = [e["step_completed"]["step"] for e in events if "step_completed" in e]
    assert [step["sequence"] for step in steps] == [2, 3, 4]
    assert events[-1]["run_completed"]["run"]["stop_signal"]["reason"] == "STOP_REASON_COMPLETED"

    assert (await cli("retry", session_id)).code == 2  # --from is required


@pytest.mark.parametrize(
    ("sequence", "complaint"),
    [
        ("1", "argument --from: must be at least 2 (step #1, the first message, stays"),
        ("0", "argument --from: must be at least 2"),
        ("six", "argument --from: must be an integer, got 'six'"),
        (
            "6",
            "retry: --from 6 is past the end of session {session}: it has 4 steps, so "
            "--from is 2..5 (5: regenerate after the last step)",
        ),
    ],
)
async def test_retry_from_outside_2_to_the_last_step_plus_1_is_a_usage_error(
    cli: Cli, client: AgioClient, sequence: str, complaint: str
) -> None:
    done = await client.run_to_end("What is 12 * 7?")
    result = await cli("retry", done.session_id, "--from", sequence)
    assert result.code == 2
    assert complaint.format(session=done.session_id) in result.err
    assert result.out == ""
    steps = await client.list_steps(done.session_id)
    assert [step.sequence for step in steps] == [1, 2, 3, 4]  # nothing was retried


async def test_retry_from_one_past_the_last_step_regenerates_after_it(
    cli: Cli, client: AgioClient, fake_model: FakeModelServer
) -> None:
    fake_model.enqueue(Turn.error(400))  # a refusal, not retried: the user step stays alone
    failed = await client.run_to_end("What is 12 * 7?")
    assert len(await client.list_steps(failed.session_id)) == 1

    result = await cli("retry", failed.session_id, "--from", "2")
    assert result.code == 0, result.err
    assert "The result is 84." in result.out


async def test_agents_for_people_and_as_json(cli: Cli) -> None:
    result = await cli("agents", "-v")
    assert result.code == 0, result.err
    assert result.out.startswith("assistant  model=fake-model  tools: current_time, calculate")
    assert "    calculate: Evaluate an arithmetic expression" in result.out

    as_json = await cli("agents", "--json")
    agents = json.loads(as_json.out)["agents"]
    assert agents[0]["name"] == "assistant"
    calculate = next(tool for tool in agents[0]["tools"] if tool["name"] == "calculate")
    assert json.loads(calculate["parameters_json"])["required"] == ["expression"]


async def test_the_address_comes_from_agio_address(
    cli: Cli, app: AgioApp, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGIO_ADDRESS", app.address)
    result = await cli("agents", address=False)
    assert result.code == 0, result.err
    assert result.out.startswith("assistant")


CITY_SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "population": {"type": "integer"}},
    "required": ["city", "population"],
}


@pytest.fixture
def city_schema_file(tmp_path: Path) -> str:
    path = tmp_path / "city.json"
    path.write_text(json.dumps(CITY_SCHEMA))
    return str(path)


async def test_chat_with_an_output_schema_prints_only_the_answer_as_json(
    cli: Cli, fake_model: FakeModelServer, city_schema_file: str
) -> None:
    fake_model.enqueue(Turn.json({"city": "Paris", "population": 2100000}))

    result = await cli("chat", "Which city?", "--output-schema", city_schema_file)

    assert result.code == 0, result.err
    assert json.loads(result.out) == {"city": "Paris", "population": 2100000}
    assert "[COMPLETED]" in result.err
    sent = fake_model.requests[0]["response_format"]["json_schema"]["schema"]
    assert sent == CITY_SCHEMA


async def test_chat_json_with_an_output_schema_prints_the_whole_run(
    cli: Cli, fake_model: FakeModelServer, city_schema_file: str
) -> None:
    fake_model.enqueue(Turn.json({"city": "Paris", "population": 2100000}))

    result = await cli("chat", "Which city?", "--output-schema", city_schema_file, "--json")

    assert result.code == 0, result.err
    run = json.loads(result.out)
    assert run["output"] == {"city": "Paris", "population": 2100000}
    assert run["stop_signal"]["reason"] == "STOP_REASON_COMPLETED"


async def test_chat_whose_answer_stays_invalid_exits_1_and_prints_nothing(
    cli: Cli, fake_model: FakeModelServer, city_schema_file: str
) -> None:
    fake_model.enqueue(Turn.text("Paris"), Turn.text("Paris!"))

    result = await cli("chat", "Which city?", "--output-schema", city_schema_file)

    assert result.code == 1
    assert result.out == ""
    assert "[OUTPUT_INVALID]" in result.err


async def test_chat_with_an_output_schema_that_is_not_json_is_a_usage_error(
    cli: Cli, tmp_path: Path
) -> None:
    path = tmp_path / "broken.json"
    path.write_text("{")

    result = await cli("chat", "Which city?", "--output-schema", str(path))

    assert result.code == 2
    assert "is not JSON" in result.err
