"""Structured output over gRPC: `RunRequest.output_schema_json` and an agent's
`output_schema`, the answer as `Run.output`, bad schemas refused before a run starts
(INVALID_ARGUMENT with a field violation; at start-up, one line and exit 2)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import json_format
from pydantic import BaseModel, ValidationError

from agio_grpc.cli.serve import configuration_lines
from agio_grpc.client import AgioClient, AgioError, collect
from agio_grpc.config import AgentConfig, Settings
from agio_grpc.service.app import AgioApp
from agio_grpc.testing import FakeModelServer, ToolCallSpec, Turn
from agio_grpc.v1 import resources_pb2
from tests.service.conftest import make_settings
from tests.service.test_startup_errors import serve_output
from tests.sqlite import sqlite_at

PARIS = {"city": "Paris", "population": 2_100_000}
CITY_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "population": {"type": "integer"}},
    "required": ["city", "population"],
    "additionalProperties": False,
}


class City(BaseModel):
    city: str
    population: int


async def test_the_answer_is_the_run_output_in_the_stream_and_in_the_store(
    backend_client: AgioClient, fake_model: FakeModelServer
) -> None:
    fake_model.enqueue(Turn.json(PARIS))

    result = await backend_client.run_to_end("Which city?", output_schema=CITY_SCHEMA)

    assert result.stop_signal.reason == resources_pb2.STOP_REASON_COMPLETED
    assert result.output == PARIS
    assert json.loads(result.text) == PARIS, "the final step keeps the raw JSON"
    stored = await backend_client.get_run(result.run.id)
    assert stored.output == result.run.output
    assert fake_model.requests[0]["response_format"]["json_schema"]["schema"] == CITY_SCHEMA


async def test_a_pydantic_model_gives_an_instance_of_it(
    client: AgioClient, fake_model: FakeModelServer
) -> None:
    fake_model.enqueue(Turn.json(PARIS))

    result = await client.run_to_end("Which city?", output_schema=City)

    assert result.output == City(city="Paris", population=2_100_000)
    sent = fake_model.requests[0]["response_format"]["json_schema"]["schema"]
    assert sent == City.model_json_schema()


async def test_an_answer_that_stays_invalid_fails_the_run_output_invalid(
    backend_client: AgioClient, fake_model: FakeModelServer
) -> None:
    fake_model.enqueue(Turn.text("Paris"), Turn.text("Paris!"))

    result = await backend_client.run_to_end("Which city?", output_schema=CITY_SCHEMA)

    assert result.run.status == resources_pb2.RUN_STATUS_FAILED
    signal = result.stop_signal
    assert signal.reason == resources_pb2.STOP_REASON_OUTPUT_INVALID
    assert signal.retryable
    (error,) = json_format.MessageToDict(signal.context)["errors"]
    assert "not JSON" in error
    assert result.output is None
    assert not result.run.HasField("output")


HUGE = {"type": "object", "description": "x" * (64 * 1024)}


@pytest.mark.parametrize(
    ("schema_json", "problem"),
    [
        ("{not json", "is not valid JSON"),
        ("[1, 2]", "must be a JSON object"),
        ('{"type": "nonsense"}', "is not a valid JSON Schema"),
        ('{"$ref": "https://example.com/s.json"}', "only references within the schema"),
        ('{"$ref": "#/$defs/missing"}', "does not resolve"),
        ('{"type": "string", "pattern": "(a+)+$"}', "may backtrack catastrophically"),
        ('{"type": "string", "pattern": "(a)\\\\1"}', "backreferences are not allowed"),
        (json.dumps(HUGE), "must be at most 65536 bytes"),
        ("[" * 40 + "]" * 40, "must not nest more than 32 levels"),
    ],
    ids=[
        "not-json",
        "not-object",
        "bad-type",
        "remote-ref",
        "dangling-ref",
        "redos",
        "backref",
        "too-large",
        "too-deep",
    ],
)
async def test_a_bad_schema_is_refused_before_the_run_starts(
    client: AgioClient, fake_model: FakeModelServer, schema_json: str, problem: str
) -> None:
    with pytest.raises(AgioError) as refused:
        await client.run_to_end("Which city?", output_schema=schema_json)

    assert refused.value.code is grpc.StatusCode.INVALID_ARGUMENT
    ((field, description),) = refused.value.field_violations
    assert field == "output_schema_json"
    assert problem in description
    assert fake_model.requests == [], "no run started"
    assert await client.list_sessions() == []


async def test_an_agent_schema_from_a_file_applies_to_its_runs(
    tmp_path: Path, fake_model: FakeModelServer
) -> None:
    schema_file = tmp_path / "city.json"
    schema_file.write_text(json.dumps(CITY_SCHEMA))
    agent = AgentConfig(name="cities", tools=[], output_schema=schema_file, output_mode="tool")
    settings = make_settings(
        sqlite_at(tmp_path / "agio.db"),
        fake_model.base_url,
        agents=[agent],
        default_agent="cities",
    )
    fake_model.enqueue(Turn.tool_calls([ToolCallSpec("final_output", json.dumps(PARIS))]))
    app = await AgioApp.start(settings)
    try:
        async with AgioClient(app.address) as client:
            result = await client.run_to_end("Which city?")
    finally:
        await app.stop(grace=0)

    assert result.output == PARIS
    (tool,) = fake_model.requests[0]["tools"]
    assert tool["function"]["parameters"] == CITY_SCHEMA


def test_a_bad_agent_schema_is_one_configuration_line() -> None:
    with pytest.raises(ValidationError) as invalid:
        Settings(agents=[{"name": "cities", "output_schema": {"type": "nonsense"}}])

    (line,) = configuration_lines(invalid.value)
    assert "agents.0.output_schema" in line
    assert "is not a valid JSON Schema" in line


@pytest.mark.slow  # a real `agio-grpc serve` process
async def test_serve_with_a_bad_agent_schema_exits_2_with_one_line(tmp_path: Path) -> None:
    config = tmp_path / "agio.yaml"
    config.write_text(
        "default_agent: cities\nagents:\n  - name: cities\n    output_schema: missing.json\n"
    )

    code, stderr = await serve_output(tmp_path, {"AGIO_CONFIG": str(config)})

    assert code == 2
    (line,) = stderr.splitlines()
    assert "output_schema" in line
    assert "cannot read missing.json" in line


async def test_fork_compaction_and_retry_keep_working_on_a_session_of_structured_runs(
    backend_client: AgioClient, fake_model: FakeModelServer
) -> None:
    client = backend_client
    fake_model.enqueue(Turn.json(PARIS), Turn.json({"city": "Lyon", "population": 500_000}))
    first = await client.run_to_end("Which city?", output_schema=CITY_SCHEMA)
    await client.run_to_end(
        "And the second?", session_id=first.session_id, output_schema=CITY_SCHEMA
    )

    compacted = await client.compact_session(first.session_id, keep_recent_steps=2)
    summary_request = fake_model.requests[-1]
    assert compacted.summary.content.startswith("Summary:")
    assert "response_format" not in summary_request, "a summary is text, whatever the runs"

    fork = await client.fork_session(first.session_id)
    fake_model.enqueue(Turn.json({"city": "Nice", "population": 340_000}))
    forked = await client.run_to_end(
        "And the third?", session_id=fork.id, output_schema=CITY_SCHEMA
    )
    assert forked.output == {"city": "Nice", "population": 340_000}

    fake_model.enqueue(Turn.json({"city": "Lille", "population": 230_000}))
    last_answer = forked.steps[-1].sequence
    retried = await collect(client.retry(fork.id, last_answer))
    assert retried.output == {"city": "Lille", "population": 230_000}, "the same schema"
    assert fake_model.requests[-1]["response_format"]["json_schema"]["schema"] == CITY_SCHEMA
