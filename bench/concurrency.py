"""B4: many concurrent runs, each one tool call then a reply the model paces.

For each concurrency level: a fresh fake model (tool call first, then `tokens` one-word
chunks at `rate` tokens/s) and a fresh server (so its peak memory is this level's), then
load generator processes (`bench.loadgen`, up to 500 runs each) that start every run at
once over lean `grpc.aio` stubs. Then the gRPC floor (`bench.floor`: a bare grpc.aio server
streaming the same paced deltas, nothing behind them) under the same load generators, and
the Agents SDK at the same concurrency, in one process of its own against its own fake
model. Reported: errors, the p50/p99 gap between text deltas as the caller sees them (the
model's own pace is 1000/rate ms), server CPU per run and peak memory (the SDK's process
for the SDK), and the CPU every process of the level used together (server, fake model,
load generators) over the wall time, in cores: all of them share this machine's cores.
"""

from __future__ import annotations

import asyncio
import json
import math
import sys
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass

from bench import procs
from bench.loadgen import LoadResult
from bench.stats import percentile

RUNS_PER_GENERATOR = 500


@dataclass(slots=True)
class LevelResult:
    """One concurrency level of one system."""

    system: str
    concurrency: int
    errors: int
    error_samples: list[str]
    gap_p50_ms: float
    gap_p99_ms: float
    ttft_p50_ms: float
    cpu_ms_per_run: float
    peak_rss_mb: float
    wall_s: float
    machine_cores: float
    """CPU seconds of every process of the level (server, model, load) per wall second."""


async def generate(
    kind: str,
    target: str,
    runs: int,
    per_channel: int = 100,
    *,
    concurrency: int = 0,
    warmup: int = 0,
) -> LoadResult:
    """One load generator process (bench/loadgen.py) and what it measured."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bench.loadgen",
        kind,
        target,
        "--runs",
        str(runs),
        "--runs-per-channel",
        str(per_channel),
        "--concurrency",
        str(concurrency),
        "--warmup",
        str(warmup),
        env=procs.clean_env(),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"load generator failed: {err.decode()[-2000:]}")
    return LoadResult(**json.loads(out.decode().strip().splitlines()[-1]))


def merge(parts: list[LoadResult]) -> LoadResult:
    merged = LoadResult()
    for part in parts:
        merged.runs += part.runs
        merged.errors += part.errors
        merged.error_samples += part.error_samples[: 5 - len(merged.error_samples)]
        merged.gaps_ms += part.gaps_ms
        merged.ttft_ms += part.ttft_ms
        merged.wall_s = max(merged.wall_s, part.wall_s)
        merged.cpu_s += part.cpu_s
        merged.peak_rss_mb = max(merged.peak_rss_mb, part.peak_rss_mb)
    return merged


async def agio_level(
    concurrency: int,
    tokens: int,
    rate: float,
    database: AbstractAsyncContextManager[str] | None = None,
    system: str = "agio-grpc",
) -> LevelResult:
    """agio-grpc at one level, on `database` (the URL it yields; default a SQLite file)."""
    async with (
        procs.fake_model(tokens, rate, tool_first=True) as model,
        database or procs.scratch_database() as url,
    ):
        # Admission sized to the level: this measures the engine, not the wait for a slot.
        slots = {"AGIO_SERVER__MAX_RUNNING_RUNS": str(concurrency)}
        async with procs.agio_server(model.ready, url, slots) as server:
            return await _served_level(system, server, model, concurrency)


async def _served_level(
    system: str, server: procs.Child, model: procs.Child, concurrency: int
) -> LevelResult:
    """`concurrency` runs on `server` against the fake `model`, both still running."""
    cpu, model_cpu = server.cpu_s(), model.cpu_s()
    load = await run_load("agio", server.ready, concurrency)
    server_cpu = server.cpu_s() - cpu
    others_cpu = model.cpu_s() - model_cpu + load.cpu_s
    return level_result(system, concurrency, load, server_cpu, server.peak_rss_mb(), others_cpu)


async def floor_level(concurrency: int, tokens: int, rate: float) -> LevelResult:
    async with procs.grpc_floor(tokens, rate) as server:
        cpu = server.cpu_s()
        load = await run_load("agio", server.ready, concurrency)
        server_cpu = server.cpu_s() - cpu
        peak = server.peak_rss_mb()
    return level_result("grpc floor", concurrency, load, server_cpu, peak, load.cpu_s)


async def relay_floor_level(concurrency: int, tokens: int, rate: float) -> LevelResult:
    """A bare grpc.aio server relaying the paced model's stream, read with the plain openai
    client (bench/floor.py --relay; the model answers at once, no tool call first): what
    reading a model and relaying it costs in Python alone, with no store or engine."""
    async with (
        procs.fake_model(tokens, rate, tool_first=False) as model,
        procs.grpc_floor(tokens, rate, relay=model.ready) as server,
    ):
        return await _served_level("grpc relay floor", server, model, concurrency)


async def run_floor_level(concurrency: int, tokens: int, rate: float) -> LevelResult:
    """The run floor (bench/run_floor.py) on B4's shape: the tool call, its result, then the
    paced answer, read with agio-grpc's own model driver and written as agio-grpc writes a
    run, with no store, engine or tracing."""
    async with (
        procs.fake_model(tokens, rate, tool_first=True) as model,
        procs.run_floor(model.ready) as server,
    ):
        return await _served_level("run floor", server, model, concurrency)


async def sdk_level(concurrency: int, tokens: int, rate: float) -> LevelResult:
    async with procs.fake_model(tokens, rate, tool_first=True) as model:
        model_cpu = model.cpu_s()
        load = await generate("sdk", model.ready, concurrency)
        model_cpu = model.cpu_s() - model_cpu
    return level_result("agents-sdk", concurrency, load, load.cpu_s, load.peak_rss_mb, model_cpu)


async def run_load(
    kind: str, targets: str | list[str], concurrency: int, per_channel: int = 100
) -> LoadResult:
    """`concurrency` runs at once, over as many load generator processes as it takes (at
    least one per target), split evenly over `targets`; `per_channel` streams a connection."""
    targets = [targets] if isinstance(targets, str) else targets
    generators = max(len(targets), math.ceil(concurrency / RUNS_PER_GENERATOR))
    shares = [concurrency // generators] * generators
    shares[0] += concurrency - sum(shares)
    parts = await asyncio.gather(
        *(
            generate(kind, targets[i % len(targets)], share, per_channel)
            for i, share in enumerate(shares)
        )
    )
    return merge(list(parts))


def level_result(
    system: str,
    concurrency: int,
    load: LoadResult,
    cpu_s: float,
    peak_mb: float,
    others_cpu_s: float,
) -> LevelResult:
    return LevelResult(
        system=system,
        concurrency=concurrency,
        errors=load.errors + max(0, concurrency - load.runs),
        error_samples=load.error_samples,
        gap_p50_ms=percentile(load.gaps_ms, 50),
        gap_p99_ms=percentile(load.gaps_ms, 99),
        ttft_p50_ms=percentile(load.ttft_ms, 50),
        cpu_ms_per_run=cpu_s / concurrency * 1000,
        peak_rss_mb=peak_mb,
        wall_s=load.wall_s,
        machine_cores=(cpu_s + others_cpu_s) / load.wall_s if load.wall_s else 0.0,
    )


async def measure(
    levels: list[int], tokens: int, rate: float, sdk: bool, postgres: bool = False
) -> list[LevelResult]:
    """Each level: agio-grpc on SQLite, the gRPC floor, the relay and run floors, the SDK;
    with `postgres`, agio-grpc on PostgreSQL with TLS too at the highest level (bench/runs.py's
    database)."""
    from bench.runs import postgres_tls

    results: list[LevelResult] = []
    for level in levels:
        results.append(await agio_level(level, tokens, rate))
        if postgres and level == max(levels):
            async with postgres_tls() as new_database:
                system = "agio-grpc (PostgreSQL, TLS)"
                results.append(await agio_level(level, tokens, rate, new_database(), system))
        results.append(await floor_level(level, tokens, rate))
        results.append(await relay_floor_level(level, tokens, rate))
        results.append(await run_floor_level(level, tokens, rate))
        if sdk:
            results.append(await sdk_level(level, tokens, rate))
    return results
