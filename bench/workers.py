"""B4 with `serve --workers 2` against one worker and against the gRPC floor in one and two
processes, in one run.

    python -m bench.workers                        # 1,000 runs, SQLite
    python -m bench.workers --postgres postgresql://agio_ci:agio_ci@127.0.0.1:5432/postgres

B4's load (bench/concurrency.py): every run at once, one tool call then `--tokens` words the
fake model paces at `--rate` tokens/s, driven by load generator processes over lean stubs
(one HTTP/2 connection per 20 runs, so the kernel spreads the connections evenly over the
workers). Systems, one after the other, each with a fresh fake model and database:

- agio-grpc with 1 worker, and with 2 (a supervisor and two workers on one port), on SQLite
  (one file in WAL mode) and, with `--postgres`, on a fresh PostgreSQL database;
- the gRPC floor (bench/floor.py: bare grpc.aio streaming the same paced deltas, nothing
  behind them) as one process, and as two processes with the runs split between them: the
  best two processes of Python gRPC can do on this machine.

Reported: errors, the p50/p99 gap between text deltas (the pace is 1000/rate ms) and the
p99 over the pace, runs finished per second of wall time, server CPU per run (the
supervisor and its workers together; both floor processes together), and the cores every
process of the system used (server, model, load) over the wall time.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from contextlib import AsyncExitStack
from dataclasses import dataclass

from bench import procs
from bench.concurrency import run_load
from bench.loadgen import LoadResult
from bench.stats import percentile

RUNS_PER_CONNECTION = 20
"""50 connections for 1,000 runs: enough for the kernel to spread them evenly over the
workers (it picks a worker per connection, by a hash of its addresses)."""


@dataclass(slots=True)
class Row:
    system: str
    runs: int
    errors: int
    gap_p50_ms: float
    gap_p99_ms: float
    runs_per_s: float
    cpu_ms_per_run: float
    cores: float
    samples: list[str]


async def load(targets: list[str], runs: int) -> LoadResult:
    """`runs` runs at once, split evenly over `targets`."""
    return await run_load("agio", targets, runs, RUNS_PER_CONNECTION)


def row(system: str, runs: int, result: LoadResult, server_cpu_s: float, others: float) -> Row:
    wall = result.wall_s or 1.0
    return Row(
        system=system,
        runs=runs,
        errors=result.errors + max(0, runs - result.runs),
        gap_p50_ms=percentile(result.gaps_ms, 50),
        gap_p99_ms=percentile(result.gaps_ms, 99),
        runs_per_s=(result.runs - result.errors) / wall,
        cpu_ms_per_run=server_cpu_s / runs * 1000,
        cores=(server_cpu_s + others) / wall,
        samples=result.error_samples,
    )


async def agio(workers: int, database: str, runs: int, tokens: int, rate: float, label: str) -> Row:
    async with procs.fake_model(tokens, rate, tool_first=True) as model:
        env = {
            "AGIO_SERVER__WORKERS": str(workers),
            # Admission sized to the load: this measures the engine, not the wait for a slot.
            "AGIO_SERVER__MAX_RUNNING_RUNS": str(runs),
        }
        async with procs.agio_server(model.ready, database, env) as server:
            await asyncio.sleep(1.0)  # every worker up (the supervisor reports the first)
            before, model_cpu = per_process_cpu(server.pid), model.cpu_s()
            result = await load([server.ready], runs)
            after = per_process_cpu(server.pid)
            others = model.cpu_s() - model_cpu + result.cpu_s
    used = {pid: after[pid] - before.get(pid, 0.0) for pid in after}
    name = f"agio-grpc, {workers} worker{'s' if workers > 1 else ''}, {label}"
    measured = row(name, runs, result, sum(used.values()), others)
    if workers > 1:  # how the kernel spread the connections: each worker's share of the CPU
        shares = sorted((cpu for pid, cpu in used.items() if pid != server.pid), reverse=True)
        measured.system += f" ({' / '.join(f'{cpu / sum(shares):.0%}' for cpu in shares)})"
    return measured


def per_process_cpu(pid: int) -> dict[int, float]:
    """CPU seconds of `pid` and of each of its live descendants."""
    found: dict[int, float] = {}
    for each in procs.process_tree(pid):
        try:
            found[each] = procs.process_cpu_s(each)
        except OSError:  # exited meanwhile
            continue
    return found


async def floor(processes: int, runs: int, tokens: int, rate: float) -> Row:
    async with AsyncExitStack() as stack:
        floors = [
            await stack.enter_async_context(procs.grpc_floor(tokens, rate))
            for _ in range(processes)
        ]
        cpu = sum(each.cpu_s() for each in floors)
        result = await load([each.ready for each in floors], runs)
        server_cpu = sum(each.cpu_s() for each in floors) - cpu
    name = f"gRPC floor, {processes} process{'es' if processes > 1 else ''}"
    return row(name, runs, result, server_cpu, result.cpu_s)


async def measure(args: argparse.Namespace) -> list[Row]:
    runs, tokens, rate = args.runs, args.tokens, args.rate
    rows = [await floor(1, runs, tokens, rate), await floor(2, runs, tokens, rate)]
    for workers in (1, 2):
        async with procs.scratch_database() as url:
            rows.append(await agio(workers, url, runs, tokens, rate, "SQLite"))
    if args.postgres:
        for workers in (1, 2):
            async with procs.scratch_database(args.postgres) as url:
                rows.append(await agio(workers, url, runs, tokens, rate, "PostgreSQL"))
    return rows


def table(rows: list[Row], rate: float) -> str:
    pace = 1000 / rate
    lines = [
        "| system | runs | errors | gap p50 (ms) | gap p99 (ms) | p99 over pace (ms) | "
        "runs/s | server CPU per run (ms) | cores used |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for each in rows:
        lines.append(
            f"| {each.system} | {each.runs} | {each.errors} | {each.gap_p50_ms:.0f} | "
            f"{each.gap_p99_ms:.0f} | {each.gap_p99_ms - pace:+.0f} | {each.runs_per_s:.1f} | "
            f"{each.cpu_ms_per_run:.1f} | {each.cores:.2f} |"
        )
    samples = [f"- {each.system}: {s}" for each in rows for s in each.samples[:2]]
    return "\n".join(lines + (["", "Error samples:", *samples] if samples else []))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1000, help="runs at once (default 1000)")
    parser.add_argument("--tokens", type=int, default=100, help="words a reply (default 100)")
    parser.add_argument("--rate", type=float, default=10.0, help="model tokens/s (default 10)")
    parser.add_argument("--postgres", default="", help="a PostgreSQL server URL, for those rows")
    args = parser.parse_args(argv)
    rows = asyncio.run(measure(args))
    print(
        f"B4, {args.runs} runs at once, one tool call then {args.tokens} words at "
        f"{args.rate:g} tokens/s:"
    )
    print(table(rows, args.rate))
    return 0


if __name__ == "__main__":
    sys.exit(main())
