"""The tenant in telemetry: on each run segment's span (`agio.tenant`), and in each log line
(`tenant=`): the run's while its loop runs, even when it started from no call of its
tenant's (a queued run), else the current caller's."""

from __future__ import annotations

import io
import logging
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from agio_grpc.client import AgioClient
from agio_grpc.service.app import AgioApp
from agio_grpc.service.identity import Caller, calling_as, current_caller
from agio_grpc.telemetry import attributes as agio
from agio_grpc.telemetry import trace_log_handler
from agio_grpc.testing import FakeModelServer, ToolCallSpec, Turn
from agio_grpc.v1 import agent_service_pb2 as pb
from tests.service.conftest import make_settings
from tests.service.tenancy import tenant_interceptors, tenant_metadata
from tests.sqlite import sqlite_at
from tests.telemetry.conftest import Traced

TENANT = "tenant-a"


@pytest.fixture
def log_lines() -> Iterator[io.StringIO]:
    """Every log line at INFO and above, written as `agio-grpc serve` writes them."""
    stream = io.StringIO()
    handler = trace_log_handler(
        logging.StreamHandler(stream), tenant=lambda: current_caller().tenant
    )
    handler.setLevel(logging.INFO)
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    yield stream
    root.removeHandler(handler)
    root.setLevel(old_level)


@pytest.fixture
async def tenant_client(
    tmp_path: Path, fake_model: FakeModelServer, traced: Traced
) -> AsyncIterator[AgioClient]:
    settings = make_settings(sqlite_at(tmp_path / "agio.db"), fake_model.base_url)
    app = await AgioApp.start(settings, traced.telemetry, interceptors=tenant_interceptors())
    try:
        async with AgioClient(app.address, metadata=tenant_metadata(TENANT)) as client:
            yield client
    finally:
        await app.stop(grace=0)


async def test_a_queued_runs_span_and_log_lines_name_its_tenant(
    tenant_client: AgioClient, fake_model: FakeModelServer, traced: Traced, log_lines: io.StringIO
) -> None:
    fake_model.enqueue(Turn.hanging())
    first = await tenant_client.start_run("Wait.")
    await fake_model.wait_for_requests(1)
    fake_model.enqueue(
        Turn.tool_calls([ToolCallSpec("explode", '{"message": "boom"}')]), Turn.text("Done.")
    )
    queued = await tenant_client.start_run(
        "Then explode.", session_id=first.session_id, on_busy=pb.BUSY_POLICY_ENQUEUE
    )
    # Its start comes from the first run's end, in a context no call of the tenant's made.
    await tenant_client.cancel_run(first.id)
    events = [event async for event in tenant_client.follow_run(queued.id)]
    await traced.open_spans.all_ended()

    assert events[-1].WhichOneof("event") == "run_completed"
    runs = [span for span in traced.spans() if span.name == "invoke_agent assistant"]
    assert len(runs) == 3  # the first run; the queued one's queueing, then its start
    assert all((span.attributes or {})[agio.TENANT] == TENANT for span in runs)
    line = next(line for line in log_lines.getvalue().splitlines() if "explode raised" in line)
    assert f"tenant={TENANT} " in line


def test_a_log_line_outside_any_run_names_the_callers_tenant(log_lines: io.StringIO) -> None:
    logger = logging.getLogger("tests.telemetry.tenant")
    with calling_as(Caller("tenant-b")):
        logger.warning("in a call")
    logger.warning("outside any call")

    first, second = (line for line in log_lines.getvalue().splitlines() if "call" in line)
    assert "tenant=tenant-b in a call" in first
    assert "tenant=default outside any call" in second
