"""A handler that fails after its call is over (the caller's deadline passed while it could
not be cancelled): the status is not sent, one INFO line says so, and grpc logs nothing."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import grpc
import pytest

from agio_grpc.service.interceptors import ErrorInterceptor
from agio_grpc.v1 import session_service_pb2 as pb
from agio_grpc.v1 import session_service_pb2_grpc as pb_grpc


class LateFailure(pb_grpc.SessionServiceServicer):
    """GetSession outlives its deadline (it finishes a write it may not leave half done),
    then fails."""

    def __init__(self) -> None:
        self.failed = asyncio.Event()

    async def GetSession(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            await asyncio.sleep((context.time_remaining() or 0) + 0.05)  # past the deadline
        self.failed.set()
        raise RuntimeError("a late fault")


async def test_a_status_after_the_callers_deadline_is_not_sent(
    caplog: pytest.LogCaptureFixture,
) -> None:
    servicer = LateFailure()  # type: ignore[abstract]  # only GetSession is served
    server = grpc.aio.server(interceptors=[ErrorInterceptor()])
    pb_grpc.add_SessionServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        with caplog.at_level(logging.INFO):
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                stub = pb_grpc.SessionServiceStub(channel)
                with pytest.raises(grpc.aio.AioRpcError) as failed:
                    await stub.GetSession(pb.GetSessionRequest(session_id="sess_1"), timeout=0.2)
                # Set in the handler's step that goes on to the interceptor's line.
                await servicer.failed.wait()
    finally:
        await server.stop(None)
    assert failed.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    lines = [(r.name, r.levelname, r.getMessage()) for r in caplog.records]
    assert (
        "agio_grpc.service.interceptors",
        "INFO",
        "/agio.v1.SessionService/GetSession: INTERNAL not sent (the call was over)",
    ) in lines
    assert not [line for line in lines if line[0].startswith("grpc")], lines
