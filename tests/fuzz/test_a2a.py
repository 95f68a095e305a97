"""The A2A endpoints under fuzz, on SQLite and PostgreSQL: random and hostile JSON-RPC
requests, HTTP+JSON requests (methods, paths, bodies) and gRPC `lf.a2a.v1` requests, some
aimed at a real task and context. Every HTTP answer is below 500 and is JSON (a result or
an A2A error; each SSE event too); no gRPC call ends INTERNAL or UNKNOWN.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import grpc
import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agio_grpc.service.app import AgioApp
from agio_grpc.testing import FakeModelServer
from tests.conftest import BACKENDS
from tests.fuzz.conftest import served
from tests.fuzz.harness import FAST_RETRIES, Tally, fuzz_settings
from tests.fuzz.profiles import BUDGET, REQUEST_SETTINGS

pytestmark = pytest.mark.timeout(BUDGET.timeout_s)

A2A_SETTINGS = settings(
    REQUEST_SETTINGS, max_examples=max(15, round(REQUEST_SETTINGS.max_examples * 0.4))
)
"""A2A's properties run 2 in 5 of a request property's examples (1,000 each under `fuzz`):
its answers are mostly the SDK's refusals, cheaper to cover than the engine's paths."""

TASK, CONTEXT = "<task>", "<context>"
"""Stand-ins for the real task and context the fixture made, put in at send time."""
RPC = "/a2a/assistant/"
METHODS = (
    "SendMessage",
    "SendStreamingMessage",
    "GetTask",
    "ListTasks",
    "CancelTask",
    "SubscribeToTask",
    "CreateTaskPushNotificationConfig",
    "GetTaskPushNotificationConfig",
    "ListTaskPushNotificationConfigs",
    "DeleteTaskPushNotificationConfig",
    "GetExtendedAgentCard",
)
GRPC_METHODS = tuple(m for m in METHODS if m != "GetExtendedAgentCard")
CALL_TIMEOUT_S = 15.0

hostile_text = st.one_of(
    st.text(max_size=40),
    st.sampled_from(["", "\x00", "a\x00b", "\ud800", "../../etc", "%00", "x" * 300, TASK]),
)
ids = st.one_of(st.sampled_from([TASK, CONTEXT, "run_missing", ""]), hostile_text)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | hostile_text,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=12,
)
parts = st.one_of(
    st.fixed_dictionaries({"text": hostile_text}),
    st.fixed_dictionaries({"data": json_values}),
    st.fixed_dictionaries({"url": hostile_text}),
    st.fixed_dictionaries({"raw": hostile_text}),
    json_values,
)
messages = st.fixed_dictionaries(
    {"messageId": ids, "role": st.sampled_from(["ROLE_USER", "ROLE_AGENT", "ROLE_X", 7])},
    optional={
        "parts": st.lists(parts, max_size=3),
        "contextId": ids,
        "taskId": ids,
        "metadata": json_values,
    },
)
params = st.one_of(
    st.fixed_dictionaries(
        {"message": messages},
        optional={
            "configuration": st.fixed_dictionaries(
                {},
                optional={
                    "historyLength": st.integers(-(2**40), 2**40),
                    "returnImmediately": st.booleans(),
                    "taskPushNotificationConfig": json_values,
                },
            ),
            "tenant": hostile_text,
        },
    ),
    st.fixed_dictionaries(
        {"id": ids},
        optional={
            "historyLength": st.integers(-(2**40), 2**40),
            "tenant": st.sampled_from(["", "assistant", "terse", "nobody", "\x00"]),
            "taskId": ids,
        },
    ),
    st.fixed_dictionaries(
        {},
        optional={
            "contextId": ids,
            "pageSize": st.integers(-(2**40), 2**40),
            "pageToken": hostile_text,
            "status": st.sampled_from(["TASK_STATE_COMPLETED", "NOPE", 99]),
            "includeArtifacts": json_values,
        },
    ),
    json_values,
)
json_rpc = st.fixed_dictionaries(
    {
        "jsonrpc": st.sampled_from(["2.0", "1.0", 2]),
        "method": st.one_of(st.sampled_from(METHODS), hostile_text),
        "params": params,
    },
    optional={"id": st.one_of(st.integers(), hostile_text, st.none())},
)
bodies = st.one_of(
    json_rpc.map(lambda value: ("json", value)),
    json_values.map(lambda value: ("json", value)),
    st.binary(max_size=200).map(lambda value: ("bytes", value)),
)
rest_paths = st.one_of(
    st.sampled_from(
        [
            "/message:send",
            "/message:stream",
            f"/tasks/{TASK}",
            f"/tasks/{TASK}:cancel",
            f"/tasks/{TASK}:subscribe",
            "/tasks",
            f"/tasks/{TASK}/pushNotificationConfigs",
            f"/tasks/{TASK}/pushNotificationConfigs/p1",
            f"/assistant/tasks/{TASK}",
            f"/nobody/tasks/{TASK}",
            "/extendedAgentCard",
        ]
    ),
    st.text(alphabet="/:abcdeflmnorst%0.-", max_size=30).map(lambda p: "/" + p),
)
rest_queries = st.dictionaries(
    st.sampled_from(["historyLength", "pageSize", "contextId", "status", "pageToken", "x"]),
    st.one_of(st.integers(-(2**40), 2**40).map(str), hostile_text),
    max_size=3,
)


@dataclass(slots=True)
class A2AService:
    backend: str
    loop: asyncio.AbstractEventLoop
    app: AgioApp
    http: httpx.AsyncClient
    channel: grpc.aio.Channel
    tally: Tally
    task_id: str
    context_id: str

    def __repr__(self) -> str:
        return f"A2AService({self.backend})"

    def aimed(self, value: Any) -> Any:
        """`value` with the stand-ins replaced by the real task and context."""
        if isinstance(value, str):
            return value.replace(TASK, self.task_id).replace(CONTEXT, self.context_id)
        if isinstance(value, list):
            return [self.aimed(v) for v in value]
        if isinstance(value, dict):
            return {k: self.aimed(v) for k, v in value.items()}
        return value

    def run(self, prop: str, work: Any) -> None:
        started = time.perf_counter()
        self.loop.run_until_complete(asyncio.wait_for(work, CALL_TIMEOUT_S))
        self.tally.count_case(self.backend, prop, time.perf_counter() - started)


@asynccontextmanager
async def serving(backend: str, url: str, tally: Tally) -> AsyncIterator[A2AService]:
    async with FakeModelServer() as model:
        settings = fuzz_settings(url, model.base_url)
        settings.http_address = "127.0.0.1:0"
        app = await AgioApp.start(settings)
        app.model.retry = FAST_RETRIES
        assert app.http is not None
        try:
            async with (
                httpx.AsyncClient(
                    base_url=f"http://{app.http.address}",
                    headers={"a2a-version": "1.0"},
                    timeout=CALL_TIMEOUT_S,
                ) as http,
                grpc.aio.insecure_channel(app.address) as channel,
            ):
                first = await http.post(
                    RPC,
                    json={
                        "jsonrpc": "2.0",
                        "id": 1,
                        "method": "SendMessage",
                        "params": {
                            "message": {
                                "messageId": "seed",
                                "role": "ROLE_USER",
                                "parts": [{"text": "hello"}],
                            }
                        },
                    },
                )
                task = first.json()["result"]["task"]
                yield A2AService(
                    backend,
                    asyncio.get_running_loop(),
                    app,
                    http,
                    channel,
                    tally,
                    task["id"],
                    task["contextId"],
                )
        finally:
            await app.stop(grace=0)


@pytest.fixture(scope="module", params=BACKENDS)
def a2a_service(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[A2AService]:
    yield from served(request, tmp_path_factory, serving)


def assert_json_answer(response: httpx.Response, sent: object) -> None:
    assert response.status_code < 500, f"{response.status_code} for {sent!r}: {response.text}"
    assert "Traceback" not in response.text
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        for line in response.text.splitlines():
            if line.startswith("data:"):
                json.loads(line.removeprefix("data:"))
    elif response.status_code not in (204, 304) and response.content:
        json.loads(response.content)


async def send_body(service: A2AService, path: str, method: str, body: tuple[str, Any]) -> None:
    kind, value = body
    content = (
        json.dumps(service.aimed(value)).encode("utf-8", "surrogatepass")
        if kind == "json"
        else value
    )
    response = await service.http.request(
        method, path, content=content, headers={"content-type": "application/json"}
    )
    assert_json_answer(response, value)


@A2A_SETTINGS
@given(body=bodies)
def test_a2a_json_rpc_answers_every_request_below_500(
    a2a_service: A2AService, body: tuple[str, Any]
) -> None:
    a2a_service.run("a2a json-rpc requests", send_body(a2a_service, RPC, "POST", body))


@A2A_SETTINGS
@given(
    method=st.sampled_from(["GET", "POST", "DELETE", "PUT"]),
    path=rest_paths,
    query=rest_queries,
    body=bodies,
)
def test_a2a_http_json_answers_every_request_below_500(
    a2a_service: A2AService,
    method: str,
    path: str,
    query: dict[str, str],
    body: tuple[str, Any],
) -> None:
    async def send() -> None:
        target = "/a2a/assistant" + a2a_service.aimed(path)
        # Percent-encoded by hand: a lone surrogate goes as the bytes no UTF-8 decodes.
        encoded = "&".join(
            f"{key}={quote(a2a_service.aimed(value).encode('utf-8', 'surrogatepass'))}"
            for key, value in query.items()
        )
        response = await a2a_service.http.request(
            method,
            f"{target}?{encoded}" if encoded else target,
            content=json.dumps(a2a_service.aimed(body[1])).encode("utf-8", "surrogatepass")
            if body[0] == "json"
            else body[1],
            headers={"content-type": "application/json"},
        )
        assert_json_answer(response, (method, target, query, body))

    a2a_service.run("a2a http+json requests", send())


@A2A_SETTINGS
@given(
    method=st.sampled_from(GRPC_METHODS),
    request=st.one_of(st.binary(max_size=200), params),
)
def test_a2a_grpc_never_answers_internal_or_unknown(
    a2a_service: A2AService, method: str, request: bytes | Any
) -> None:
    async def send() -> None:
        from a2a.types import a2a_pb2
        from google.protobuf import json_format

        if isinstance(request, bytes):
            data = request
        else:
            name = {
                "SendMessage": "SendMessageRequest",
                "SendStreamingMessage": "SendMessageRequest",
                "CreateTaskPushNotificationConfig": "TaskPushNotificationConfig",
            }.get(method, f"{method}Request")
            try:
                message = json_format.ParseDict(
                    a2a_service.aimed(request),
                    getattr(a2a_pb2, name)(),
                    ignore_unknown_fields=True,
                )
                data = message.SerializeToString()
            except Exception:
                return
        path = f"/lf.a2a.v1.A2AService/{method}"
        code = grpc.StatusCode.OK
        try:
            if method in ("SendStreamingMessage", "SubscribeToTask"):
                async for _ in a2a_service.channel.unary_stream(path)(data, timeout=10):
                    pass
            else:
                await a2a_service.channel.unary_unary(path)(data, timeout=10)
        except grpc.aio.AioRpcError as error:
            code = error.code()
        a2a_service.tally.count_code(a2a_service.backend, code)
        assert code not in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN), (
            f"{method} {request!r}: {code.name}"
        )

    a2a_service.run("a2a grpc requests", send())
