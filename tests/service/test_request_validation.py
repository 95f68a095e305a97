"""Every bad request is refused at the edge with INVALID_ARGUMENT, an ErrorInfo and the field
that is wrong, before the engine or the store sees it: U+0000 in any string, integers out of
range, malformed durations, oversized parts, invalid client tool schemas, forged page tokens
and request bytes that do not decode.

Requests go over the real server with the generated stubs (no client-side checks in the
way). A request that is only *just* within a limit is shown to pass validation by the next
refusal it meets: an unknown session or run (NOT_FOUND), so nothing runs and nothing is
written. Cases that reach the store run on SQLite and PostgreSQL.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import socket
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
from google.protobuf import duration_pb2, struct_pb2
from pydantic import ValidationError

from agio_grpc.client import AgioClient, AgioError, decode_error
from agio_grpc.config import (
    AgentConfig,
    LimitsConfig,
    RequestLimitsConfig,
    ServerConfig,
    Settings,
)
from agio_grpc.service.agent_service import AgentServicer
from agio_grpc.service.app import AgioApp
from agio_grpc.service.server import start_grpc_server
from agio_grpc.service.validation import (
    PageTokens,
    ToolSchemaChecks,
    json_nesting_over,
    nul_violations,
)
from agio_grpc.testing import FakeModelServer, Turn
from agio_grpc.v1 import (
    agent_service_pb2,
    agent_service_pb2_grpc,
    resources_pb2,
    session_service_pb2,
    session_service_pb2_grpc,
)

KIB = 1024
MIB = 1024 * KIB
MISSING_SESSION = "sess_missing"
MISSING_RUN = "run_missing"

RunRequest = agent_service_pb2.RunRequest
RunOverrides = agent_service_pb2.RunOverrides
ToolDefinition = resources_pb2.ToolDefinition


@dataclass(slots=True)
class Stubs:
    """The generated stubs on one channel to the server under test."""

    agents: agent_service_pb2_grpc.AgentServiceStub
    sessions: session_service_pb2_grpc.SessionServiceStub
    channel: grpc.aio.Channel


@pytest.fixture
async def stubs(app: AgioApp) -> AsyncIterator[Stubs]:
    async with grpc.aio.insecure_channel(app.address) as channel:
        yield Stubs(
            agent_service_pb2_grpc.AgentServiceStub(channel),
            session_service_pb2_grpc.SessionServiceStub(channel),
            channel,
        )


@pytest.fixture
async def backend_stubs(backend_app: AgioApp) -> AsyncIterator[Stubs]:
    async with grpc.aio.insecure_channel(backend_app.address) as channel:
        yield Stubs(
            agent_service_pb2_grpc.AgentServiceStub(channel),
            session_service_pb2_grpc.SessionServiceStub(channel),
            channel,
        )


Call = Callable[[Stubs], Any]


async def failure_of(call: Call, stubs: Stubs) -> AgioError:
    """Make the call (draining a stream) and return how it failed."""
    pending = call(stubs)
    try:
        if isinstance(pending, grpc.aio.UnaryStreamCall):
            async for _ in pending:
                pass
        else:
            await pending
    except grpc.aio.AioRpcError as error:
        return decode_error(error)
    raise AssertionError("the call succeeded")


async def expect_invalid(call: Call, stubs: Stubs, *fields: str) -> AgioError:
    """The call fails INVALID_ARGUMENT naming exactly `fields`."""
    failure = await failure_of(call, stubs)
    assert failure.code == grpc.StatusCode.INVALID_ARGUMENT, failure
    assert failure.reason == "INVALID_ARGUMENT", failure
    assert failure.domain == "agio-grpc"
    assert [field for field, _ in failure.field_violations] == list(fields), failure
    return failure


async def expect_not_found(call: Call, stubs: Stubs, reason: str) -> None:
    """The call got past validation: it fails only on the unknown session or run."""
    failure = await failure_of(call, stubs)
    assert (failure.code, failure.reason) == (grpc.StatusCode.NOT_FOUND, reason), failure


def run(**fields: Any) -> Call:
    """A `Run` call; `input` defaults to "hi"."""
    fields.setdefault("input", "hi")
    return lambda s: s.agents.Run(RunRequest(**fields))


def run_on_missing_session(**fields: Any) -> Call:
    return run(session_id=MISSING_SESSION, **fields)


def tool(name: str = "lookup", description: str = "", parameters_json: str = "") -> ToolDefinition:
    return ToolDefinition(name=name, description=description, parameters_json=parameters_json)


# -- U+0000 in any string field --------------------------------------------------------------

NUL_CASES: list[tuple[str, Call, str]] = [
    ("run input", run(input="a\x00b"), "input"),
    ("run session id", run(session_id="s\x00"), "session_id"),
    ("run agent", run(agent="a\x00"), "agent"),
    ("run request id", run(request_id="r\x00"), "request_id"),
    ("metadata key", run(metadata={"k\x00": "v"}), "metadata"),
    ("metadata value", run(metadata={"tenant": "v\x00"}), 'metadata["tenant"]'),
    (
        "instructions",
        run(overrides=RunOverrides(instructions="be \x00 terse")),
        "overrides.instructions",
    ),
    ("model override", run(overrides=RunOverrides(model="m\x00")), "overrides.model"),
    (
        "tool selection",
        run(overrides=RunOverrides(tools=agent_service_pb2.ToolSelection(names=["a", "b\x00"]))),
        "overrides.tools.names[1]",
    ),
    ("client tool name", run(client_tools=[tool(name="t\x00")]), "client_tools[0].name"),
    (
        "client tool description",
        run(client_tools=[tool(), tool("other", description="d\x00")]),
        "client_tools[1].description",
    ),
    (
        "client tool schema",
        run(client_tools=[tool(parameters_json='{"description": "\x00"}')]),
        "client_tools[0].parameters_json",
    ),
    (
        "start run input",
        lambda s: s.agents.StartRun(RunRequest(input="\x00")),
        "input",
    ),
    (
        "tool output",
        lambda s: s.agents.SubmitToolOutputs(
            agent_service_pb2.SubmitToolOutputsRequest(
                run_id="run_1",
                tool_outputs=[
                    agent_service_pb2.ToolOutput(tool_call_id="c1", output="ok"),
                    agent_service_pb2.ToolOutput(tool_call_id="c2", output="o\x00"),
                ],
            )
        ),
        "tool_outputs[1].output",
    ),
    (
        "tool call id",
        lambda s: s.agents.SubmitToolOutputs(
            agent_service_pb2.SubmitToolOutputsRequest(
                run_id="run_1",
                tool_outputs=[agent_service_pb2.ToolOutput(tool_call_id="c\x00", output="ok")],
            )
        ),
        "tool_outputs[0].tool_call_id",
    ),
    (
        "submit run id",
        lambda s: s.agents.SubmitToolOutputs(
            agent_service_pb2.SubmitToolOutputsRequest(run_id="r\x00")
        ),
        "run_id",
    ),
    (
        "retry session id",
        lambda s: s.agents.Retry(agent_service_pb2.RetryRequest(session_id="\x00", sequence=1)),
        "session_id",
    ),
    (
        "watch run id",
        lambda s: s.agents.WatchRun(agent_service_pb2.WatchRunRequest(run_id="\x00")),
        "run_id",
    ),
    (
        "cancel reason",
        lambda s: s.agents.CancelRun(
            agent_service_pb2.CancelRunRequest(run_id="run_1", reason="why\x00")
        ),
        "reason",
    ),
    (
        "get run id",
        lambda s: s.agents.GetRun(agent_service_pb2.GetRunRequest(run_id="\x00")),
        "run_id",
    ),
    (
        "list runs page token",
        lambda s: s.agents.ListRuns(
            agent_service_pb2.ListRunsRequest(session_id="sess_1", page_token="t\x00")
        ),
        "page_token",
    ),
    (
        "get session id",
        lambda s: s.sessions.GetSession(session_service_pb2.GetSessionRequest(session_id="\x00")),
        "session_id",
    ),
    (
        "list sessions page token",
        lambda s: s.sessions.ListSessions(
            session_service_pb2.ListSessionsRequest(page_token="\x00")
        ),
        "page_token",
    ),
    (
        "delete session id",
        lambda s: s.sessions.DeleteSession(
            session_service_pb2.DeleteSessionRequest(session_id="\x00")
        ),
        "session_id",
    ),
    (
        "list steps page token",
        lambda s: s.sessions.ListSteps(
            session_service_pb2.ListStepsRequest(session_id="sess_1", page_token="\x00")
        ),
        "page_token",
    ),
    (
        "get step session id",
        lambda s: s.sessions.GetStep(
            session_service_pb2.GetStepRequest(session_id="\x00", sequence=1)
        ),
        "session_id",
    ),
    (
        "delete steps session id",
        lambda s: s.sessions.DeleteSteps(
            session_service_pb2.DeleteStepsRequest(session_id="\x00", start_sequence=1)
        ),
        "session_id",
    ),
    (
        "fork session id",
        lambda s: s.sessions.ForkSession(session_service_pb2.ForkSessionRequest(session_id="\x00")),
        "session_id",
    ),
    (
        "context agent",
        lambda s: s.sessions.GetContext(
            session_service_pb2.GetContextRequest(session_id="sess_1", agent="\x00")
        ),
        "agent",
    ),
]


async def test_a_nul_in_any_request_string_is_refused_naming_the_field(
    backend_stubs: Stubs,
) -> None:
    # Every case against one server per backend (a server each made this the suite's
    # slowest test).
    for name, call, field in NUL_CASES:
        failure = await expect_invalid(call, backend_stubs, field)
        assert "U+0000" in failure.field_violations[0][1], name


def test_the_nul_walk_reaches_struct_values_and_repeated_messages() -> None:
    context = struct_pb2.Struct()
    context.update({"outer": {"inner": ["fine", "bad\x00"]}, "k\x00": 1})
    signal = resources_pb2.StopSignal(message="ok", context=context)
    found = sorted(v.field for v in nul_violations(signal))
    assert found == [
        "context.fields",
        'context.fields["outer"].struct_value.fields["inner"].list_value.values[1].string_value',
    ]
    assert (
        nul_violations(resources_pb2.StopSignal(message="clean", context=struct_pb2.Struct())) == []
    )


# -- integers out of range ---------------------------------------------------------------------

INTEGER_CASES: list[tuple[str, Call, str]] = [
    ("max_steps 0", run(overrides=RunOverrides(max_steps=0)), "overrides.max_steps"),
    ("max_steps -1", run(overrides=RunOverrides(max_steps=-1)), "overrides.max_steps"),
    ("max_steps 1001", run(overrides=RunOverrides(max_steps=1001)), "overrides.max_steps"),
    ("max_tokens 0", run(overrides=RunOverrides(max_tokens=0)), "overrides.max_tokens"),
    (
        "max_tokens -2^31",
        run(overrides=RunOverrides(max_tokens=-(2**31))),
        "overrides.max_tokens",
    ),
    ("token_budget 0", run(overrides=RunOverrides(token_budget=0)), "overrides.token_budget"),
    (
        "token_budget -2^63",
        run(overrides=RunOverrides(token_budget=-(2**63))),
        "overrides.token_budget",
    ),
    (
        "retry sequence 0",
        lambda s: s.agents.Retry(agent_service_pb2.RetryRequest(session_id="sess_1", sequence=0)),
        "sequence",
    ),
    (
        "retry sequence -2^63",
        lambda s: s.agents.Retry(
            agent_service_pb2.RetryRequest(session_id="sess_1", sequence=-(2**63))
        ),
        "sequence",
    ),
    (
        "watch after_seq -1",
        lambda s: s.agents.WatchRun(agent_service_pb2.WatchRunRequest(run_id="r", after_seq=-1)),
        "after_seq",
    ),
    (
        "list runs page_size -1",
        lambda s: s.agents.ListRuns(
            agent_service_pb2.ListRunsRequest(session_id="sess_1", page_size=-1)
        ),
        "page_size",
    ),
    (
        "list sessions page_size -2^31",
        lambda s: s.sessions.ListSessions(
            session_service_pb2.ListSessionsRequest(page_size=-(2**31))
        ),
        "page_size",
    ),
    (
        "list steps start -1",
        lambda s: s.sessions.ListSteps(
            session_service_pb2.ListStepsRequest(session_id="sess_1", start_sequence=-1)
        ),
        "start_sequence",
    ),
    (
        "list steps end -2^63",
        lambda s: s.sessions.ListSteps(
            session_service_pb2.ListStepsRequest(session_id="sess_1", end_sequence=-(2**63))
        ),
        "end_sequence",
    ),
    (
        "list steps page_size -1",
        lambda s: s.sessions.ListSteps(
            session_service_pb2.ListStepsRequest(session_id="sess_1", page_size=-1)
        ),
        "page_size",
    ),
    (
        "get step 0",
        lambda s: s.sessions.GetStep(
            session_service_pb2.GetStepRequest(session_id="sess_1", sequence=0)
        ),
        "sequence",
    ),
    (
        "get step -2^63",
        lambda s: s.sessions.GetStep(
            session_service_pb2.GetStepRequest(session_id="sess_1", sequence=-(2**63))
        ),
        "sequence",
    ),
    (
        "delete steps 0",
        lambda s: s.sessions.DeleteSteps(
            session_service_pb2.DeleteStepsRequest(session_id="sess_1", start_sequence=0)
        ),
        "start_sequence",
    ),
    (
        "fork -1",
        lambda s: s.sessions.ForkSession(
            session_service_pb2.ForkSessionRequest(session_id="sess_1", sequence=-1)
        ),
        "sequence",
    ),
]


@pytest.mark.parametrize(
    ("call", "field"), [c[1:] for c in INTEGER_CASES], ids=[c[0] for c in INTEGER_CASES]
)
async def test_an_integer_out_of_range_is_refused_naming_the_field(
    stubs: Stubs, call: Call, field: str
) -> None:
    await expect_invalid(call, stubs, field)


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        (RunOverrides(max_steps=1000), "overrides.max_steps"),
        (RunOverrides(max_tokens=2**31 - 1), "overrides.max_tokens"),
        (RunOverrides(token_budget=2**63 - 1), "overrides.token_budget"),
    ],
)
async def test_the_largest_integers_allowed_pass_validation(
    stubs: Stubs, overrides: RunOverrides, field: str
) -> None:
    await expect_not_found(run_on_missing_session(overrides=overrides), stubs, "SESSION_NOT_FOUND")


async def test_the_largest_sequences_never_give_internal_on_either_backend(
    backend_app: AgioApp,
    backend_stubs: Stubs,
    backend_client: AgioClient,
    fake_model: FakeModelServer,
) -> None:
    fake_model.enqueue(Turn.text("hi"))
    ran = await backend_client.run_to_end("hello")
    session_id, top = ran.session_id, 2**63 - 1
    sessions = backend_stubs.sessions

    missing = await failure_of(
        lambda s: s.sessions.GetStep(
            session_service_pb2.GetStepRequest(session_id=session_id, sequence=top)
        ),
        backend_stubs,
    )
    assert (missing.code, missing.reason) == (grpc.StatusCode.NOT_FOUND, "STEP_NOT_FOUND")
    listed = await sessions.ListSteps(
        session_service_pb2.ListStepsRequest(session_id=session_id, start_sequence=top)
    )
    assert list(listed.steps) == []
    listed = await sessions.ListSteps(
        session_service_pb2.ListStepsRequest(session_id=session_id, end_sequence=top)
    )
    assert [s.sequence for s in listed.steps] == [1, 2]
    past_the_end = await failure_of(
        lambda s: s.sessions.ForkSession(
            session_service_pb2.ForkSessionRequest(session_id=session_id, sequence=top)
        ),
        backend_stubs,
    )
    assert (past_the_end.code, past_the_end.reason) == (
        grpc.StatusCode.OUT_OF_RANGE,
        "SEQUENCE_OUT_OF_RANGE",
    )
    retry = await failure_of(
        lambda s: s.agents.Retry(
            agent_service_pb2.RetryRequest(session_id=session_id, sequence=top)
        ),
        backend_stubs,
    )
    assert (retry.code, retry.field_violations[0][0]) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "sequence",
    )
    deleted = await sessions.DeleteSteps(
        session_service_pb2.DeleteStepsRequest(session_id=session_id, start_sequence=top)
    )
    assert deleted.deleted_count == 0
    watched = [
        event.WhichOneof("event")
        async for event in backend_stubs.agents.WatchRun(
            agent_service_pb2.WatchRunRequest(run_id=ran.run.id, after_seq=top)
        )
    ]
    assert watched == ["run_completed"]  # the terminal event, whatever the cursor
    assert len(await backend_client.list_steps(session_id)) == 2


# -- durations -----------------------------------------------------------------------------------

Duration = duration_pb2.Duration


@pytest.mark.parametrize(
    "timeout",
    [
        pytest.param(Duration(seconds=-1), id="negative"),
        pytest.param(Duration(seconds=0, nanos=-1), id="negative nanos"),
        pytest.param(Duration(), id="zero"),
        pytest.param(Duration(seconds=1, nanos=-1), id="mixed signs"),
        pytest.param(Duration(seconds=-1, nanos=5), id="mixed signs the other way"),
        pytest.param(Duration(seconds=1, nanos=1_000_000_000), id="nanos of a whole second"),
        pytest.param(Duration(seconds=0, nanos=-1_000_000_000), id="negative nanos too large"),
        pytest.param(Duration(seconds=2**62), id="2^62 seconds"),
        pytest.param(Duration(seconds=2**63 - 1, nanos=999_999_999), id="int64 max"),
        pytest.param(Duration(seconds=24 * 3600, nanos=1), id="just over 24h"),
    ],
)
async def test_a_bad_timeout_is_refused_naming_it(stubs: Stubs, timeout: Duration) -> None:
    await expect_invalid(run(overrides=RunOverrides(timeout=timeout)), stubs, "overrides.timeout")


@pytest.mark.parametrize(
    "timeout",
    [
        pytest.param(Duration(seconds=24 * 3600), id="24h exactly"),
        pytest.param(Duration(nanos=1), id="one nanosecond"),
        pytest.param(Duration(seconds=30, nanos=999_999_999), id="largest nanos"),
    ],
)
async def test_a_timeout_within_the_maximum_passes_validation(
    stubs: Stubs, timeout: Duration
) -> None:
    overrides = RunOverrides(timeout=timeout)
    await expect_not_found(run_on_missing_session(overrides=overrides), stubs, "SESSION_NOT_FOUND")


# -- sizes ----------------------------------------------------------------------------------


def schema_of_size(size: int) -> str:
    """A valid JSON Schema of exactly `size` bytes."""
    empty = json.dumps({"type": "object", "description": ""})
    return json.dumps({"type": "object", "description": "d" * (size - len(empty))})


def nested_schema(depth: int) -> str:
    """A valid JSON Schema nesting `depth` objects (`{"not": {"not": ... {}}}`)."""
    return '{"not": ' * (depth - 1) + "{}" + "}" * (depth - 1)


def schema_of_objects(count: int) -> str:
    """A valid JSON Schema holding `count` JSON objects: itself, its property map, and
    `count - 2` empty property schemas."""
    return json.dumps({"properties": {f"p{i}": {} for i in range(count - 2)}})


def many_tools(count: int) -> list[ToolDefinition]:
    return [tool(f"client_tool_{i}") for i in range(count)]


SIZE_CASES: list[tuple[str, dict[str, Any], dict[str, Any], str]] = [
    # (name, the request just within the limit, the request just over it, the field)
    ("input", {"input": "x" * MIB}, {"input": "x" * (MIB + 1)}, "input"),
    (
        "input in multibyte characters",
        {"input": "é" * (MIB // 2)},
        {"input": "é" * (MIB // 2) + "x"},
        "input",
    ),
    (
        "instructions",
        {"overrides": RunOverrides(instructions="i" * (256 * KIB))},
        {"overrides": RunOverrides(instructions="i" * (256 * KIB + 1))},
        "overrides.instructions",
    ),
    (
        "metadata entries",
        {"metadata": {f"k{i}": "v" for i in range(64)}},
        {"metadata": {f"k{i}": "v" for i in range(65)}},
        "metadata",
    ),
    (
        "metadata key",
        {"metadata": {"k" * 128: "v"}},
        {"metadata": {"k" * 129: "v"}},
        "metadata",
    ),
    (
        "metadata value",
        {"metadata": {"tenant": "v" * (4 * KIB)}},
        {"metadata": {"tenant": "v" * (4 * KIB + 1)}},
        'metadata["tenant"]',
    ),
    (
        "client tool count",
        {"client_tools": many_tools(128)},
        {"client_tools": many_tools(129)},
        "client_tools",
    ),
    (
        "client tool description",
        {"client_tools": [tool(description="d" * (16 * KIB))]},
        {"client_tools": [tool(description="d" * (16 * KIB + 1))]},
        "client_tools[0].description",
    ),
    (
        "client tool schema size",
        {"client_tools": [tool(parameters_json=schema_of_size(64 * KIB))]},
        {"client_tools": [tool(parameters_json=schema_of_size(64 * KIB + 1))]},
        "client_tools[0].parameters_json",
    ),
    (
        "client tool schema objects",
        {"client_tools": [tool(parameters_json=schema_of_objects(2048))]},
        {
            "client_tools": [
                tool(parameters_json=schema_of_objects(1024)),
                tool("other", parameters_json=schema_of_objects(1025)),
            ]
        },
        "client_tools",
    ),
    (
        "client tool schema depth",
        {"client_tools": [tool(parameters_json=nested_schema(32))]},
        {"client_tools": [tool(parameters_json=nested_schema(33))]},
        "client_tools[0].parameters_json",
    ),
]


@pytest.mark.parametrize(
    ("within", "over", "field"), [c[1:] for c in SIZE_CASES], ids=[c[0] for c in SIZE_CASES]
)
async def test_each_size_limit_refuses_one_byte_over_and_passes_at_the_limit(
    backend_stubs: Stubs, within: dict[str, Any], over: dict[str, Any], field: str
) -> None:
    await expect_not_found(run_on_missing_session(**within), backend_stubs, "SESSION_NOT_FOUND")
    await expect_invalid(run_on_missing_session(**over), backend_stubs, field)


def submit(output: str) -> Call:
    return lambda s: s.agents.SubmitToolOutputs(
        agent_service_pb2.SubmitToolOutputsRequest(
            run_id=MISSING_RUN,
            tool_outputs=[agent_service_pb2.ToolOutput(tool_call_id="call_1", output=output)],
        )
    )


async def test_a_tool_output_one_byte_over_the_limit_is_refused(stubs: Stubs) -> None:
    await expect_not_found(submit("o" * MIB), stubs, "RUN_NOT_FOUND")
    await expect_invalid(submit("o" * (MIB + 1)), stubs, "tool_outputs[0].output")


def test_schema_sizes_used_above_are_exact() -> None:
    assert len(schema_of_size(64 * KIB).encode()) == 64 * KIB
    assert json_nesting_over(nested_schema(32), 32) is False
    assert json_nesting_over(nested_schema(33), 32) is True
    # Brackets inside strings are not nesting.
    assert json_nesting_over('{"description": "[[[[{{{{"}', 1) is False


@pytest.mark.parametrize(
    ("schema", "words"),
    [
        pytest.param("[" * 20_000 + "]" * 20_000, "nest", id="20k deep array"),
        pytest.param('{"a":' * 2_000 + "1" + "}" * 2_000, "nest", id="2k deep object"),
        pytest.param("[" * 60_000, "nest", id="60k unclosed brackets"),
        pytest.param("{not json", "valid JSON", id="not JSON"),
        pytest.param("[]", "JSON object", id="an array"),
        pytest.param('"a string"', "JSON object", id="a string"),
        pytest.param('{"type": "objekt"}', "JSON Schema", id="unknown type"),
        pytest.param('{"properties": 3}', "JSON Schema", id="properties not an object"),
        pytest.param('{"required": "city"}', "JSON Schema", id="required not an array"),
        pytest.param('{"pattern": "(("}', "JSON Schema", id="pattern not a regex"),
        pytest.param('{"$schema": 5}', "JSON Schema", id="$schema not a string"),
        pytest.param(
            '{"$schema": "http://json-schema.org/draft-07/schema#", "minLength": -1}',
            "JSON Schema",
            id="invalid for its own draft",
        ),
    ],
)
async def test_a_client_tool_schema_must_be_a_shallow_valid_json_schema(
    stubs: Stubs, schema: str, words: str
) -> None:
    failure = await expect_invalid(
        run_on_missing_session(client_tools=[tool(parameters_json=schema)]),
        stubs,
        "client_tools[0].parameters_json",
    )
    assert words in failure.field_violations[0][1]


async def test_schema_checks_give_the_same_answer_when_a_schema_comes_again() -> None:
    checks = ToolSchemaChecks(RequestLimitsConfig(max_tool_schema_objects=3), remembered=1)
    good, bad = '{"type": "object"}', '{"type": "objekt"}'
    for _ in range(3):
        assert await checks.violations([("a", good), ("b", "")]) == []
        assert [v.field for v in await checks.violations([("a", good), ("b", bad)])] == ["b"]
        # Remembered or not, a schema still counts towards the budget.
        over = await checks.violations([("a", good), ("b", good), ("c", '{"not": {}}')])
        assert [v.field for v in over] == ["client_tools"]


async def test_a_valid_draft_07_schema_passes(stubs: Stubs) -> None:
    schema = {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "type": "object",
        "properties": {"city": {"type": "string", "pattern": "^[A-Z]"}},
        "required": ["city"],
        "definitions": {"unit": {"enum": ["C", "F"]}},
    }
    call = run_on_missing_session(client_tools=[tool(parameters_json=json.dumps(schema))])
    await expect_not_found(call, stubs, "SESSION_NOT_FOUND")


async def test_many_violations_still_fit_in_one_status(stubs: Stubs) -> None:
    tools = [tool(f"t{i}", description="d" * (17 * KIB)) for i in range(128)]
    failure = await expect_invalid(
        run_on_missing_session(client_tools=tools),
        stubs,
        *[f"client_tools[{i}].description" for i in range(8)],
    )
    assert "and 125 more" in failure.message


def test_limits_and_the_longest_run_timeout_are_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGIO_SERVER__REQUEST_LIMITS__MAX_INPUT_BYTES", "10")
    monkeypatch.setenv("AGIO_SERVER__MAX_RUN_TIMEOUT_S", "600")
    settings = Settings()
    assert settings.server.request_limits.max_input_bytes == 10
    assert settings.server.request_limits.max_tool_output_bytes == MIB  # the default
    assert settings.server.max_run_timeout_s == 600
    slow = AgentConfig(name="assistant", limits=LimitsConfig(run_timeout_s=601))
    with pytest.raises(ValidationError, match="max_run_timeout_s"):
        Settings(agents=[slow])


def test_a_step_limit_must_leave_room_in_a_message() -> None:
    fits = AgentConfig(name="assistant", limits=LimitsConfig(max_step_bytes=8 * MIB))
    assert Settings(agents=[fits]).agents[0].limits.max_step_bytes == 8 * MIB
    big = AgentConfig(name="assistant", limits=LimitsConfig(max_step_bytes=8 * MIB + 1))
    with pytest.raises(ValidationError, match="max_step_bytes"):
        Settings(agents=[big])


def test_the_instance_id_is_configured_or_derived_from_the_listen_address() -> None:
    from agio_grpc.service.app import instance_id

    picked = Settings(listen_address="127.0.0.1:0")  # a port a restart never gets again
    assert instance_id(picked) != instance_id(picked)
    assert instance_id(picked).startswith(f"{socket.gethostname()}/{os.getpid()}-")
    derived = instance_id(Settings(listen_address="0.0.0.0:50051"))
    assert derived.endswith("/0.0.0.0:50051")
    named = Settings.model_validate({"server": {"instance_id": "replica-a"}})
    assert instance_id(named) == "replica-a"


def test_member_addresses_are_host_and_port() -> None:
    assert ServerConfig().member_address == "127.0.0.1:0"
    assert ServerConfig().member_advertise_address == ""
    fine = ServerConfig(member_address="0.0.0.0:50052", member_advertise_address="10.0.0.5:1")
    assert fine.member_advertise_address == "10.0.0.5:1"
    for field in ("member_address", "member_advertise_address"):
        for wrong in ("50052", "host:", ":1", "host:65536", "host:port"):
            with pytest.raises(ValidationError, match=field):
                ServerConfig.model_validate({field: wrong})
    with pytest.raises(ValidationError, match="member_address"):
        ServerConfig(member_address="")


def test_the_advertised_member_address_is_the_configured_one_else_the_bound_one() -> None:
    from agio_grpc.service.members import advertised_address

    assert advertised_address("127.0.0.1:40001", "") == "127.0.0.1:40001"
    assert advertised_address("0.0.0.0:40001", "10.0.0.5:50052") == "10.0.0.5:50052"
    host = socket.gethostname()
    assert advertised_address("0.0.0.0:40001", "") == f"{host}:40001"  # a wildcard: this host
    assert advertised_address("[::]:40001", "") == f"{host}:40001"


async def test_the_agent_service_applies_the_configured_limits(app: AgioApp) -> None:
    config = ServerConfig(
        max_run_timeout_s=60,
        request_limits=RequestLimitsConfig(max_input_bytes=8, max_tool_output_bytes=4),
    )
    servicer = AgentServicer(app.runtime, config)
    bound = await start_grpc_server(
        app.settings, [(agent_service_pb2_grpc.add_AgentServiceServicer_to_server, servicer)]
    )
    try:
        async with grpc.aio.insecure_channel(bound.address) as channel:
            stubs = Stubs(
                agent_service_pb2_grpc.AgentServiceStub(channel),
                session_service_pb2_grpc.SessionServiceStub(channel),
                channel,
            )
            await expect_not_found(
                run_on_missing_session(input="x" * 8), stubs, "SESSION_NOT_FOUND"
            )
            await expect_invalid(run_on_missing_session(input="x" * 9), stubs, "input")
            within = RunOverrides(timeout=Duration(seconds=60))
            await expect_not_found(
                run_on_missing_session(overrides=within), stubs, "SESSION_NOT_FOUND"
            )
            over = RunOverrides(timeout=Duration(seconds=60, nanos=1))
            await expect_invalid(run_on_missing_session(overrides=over), stubs, "overrides.timeout")
            await expect_not_found(submit("oooo"), stubs, "RUN_NOT_FOUND")
            await expect_invalid(submit("ooooo"), stubs, "tool_outputs[0].output")
    finally:
        await bound.server.stop(0)


# -- page tokens ------------------------------------------------------------------------------


def forged(payload: object) -> str:
    return base64.urlsafe_b64encode(json.dumps(payload).encode()).decode().rstrip("=")


def list_steps_with(session_id: str, token: str) -> Call:
    return lambda s: s.sessions.ListSteps(
        session_service_pb2.ListStepsRequest(session_id=session_id, page_token=token)
    )


def list_runs_with(session_id: str, token: str) -> Call:
    return lambda s: s.agents.ListRuns(
        agent_service_pb2.ListRunsRequest(session_id=session_id, page_token=token)
    )


def list_sessions_with(token: str) -> Call:
    return lambda s: s.sessions.ListSessions(
        session_service_pb2.ListSessionsRequest(page_token=token)
    )


async def test_forged_page_tokens_are_refused_on_either_backend(
    backend_app: AgioApp,
    backend_stubs: Stubs,
    backend_client: AgioClient,
    fake_model: FakeModelServer,
) -> None:
    fake_model.enqueue(Turn.text("hi"))
    session = (await backend_client.run_to_end("hello")).session_id
    steps = {"rpc": "ListSteps", "session": session, "start": 0, "end": 0}
    runs = {"rpc": "ListRuns", "session": session}
    sessions = {"rpc": "ListSessions"}
    # Positions no request gives, in tokens signed with the service's own key: checked too.
    encode_page_token = backend_app.pages.encode
    real = (
        await backend_stubs.sessions.ListSteps(
            session_service_pb2.ListStepsRequest(session_id=session, page_size=1)
        )
    ).next_page_token
    body, _, signature = real.partition(".")
    forged_calls = [
        # Not signed by this service: unsigned, another key, a changed payload or signature.
        list_steps_with(session, forged({"q": "x", "p": [2]})),
        list_steps_with(session, PageTokens().encode(steps, [2])),
        list_steps_with(session, forged({"q": "x", "p": [2]}) + "." + signature),
        list_steps_with(session, body + "." + signature[::-1]),
        list_steps_with(session, body),
        list_steps_with(session, real + "x"),
        # Another request's token.
        list_steps_with(session, backend_app.pages.encode(runs, [2])),
        list_steps_with(session, encode_page_token(steps, [2**63])),
        list_steps_with(session, encode_page_token(steps, [2**70])),
        list_steps_with(session, encode_page_token(steps, [0])),
        list_steps_with(session, encode_page_token(steps, [True])),
        list_steps_with(session, encode_page_token(steps, [1.5])),
        list_steps_with(session, encode_page_token(steps, [1, 2])),
        list_runs_with(session, encode_page_token(runs, ["2026-01-01T00:00:00", "run_x"])),
        list_sessions_with(encode_page_token(sessions, ["0001-01-01T00:00:00+14:00", "sess_x"])),
        list_sessions_with(encode_page_token(sessions, ["2026-01-01T00:00:00+00:00", 7])),
        list_sessions_with(forged({"q": "x", "p": [[[[[[1]]]]]]})),
        list_sessions_with("W" * 100_000),
        list_sessions_with(base64.urlsafe_b64encode(b"[" * 5000).decode()),
    ]
    for call in forged_calls:
        await expect_invalid(call, backend_stubs, "page_token")
    # A real token still works.
    first = await backend_stubs.sessions.ListSteps(
        session_service_pb2.ListStepsRequest(session_id=session, page_size=1)
    )
    rest = await backend_stubs.sessions.ListSteps(
        session_service_pb2.ListStepsRequest(
            session_id=session, page_size=1, page_token=first.next_page_token
        )
    )
    assert [s.sequence for s in [*first.steps, *rest.steps]] == [1, 2]


# -- undecodable requests -------------------------------------------------------------------


def with_invalid_utf8(message: Any, text: str) -> bytes:
    """The message serialized, with the first byte of `text` (a string field's value)
    replaced by 0xFF: no longer valid UTF-8, same length."""
    encoded: bytes = message.SerializeToString()
    assert encoded.count(text.encode()) == 1
    return encoded.replace(text.encode(), b"\xff" + text.encode()[1:])


def identity(data: bytes) -> bytes:
    return data


async def send_raw(
    channel: grpc.aio.Channel, method: str, payload: bytes, *, streams: bool
) -> None:
    """Call `method` with `payload` as the request's bytes, as they are."""
    if streams:
        call = channel.unary_stream(
            method, request_serializer=identity, response_deserializer=identity
        )
        async for _ in call(payload):
            pass
    else:
        await channel.unary_unary(
            method, request_serializer=identity, response_deserializer=identity
        )(payload)


UNDECODABLE_CASES = [
    pytest.param(
        "/agio.v1.AgentService/GetRun",
        with_invalid_utf8(agent_service_pb2.GetRunRequest(run_id="run_abc"), "run_abc"),
        False,
        id="unary, invalid UTF-8",
    ),
    pytest.param(
        "/agio.v1.AgentService/Run",
        with_invalid_utf8(RunRequest(input="hello there", metadata={"k": "v"}), "hello there"),
        True,
        id="stream, invalid UTF-8",
    ),
    pytest.param(
        "/agio.v1.SessionService/GetSession",
        b"\x0a\x10abc",  # a string field announcing 16 bytes, with 3
        False,
        id="unary, truncated",
    ),
]


@pytest.mark.parametrize(("method", "payload", "streams"), UNDECODABLE_CASES)
async def test_an_undecodable_request_is_refused_with_one_warning_and_no_traceback(
    stubs: Stubs,
    caplog: pytest.LogCaptureFixture,
    method: str,
    payload: bytes,
    streams: bool,
) -> None:
    caplog.set_level(logging.DEBUG)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await send_raw(stubs.channel, method, payload, streams=streams)
    failure = decode_error(caught.value)
    assert failure.code == grpc.StatusCode.INVALID_ARGUMENT, failure
    assert (failure.reason, failure.domain) == ("MALFORMED_REQUEST", "agio-grpc")
    assert failure.metadata == {"method": method}
    assert "Error" not in failure.message  # no Python class name
    loud = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert [(r.levelno, r.name) for r in loud] == [
        (logging.WARNING, "agio_grpc.service.interceptors")
    ]
    assert all(r.exc_info is None for r in caplog.records)
    assert method in loud[0].getMessage()

    # The server is fine afterwards.
    assert (await stubs.agents.ListAgents(agent_service_pb2.ListAgentsRequest())).agents


async def test_nothing_refused_was_written_on_either_backend(
    backend_client: AgioClient, backend_stubs: Stubs
) -> None:
    refused = [
        *(call for _, call, _ in NUL_CASES[:6]),
        run(overrides=RunOverrides(timeout=Duration(seconds=2**62))),
        run(input="x" * (MIB + 1)),
        run(client_tools=[tool(parameters_json="[" * 20_000)]),
    ]
    for call in refused:
        failure = await failure_of(call, backend_stubs)
        assert failure.code == grpc.StatusCode.INVALID_ARGUMENT, failure
    assert await backend_client.list_sessions() == []
