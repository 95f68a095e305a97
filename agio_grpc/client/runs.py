"""What the client sends to start a run and what it gives back at the end: the request
(with client tools, an output schema), `RunResult`, `collect`, a run's parsed output."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf import json_format
from pydantic import BaseModel

from agio_grpc.client.errors import AgioError
from agio_grpc.v1 import (
    agent_service_pb2,
    events_pb2,
    resources_pb2,
)


@dataclass(slots=True)
class RunResult:
    """What a whole run produced, collected by `AgioClient.run_to_end`."""

    run: resources_pb2.Run
    text: str
    steps: list[resources_pb2.Step]
    events: int
    output: Any = None
    """A run with an output schema that completed: its answer (`Run.output`) as Python
    values (JSON numbers without a fraction as `int`), or an instance of the pydantic model
    given as `output_schema`; None otherwise."""

    @property
    def stop_signal(self) -> resources_pb2.StopSignal:
        return self.run.stop_signal

    @property
    def session_id(self) -> str:
        return self.run.session_id


def tool_definitions(
    tools: Iterable[resources_pb2.ToolDefinition | Mapping[str, str]],
) -> list[resources_pb2.ToolDefinition]:
    return [
        tool
        if isinstance(tool, resources_pb2.ToolDefinition)
        else resources_pb2.ToolDefinition(
            name=tool["name"],
            description=tool.get("description", ""),
            parameters_json=tool.get("parameters_json", ""),
        )
        for tool in tools
    ]


OutputSchema = Mapping[str, Any] | str | type[BaseModel]
"""A run's output schema: a JSON Schema (a mapping, or JSON text) or a pydantic model class
(its `model_json_schema()`)."""


def output_schema_json(schema: OutputSchema | None) -> str:
    """`RunRequest.output_schema_json` for `schema` ("" for none)."""
    if schema is None:
        return ""
    if isinstance(schema, str):
        return schema
    if isinstance(schema, type):
        return json.dumps(schema.model_json_schema())
    return json.dumps(dict(schema))


def output_value(run: resources_pb2.Run) -> Any:
    """The run's output as Python values (None when it has none); a JSON number without a
    fraction is an `int`, as it was in the answer (`google.protobuf.Value` holds doubles)."""
    if not run.HasField("output"):
        return None
    return _whole_numbers(json_format.MessageToDict(run.output))


_EXACT_INTEGERS = 2**53


def _whole_numbers(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer() and abs(value) <= _EXACT_INTEGERS:
        return int(value)
    if isinstance(value, dict):
        return {key: _whole_numbers(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_whole_numbers(item) for item in value]
    return value


def run_request(
    input: str,
    *,
    session_id: str,
    agent: str,
    overrides: agent_service_pb2.RunOverrides | None,
    client_tools: Iterable[resources_pb2.ToolDefinition | Mapping[str, str]],
    request_id: str,
    metadata: Mapping[str, str] | None,
    on_busy: agent_service_pb2.BusyPolicy,
    on_disconnect: agent_service_pb2.DisconnectPolicy = (
        agent_service_pb2.DISCONNECT_POLICY_UNSPECIFIED
    ),
    output_schema: OutputSchema | None = None,
    require_approval: Iterable[str] = (),
) -> agent_service_pb2.RunRequest:
    return agent_service_pb2.RunRequest(
        session_id=session_id,
        agent=agent,
        input=input,
        overrides=overrides,
        client_tools=tool_definitions(client_tools),
        request_id=request_id,
        metadata=dict(metadata or {}),
        on_busy=on_busy,
        on_disconnect=on_disconnect,
        output_schema_json=output_schema_json(output_schema),
        require_approval=list(require_approval),
    )


async def collect(events: AsyncIterator[events_pb2.StepEvent]) -> RunResult:
    """Drain a run stream into a RunResult; raises if the stream ends without a terminal event."""
    steps: list[resources_pb2.Step] = []
    count = 0
    async for event in events:
        count += 1
        kind = event.WhichOneof("event")
        if kind == "step_completed":
            steps.append(event.step_completed.step)
        elif kind in ("run_completed", "run_failed"):
            run = getattr(event, kind).run
            text = next(
                (
                    s.content
                    for s in reversed(steps)
                    if s.role == resources_pb2.ROLE_ASSISTANT and s.content
                ),
                "",
            )
            return RunResult(
                run=run, text=text, steps=steps, events=count, output=output_value(run)
            )
    raise AgioError(grpc.StatusCode.UNKNOWN, "the run stream ended without a terminal event")
