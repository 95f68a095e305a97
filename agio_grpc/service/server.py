"""Server bootstrap: build the grpc.aio server, run it, and drain it on SIGTERM.

Start-up order: open the store (migrations run), build the engine runtime, register the
servicers, health (SERVING) and reflection (when asked for), bind (plaintext, or TLS with the
credentials of service/tls.py). Shutdown order (DESIGN.md section 4 and the gRPC notes):
health NOT_SERVING -> stop accepting and let calls finish within the grace period ->
interrupt runs still active -> close the store.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import grpc
from a2a.types import a2a_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer

from agio_grpc.config import ServerConfig, Settings
from agio_grpc.service.interceptors import ErrorInterceptor
from agio_grpc.service.reflection import enable_reflection
from agio_grpc.v1 import agent_service_pb2, session_service_pb2

log = logging.getLogger(__name__)

SERVICE_NAMES = (
    agent_service_pb2.DESCRIPTOR.services_by_name["AgentService"].full_name,
    session_service_pb2.DESCRIPTOR.services_by_name["SessionService"].full_name,
)
A2A_SERVICE_NAME = a2a_pb2.DESCRIPTOR.services_by_name["A2AService"].full_name


def server_options(config: ServerConfig, *, share_port: bool = False) -> list[tuple[str, int]]:
    """Channel arguments: explicit limits, keepalive, and no silent port sharing (unless
    `share_port`: the workers of one supervisor, which checked the port and holds it)."""
    return [
        # A second server on the same port must fail to bind, not share it silently.
        ("grpc.so_reuseport", int(share_port)),
        ("grpc.max_receive_message_length", config.max_message_bytes),
        ("grpc.max_send_message_length", config.max_message_bytes),
        ("grpc.keepalive_time_ms", int(config.keepalive_time_s * 1000)),
        ("grpc.keepalive_timeout_ms", int(config.keepalive_timeout_s * 1000)),
        ("grpc.keepalive_permit_without_calls", 1),
        (
            "grpc.http2.min_ping_interval_without_data_ms",
            int(config.min_client_ping_interval_s * 1000),
        ),
        ("grpc.max_connection_idle_ms", int(config.max_connection_idle_s * 1000)),
        ("grpc.server_max_unrequested_time_in_server", config.max_call_queue_time_s),
        # gRPC's own defaults (1,000, then 3,000) cancel calls beyond them with a bare
        # CANCELLED before they reach the service: ~10% of a burst of 2,000 calls.
        ("grpc.server.max_pending_requests", config.max_pending_calls),
        ("grpc.server.max_pending_requests_hard_limit", config.max_pending_calls),
    ]


def method_interceptors(
    interceptors: Sequence[grpc.aio.ServerInterceptor],
    response_metadata: tuple[tuple[str, str], ...] = (),
) -> list[grpc.aio.ServerInterceptor]:
    """Every interceptor of a call, outermost first: `interceptors`, then the error mapping.
    The gRPC server and the HTTP listener (service/http_listener.py) both serve with these."""
    return [*interceptors, ErrorInterceptor(response_metadata)]


@dataclass(slots=True)
class BoundServer:
    """A started server and what shutting it down needs."""

    server: grpc.aio.Server
    health: HealthServicer
    port: int
    address: str


async def start_grpc_server(
    settings: Settings,
    register: list[tuple[object, object]],
    interceptors: Sequence[grpc.aio.ServerInterceptor] = (),
    *,
    reflection: bool = True,
    credentials: grpc.ServerCredentials | None = None,
    share_port: bool = False,
    response_metadata: tuple[tuple[str, str], ...] = (),
) -> BoundServer:
    """Create, register and bind the server; `register` pairs an add_*_to_server function
    with its servicer; `interceptors` go before the error mapping (tracing first, so the
    status it maps is on the span); `reflection` serves server reflection; with
    `credentials` the port speaks TLS only; `share_port` binds with SO_REUSEPORT (a worker);
    `response_metadata` starts every `agio.v1` response. Raises OSError when the address
    cannot be bound."""
    config = settings.server
    server = grpc.aio.server(
        interceptors=method_interceptors(interceptors, response_metadata),
        options=server_options(config, share_port=share_port),
        maximum_concurrent_rpcs=config.max_concurrent_rpcs,
    )
    for add, servicer in register:
        add(servicer, server)  # type: ignore[operator]
    health = HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    if reflection:
        enable_reflection(
            server,
            (
                *SERVICE_NAMES,
                A2A_SERVICE_NAME,
                health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
            ),
        )
    try:
        if credentials is None:
            port = server.add_insecure_port(settings.listen_address)
        else:
            port = server.add_secure_port(settings.listen_address, credentials)
    except RuntimeError as error:  # grpc reports a failed bind this way
        raise OSError(f"could not bind {settings.listen_address}: address in use?") from error
    if port == 0:
        raise OSError(f"could not bind {settings.listen_address}")
    await server.start()
    for name in ("", *SERVICE_NAMES, A2A_SERVICE_NAME):
        await health.set(name, health_pb2.HealthCheckResponse.SERVING)
    host = settings.listen_address.rpartition(":")[0]
    return BoundServer(server=server, health=health, port=port, address=f"{host}:{port}")


def install_signal_handlers(
    stop: asyncio.Event, reload: Callable[[], object] | None = None
) -> None:
    """SIGTERM and SIGINT set `stop`; a second signal is left to the default handler.
    SIGHUP calls `reload` when there is one (else it keeps its default: the process ends)."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if reload is not None:
        loop.add_signal_handler(signal.SIGHUP, reload)
