"""`agio.history.cache.usage`: the memory of the histories kept between runs, an observable
gauge read through the app's own metric reader, as any OpenTelemetry exporter reads it."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from opentelemetry.sdk.metrics.export import NumberDataPoint

from agio_grpc.client import AgioClient
from agio_grpc.domain import Role, Step, ToolCall
from agio_grpc.engine.history import step_bytes
from agio_grpc.service.app import AgioApp
from agio_grpc.testing import FakeModelServer
from agio_grpc.v1 import resources_pb2
from tests.service.conftest import make_settings
from tests.sqlite import sqlite_at
from tests.telemetry.conftest import Traced, make_traced

GAUGE = "agio.history.cache.usage"


def cache_usage(traced: Traced) -> list[int]:
    """The gauge's values at a collection now (one per app on the meter provider)."""
    data = traced.metrics.get_metrics_data()
    assert data is not None
    points = [
        point
        for resource in data.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
        if metric.name == GAUGE
        for point in metric.data.data_points
    ]
    assert all(isinstance(point, NumberDataPoint) for point in points)
    return [int(point.value) for point in points if isinstance(point, NumberDataPoint)]


def estimated(steps: Sequence[resources_pb2.Step]) -> int:
    """What the cache counts for these steps (engine/history.py `step_bytes`)."""
    return sum(
        step_bytes(
            Step(
                step.session_id,
                step.run_id,
                Role.USER,
                content=step.content,
                reasoning_content=step.reasoning_content,
                tool_calls=[
                    ToolCall(call.id, call.name, call.arguments) for call in step.tool_calls
                ],
            )
        )
        for step in steps
    )


async def test_the_gauge_reads_the_bytes_of_the_histories_kept_between_runs(
    app: AgioApp, client: AgioClient, traced: Traced
) -> None:
    assert cache_usage(traced) == [0]  # nothing kept yet

    first = await client.run_to_end("What is 12 * 7?")
    kept = await client.list_steps(first.session_id)
    assert cache_usage(traced) == [estimated(kept)]

    await client.run_to_end("And 2 * 3?", session_id=first.session_id)
    other = await client.run_to_end("What is 1 + 1?")
    kept = [*await client.list_steps(first.session_id), *await client.list_steps(other.session_id)]
    assert cache_usage(traced) == [estimated(kept)]


async def test_with_the_cache_off_the_gauge_reads_zero(
    tmp_path: Path, fake_model: FakeModelServer
) -> None:
    traced = make_traced()
    settings = make_settings(
        sqlite_at(tmp_path / "agio.db"),
        fake_model.base_url,
        server={"history_cache_mb": 0},
    )
    app = await AgioApp.start(settings, traced.telemetry)
    try:
        async with AgioClient(app.address) as client:
            await client.run_to_end("What is 12 * 7?")
        assert cache_usage(traced) == [0]
    finally:
        await app.stop(grace=0)
        traced.tracer_provider.shutdown()
