"""Quotas per tenant (`quotas` in the config), as a client sees them on SQLite and on
PostgreSQL: a run past its tenant's quota of running or queued runs is refused with
RESOURCE_EXHAUSTED `TENANT_QUOTA_EXCEEDED`, a `google.rpc.QuotaFailure` naming the tenant
and a `google.rpc.RetryInfo`; nothing is stored, and other tenants are not held back."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from google.rpc import error_details_pb2, status_pb2

from agio_grpc.client import AgioClient, AgioError
from agio_grpc.config import QuotasConfig
from agio_grpc.service.app import AgioApp
from agio_grpc.testing import FakeModelServer, Turn
from agio_grpc.v1 import agent_service_pb2 as pb
from agio_grpc.v1.resources_pb2 import RunStatus
from tests.service.conftest import make_settings
from tests.service.tenancy import tenant_interceptors, tenant_metadata

A = "tenant-a"
B = "tenant-b"


@pytest.fixture
async def quota_app(store_url: str, fake_model: FakeModelServer) -> AsyncIterator[AgioApp]:
    """Each tenant may run one run at a time, and queue one."""
    quotas = QuotasConfig(max_running_runs_per_tenant=1, max_queued_runs_per_tenant=1)
    settings = make_settings(store_url, fake_model.base_url, quotas=quotas)
    started = await AgioApp.start(settings, interceptors=tenant_interceptors())
    try:
        yield started
    finally:
        await started.stop(grace=0)


def details(error: grpc.aio.AioRpcError) -> dict[str, Any]:
    """The refusal's google.rpc details, by type."""
    found: dict[str, Any] = {}
    for key, value in error.trailing_metadata() or ():
        if key != "grpc-status-details-bin" or not isinstance(value, bytes):
            continue
        for packed in status_pb2.Status.FromString(value).details:
            for kind in (
                error_details_pb2.ErrorInfo,
                error_details_pb2.QuotaFailure,
                error_details_pb2.RetryInfo,
            ):
                if packed.Is(kind.DESCRIPTOR):
                    message = kind()
                    packed.Unpack(message)
                    found[kind.DESCRIPTOR.name] = message
    return found


async def test_a_run_past_the_tenants_running_quota_is_refused_with_quota_details(
    quota_app: AgioApp, fake_model: FakeModelServer
) -> None:
    async with (
        AgioClient(quota_app.address, metadata=tenant_metadata(A)) as theirs,
        AgioClient(quota_app.address, metadata=tenant_metadata(B)) as other,
    ):
        fake_model.enqueue(Turn.hanging())
        running = await theirs.start_run("Think it over.")
        await fake_model.wait_for_requests(1)
        sessions = await theirs.list_sessions()

        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await theirs.agents.StartRun(
                pb.RunRequest(input="One more."), metadata=tenant_metadata(A)
            )
        fake_model.enqueue(Turn.text("B is not held back."))
        served = await other.run_to_end("Mine.")

        error = refused.value
        found = details(error)
        assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert found["ErrorInfo"].reason == "TENANT_QUOTA_EXCEEDED"
        assert dict(found["ErrorInfo"].metadata) == {
            "tenant": A,
            "quota": "max_running_runs_per_tenant",
            "limit": "1",
        }
        (violation,) = found["QuotaFailure"].violations
        assert violation.subject == f"tenant:{A}"
        assert "max_running_runs_per_tenant" in violation.description
        assert found["RetryInfo"].retry_delay.seconds >= 1
        assert await theirs.list_sessions() == sessions  # the refused run stored nothing
        assert served.run.status == RunStatus.RUN_STATUS_COMPLETED
        await theirs.cancel_run(running.id)
        fake_model.enqueue(Turn.text("Now there is room."))
        assert (await theirs.run_to_end("Again.")).run.status == RunStatus.RUN_STATUS_COMPLETED


async def test_a_run_past_the_tenants_queued_quota_is_refused(
    quota_app: AgioApp, fake_model: FakeModelServer
) -> None:
    async with AgioClient(quota_app.address, metadata=tenant_metadata(A)) as theirs:
        fake_model.enqueue(Turn.hanging())
        running = await theirs.start_run("Think it over.")
        await fake_model.wait_for_requests(1)
        queued = await theirs.start_run(
            "Then this.", session_id=running.session_id, on_busy=pb.BUSY_POLICY_ENQUEUE
        )

        with pytest.raises(AgioError) as refused:
            await theirs.start_run(
                "And this.", session_id=running.session_id, on_busy=pb.BUSY_POLICY_ENQUEUE
            )

        assert queued.status == RunStatus.RUN_STATUS_QUEUED
        assert refused.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert refused.value.reason == "TENANT_QUOTA_EXCEEDED"
        assert refused.value.metadata["quota"] == "max_queued_runs_per_tenant"
        assert [run.id for run in await theirs.list_runs(running.session_id)] == [
            queued.id,
            running.id,
        ]
        await theirs.cancel_run(queued.id)
        await theirs.cancel_run(running.id)
