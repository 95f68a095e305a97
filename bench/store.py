"""B5: context build time by session length, and step write throughput under concurrency.

Context build = what a run does before its first model call can start: read the session's
conversation (`StepStore.get_history`, the engine's read: message fields only) and turn it
into messages (`build_context`). Alongside, the full read of the same steps
(`StepStore.get_steps`: every column, what ListSteps serves). Sessions of 100,
1,000 and 10,000 steps (a user / assistant-with-tool-call / tool / assistant pattern);
median and p99 of repeated builds. Write throughput = steps/s when C tasks each append one
step per transaction to their own session, as C concurrent runs do.

On SQLite (a temporary file) and PostgreSQL (a throwaway cluster from tests/postgres.py,
or AGIO_TEST_POSTGRES_URL); PostgreSQL is skipped, with the reason, when neither is there.
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

from agio_grpc.domain import Role, Step, ToolCall
from agio_grpc.engine.context import build_context
from agio_grpc.store.sql import SqlStepStore, open_store
from bench.stats import median, percentile


@dataclass(slots=True)
class StoreResult:
    backend: str
    context_ms: dict[int, tuple[float, float]] = field(default_factory=dict)
    """Steps in the session -> (median, p99) ms of one context build."""
    full_read_ms: dict[int, float] = field(default_factory=dict)
    """Steps in the session -> median ms of one `get_steps` of all of them."""
    writes_per_s: dict[int, float] = field(default_factory=dict)
    """Concurrent writers -> steps stored per second."""
    skipped: str = ""


def _steps(session_id: str, count: int) -> list[Step]:
    steps: list[Step] = []
    for index in range(count):
        match index % 4:
            case 0:
                steps.append(Step(session_id, "run_b", Role.USER, content=f"question {index}"))
            case 1:
                call = ToolCall(f"call_{index}", "calculate", '{"expression": "2 + 2"}')
                steps.append(Step(session_id, "run_b", Role.ASSISTANT, tool_calls=[call]))
            case 2:
                steps.append(
                    Step(
                        session_id,
                        "run_b",
                        Role.TOOL,
                        content="4",
                        tool_call_id=f"call_{index - 1}",
                        name="calculate",
                    )
                )
            case _:
                steps.append(Step(session_id, "run_b", Role.ASSISTANT, content="The answer is 4."))
    return steps


async def _context_build(
    store: SqlStepStore, count: int, repeats: int
) -> tuple[tuple[float, float], float]:
    """((median, p99) ms of a context build, median ms of a full read) for `count` steps."""
    session = await store.create_session()
    steps = _steps(session.id, count)
    for start in range(0, count, 1000):
        await store.append_steps(steps[start : start + 1000])
    timings: list[float] = []
    full_reads: list[float] = []
    for _ in range(repeats + 2):
        started = time.perf_counter()
        history = await store.get_history(session.id)
        build_context("You are a helpful assistant.", history, None)
        timings.append((time.perf_counter() - started) * 1000)
        started = time.perf_counter()
        await store.get_steps(session.id)
        full_reads.append((time.perf_counter() - started) * 1000)
    timings, full_reads = timings[2:], full_reads[2:]  # warm caches first
    return (median(timings), percentile(timings, 99)), median(full_reads)


async def _write_throughput(store: SqlStepStore, writers: int, duration_s: float) -> float:
    sessions = [await store.create_session() for _ in range(writers)]
    stored = 0
    deadline = time.perf_counter() + duration_s

    async def writer(session_id: str) -> None:
        nonlocal stored
        while time.perf_counter() < deadline:
            await store.append_step(Step(session_id, "run_b", Role.ASSISTANT, content="ok " * 50))
            stored += 1

    started = time.perf_counter()
    await asyncio.gather(*(writer(session.id) for session in sessions))
    return stored / (time.perf_counter() - started)


async def measure_store(
    url: str, backend: str, sizes: list[int], writers: list[int], repeats: int, write_s: float
) -> StoreResult:
    result = StoreResult(backend)
    store = await open_store(url)
    try:
        for size in sizes:
            result.context_ms[size], result.full_read_ms[size] = await _context_build(
                store, size, repeats
            )
        for count in writers:
            result.writes_per_s[count] = await _write_throughput(store, count, write_s)
    finally:
        await store.close()
    return result


@contextlib.asynccontextmanager
async def _postgres_url() -> AsyncIterator[str]:
    """An empty PostgreSQL database for the benchmark; raises when none can be had."""
    from tests.postgres import TestDatabases, start_postgres

    admin_url, cluster = await asyncio.to_thread(start_postgres)
    databases = TestDatabases(admin_url)
    try:
        await asyncio.to_thread(databases.prepare)
        url = await databases.create()
        try:
            yield url
        finally:
            await databases.drop(url)
    finally:
        await asyncio.to_thread(databases.dispose)
        if cluster is not None:
            await asyncio.to_thread(cluster.stop)


async def measure(
    sizes: list[int], writers: list[int], repeats: int, write_s: float, postgres: bool
) -> list[StoreResult]:
    results: list[StoreResult] = []
    with tempfile.TemporaryDirectory() as scratch:
        url = f"sqlite+aiosqlite:///{Path(scratch) / 'b5.db'}"
        results.append(await measure_store(url, "sqlite", sizes, writers, repeats, write_s))
    if not postgres:
        return results
    try:
        async with _postgres_url() as url:
            results.append(await measure_store(url, "postgresql", sizes, writers, repeats, write_s))
    except Exception as error:
        results.append(StoreResult("postgresql", skipped=f"{type(error).__name__}: {error}"))
    return results
