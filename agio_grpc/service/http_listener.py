"""The HTTP listener (`AGIO_HTTP_ADDRESS`): the gRPC server's handlers for browsers and any
HTTP/1.1 client, over Connect and gRPC-Web (service/connect.py), in the same process and
event loop as the gRPC server.

Served by uvicorn on a socket bound here (so that a port of 0 is picked and reported, and a
taken one refused with the same OSError as the gRPC port). In front of the Connect
application, `CrossOriginPolicy` decides which web pages may call: a request from a page of
another origin is refused (403, a Connect `permission_denied` error) unless that origin is in
`http.allowed_origins`; requests from the listener's own origin and from clients that are not
browsers (no `Origin` header) pass. Plain gRPC (`application/grpc`) is refused with 415: it
needs HTTP/2 trailers, and has the gRPC port.

Shutdown mirrors the gRPC server's: stop accepting, let calls end within the grace period
(runs are interrupted meanwhile, so their streams end with their terminal event), then cancel
what is left. It never installs signal handlers: the service's own decide when to stop.
"""

from __future__ import annotations

import json
import logging
import math
import re
import socket
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
import uvicorn
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer

from agio_grpc.config import HttpConfig, Settings
from agio_grpc.service.auth import is_loopback
from agio_grpc.service.connect import ConnectApplication, ConnectGateway, HandlerTable
from agio_grpc.service.console import ConsolePages
from agio_grpc.service.server import method_interceptors
from agio_grpc.v1 import agent_service_pb2, session_service_pb2

log = logging.getLogger(__name__)

SERVICES = (
    agent_service_pb2.DESCRIPTOR.services_by_name["AgentService"],
    session_service_pb2.DESCRIPTOR.services_by_name["SessionService"],
    health_pb2.DESCRIPTOR.services_by_name["Health"],
)
"""What the listener serves: the two agio.v1 services, and health checking (the gRPC
server's `HealthServicer`, so both listeners report the same status)."""

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
AsgiApp = Callable[[Scope, Receive, Send], Awaitable[None]]

PREFLIGHT_MAX_AGE_S = 7200
ALLOWED_METHODS = "GET, POST"
EXPOSED_HEADERS = ", ".join(
    (
        "grpc-status",
        "grpc-message",
        "grpc-status-details-bin",
        "connect-content-encoding",
        "content-encoding",
        "x-agio-worker",
    )
)
"""Response headers a page may read: those of gRPC-Web's status and Connect's encoding."""


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return bytes(value).decode("latin-1")
    return None


async def _respond(
    send: Send, status: int, headers: list[tuple[bytes, bytes]], body: bytes = b""
) -> None:
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


def _connect_error_body(code: str, message: str) -> bytes:
    return json.dumps({"code": code, "message": message}).encode()


class CrossOriginPolicy:
    """CORS: which pages may call. Same-origin only unless `allowed_origins` names others
    (`*`: any page, for development).

    On a loopback listener a page is of the listener's own origin only under a loopback
    name (`localhost`, `127.0.0.1`, `[::1]`): a page of `http://attacker.example:8080` whose
    name was made to resolve to 127.0.0.1 (DNS rebinding) sends that name as its Host, and
    must not pass for the console."""

    def __init__(self, app: AsgiApp, allowed_origins: list[str], *, loopback: bool) -> None:
        self._app = app
        self._any = "*" in allowed_origins
        self._allowed = frozenset(origin.rstrip("/") for origin in allowed_origins)
        self._loopback = loopback

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        origin = _header(scope, b"origin")
        if origin is None or origin == self._own_origin(scope):
            await _refuse_plain_grpc(self._app, scope, receive, send)
            return
        if not (self._any or origin in self._allowed):
            log.info("refused a request from origin %r (not in http.allowed_origins)", origin)
            await _respond(
                send,
                403,
                [(b"content-type", b"application/json"), (b"vary", b"Origin")],
                _connect_error_body(
                    "permission_denied",
                    f"origin {origin!r} may not call this server (http.allowed_origins)",
                ),
            )
            return
        cors = [
            (b"access-control-allow-origin", origin.encode("latin-1")),
            (b"vary", b"Origin"),
        ]
        if scope["method"] == "OPTIONS" and _header(scope, b"access-control-request-method"):
            requested = _header(scope, b"access-control-request-headers") or ""
            await _respond(
                send,
                204,
                [
                    *cors,
                    (b"access-control-allow-methods", ALLOWED_METHODS.encode()),
                    (b"access-control-allow-headers", requested.encode("latin-1")),
                    (b"access-control-max-age", str(PREFLIGHT_MAX_AGE_S).encode()),
                ],
            )
            return

        async def send_with_cors(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [
                    *message.get("headers", ()),
                    *cors,
                    (b"access-control-expose-headers", EXPOSED_HEADERS.encode()),
                ]
            await send(message)

        await _refuse_plain_grpc(self._app, scope, receive, send_with_cors)

    def _own_origin(self, scope: Scope) -> str | None:
        """The origin of the request's own URL (None when it has no Host, or a name that
        cannot be the loopback listener's own)."""
        host = _header(scope, b"host")
        if host is None:
            return None
        with_port = host if re.search(r":\d+$", host) else f"{host}:0"
        if self._loopback and not is_loopback(with_port):
            return None
        return f"{scope.get('scheme', 'http')}://{host}"


async def _refuse_plain_grpc(app: AsgiApp, scope: Scope, receive: Receive, send: Send) -> None:
    content_type = (_header(scope, b"content-type") or "").lower()
    if content_type.startswith("application/grpc") and not content_type.startswith(
        "application/grpc-web"
    ):
        await _respond(
            send,
            415,
            [(b"accept-post", b"application/json, application/proto, application/grpc-web")],
        )
        return
    await app(scope, receive, send)


class _Contained:
    """Whatever escapes the application is logged here and answered 500 without a body
    (uvicorn would log it as its own); the service's errors never get this far."""

    def __init__(self, app: AsgiApp) -> None:
        self._app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = False

        async def tracking(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self._app(scope, receive, tracking)
        except Exception:
            log.exception("HTTP request %s failed", scope.get("path"))
            if not started:
                await _respond(send, 500, [(b"content-length", b"0")])


def bind_socket(address: str, *, share_port: bool = False) -> socket.socket:
    """A listening TCP socket on `host:port` (port 0 picks one); OSError when it cannot."""
    host, _, port = address.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        # Accepted connections inherit it: uvicorn writes a response's head and body
        # apart, and with Nagle on a kept-alive connection the body waits ~40 ms for
        # the client's delayed ACK of the head.
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if share_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, int(port)))
        sock.listen(2048)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


@dataclass(slots=True)
class HttpListener:
    """A started HTTP listener."""

    server: uvicorn.Server
    sock: socket.socket
    address: str
    """host:port it listens on (the port it picked for a port of 0)."""

    @property
    def port(self) -> int:
        port: int = self.sock.getsockname()[1]
        return port

    @classmethod
    async def start(
        cls, app: AsgiApp, address: str, config: HttpConfig, *, share_port: bool = False
    ) -> HttpListener:
        """Serve `app` behind the cross-origin policy; OSError when `address` cannot be
        bound."""
        sock = bind_socket(address, share_port=share_port)
        server = uvicorn.Server(
            uvicorn.Config(
                _Contained(
                    CrossOriginPolicy(
                        ConsolePages(app, config),
                        config.allowed_origins,
                        loopback=is_loopback(address),
                    )
                ),
                http="h11",
                ws="none",
                lifespan="off",
                log_config=None,
                access_log=False,
                server_header=False,
                timeout_keep_alive=config.keep_alive_s,
            )
        )
        # What uvicorn's `serve` does before `startup`, without its signal handlers.
        server.config.load()
        server.lifespan = server.config.lifespan_class(server.config)
        try:
            await server.startup(sockets=[sock])
        except BaseException:
            sock.close()
            raise
        host = address.rpartition(":")[0]
        return cls(server, sock, f"{host}:{sock.getsockname()[1]}")

    async def stop(self, grace_s: float) -> None:
        """Stop accepting, let calls end within `grace_s`, then cancel those left."""
        # uvicorn reports a wait that timed out as an error even when nothing was left to
        # cancel: with no call in flight, idle connections close at once, within a second.
        busy = bool(self.server.server_state.tasks)
        grace = math.ceil(max(grace_s, 0.0))
        self.server.config.timeout_graceful_shutdown = grace if busy else max(grace, 1)
        await self.server.shutdown(sockets=[self.sock])


async def serve_over_http(
    settings: Settings,
    register: list[tuple[object, object]],
    interceptors: Sequence[grpc.aio.ServerInterceptor],
    health: HealthServicer,
    *,
    share_port: bool = False,
    response_metadata: tuple[tuple[str, str], ...] = (),
) -> HttpListener:
    """Start the HTTP listener on `settings.http_address` with the handlers and interceptors
    the gRPC server has (`register` and `interceptors` as `start_grpc_server` takes them),
    and its `health`. OSError when the address cannot be bound."""
    assert settings.http_address is not None
    table = HandlerTable()
    for add, servicer in register:
        add(servicer, table)  # type: ignore[operator]
    health_pb2_grpc.add_HealthServicer_to_server(health, table)
    gateway = ConnectGateway(table, method_interceptors(interceptors, response_metadata), SERVICES)
    app = ConnectApplication(gateway, read_max_bytes=settings.server.max_message_bytes)
    return await HttpListener.start(
        app, settings.http_address, settings.http, share_port=share_port
    )
