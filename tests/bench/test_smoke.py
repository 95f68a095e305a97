"""The benchmark's moving parts run end to end at toy sizes: B1-B3's paths (direct client,
relay floor, `agio-grpc serve` untraced and traced, the Agents SDK), B4's load generators
against the service, the gRPC floor and the SDK, and the store measurements. Figures are not
checked, only that each part produces them (timing belongs to `make bench`, never to
tests)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bench import (
    ab,
    busy_reads,
    concurrency,
    connect,
    long_start,
    procs,
    run_writes,
    runs,
    store,
    streaming,
    timeline,
)
from bench.store import measure_store

# Benchmark smoke runs: processes of their own, tens of seconds each (make test-slow).
pytestmark = pytest.mark.slow

THIS_TREE = str(Path(__file__).resolve().parents[2])  # served as both builds of the A/B


async def test_the_load_generator_drives_the_grpc_floor() -> None:
    async with procs.grpc_floor(tokens=5, tokens_per_second=200) as floor:
        load = await concurrency.run_load("agio", floor.ready, 3)
        assert floor.cpu_s() > 0
        assert floor.peak_rss_mb() > 0
    assert (load.runs, load.errors) == (3, 0), load.error_samples
    assert len(load.ttft_ms) == 3
    assert len(load.gaps_ms) == 3 * 4  # 5 deltas per run: 4 gaps


async def test_every_streaming_path_runs_against_its_own_processes() -> None:
    result = await streaming.measure(runs=2, tokens=5, warmup=1)
    assert set(result.paths) == {
        "direct",
        "grpc relay floor",
        "run floor",
        "agio-grpc",
        "agents-sdk",
        "agio-grpc traced",
    }
    for name, samples in result.paths.items():
        assert len(samples.ttft_ms) == 2, name
        assert samples.tokens > 0, name
    assert (result.spans_exported or 0) > 0  # the traced server exported its spans


async def test_the_load_generators_drive_the_service_and_the_sdk() -> None:
    for level in (
        await concurrency.agio_level(3, tokens=5, rate=200),
        await concurrency.relay_floor_level(3, tokens=5, rate=200),
        await concurrency.run_floor_level(3, tokens=5, rate=200),
        await concurrency.sdk_level(3, tokens=5, rate=200),
    ):
        assert (level.concurrency, level.errors) == (3, 0), level.error_samples
        assert level.gap_p50_ms > 0, level.system


async def test_the_ab_comparison_runs_each_build_in_turn_with_the_direct_client(
    tmp_path: Path,
) -> None:
    other = tmp_path / "other-tree"  # the same code under a second name: two builds
    other.symlink_to(THIS_TREE, target_is_directory=True)
    trees = [THIS_TREE, str(other)]
    rounds = await ab.measure(trees, runs=2, rounds=2, tokens=5, warmup=1)
    assert [measured.order for measured in rounds] == [trees, trees[::-1]]
    for measured in rounds:
        assert set(measured.ttft_p50_ms) == {ab.DIRECT, *trees}
        assert all(ttft > 0 for ttft in measured.ttft_p50_ms.values())
    rows = ab.table(trees, rounds).splitlines()
    assert [row.split(":")[0] for row in rows[-2:]] == [f"| {tree}" for tree in trees]
    assert all(row.count(" (+") + row.count(" (-") == 2 for row in rows[-2:])  # per round


def test_a_server_of_the_ab_imports_its_own_tree() -> None:
    environment = ab.tree_environment("/some/tree")
    assert environment["PYTHONPATH"].split(os.pathsep)[0] == "/some/tree"
    assert environment["PYTHONSAFEPATH"] == "1"  # `python -m` would put its cwd first


async def test_the_store_measurements_run_on_sqlite(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'b5.db'}"
    samples = await measure_store(url, [10], [2], repeats=2, write_s=0.2)
    assert {len(samples.context[10]), len(samples.full_read[10])} == {2}
    assert {len(samples.start_whole[10]), len(samples.start_held[10])} == {2}
    assert samples.writes_per_s[2][0] > 0
    assert len(samples.floor[10]) == 2


async def test_the_context_builds_floor_builds_the_messages_the_engine_builds(
    tmp_path: Path,
) -> None:
    import contextlib
    import sqlite3

    from agio_grpc.engine.context import build_context
    from agio_grpc.store.sql import open_store
    from bench.sessions import stored_session, tool_rounds

    path = tmp_path / "floor.db"
    sql_store = await open_store(f"sqlite+aiosqlite:///{path}")
    try:
        session_id = await stored_session(sql_store, lambda id: tool_rounds(id, 9))
        history = await sql_store.log.get_history(session_id)
    finally:
        await sql_store.close()
    with contextlib.closing(sqlite3.connect(path)) as conn:
        floor = store.floor_messages(conn, session_id)
    assert floor == build_context(store.INSTRUCTIONS, history, None)
    assert {"tool_calls", "tool_call_id"} <= {key for message in floor for key in message}


async def test_the_long_start_benchmark_times_the_appends_and_the_starts() -> None:
    result = await long_start.measure(steps=300, writers=2, starts=2)
    assert result.appends > 0
    assert result.appends_per_s > 0
    assert 0 < result.append_p50_ms <= result.append_p99_ms <= result.append_max_ms
    assert result.start_p50_ms > 0


async def test_the_busy_reads_benchmark_reads_both_ways_under_each_load() -> None:
    results = await busy_reads.measure(steps=40, reads=2, slice_us=50, busy=[0, 1])
    assert [result.busy_tasks for result in results] == [0, 1]
    for result in results:
        assert len(result.loop_ms) == len(result.thread_ms) == 2
        assert min(result.loop_ms + result.thread_ms) > 0


async def test_the_run_writes_benchmark_counts_cpu_frames_and_the_log() -> None:
    result = await run_writes.measure(runs=30, warmup=5)
    assert result.cpu_ms_per_run > 0
    assert result.frames_per_run > 2  # two commits, each over several b-trees
    assert result.largest_wal_bytes > 0


async def test_the_store_measurements_are_pooled_from_processes_of_their_own() -> None:
    [result] = await store.measure([10, 20], [1], repeats=2, write_s=0.2, postgres=False)
    assert (result.backend, result.skipped, result.processes) == ("sqlite", "", store.PROCESSES)
    assert set(result.context_ms) == set(result.run_start_ms) == {10, 20}
    assert min(result.run_start_ms[20]) > 0
    assert result.writes_per_s[1] > 0


def test_pooled_samples_keep_every_process_timings() -> None:
    first = store.StoreSamples(context={10: [1.0, 2.0]}, writes_per_s={1: [100.0]})
    second = store.StoreSamples.from_json(store.StoreSamples(context={10: [3.0]}).to_json())
    first.merge(second)
    assert first.context == {10: [1.0, 2.0, 3.0]}
    assert first.writes_per_s == {1: [100.0]}
    assert first.processes == 2


async def test_the_mcp_benchmark_times_both_paths() -> None:
    from bench import mcp as mcp_bench

    samples = await mcp_bench.measure(calls=3, warmup=1)
    assert {path: len(times) for path, times in samples.items()} == {
        "in-process echo": 3,
        "MCP stdio echo": 3,
    }
    assert "| MCP stdio echo |" in mcp_bench.table(samples)


async def test_the_connect_benchmark_runs_every_path_on_one_server() -> None:
    samples = await connect.measure(runs=2, tokens=5, warmup=1)
    assert set(samples) == set(connect.PATHS)
    for name, measured in samples.items():
        assert len(measured.ttft_ms) == 2, name
        assert all(ttft > 0 for ttft in measured.ttft_ms), name
    assert "| Connect, JSON |" in connect.table(samples)


async def test_the_members_benchmark_follows_and_cancels_across_two_servers() -> None:
    from argparse import Namespace

    from bench import members

    args = Namespace(postgres="", runs=2, concurrent=2, tokens=3, rate=50.0, cancels=1)
    figures = await members.measure(args)
    assert figures.deltas_on_owner <= 6  # a watch that attaches after a step misses its deltas
    assert (len(figures.cancel_local_ms), len(figures.cancel_elsewhere_ms)) == (1, 1)
    assert (len(figures.end_local_ms), len(figures.end_elsewhere_ms)) == (1, 1)
    assert "| CancelRun on another member: answered | 1 |" in members.tables(figures)


async def test_the_workers_benchmark_measures_floors_and_workers() -> None:
    from argparse import Namespace

    from bench import workers

    rows = await workers.measure(Namespace(runs=4, tokens=3, rate=100.0, postgres=""))
    assert [row.system.split(" (")[0] for row in rows] == [
        "gRPC floor, 1 process",
        "gRPC floor, 2 processes",
        "agio-grpc, 1 worker, SQLite",
        "agio-grpc, 2 workers, SQLite",
    ]
    assert all((row.runs, row.errors) == (4, 0) for row in rows), rows
    assert "| agio-grpc, 2 workers, SQLite" in workers.table(rows, 100.0)


async def test_whole_runs_are_measured_for_the_service_and_the_sdk() -> None:
    rows = await runs.measure(runs=4, concurrency=2, warmup=1, postgres=False)
    assert [(row.shape, row.system) for row in rows] == [
        ("short", "grpc floor"),
        ("short", "agents-sdk"),
        ("short", "run floor"),
        ("short", "agio-grpc"),
        ("tool", "agents-sdk"),
        ("tool", "run floor"),
        ("tool", "agio-grpc"),
    ]
    for row in rows:
        assert row.errors == 0, row.error_samples
        assert row.runs_per_s > 0, row
        # CPU is read in clock ticks (10 ms): the floors' few runs may not fill one.
        assert row.cpu_ms_per_run > 0 or row.system.endswith(" floor"), row


@pytest.mark.parametrize("shape", list(runs.SHAPES))
async def test_the_run_floor_writes_what_an_agio_grpc_run_writes(shape: str) -> None:
    """The floor is only a floor if it streams what the service streams: the same kinds of
    message in the same order (a step's deltas counted as one, as they merge by timing),
    the same steps' roles and texts."""
    import grpc

    from agio_grpc.v1 import agent_service_pb2, agent_service_pb2_grpc

    async def streamed(address: str) -> list[tuple[str, str]]:
        seen: list[tuple[str, str]] = []
        async with grpc.aio.insecure_channel(address) as channel:
            call = agent_service_pb2_grpc.AgentServiceStub(channel).Run(
                agent_service_pb2.RunRequest(input="what is 2 + 2?")
            )
            async for event in call:
                kind = event.WhichOneof("event")
                if kind == "step_delta" and seen[-1][0] == kind:
                    continue
                step = event.step_completed.step
                seen.append((kind, f"{step.role} {step.content} {step.tool_call_id != ''}"))
        return seen

    tool_first = runs.SHAPES[shape]
    async with procs.fake_model(runs.TOKENS, 0.0, tool_first=tool_first) as model:
        async with procs.run_floor(model.ready) as floor:
            from_floor = await streamed(floor.ready)
        async with (
            procs.scratch_database() as url,
            procs.agio_server(model.ready, url) as server,
        ):
            from_agio = await streamed(server.ready)
    assert from_floor == from_agio
    assert len(from_agio) == (11 if tool_first else 6)


async def test_the_timeline_marks_every_phase_of_a_run_in_order() -> None:
    marks, direct, agio = await timeline.measure(runs=2, warmup=1)
    assert (len(marks), len(direct), len(agio)) == (2, 2, 2)
    for run in marks:
        order = sorted(run, key=run.__getitem__)
        assert (order[0], order[-1]) == ("arrived", "ended"), order
        phases = [
            "request checked",
            "start transaction: done",
            "loop: start",
            "compaction check: done",
            "request built",
            "model call: start",
            "model request: start",
            "model: first chunk parsed",
            "encoded: step_delta",
        ]
        assert [name for name in order if name in phases] == phases, order
    assert "| brief transaction: done |" in timeline.table(marks)


async def test_the_warmth_benchmark_times_each_path_three_ways() -> None:
    from bench import warmth

    ttft = await warmth.measure_ttft(runs=2, pause_s=0.001)
    start = await warmth.measure_start(runs=2, pause_s=0.001)
    conditions = ["back to back", "after 1 ms idle", "in B1's order"]
    assert {path: list(figures) for path, figures in ttft.items()} == {
        path: conditions for path in ("direct", "agio-grpc", "grpc relay floor")
    }
    assert all(p50 > 0 for figures in ttft.values() for p50, _ in figures.values())
    assert list(start) == ["back to back", "after 1 ms idle", "caches overwritten"]
    assert all(ms > 0 for ms in start.values())
    assert "| `start_run` |" in warmth.table(ttft, start)
