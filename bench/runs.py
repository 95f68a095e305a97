"""B6: what one whole run costs the server, short runs and tool runs, against the Agents SDK.

    python -m bench --only b6            # within make bench
    python -m bench.runs --runs 500      # alone, printed

Two shapes of run, each a fresh fake model answering as fast as it can:
- short: one model call, a 20-token answer;
- tool: the model calls the `calculate` tool, the tool runs, a second call answers in 20
  tokens.

agio-grpc serves them as `agio-grpc serve` does by default (one process, tracing off),
on a SQLite file and on PostgreSQL with the database connection over TLS
(`?ssl=require`: the run fails rather than fall back to plaintext). A load generator
process (bench/loadgen.py) keeps `concurrency` runs going over `grpc.aio` until `runs`
have finished, after `warmup` unmeasured ones; the figure is the server process's CPU over
the measured runs, per run. The Agents SDK runs the same agent shape in one process of its
own (`Runner.run_streamed` on the same fake model, the same concurrency), so its figure
includes its callers: it is what a framework costs in the process that runs it. The gRPC
floor (bench/floor.py) streams a short run's messages from a bare grpc.aio server with
nothing behind them: what Python gRPC alone costs per run here. The run floor
(bench/run_floor.py) writes what an agio-grpc run of each shape writes, its model read with
agio-grpc's own driver, with no store, engine or tracing: what such a run costs in Python
before any of them, so agio-grpc's figure over it is what those cost.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass

from bench import procs
from bench.concurrency import generate
from bench.loadgen import LoadResult
from bench.stats import percentile, speed_gauge

TOKENS = 20
SHAPES = {"short": False, "tool": True}
"""Shape name -> whether the fake model calls the tool first."""


@dataclass(slots=True)
class RunsRow:
    system: str
    backend: str
    shape: str
    runs: int
    concurrency: int
    errors: int
    cpu_ms_per_run: float
    runs_per_s: float
    ttft_p50_ms: float
    error_samples: list[str]


def postgres_tls() -> AbstractAsyncContextManager[Callable[[], AbstractAsyncContextManager[str]]]:
    """Fresh databases on a PostgreSQL that offers TLS, as URLs that require it: the server
    in AGIO_TEST_POSTGRES_URL (which must have `ssl = on`), else a throwaway cluster with a
    certificate of its own (tests/postgres.py)."""
    return procs.postgres_databases(tls=True)


def _row(
    system: str, backend: str, shape: str, concurrency: int, load: LoadResult, cpu_s: float
) -> RunsRow:
    return RunsRow(
        system=system,
        backend=backend,
        shape=shape,
        runs=load.runs,
        concurrency=concurrency,
        errors=load.errors,
        cpu_ms_per_run=cpu_s / load.runs * 1000 if load.runs else 0.0,
        runs_per_s=load.runs / load.wall_s if load.wall_s else 0.0,
        ttft_p50_ms=percentile(load.ttft_ms, 50),
        error_samples=load.error_samples,
    )


async def agio_row(
    backend: str,
    database: AbstractAsyncContextManager[str],
    shape: str,
    runs: int,
    concurrency: int,
    warmup: int,
    server_env: dict[str, str] | None = None,
) -> RunsRow:
    async with procs.fake_model(TOKENS, 0.0, tool_first=SHAPES[shape]) as model, database as url:
        slots = {"AGIO_SERVER__MAX_RUNNING_RUNS": str(concurrency)} | (server_env or {})
        async with procs.agio_server(model.ready, url, slots) as server:
            return await _served_row(
                server, ("agio-grpc", backend, shape), runs, concurrency, warmup
            )


async def _served_row(
    server: procs.Child, names: tuple[str, str, str], runs: int, concurrency: int, warmup: int
) -> RunsRow:
    """`runs` runs on the running `server` after `warmup` unmeasured ones, as the row of
    `names` (system, backend, shape): its CPU over the measured runs."""
    await generate("agio", server.ready, warmup, concurrency=concurrency)
    cpu = server.cpu_s()
    load = await generate("agio", server.ready, runs, concurrency=concurrency)
    return _row(*names, concurrency, load, server.cpu_s() - cpu)


async def floor_row(runs: int, concurrency: int, warmup: int) -> RunsRow:
    """The gRPC floor for a short run's messages: `run_started`, TOKENS deltas and
    `run_completed` from a bare grpc.aio server (bench/floor.py), no model, store or engine."""
    async with procs.grpc_floor(TOKENS, 0.0) as server:
        return await _served_row(server, ("grpc floor", "none", "short"), runs, concurrency, warmup)


async def run_floor_row(shape: str, runs: int, concurrency: int, warmup: int) -> RunsRow:
    """The run floor for `shape` (bench/run_floor.py): its messages and model calls through
    agio-grpc's own driver and conversions, nothing stored, no engine."""
    async with (
        procs.fake_model(TOKENS, 0.0, tool_first=SHAPES[shape]) as model,
        procs.run_floor(model.ready) as server,
    ):
        return await _served_row(server, ("run floor", "none", shape), runs, concurrency, warmup)


async def sdk_row(shape: str, runs: int, concurrency: int, warmup: int) -> RunsRow:
    async with procs.fake_model(TOKENS, 0.0, tool_first=SHAPES[shape]) as model:
        load = await generate("sdk", model.ready, runs, concurrency=concurrency, warmup=warmup)
    return _row("agents-sdk", "in process", shape, concurrency, load, load.cpu_s)


async def measure(
    runs: int,
    concurrency: int,
    warmup: int,
    *,
    postgres: bool = True,
    sdk: bool = True,
    server_env: dict[str, str] | None = None,
) -> list[RunsRow]:
    """The gRPC floor, then every shape: the SDK, agio-grpc on SQLite, agio-grpc on
    PostgreSQL with TLS (`server_env`: settings for agio-grpc, e.g. to compare two)."""
    rows: list[RunsRow] = []
    async with contextlib.AsyncExitStack() as stack:
        new_postgres = await stack.enter_async_context(postgres_tls()) if postgres else None
        rows.append(await floor_row(runs, concurrency, warmup))
        for shape in SHAPES:
            if sdk:
                rows.append(await sdk_row(shape, runs, concurrency, warmup))
            rows.append(await run_floor_row(shape, runs, concurrency, warmup))
            sqlite = procs.scratch_database()
            rows.append(
                await agio_row("sqlite", sqlite, shape, runs, concurrency, warmup, server_env)
            )
            if new_postgres is not None:
                postgres_row = agio_row(
                    "postgresql, TLS", new_postgres(), shape, runs, concurrency, warmup, server_env
                )
                rows.append(await postgres_row)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.runs", description=__doc__)
    parser.add_argument("--runs", type=int, default=500)
    parser.add_argument("--concurrency", type=int, default=25)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--no-postgres", action="store_true")
    parser.add_argument("--no-sdk", action="store_true")
    parser.add_argument(
        "--server-env",
        nargs="*",
        default=[],
        metavar="AGIO_NAME=VALUE",
        help="settings for the agio-grpc servers (e.g. AGIO_DATABASE_POOL_SIZE=10)",
    )
    args = parser.parse_args(argv)
    server_env = dict(item.split("=", 1) for item in args.server_env)
    print(f"machine speed before: {speed_gauge().describe()}", file=sys.stderr)
    rows = asyncio.run(
        measure(
            args.runs,
            args.concurrency,
            args.warmup,
            postgres=not args.no_postgres,
            sdk=not args.no_sdk,
            server_env=server_env,
        )
    )
    for row in rows:
        print(
            f"{row.shape:6} {row.system:10} {row.backend:16} errors {row.errors:3}  "
            f"CPU {row.cpu_ms_per_run:6.2f} ms/run  {row.runs_per_s:7.1f} runs/s  "
            f"TTFT p50 {row.ttft_p50_ms:6.1f} ms",
            *row.error_samples[:1],
            file=sys.stderr,
        )
    print(f"machine speed after: {speed_gauge().describe()}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
