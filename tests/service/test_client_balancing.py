"""One client, several servers: the Python client's target and its round_robin balancing."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

from agio_grpc.client import AddressError, AgioClient, channel_target
from agio_grpc.handlers import AgioMethodInterceptor, Behavior, rewrap_handler
from agio_grpc.service.app import AgioApp
from agio_grpc.testing import FakeModelServer
from tests.service.conftest import make_settings
from tests.sqlite import sqlite_at


class CallCounter(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Counts the `agio.v1` calls one server received."""

    def __init__(self) -> None:
        self.calls = 0

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        if handler_call_details.method.startswith("/agio.v1."):
            self.calls += 1
        return await continuation(handler_call_details)


class PeerRecorder(AgioMethodInterceptor):
    """The peer (client address and port: its connection) of each `agio.v1` call."""

    def __init__(self) -> None:
        self.peers: list[str] = []

    def rewrap(
        self, handler: grpc.RpcMethodHandler, details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler:
        def wrap(behavior: Behavior) -> Behavior:
            async def recorded(request: Any, context: grpc.aio.ServicerContext) -> Any:
                self.peers.append(context.peer())
                return await behavior(request, context)

            return recorded

        return rewrap_handler(handler, wrap)


@pytest.mark.parametrize(
    ("address", "target"),
    [
        ("127.0.0.1:50051", "127.0.0.1:50051"),
        ("agio.internal:50051", "agio.internal:50051"),
        ("dns:///agio.internal:50051", "dns:///agio.internal:50051"),
        ("127.0.0.1:5001,127.0.0.1:5002", "ipv4:127.0.0.1:5001,127.0.0.1:5002"),
        (" 10.0.0.1:5001 , 10.0.0.2:5001 ", "ipv4:10.0.0.1:5001,10.0.0.2:5001"),
        (["[::1]:5001", "[::1]:5002"], "ipv6:[::1]:5001,[::1]:5002"),
        ("ipv4:10.0.0.1:1,10.0.0.2:1", "ipv4:10.0.0.1:1,10.0.0.2:1"),
    ],
)
def test_addresses_become_one_grpc_target(address: str | list[str], target: str) -> None:
    assert channel_target(address) == target


@pytest.mark.parametrize("address", ["a.internal:1,b.internal:1", "127.0.0.1:1,[::1]:1", " , "])
def test_addresses_that_make_no_target_are_refused(address: str) -> None:
    with pytest.raises(AddressError):
        channel_target(address)


async def test_one_client_spreads_its_calls_over_two_servers(
    tmp_path: Path, fake_model: FakeModelServer
) -> None:
    counters = [CallCounter(), CallCounter()]
    apps = [
        await AgioApp.start(
            make_settings(f"sqlite+aiosqlite:///{tmp_path / f'{n}.db'}", fake_model.base_url),
            interceptors=[counter],
        )
        for n, counter in enumerate(counters)
    ]
    try:
        async with AgioClient(",".join(app.address for app in apps)) as client:
            async with asyncio.timeout(60):
                while not all(counter.calls for counter in counters):
                    await client.list_agents()
            # Both connected, round robin takes turns: the next calls split evenly.
            before = Counter({n: counter.calls for n, counter in enumerate(counters)})
            for _ in range(10):
                await client.list_agents()
            after = Counter({n: counter.calls for n, counter in enumerate(counters)})
            assert after - before == Counter({0: 5, 1: 5})
            result = await client.run_to_end("What is 12 * 7?")
            assert "84" in result.text
    finally:
        for app in apps:
            await app.stop(grace=0)


async def test_two_clients_of_one_address_have_a_connection_each(
    tmp_path: Path, fake_model: FakeModelServer
) -> None:
    """What lets clients of one `serve --workers N` address spread over its workers (each
    connection goes to one worker): gRPC would otherwise share one connection per address
    among every channel of the process."""
    recorder = PeerRecorder()
    app = await AgioApp.start(
        make_settings(sqlite_at(tmp_path / "agio.db"), fake_model.base_url),
        interceptors=[recorder],
    )
    try:
        async with contextlib.AsyncExitStack() as clients:
            for _ in range(3):
                client = await clients.enter_async_context(AgioClient(app.address))
                await client.list_agents()
                await client.list_agents()
    finally:
        await app.stop(grace=0)
    first, second, third = recorder.peers[::2]
    assert recorder.peers[1::2] == [first, second, third]  # a client keeps its connection
    assert len({first, second, third}) == 3
