"""The HTTP listener (`AGIO_HTTP_ADDRESS`): the gRPC server's handlers for browsers and any
HTTP client, over Connect and gRPC-Web (service/connect.py), in the same process and event
loop as the gRPC server.

Served by hypercorn on a socket bound here (so that a port of 0 is picked and reported, and a
taken one refused with the same OSError as the gRPC port), over HTTP/1.1 and cleartext
HTTP/2 (h2c, with prior knowledge or by `Upgrade`): bidirectional streams need HTTP/2, and
`buf curl` asks server reflection (a bidirectional stream) over it. In front of the Connect
application, `HostPolicy` refuses a request naming a host the listener does not answer for
(403 `HOST_NOT_ALLOWED`: a page of a name made to resolve to this server, DNS rebinding,
names its own), then `CrossOriginPolicy` decides which web pages may call: a request from a page of
another origin is refused (403, a Connect `permission_denied` error) unless that origin is in
`http.allowed_origins`; requests from the listener's own origin and from clients that are not
browsers (no `Origin` header) pass. Plain gRPC (`application/grpc`) is served over HTTP/2
only, and refused with 415 over HTTP/1.1, which has no trailers for its status.

Shutdown mirrors the gRPC server's: stop accepting, let calls end within the grace period
(runs are interrupted meanwhile, so their streams end with their terminal event), then cancel
what is left. It never installs signal handlers: the service's own decide when to stop.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import logging
import re
import socket
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import grpc
from connectrpc._protocol import ConnectWireError
from google.protobuf.descriptor import ServiceDescriptor
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer
from hypercorn.app_wrappers import ASGIWrapper
from hypercorn.asyncio.tcp_server import TCPServer
from hypercorn.asyncio.worker_context import WorkerContext
from hypercorn.config import Config as HypercornConfig
from hypercorn.typing import ASGIFramework

from agio_grpc.config import HttpConfig, Settings
from agio_grpc.service.a2a.http import A2ARouter
from agio_grpc.service.auth import is_loopback, reflection_enabled
from agio_grpc.service.connect import (
    ConnectApplication,
    ConnectGateway,
    HandlerTable,
    status_error,
)
from agio_grpc.service.console import ConsolePages
from agio_grpc.service.errors import host_not_allowed, to_status
from agio_grpc.service.reflection import REFLECTION_SERVICE, enable_reflection
from agio_grpc.service.server import method_interceptors
from agio_grpc.v1 import agent_service_pb2, session_service_pb2

log = logging.getLogger(__name__)
SERVER_LOG = logging.getLogger(f"{__name__}.hypercorn")
# hypercorn's INFO line ("Running on ...") would repeat the service's own listening line.
SERVER_LOG.setLevel(logging.WARNING)

SERVICES = (
    agent_service_pb2.DESCRIPTOR.services_by_name["AgentService"],
    session_service_pb2.DESCRIPTOR.services_by_name["SessionService"],
    health_pb2.DESCRIPTOR.services_by_name["Health"],
)
"""What the listener serves: the two agio.v1 services, and health checking (the gRPC
server's `HealthServicer`, so both listeners report the same status); and server reflection
when the gRPC server serves it (`server.reflection`)."""

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
AsgiApp = Callable[[Scope, Receive, Send], Awaitable[None]]

LISTEN_BACKLOG = 2048
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


def host_name(value: str) -> str:
    """The host of a `Host` header or `:authority` (`name:port`, `[v6]:port`), lowercased,
    without its port or a trailing dot."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[1 : value.find("]")] if "]" in value else value
    name, colon, port = value.rpartition(":")
    if colon and port.isdigit() and ":" not in name:
        value = name
    return value.removesuffix(".")


def _is_ip_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


WILDCARD_HOSTS = frozenset({"", "0.0.0.0", "::"})


def own_host_names(settings: Settings) -> frozenset[str]:
    """The names the HTTP listener answers to without `http.allowed_hosts`: its bound host,
    the gRPC listener's and the advertised member address's hosts, the machine's name when
    it listens on every interface, and `localhost` there or on loopback (IP addresses are
    always answered: a page's origin is never an address of someone else's that reaches
    this server)."""
    assert settings.http_address is not None
    bound = host_name(settings.http_address)
    hosts = {bound}
    for address in (settings.listen_address, settings.server.member_advertise_address):
        if address:
            hosts.add(host_name(address))
    if bound in WILDCARD_HOSTS:
        hosts.add(socket.gethostname().lower())
    if bound in WILDCARD_HOSTS or is_loopback(settings.http_address):
        hosts.add("localhost")
    return frozenset(hosts - WILDCARD_HOSTS)


class HostPolicy:
    """Refuses a request whose `Host` (HTTP/2: `:authority`) names neither an IP address
    nor one of `own_names`, nor matches `allowed` (`http.allowed_hosts`); a request naming
    no host (HTTP/1.0) passes."""

    def __init__(self, app: AsgiApp, own_names: frozenset[str], allowed: Sequence[str]) -> None:
        self._app = app
        self._any = "*" in allowed
        self._names = own_names | {pattern for pattern in allowed if "*" not in pattern}
        self._domains = tuple(pattern[1:] for pattern in allowed if pattern.startswith("*."))

    def allows(self, host: str) -> bool:
        return (
            self._any or host in self._names or host.endswith(self._domains) or _is_ip_address(host)
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        named = _header(scope, b"host") or _header(scope, b":authority")
        if named is None or self.allows(host_name(named)):
            await self._app(scope, receive, send)
            return
        refusal = host_not_allowed(host_name(named))
        log.info(
            "refused a request for host %r (not in http.allowed_hosts)", refusal.metadata["host"]
        )
        wire = ConnectWireError.from_exception(status_error(to_status(refusal)))
        await _respond(
            send,
            int(wire.to_http_status().code),
            [(b"content-type", b"application/json")],
            wire.to_json_bytes(),
        )


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
    """gRPC over HTTP/1.1 is refused: its status goes in trailers, which HTTP/1.1 has not."""
    content_type = (_header(scope, b"content-type") or "").lower()
    if (
        content_type.startswith("application/grpc")
        and not content_type.startswith("application/grpc-web")
        and scope.get("http_version") != "2"
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
    (hypercorn would log it as its own); the service's errors never get this far."""

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


class _RequestReadBeforeResponseEnds:
    """Over HTTP/2, a response that ends before its request's body ended (a refusal, an
    unknown path) first reads the rest of the body.

    hypercorn 0.18 forgets a stream once its response ended, and a DATA frame of the request
    arriving after that fails the whole connection with a KeyError (and a traceback in the
    log): `buf curl` asking `grpc.reflection.v1`, which is not served, did it every time.
    Once the request's END_STREAM (or a reset) is in, no frame of it can follow."""

    def __init__(self, app: AsgiApp) -> None:
        self._app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("http_version") != "2":
            await self._app(scope, receive, send)
            return
        request_over = False
        trailers = False

        async def tracked_receive() -> Message:
            nonlocal request_over
            message = await receive()
            request_over = request_over or not (
                message["type"] == "http.request" and message.get("more_body", False)
            )
            return message

        async def send_when_read(message: Message) -> None:
            nonlocal trailers
            kind = message["type"]
            if kind == "http.response.start":
                trailers = bool(message.get("trailers", False))
            ends = (
                kind == "http.response.body" and not message.get("more_body") and not trailers
            ) or (kind == "http.response.trailers" and not message.get("more_trailers"))
            while ends and not request_over:
                await tracked_receive()
            await send(message)

        await self._app(scope, tracked_receive, send_when_read)


def bind_socket(address: str, *, share_port: bool = False) -> socket.socket:
    """A listening TCP socket on `host:port` (port 0 picks one); OSError when it cannot."""
    host, _, port = address.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        # Accepted connections inherit it: a response's head and body are written apart,
        # and with Nagle on a kept-alive connection the body waits ~40 ms for the
        # client's delayed ACK of the head.
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if share_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, int(port)))
        sock.listen(LISTEN_BACKLOG)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


@dataclass(slots=True)
class HttpListener:
    """A started HTTP listener: hypercorn's connection handling (HTTP/1.1, h2c) on our own
    accept loop, which shuts down as the gRPC server does."""

    server: asyncio.Server
    config: HypercornConfig
    context: WorkerContext
    connections: set[asyncio.Task[None]]
    sock: socket.socket
    address: str
    """host:port it listens on (the port it picked for a port of 0)."""

    @property
    def port(self) -> int:
        port: int = self.sock.getsockname()[1]
        return port

    @classmethod
    async def start(
        cls,
        app: AsgiApp,
        address: str,
        config: HttpConfig,
        *,
        own_names: frozenset[str],
        share_port: bool = False,
    ) -> HttpListener:
        """Serve `app` behind the host and cross-origin policies (`own_names`: the hosts it
        answers to besides `config.allowed_hosts`); OSError when `address` cannot be
        bound."""
        sock = bind_socket(address, share_port=share_port)
        served = ASGIWrapper(
            cast(
                ASGIFramework,
                _RequestReadBeforeResponseEnds(
                    _Contained(
                        HostPolicy(
                            CrossOriginPolicy(
                                ConsolePages(app, config),
                                config.allowed_origins,
                                loopback=is_loopback(address),
                            ),
                            own_names,
                            config.allowed_hosts,
                        )
                    )
                ),
            )
        )
        settings = HypercornConfig()
        settings.keep_alive_timeout = config.keep_alive_s
        settings.include_server_header = False
        settings.accesslog = None
        settings.errorlog = SERVER_LOG
        context = WorkerContext(None)
        connections: set[asyncio.Task[None]] = set()
        loop = asyncio.get_running_loop()

        async def connected(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            task = asyncio.current_task()
            assert task is not None
            connections.add(cast(asyncio.Task[None], task))
            task.add_done_callback(connections.discard)
            # A connection still open past the grace period is cancelled; on Python 3.11,
            # asyncio logs a cancelled connection task as an unhandled error.
            with contextlib.suppress(asyncio.CancelledError):
                await TCPServer(served, loop, settings, context, {}, reader, writer)

        try:
            server = await asyncio.start_server(connected, sock=sock, backlog=LISTEN_BACKLOG)
        except BaseException:
            sock.close()
            raise
        host = address.rpartition(":")[0]
        return cls(server, settings, context, connections, sock, f"{host}:{sock.getsockname()[1]}")

    async def stop(self, grace_s: float) -> None:
        """Stop accepting, let calls end within `grace_s`, then cancel those left."""
        self.server.close()
        # Idle connections close now, and busy ones once their calls end (HTTP/2: GOAWAY).
        await self.context.terminated.set()
        if self.connections:
            await asyncio.wait(set(self.connections), timeout=max(grace_s, 0.0))
        left = set(self.connections)
        for task in left:
            task.cancel()
        await asyncio.gather(*left, return_exceptions=True)
        self.sock.close()


async def serve_over_http(
    settings: Settings,
    register: list[tuple[object, object]],
    interceptors: Sequence[grpc.aio.ServerInterceptor],
    health: HealthServicer,
    *,
    share_port: bool = False,
    response_metadata: tuple[tuple[str, str], ...] = (),
    a2a: AsgiApp | None = None,
) -> HttpListener:
    """Start the HTTP listener on `settings.http_address` with the handlers and interceptors
    the gRPC server has (`register` and `interceptors` as `start_grpc_server` takes them),
    its `health`, and server reflection when the gRPC server has it; `a2a` serves A2A's
    paths (service/a2a/http.py). OSError when the address
    cannot be bound."""
    assert settings.http_address is not None
    table = HandlerTable()
    for add, servicer in register:
        add(servicer, table)  # type: ignore[operator]
    health_pb2_grpc.add_HealthServicer_to_server(health, table)
    services: tuple[ServiceDescriptor, ...] = SERVICES
    # The service started, so an unset mode was `none` (auth.choose_auth_mode).
    if reflection_enabled(settings, settings.auth.mode or "none"):
        enable_reflection(table, [service.full_name for service in SERVICES])
        services = (*SERVICES, REFLECTION_SERVICE)
    gateway = ConnectGateway(table, method_interceptors(interceptors, response_metadata), services)
    app: AsgiApp = ConnectApplication(gateway, read_max_bytes=settings.server.max_message_bytes)
    if a2a is not None:
        app = A2ARouter(a2a, app)
    return await HttpListener.start(
        app,
        settings.http_address,
        settings.http,
        own_names=own_host_names(settings),
        share_port=share_port,
    )
