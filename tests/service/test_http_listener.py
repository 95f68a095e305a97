"""The HTTP listener: the same services over Connect (JSON and binary) and gRPC-Web, served
by the gRPC handlers, on a real server (127.0.0.1:0) with the fake model, called with a plain
HTTP client as a browser calls them."""

from __future__ import annotations

import asyncio
import json
import random
import struct
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import httpx2
import pytest

from agio_grpc.client import AgioClient
from agio_grpc.config import AgentConfig, LimitsConfig, ServerConfig, Settings
from agio_grpc.service.app import AgioApp
from agio_grpc.service.auth import choose_auth_mode
from agio_grpc.service.startup import StartupError
from agio_grpc.store.keys import KeyStore
from agio_grpc.testing import FakeModelServer, ToolCallSpec, Turn
from agio_grpc.testing.envelopes import END_STREAM, TRAILERS, envelope, envelopes, read_envelopes
from agio_grpc.v1 import agent_service_pb2, resources_pb2
from tests.roles import open_roles
from tests.service.auth_helpers import WHOAMI, auth_settings, bearer, serving
from tests.service.conftest import make_settings
from tests.service.connect_wire import (
    CONNECT_JSON,
    CONNECT_STREAM_JSON,
    CONNECT_STREAM_PROTO,
    GRPC_WEB_PROTO,
    connect_stream,
    grpc_web_stream,
    json_envelope,
    wire_error,
)
from tests.sqlite import sqlite_at

RUN = "/agio.v1.AgentService/Run"
LIST_AGENTS = "/agio.v1.AgentService/ListAgents"
GET_SESSION = "/agio.v1.SessionService/GetSession"
ALLOWED_ORIGIN = "https://console.example"


def http_settings(tmp_path: Path, model_url: str, **overrides: Any) -> Any:
    return make_settings(
        sqlite_at(tmp_path / "agio.db"),
        model_url,
        **{"http_address": "127.0.0.1:0", **overrides},
    )


@pytest.fixture
async def http_app(tmp_path: Path, fake_model: FakeModelServer) -> AsyncIterator[AgioApp]:
    """The service with its HTTP listener; pages of `ALLOWED_ORIGIN` may call it."""
    settings = http_settings(
        tmp_path, fake_model.base_url, http={"allowed_origins": [ALLOWED_ORIGIN]}
    )
    async with serving(settings) as app:
        yield app


@pytest.fixture
async def http(http_app: AgioApp) -> AsyncIterator[httpx2.AsyncClient]:
    assert http_app.http is not None
    async with httpx2.AsyncClient(base_url=f"http://{http_app.http.address}") as client:
        yield client


def no_traceback(response: httpx2.Response) -> None:
    assert response.status_code != 500
    assert "Traceback" not in response.text


# -- Connect -------------------------------------------------------------------------------


async def test_a_connect_unary_call_in_json_lists_the_agents(http: httpx2.AsyncClient) -> None:
    response = await http.post(LIST_AGENTS, content=b"{}", headers=CONNECT_JSON)
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    agents = response.json()["agents"]
    assert [agent["name"] for agent in agents] == ["assistant"]
    assert "calculate" in [tool["name"] for tool in agents[0]["tools"]]


async def test_a_connect_stream_in_json_runs_a_tool_call_to_its_stop_signal(
    http: httpx2.AsyncClient, fake_model: FakeModelServer
) -> None:
    fake_model.enqueue(
        Turn.tool_calls([ToolCallSpec("calculate", '{"expression": "12 * 7"}')]),
        Turn.text("It is 84."),
    )
    request = agent_service_pb2.RunRequest(input="What is 12 * 7?")
    response = await http.post(RUN, content=json_envelope(request), headers=CONNECT_STREAM_JSON)
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/connect+json"
    stream = connect_stream(response.content, binary=False)
    assert stream.error is None
    assert [event.seq for event in stream.events] == list(range(1, len(stream.events) + 1))
    kinds = [event.WhichOneof("event") for event in stream.events]
    assert kinds[0] == "run_started"
    assert kinds[-1] == "run_completed"
    completed = [e.step_completed.step for e in stream.events if e.HasField("step_completed")]
    assert [step.role for step in completed] == [
        resources_pb2.ROLE_USER,
        resources_pb2.ROLE_ASSISTANT,
        resources_pb2.ROLE_TOOL,
        resources_pb2.ROLE_ASSISTANT,
    ]
    assert completed[2].content == "84"
    assert completed[3].content == "It is 84."
    run = stream.events[-1].run_completed.run
    assert run.stop_signal.reason == resources_pb2.STOP_REASON_COMPLETED


async def test_a_connect_stream_in_binary_is_the_same_run_as_over_grpc(
    http: httpx2.AsyncClient, http_app: AgioApp
) -> None:
    request = agent_service_pb2.RunRequest(input="hello there")
    response = await http.post(
        RUN, content=envelope(request.SerializeToString()), headers=CONNECT_STREAM_PROTO
    )
    assert response.headers["content-type"] == "application/connect+proto"
    stream = connect_stream(response.content, binary=True)
    assert stream.error is None
    final = stream.events[-1].run_completed.run
    assert final.stop_signal.reason == resources_pb2.STOP_REASON_COMPLETED
    async with AgioClient(http_app.address) as client:
        stored = await client.get_run(final.id)
        steps = await client.list_steps(final.session_id)
    assert stored == final
    streamed = [e.step_completed.step for e in stream.events if e.HasField("step_completed")]
    assert streamed == steps


async def test_a_background_run_started_in_binary_is_watched_over_connect(
    http: httpx2.AsyncClient,
) -> None:
    request = agent_service_pb2.RunRequest(input="hello there")
    started = await http.post(
        "/agio.v1.AgentService/StartRun",
        content=request.SerializeToString(),
        headers={"content-type": "application/proto"},
    )
    assert started.status_code == 200
    assert started.headers["content-type"] == "application/proto"
    run = agent_service_pb2.StartRunResponse.FromString(started.content).run
    watch = agent_service_pb2.WatchRunRequest(run_id=run.id, after_seq=0)
    watched = await http.post(
        "/agio.v1.AgentService/WatchRun", content=json_envelope(watch), headers=CONNECT_STREAM_JSON
    )
    stream = connect_stream(watched.content, binary=False)
    assert stream.error is None
    # A replay skips the deltas the journal does not keep; the cursor only moves on.
    seqs = [event.seq for event in stream.events]
    assert seqs == sorted(set(seqs))
    assert stream.events[0].HasField("run_started")
    assert stream.events[0].run_id == run.id
    assert stream.events[-1].run_completed.run.status == resources_pb2.RUN_STATUS_COMPLETED


async def test_a_grpc_web_stream_ends_with_its_status_in_the_trailers(
    http: httpx2.AsyncClient,
) -> None:
    request = agent_service_pb2.RunRequest(input="hello there")
    response = await http.post(
        RUN, content=envelope(request.SerializeToString()), headers=GRPC_WEB_PROTO
    )
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/grpc-web+proto"
    stream = grpc_web_stream(response.content)
    assert stream.trailers["grpc-status"] == "0"
    assert stream.events[0].HasField("run_started")
    assert stream.events[-1].run_completed.run.status == resources_pb2.RUN_STATUS_COMPLETED


async def test_grpc_web_in_json_answers_a_unary_call(http: httpx2.AsyncClient) -> None:
    response = await http.post(
        LIST_AGENTS,
        content=envelope(b"{}"),
        headers={"content-type": "application/grpc-web+json", "x-grpc-web": "1"},
    )
    (flags, payload), (trailer_flags, trailers) = envelopes(response.content)
    assert flags == 0
    assert json.loads(payload)["agents"][0]["name"] == "assistant"
    assert trailer_flags == TRAILERS
    assert b"grpc-status: 0" in trailers


async def test_the_callers_traceparent_becomes_the_runs_trace(http: httpx2.AsyncClient) -> None:
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    response = await http.post(
        RUN,
        content=json_envelope(agent_service_pb2.RunRequest(input="hello")),
        headers={**CONNECT_STREAM_JSON, "traceparent": f"00-{trace_id}-00f067aa0ba902b7-01"},
    )
    run = connect_stream(response.content, binary=False).events[-1].run_completed.run
    assert run.trace_id == trace_id


# -- errors --------------------------------------------------------------------------------


async def test_a_unary_error_carries_its_error_info(http: httpx2.AsyncClient) -> None:
    response = await http.post(GET_SESSION, json={"sessionId": "sess_missing"})
    assert response.status_code == 404
    error = wire_error(response.json())
    assert error.code == "not_found"
    assert error.error_info is not None
    assert error.error_info.reason == "SESSION_NOT_FOUND"
    assert error.error_info.domain == "agio-grpc"
    assert error.error_info.metadata["key"] == "sess_missing"


async def test_an_invalid_run_ends_its_stream_with_bad_request_details(
    http: httpx2.AsyncClient,
) -> None:
    request = agent_service_pb2.RunRequest(input=" ", session_id="not an id!")
    response = await http.post(RUN, content=json_envelope(request), headers=CONNECT_STREAM_JSON)
    stream = connect_stream(response.content, binary=False)
    assert stream.events == []
    assert stream.error is not None
    assert stream.error.code == "invalid_argument"
    assert stream.error.error_info is not None
    assert stream.error.error_info.reason == "INVALID_ARGUMENT"
    assert stream.error.bad_request is not None
    fields = {v.field for v in stream.error.bad_request.field_violations}
    assert fields == {"input", "session_id"}


async def test_a_grpc_web_error_carries_the_grpc_status_details(http: httpx2.AsyncClient) -> None:
    request = agent_service_pb2.RunRequest(input="")
    response = await http.post(
        RUN, content=envelope(request.SerializeToString()), headers=GRPC_WEB_PROTO
    )
    stream = grpc_web_stream(response.content)
    assert stream.trailers["grpc-status"] == str(grpc.StatusCode.INVALID_ARGUMENT.value[0])
    details = stream.status_details()
    assert [d.type_url.rpartition("/")[2] for d in details.details] == [
        "google.rpc.ErrorInfo",
        "google.rpc.BadRequest",
    ]


# -- hostile input -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "headers"),
    [
        pytest.param(b'{"sessionId": ', CONNECT_JSON, id="truncated-json"),
        pytest.param(b"[1, 2]", CONNECT_JSON, id="json-not-an-object"),
        pytest.param(b'{"sessionId": "\xff\xfe"}', CONNECT_JSON, id="json-not-utf-8"),
        pytest.param(b'{"sessionId": 12}', CONNECT_JSON, id="json-wrong-type"),
        pytest.param(b"[" * 100_000 + b"]" * 100_000, CONNECT_JSON, id="json-nested-deep"),
        pytest.param(b"\x0a\x02\xff\xfe", {"content-type": "application/proto"}, id="proto-utf-8"),
        pytest.param(b"\x0a\x09abc", {"content-type": "application/proto"}, id="proto-truncated"),
    ],
)
async def test_a_malformed_request_is_refused_malformed_request(
    http: httpx2.AsyncClient, body: bytes, headers: dict[str, str]
) -> None:
    response = await http.post(GET_SESSION, content=body, headers=headers)
    no_traceback(response)
    assert response.status_code == 400
    error = wire_error(response.json())
    assert error.code == "invalid_argument"
    assert error.error_info is not None
    assert error.error_info.reason == "MALFORMED_REQUEST"


HOSTILE_METHODS = [
    LIST_AGENTS,
    GET_SESSION,
    RUN,
    "/agio.v1.AgentService/WatchRun",
    "/agio.v1.SessionService/ListSteps",
    "/grpc.health.v1.Health/Check",
]
HOSTILE_CONTENT_TYPES = [
    "application/json",
    "application/proto",
    "application/connect+json",
    "application/connect+proto",
    "application/grpc-web+proto",
    "application/grpc-web+json",
]


def hostile_body(rng: random.Random) -> bytes:
    """Random bytes, or an envelope whose length, flags or payload lie."""
    noise = rng.randbytes(rng.randrange(0, 300))
    match rng.randrange(4):
        case 0:
            return noise
        case 1:  # a length that promises more than follows
            return struct.pack(">BI", 0, len(noise) + rng.randrange(1, 1 << 31)) + noise
        case 2:  # a compressed flag with no encoding, or an unknown flag
            return struct.pack(">BI", rng.choice([1, 2, 0x7F, 0xFF]), len(noise)) + noise
        case _:
            return struct.pack(">BI", 0, len(noise)) + noise


async def test_random_bodies_never_get_a_server_error(http: httpx2.AsyncClient) -> None:
    rng = random.Random(22)
    seen: set[int] = set()
    for _ in range(150):
        method = rng.choice(HOSTILE_METHODS)
        content_type = rng.choice(HOSTILE_CONTENT_TYPES)
        response = await http.post(
            method, content=hostile_body(rng), headers={"content-type": content_type}
        )
        no_traceback(response)
        assert response.status_code < 500, (method, content_type, response.text)
        seen.add(response.status_code)
    assert 400 in seen  # the corpus reached the unary decoders


async def test_a_malformed_stream_request_ends_the_stream_malformed_request(
    http: httpx2.AsyncClient,
) -> None:
    response = await http.post(RUN, content=envelope(b'{"input": '), headers=CONNECT_STREAM_JSON)
    stream = connect_stream(response.content, binary=False)
    assert stream.error is not None
    assert stream.error.error_info is not None
    assert stream.error.error_info.reason == "MALFORMED_REQUEST"


@pytest.mark.parametrize(
    "content_type", ["text/plain", "application/xml", "", "application/grpc+proto"]
)
async def test_an_unknown_content_type_is_refused_unsupported_media_type(
    http: httpx2.AsyncClient, content_type: str
) -> None:
    response = await http.post(LIST_AGENTS, content=b"{}", headers={"content-type": content_type})
    no_traceback(response)
    assert response.status_code == 415


async def test_an_unknown_method_is_not_found(http: httpx2.AsyncClient) -> None:
    response = await http.post("/agio.v1.AgentService/Nope", content=b"{}", headers=CONNECT_JSON)
    assert response.status_code == 404


async def test_a_body_over_the_message_limit_is_refused_resource_exhausted(
    tmp_path: Path, fake_model: FakeModelServer
) -> None:
    settings = http_settings(
        tmp_path,
        fake_model.base_url,
        server=ServerConfig(max_message_bytes=64 * 1024),
        agents=[AgentConfig(name="assistant", limits=LimitsConfig(max_step_bytes=16 * 1024))],
    )
    async with (
        serving(settings) as app,
        httpx2.AsyncClient(base_url=f"http://{app.http.address}") as http,  # type: ignore[union-attr]
    ):
        body = json.dumps({"sessionId": "x" * 100_000}).encode()
        response = await http.post(GET_SESSION, content=body, headers=CONNECT_JSON)
        no_traceback(response)
        assert response.status_code == 429
        assert wire_error(response.json()).code == "resource_exhausted"
        request = agent_service_pb2.RunRequest(input="y" * 100_000)
        streamed = await http.post(RUN, content=json_envelope(request), headers=CONNECT_STREAM_JSON)
        stream = connect_stream(streamed.content, binary=False)
        assert stream.error is not None
        assert stream.error.code == "resource_exhausted"


# -- the caller leaving --------------------------------------------------------------------


async def test_a_client_that_leaves_a_connect_stream_cancels_its_run(
    http: httpx2.AsyncClient, http_app: AgioApp, fake_model: FakeModelServer
) -> None:
    fake_model.enqueue(Turn.hanging())
    request = agent_service_pb2.RunRequest(input="wait for the model")
    async with http.stream(
        "POST", RUN, content=json_envelope(request), headers=CONNECT_STREAM_JSON
    ) as response:
        async for flags, payload in read_envelopes(response.aiter_bytes()):
            assert flags != END_STREAM
            run_id = json.loads(payload)["runId"]
            break
    async with AgioClient(http_app.address) as client:
        async for _ in client.follow_run(run_id, after_seq=0):
            pass
        run = await client.get_run(run_id)
    assert run.status == resources_pb2.RUN_STATUS_CANCELLED
    assert run.stop_signal.source == "client"


# -- authentication ------------------------------------------------------------------------


async def test_with_api_keys_a_call_needs_a_key_and_runs_in_its_tenant(
    tmp_path: Path, fake_model: FakeModelServer
) -> None:
    settings = auth_settings(
        sqlite_at(tmp_path / "agio.db"),
        fake_model.base_url,
        http_address="127.0.0.1:0",
        auth={"mode": "api_key", "api_key": {"cache_s": 0}},
    )
    async with serving(settings) as app:
        store = await open_roles(settings.database_url)
        try:
            keys: KeyStore = store.keys()
            issued = await keys.create("acme")
        finally:
            await store.close()
        assert app.http is not None
        async with httpx2.AsyncClient(base_url=f"http://{app.http.address}") as http:
            refused = await http.post(LIST_AGENTS, content=b"{}", headers=CONNECT_JSON)
            assert refused.status_code == 401
            error = wire_error(refused.json())
            assert error.code == "unauthenticated"
            assert error.error_info is not None
            assert error.error_info.reason == "CREDENTIALS_MISSING"
            # Refused before its request is looked at, as on gRPC.
            garbage = await http.post(GET_SESSION, content=b"{", headers=CONNECT_JSON)
            assert wire_error(garbage.json()).code == "unauthenticated"

            key = dict([bearer(issued.token)])
            response = await http.post(
                RUN,
                content=json_envelope(agent_service_pb2.RunRequest(input=WHOAMI)),
                headers={**CONNECT_STREAM_JSON, **key},
            )
        stream = connect_stream(response.content, binary=False)
        [tool] = [
            e.step_completed.step
            for e in stream.events
            if e.HasField("step_completed") and e.step_completed.step.name == "whoami"
        ]
        assert tool.content == f"acme|{issued.key.id}|api_key"


# -- CORS ----------------------------------------------------------------------------------


async def test_a_page_of_another_origin_is_refused(http: httpx2.AsyncClient) -> None:
    origin = {"origin": "https://elsewhere.example"}
    preflight = await http.options(
        LIST_AGENTS,
        headers={**origin, "access-control-request-method": "POST"},
    )
    assert preflight.status_code == 403
    assert "access-control-allow-origin" not in preflight.headers
    call = await http.post(LIST_AGENTS, content=b"{}", headers={**CONNECT_JSON, **origin})
    assert call.status_code == 403
    assert "access-control-allow-origin" not in call.headers
    assert wire_error(call.json()).code == "permission_denied"


async def test_a_page_of_an_allowed_origin_may_call(http: httpx2.AsyncClient) -> None:
    origin = {"origin": ALLOWED_ORIGIN}
    preflight = await http.options(
        LIST_AGENTS,
        headers={
            **origin,
            "access-control-request-method": "POST",
            "access-control-request-headers": "content-type,authorization,connect-protocol-version",
        },
    )
    assert preflight.status_code == 204
    assert preflight.headers["access-control-allow-origin"] == ALLOWED_ORIGIN
    assert "authorization" in preflight.headers["access-control-allow-headers"]
    call = await http.post(LIST_AGENTS, content=b"{}", headers={**CONNECT_JSON, **origin})
    assert call.status_code == 200
    assert call.headers["access-control-allow-origin"] == ALLOWED_ORIGIN
    assert "grpc-status" in call.headers["access-control-expose-headers"]


async def test_by_default_only_the_listeners_own_origin_may_call(
    tmp_path: Path, fake_model: FakeModelServer
) -> None:
    async with serving(http_settings(tmp_path, fake_model.base_url)) as app:
        assert app.http is not None
        base = f"http://{app.http.address}"
        async with httpx2.AsyncClient(base_url=base) as http:
            own = await http.post(
                LIST_AGENTS, content=b"{}", headers={**CONNECT_JSON, "origin": base}
            )
            other = await http.post(
                LIST_AGENTS, content=b"{}", headers={**CONNECT_JSON, "origin": ALLOWED_ORIGIN}
            )
    assert own.status_code == 200
    assert other.status_code == 403


async def test_a_page_under_a_rebound_name_is_not_of_the_listeners_origin(
    tmp_path: Path, fake_model: FakeModelServer
) -> None:
    """DNS rebinding: a page of `http://rebound.example:PORT`, its name resolved to
    127.0.0.1, sends that name as its Host; on a loopback listener it is another origin."""
    async with serving(http_settings(tmp_path, fake_model.base_url)) as app:
        assert app.http is not None
        port = app.http.port
        async with httpx2.AsyncClient(base_url=f"http://{app.http.address}") as http:
            rebound = await http.post(
                LIST_AGENTS,
                content=b"{}",
                headers={
                    **CONNECT_JSON,
                    "host": f"rebound.example:{port}",
                    "origin": f"http://rebound.example:{port}",
                },
            )
            localhost = await http.post(
                LIST_AGENTS,
                content=b"{}",
                headers={
                    **CONNECT_JSON,
                    "host": f"localhost:{port}",
                    "origin": f"http://localhost:{port}",
                },
            )
    assert rebound.status_code == 403
    assert wire_error(rebound.json()).code == "permission_denied"
    assert localhost.status_code == 200


# -- health and start-up -------------------------------------------------------------------


async def test_health_is_served_over_http_too(http: httpx2.AsyncClient) -> None:
    response = await http.post(
        "/grpc.health.v1.Health/Check", json={"service": "agio.v1.AgentService"}
    )
    assert response.json() == {"status": "SERVING"}


async def test_an_http_address_in_use_stops_the_start_naming_its_setting(
    tmp_path: Path, fake_model: FakeModelServer
) -> None:
    async with serving(http_settings(tmp_path, fake_model.base_url)) as first:
        assert first.http is not None
        taken = http_settings(tmp_path, fake_model.base_url, http_address=first.http.address)
        with pytest.raises(StartupError) as refused:
            await AgioApp.start(taken)
    assert "AGIO_HTTP_ADDRESS" in str(refused.value)


async def test_a_drain_ends_a_connect_stream_with_its_terminal_event(
    tmp_path: Path, fake_model: FakeModelServer
) -> None:
    """As on gRPC: health turns NOT_SERVING, and a run still going when the grace period is
    nearly over is interrupted, its stream ending with its terminal event."""
    fake_model.enqueue(Turn.hanging())
    app = await AgioApp.start(http_settings(tmp_path, fake_model.base_url))
    assert app.http is not None
    request = agent_service_pb2.RunRequest(input="wait for the model")
    stopping: asyncio.Future[None] | None = None
    try:
        async with httpx2.AsyncClient(base_url=f"http://{app.http.address}") as http:
            await app.bound.health.enter_graceful_shutdown()
            health = await http.post("/grpc.health.v1.Health/Check", json={})
            assert health.json() == {"status": "NOT_SERVING"}
            async with http.stream(
                "POST", RUN, content=json_envelope(request), headers=CONNECT_STREAM_JSON
            ) as response:
                received = read_envelopes(response.aiter_bytes())
                _, first = await anext(received)
                assert "runStarted" in json.loads(first)
                stopping = asyncio.ensure_future(app.stop(grace=1))
                rest = [item async for item in received]
    finally:
        await (stopping if stopping is not None else app.stop(grace=0))
    *events, (end_flags, end) = rest
    assert end_flags == END_STREAM
    assert json.loads(end) == {}
    terminal = json.loads(events[-1][1])
    run = (terminal.get("runFailed") or terminal.get("runCompleted"))["run"]
    assert run["stopSignal"]["reason"] == "STOP_REASON_INTERRUPTED"


def test_an_http_listener_other_machines_can_reach_needs_an_authentication_mode() -> None:
    loopback = Settings(listen_address="127.0.0.1:0", http_address="127.0.0.1:0")
    assert choose_auth_mode(loopback) == "none"
    exposed = Settings(listen_address="127.0.0.1:0", http_address="0.0.0.0:8080")
    with pytest.raises(StartupError, match=r"no authentication chosen for 0\.0\.0\.0:8080"):
        choose_auth_mode(exposed)
