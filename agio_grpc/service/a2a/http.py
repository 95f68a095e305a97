"""A2A on the HTTP listener: agent cards, and the JSON-RPC and HTTP+JSON bindings.

| path | what |
|---|---|
| `GET /.well-known/agent-card.json` | the default agent's card |
| `GET /a2a/AGENT/.well-known/agent-card.json` | AGENT's card |
| `POST /a2a/AGENT/` | JSON-RPC 2.0 (`SendMessage`, `SendStreamingMessage` over SSE, ...) |
| `/a2a/AGENT/message:send`, `/a2a/AGENT/tasks/ID`, ... | HTTP+JSON |

The bindings are the SDK's own (`create_jsonrpc_routes`, `create_rest_routes`) over one
`AgentTasks` per agent. In front of them, `A2AEdge` does what the `agio.v1` interceptors do
for a call: it refuses a body larger than `server.max_message_bytes` (413), authenticates
the caller with the server's `Authenticator` (401 with an `ErrorInfo` reason, as
UNAUTHENTICATED is for `agio.v1`) and runs the request as that caller. Cards are public:
they are how a client learns that it must authenticate, and they show no instructions.
The listener's host and cross-origin policies apply as for every other path.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Sequence
from typing import Any, cast

import grpc
from a2a.server.request_handlers.response_helpers import agent_card_to_dict
from a2a.server.routes import create_jsonrpc_routes, create_rest_routes
from a2a.utils import errors as a2a_errors
from a2a.utils.constants import AGENT_CARD_WELL_KNOWN_PATH, JSONRPC_PARSE_ERROR_CODE
from a2a.utils.error_handlers import build_rest_error_payload
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from agio_grpc.config import AuthMode
from agio_grpc.domain import clean_text
from agio_grpc.engine.agents import AgentSpec
from agio_grpc.engine.runtime import Runtime
from agio_grpc.service.a2a.cards import agent_card, agent_path
from agio_grpc.service.a2a.handler import AgentTasks
from agio_grpc.service.a2a.push import PushNotifier
from agio_grpc.service.agent_service import AgentServicer
from agio_grpc.service.auth import Authenticator
from agio_grpc.service.errors import as_service_error
from agio_grpc.service.identity import ANONYMOUS, calling_as
from agio_grpc.service.validation import PageTokens

log = logging.getLogger(__name__)

A2A_PREFIX = "/a2a/"


def serves(path: str) -> bool:
    """Whether a request path is A2A's."""
    return path.startswith(A2A_PREFIX) or path == AGENT_CARD_WELL_KNOWN_PATH


class _Headers:
    """A request's headers as the `Authenticator`s read a call: its metadata and peer."""

    def __init__(self, scope: Scope) -> None:
        self._metadata = tuple(
            (name.decode("latin-1").lower(), value.decode("latin-1"))
            for name, value in scope.get("headers", ())
        )
        client = scope.get("client")
        self._peer = f"ipv4:{client[0]}:{client[1]}" if client else "unknown"

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._metadata

    def peer(self) -> str:
        return self._peer

    def auth_context(self) -> dict[str, list[bytes]]:
        return {}  # no TLS peer reaches the HTTP listener


_NOT_JSON = "the request body is not UTF-8 JSON"
_ESCAPED_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]")


def _cleaned(value: Any) -> Any:
    """`value` with every string (keys too) as the store keeps text (domain.clean_text)."""
    if isinstance(value, str):
        return clean_text(value)
    if isinstance(value, list):
        return [_cleaned(item) for item in value]
    if isinstance(value, dict):
        return {clean_text(key): _cleaned(item) for key, item in value.items()}
    return value


def checked_body(body: bytes) -> bytes | None:
    """The body as the bindings may see it, None when it is not UTF-8 JSON. JSON may spell
    a lone surrogate (`"\\ud800"`), which no UTF-8 can carry: the SDK would fail to answer
    a request holding one (500). Such a body is read and written again with U+FFFD in its
    place, as all text is stored."""
    if not body:
        return body
    try:
        text = body.decode()
    except UnicodeDecodeError:
        return None
    if not _ESCAPED_SURROGATE.search(body):
        return body
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return None
    return json.dumps(_cleaned(value), ensure_ascii=False).encode()


def _rpc_path(path: str) -> str:
    """The JSON-RPC endpoint of the agent whose path `path` is under."""
    agent = path.removeprefix(A2A_PREFIX).split("/", 1)[0]
    return f"{A2A_PREFIX}{agent}/"


async def _not_json(scope: Scope, send: Send) -> None:
    """The answer to a body that is not UTF-8 JSON: a JSON-RPC parse error on a JSON-RPC
    endpoint, else an HTTP+JSON 400."""
    if scope["path"] == _rpc_path(scope["path"]):
        error = {"code": JSONRPC_PARSE_ERROR_CODE, "message": _NOT_JSON}
        await _send_json(send, 200, {"jsonrpc": "2.0", "id": None, "error": error})
    else:
        payload = build_rest_error_payload(a2a_errors.InvalidRequestError(_NOT_JSON))
        await _send_json(send, 400, payload)


async def _send_json(
    send: Send, status: int, body: object, headers: Sequence[tuple[bytes, bytes]] = ()
) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), *headers],
        }
    )
    await send({"type": "http.response.body", "body": json.dumps(body).encode()})


async def _error(send: Send, status: int, code: str, message: str, reason: str) -> None:
    body = {
        "error": {
            "code": status,
            "status": code,
            "message": message,
            "details": [
                {
                    "@type": "type.googleapis.com/google.rpc.ErrorInfo",
                    "reason": reason,
                    "domain": "agio.dev",
                }
            ],
        }
    }
    challenge = [(b"www-authenticate", b'Bearer realm="agio"')] if status == 401 else []
    await _send_json(send, status, body, challenge)


class A2AEdge:
    """Body limit and authentication in front of the A2A bindings (cards pass)."""

    def __init__(self, app: ASGIApp, authenticator: Authenticator | None, max_bytes: int) -> None:
        self._app = app
        self._authenticator = authenticator
        self._max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"].endswith(AGENT_CARD_WELL_KNOWN_PATH):
            await self._app(scope, receive, send)
            return
        # The caller first: a request nobody may make is refused before its body is read.
        caller = ANONYMOUS
        if self._authenticator is not None:
            try:
                caller = await self._authenticator.authenticate(
                    cast(grpc.aio.ServicerContext, _Headers(scope))
                )
            except Exception as error:
                await _drain(receive, self._max_bytes)
                await _refuse(scope, send, error)
                return
        body = await _body(receive, send, self._max_bytes)
        if body is None:
            return
        checked = checked_body(body)
        if checked is None:
            # Refused here: the bindings would answer with a 500, or log a traceback.
            await _not_json(scope, send)
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": checked, "more_body": False}
            return await receive()

        with calling_as(caller):
            await self._app(scope, replay, send)


async def _drain(receive: Receive, max_bytes: int) -> None:
    """Read the request's body to its end (up to `max_bytes`), keeping none of it: a client
    still sending when the answer comes would see its connection reset, not the answer."""
    seen, more = 0, True
    while more and seen <= max_bytes:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
        seen += len(message.get("body", b""))
        more = message.get("more_body", False)


async def _refuse(scope: Scope, send: Send, error: Exception) -> None:
    """401 (or 503: the credential cannot be checked now), logged without the credential."""
    refusal = as_service_error(error)
    log.info(
        "refused A2A %s %s: %s %s (%s)",
        scope["method"],
        scope["path"],
        refusal.code.name,
        refusal.reason,
        refusal.message,
    )
    status = 401 if refusal.code is grpc.StatusCode.UNAUTHENTICATED else 503
    await _error(send, status, refusal.code.name, refusal.message, refusal.reason)


async def _body(receive: Receive, send: Send, max_bytes: int) -> bytes | None:
    """The whole request body; None when the client left or it was over `max_bytes` (413
    sent)."""
    body = bytearray()
    more = True
    while more:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        body += message.get("body", b"")
        more = message.get("more_body", False)
        if len(body) > max_bytes:
            await _error(
                send,
                413,
                "INVALID_ARGUMENT",
                f"the request body is larger than {max_bytes} bytes",
                "MESSAGE_TOO_LARGE",
            )
            return None
    return bytes(body)


async def _not_routed(request: Request, error: Exception) -> Response:
    """A path no A2A route has, or a method its route does not take: an HTTP+JSON error."""
    assert isinstance(error, HTTPException)
    status = "NOT_FOUND" if error.status_code == 404 else "UNIMPLEMENTED"
    message = "no such A2A endpoint" if error.status_code == 404 else "method not allowed"
    body = {"error": {"code": error.status_code, "status": status, "message": message}}
    return JSONResponse(body, error.status_code, headers=error.headers)


def _base_url(request: Request) -> str:
    return f"{request.url.scheme}://{request.url.netloc}"


def a2a_application(
    runtime: Runtime,
    servicer: AgentServicer,
    pages: PageTokens,
    push: PushNotifier,
    *,
    authenticator: Authenticator | None,
    auth_mode: AuthMode,
    grpc_port: int,
    max_bytes: int,
    traced: Callable[[ASGIApp], ASGIApp] = lambda app: app,
    grace_s: float = 0.0,
) -> ASGIApp:
    """The A2A application of the HTTP listener (paths for which `serves` is true), each
    request in the server span `traced` starts (outermost, so a refusal is on it too)."""

    def card_of(agent: AgentSpec) -> Callable[[Request], Any]:
        async def card(request: Request) -> Response:
            host = request.url.hostname or "localhost"
            found = agent_card(
                agent,
                runtime.registry,
                http_base=_base_url(request),
                grpc_target=f"{host}:{grpc_port}" if ":" not in host else f"[{host}]:{grpc_port}",
                auth_mode=auth_mode,
            )
            return JSONResponse(agent_card_to_dict(found))

        return card

    routes: list[BaseRoute] = [
        Route(AGENT_CARD_WELL_KNOWN_PATH, card_of(runtime.agent()), methods=["GET"])
    ]
    for agent in runtime.agents.values():
        tasks = AgentTasks(runtime, servicer, pages, push, agent.name)
        served: Sequence[BaseRoute] = [
            Route(AGENT_CARD_WELL_KNOWN_PATH, card_of(agent), methods=["GET"]),
            *create_jsonrpc_routes(tasks, "/", shutdown_grace_period=grace_s),
            *create_rest_routes(tasks, shutdown_grace_period=grace_s),
        ]
        routes.append(Mount(agent_path(agent.name).rstrip("/"), routes=list(served)))
    handlers = {404: _not_routed, 405: _not_routed}
    starlette = Starlette(routes=routes, exception_handlers=handlers)
    return traced(A2AEdge(starlette, authenticator, max_bytes))


class A2ARouter:
    """A2A's paths to `a2a`, every other one to `rest`."""

    def __init__(self, a2a: ASGIApp, rest: ASGIApp) -> None:
        self._a2a = a2a
        self._rest = rest

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and serves(scope["path"]):
            await self._a2a(scope, receive, send)
        else:
            await self._rest(scope, receive, send)
