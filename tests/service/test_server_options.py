"""Server settings reach gRPC as the channel arguments they name."""

from __future__ import annotations

import asyncio
from collections import Counter

import grpc
import pytest

from agio_grpc.config import ServerConfig
from agio_grpc.service.app import AgioApp
from agio_grpc.service.server import server_options
from agio_grpc.v1 import agent_service_pb2, agent_service_pb2_grpc

BURST = 4000


def test_queued_calls_wait_for_the_callers_deadline_not_grpcs_30_s() -> None:
    options = dict(server_options(ServerConfig()))
    assert options["grpc.server_max_unrequested_time_in_server"] == 3600
    tuned = dict(server_options(ServerConfig(max_call_queue_time_s=5)))
    assert tuned["grpc.server_max_unrequested_time_in_server"] == 5


def test_a_second_server_cannot_share_the_port_silently() -> None:
    assert dict(server_options(ServerConfig()))["grpc.so_reuseport"] == 0


def test_arrived_calls_wait_rather_than_being_cancelled_by_grpcs_defaults() -> None:
    options = dict(server_options(ServerConfig()))
    assert options["grpc.server.max_pending_requests"] == 100_000
    assert options["grpc.server.max_pending_requests_hard_limit"] == 100_000


@pytest.mark.slow
async def test_a_burst_of_calls_gets_no_bare_cancelled(app: AgioApp) -> None:
    # With gRPC's defaults about 10% of these were cancelled before reaching the service.
    counts: Counter[str] = Counter()
    async with grpc.aio.insecure_channel(app.address) as channel:
        stub = agent_service_pb2_grpc.AgentServiceStub(channel)

        async def one() -> None:
            try:
                await stub.ListAgents(agent_service_pb2.ListAgentsRequest(), timeout=120)
                counts["OK"] += 1
            except grpc.aio.AioRpcError as error:
                counts[error.code().name] += 1

        await asyncio.gather(*(one() for _ in range(BURST)))
    assert counts == {"OK": BURST}
