"""A server at its limit of running runs: a run asked for beyond it waits for a slot, then
is refused with RESOURCE_EXHAUSTED `SERVER_BUSY` (ErrorInfo) before its caller's deadline;
a run admitted ends in its own stop signal, TIMEOUT included."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from agio_grpc.client import AgioClient, AgioError
from agio_grpc.config import ServerConfig
from agio_grpc.testing import FakeModelServer, Turn
from agio_grpc.v1.resources_pb2 import RunStatus, StopReason
from tests.service.auth_helpers import serving
from tests.service.conftest import make_settings
from tests.sqlite import sqlite_at


@pytest.fixture
async def one_slot(tmp_path: Path, fake_model: FakeModelServer) -> AsyncIterator[AgioClient]:
    """A server that runs one run at a time; a run without a deadline waits 0.2 s for it."""
    settings = make_settings(
        sqlite_at(tmp_path / "agio.db"),
        fake_model.base_url,
        server=ServerConfig(max_running_runs=1, admission_wait_s=0.2),
    )
    async with serving(settings) as app, AgioClient(app.address) as client:
        yield client


async def test_a_run_past_the_limit_is_refused_server_busy_before_its_deadline(
    one_slot: AgioClient, fake_model: FakeModelServer
) -> None:
    fake_model.enqueue(Turn.hanging())
    busy = await one_slot.start_run("Think forever.")
    await fake_model.wait_for_requests(1)

    with pytest.raises(AgioError) as refused:
        await one_slot.run_to_end("me too", timeout=3)
    assert refused.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert refused.value.reason == "SERVER_BUSY"
    assert refused.value.metadata == {"runningRuns": "1", "limit": "1", "waiting": "0"}
    with pytest.raises(AgioError) as background:
        await one_slot.start_run("and me")  # no deadline: admission_wait_s
    assert background.value.reason == "SERVER_BUSY"
    assert len(fake_model.requests) == 1  # neither started

    await one_slot.cancel_run(busy.id)
    fake_model.enqueue(Turn.text("my turn"))
    done = await one_slot.run_to_end("now?")
    assert done.run.status == RunStatus.RUN_STATUS_COMPLETED
    assert done.text == "my turn"


async def test_an_admitted_run_still_ends_timeout_at_its_deadline(
    one_slot: AgioClient, fake_model: FakeModelServer
) -> None:
    fake_model.enqueue(Turn.text("too slow", chunks=10, chunk_delay=1.0))
    result = await one_slot.run_to_end("slow", timeout=3)
    assert result.run.stop_signal.reason == StopReason.STOP_REASON_TIMEOUT
    fake_model.enqueue(Turn.text("next"))
    assert (await one_slot.run_to_end("then")).text == "next"  # its slot was given back
