"""Two members of one service: deltas on the member that does not run the run, cancels
across members, and PostgreSQL LISTEN/NOTIFY as the alternative way across.

    python -m bench.members --postgres postgresql://agio_ci:agio_ci@127.0.0.1:5432/postgres
    python -m bench.members             # on one SQLite file (no LISTEN/NOTIFY row)

Two `agio-grpc serve` processes, A and B, on one database (a fresh PostgreSQL database
made on the server `--postgres` names, dropped afterwards), and fake models in processes
of their own.

- **Delta lag.** Runs started on A (the owner), `--concurrent` at a time, each a reply of
  `--tokens` one-word deltas the model paces at `--rate` tokens/s. Each run is watched at
  once from this process through `WatchRun` on A and on B; for every delta made once both
  watches stream, the time it arrived from B minus the time it arrived from A (same seq).
  B follows the run from A through A's member listener (service/members.py).
- **LISTEN/NOTIFY.** The same number of messages sent with `NOTIFY` on one PostgreSQL
  connection and received with `LISTEN` on another: the latency of the database as the
  way across, without the owner's cost of one statement per delta.
- **Cancel.** Runs held mid-reply on A; `CancelRun` sent to A (the owner: local) or to B
  (another member), alternately: the time until `CancelRun` answered (the run has
  stopped), and until the run's own stream on A got its terminal event.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import asyncpg

from agio_grpc.client import AgioClient
from agio_grpc.v1.events_pb2 import StepEvent
from bench import procs
from bench.stats import median, percentile

TERMINAL = ("run_completed", "run_failed")


@dataclass(slots=True)
class Figures:
    delta_lag_ms: list[float] = field(default_factory=list)
    deltas_on_owner: int = 0
    deltas_elsewhere: int = 0
    notify_ms: list[float] = field(default_factory=list)
    cancel_local_ms: list[float] = field(default_factory=list)
    cancel_elsewhere_ms: list[float] = field(default_factory=list)
    end_local_ms: list[float] = field(default_factory=list)
    end_elsewhere_ms: list[float] = field(default_factory=list)


async def arrivals(events: AsyncIterator[StepEvent]) -> tuple[float, dict[int, float]]:
    """When the stream's first event arrived, and when each of its deltas did, by seq
    (perf_counter)."""
    first = 0.0
    seen: dict[int, float] = {}
    async for event in events:
        first = first or time.perf_counter()
        kind = event.WhichOneof("event")
        if kind == "step_delta":
            seen[event.seq] = time.perf_counter()
        elif kind in TERMINAL:
            break
    return first, seen


async def one_watched_run(owner: AgioClient, other: AgioClient, figures: Figures) -> None:
    run = await owner.start_run("Count for me.")
    (owner_attached, on_owner), (other_attached, elsewhere) = await asyncio.gather(
        arrivals(owner.watch_run(run.id)), arrivals(other.watch_run(run.id))
    )
    figures.deltas_on_owner += len(on_owner)
    figures.deltas_elsewhere += len(elsewhere)
    attached = max(owner_attached, other_attached)
    for seq, arrived in elsewhere.items():
        # Deltas made once both watches streamed: not the replay of those made before.
        if seq in on_owner and on_owner[seq] > attached:
            figures.delta_lag_ms.append((arrived - on_owner[seq]) * 1000)


async def delta_lag(
    database_url: str, runs: int, concurrent: int, tokens: int, rate: float, figures: Figures
) -> None:
    async with (
        procs.fake_model(tokens, rate) as model,
        procs.agio_server(model.ready, database_url) as first,
        procs.agio_server(model.ready, database_url) as second,
        AgioClient(first.ready) as owner,
        AgioClient(second.ready) as other,
    ):
        await one_watched_run(owner, other, Figures())  # warm-up
        for start in range(0, runs, concurrent):
            batch = range(start, min(start + concurrent, runs))
            await asyncio.gather(*(one_watched_run(owner, other, figures) for _ in batch))


async def notify_latency(postgres: str, messages: int, figures: Figures) -> None:
    url = postgres.replace("postgresql+asyncpg://", "postgresql://")
    sender, listener = await asyncpg.connect(url), await asyncpg.connect(url)
    received: asyncio.Queue[float] = asyncio.Queue()
    try:
        await listener.add_listener(
            "agio_bench", lambda *_: received.put_nowait(time.perf_counter())
        )
        for index in range(messages + 10):
            sent = time.perf_counter()
            await sender.execute("SELECT pg_notify('agio_bench', $1)", f"delta {index}")
            arrived = await asyncio.wait_for(received.get(), 10)
            if index >= 10:
                figures.notify_ms.append((arrived - sent) * 1000)
    finally:
        await sender.close()
        await listener.close()


async def one_cancel(
    owner: AgioClient, canceller: AgioClient, local: bool, figures: Figures
) -> None:
    events = owner.run("Go on for ever.")
    async for event in events:
        if event.WhichOneof("event") == "step_delta":
            break
    run_id = event.run_id
    ended = asyncio.get_running_loop().create_future()

    async def until_end() -> None:
        async for rest in events:
            if rest.WhichOneof("event") in TERMINAL:
                ended.set_result(time.perf_counter())
                return

    reading = asyncio.create_task(until_end())
    started = time.perf_counter()
    await canceller.cancel_run(run_id, "bench")
    answered = time.perf_counter()
    end = await asyncio.wait_for(ended, 30)
    await reading
    (figures.cancel_local_ms if local else figures.cancel_elsewhere_ms).append(
        (answered - started) * 1000
    )
    (figures.end_local_ms if local else figures.end_elsewhere_ms).append((end - started) * 1000)


async def cancels(database_url: str, count: int, figures: Figures) -> None:
    # 1 token/s of a long reply: every run is mid-reply when cancelled.
    async with (
        procs.fake_model(100_000, 1.0) as model,
        procs.agio_server(model.ready, database_url) as first,
        procs.agio_server(model.ready, database_url) as second,
        AgioClient(first.ready) as owner,
        AgioClient(second.ready) as other,
    ):
        await one_cancel(owner, other, False, Figures())  # warm-up, both ways
        await one_cancel(owner, owner, True, Figures())
        for index in range(count * 2):
            local = index % 2 == 0
            await one_cancel(owner, owner if local else other, local, figures)


def row(name: str, samples: list[float]) -> str:
    if not samples:
        return f"| {name} | 0 | - | - | - |"
    return (
        f"| {name} | {len(samples)} | {median(samples):.2f} | "
        f"{percentile(samples, 99):.2f} | {max(samples):.2f} |"
    )


def tables(figures: Figures) -> str:
    head = ["| measure | samples | p50 (ms) | p99 (ms) | max (ms) |", "|---|---|---|---|---|"]
    lag = [
        *head,
        row("delta on B (non-owner) after the same delta on A (owner)", figures.delta_lag_ms),
    ]
    if figures.notify_ms:
        lag.append(row("PostgreSQL NOTIFY to LISTEN, one message", figures.notify_ms))
    cancel = [
        *head,
        row("CancelRun on the owner: answered", figures.cancel_local_ms),
        row("CancelRun on another member: answered", figures.cancel_elsewhere_ms),
        row("CancelRun on the owner: terminal event on the run's stream", figures.end_local_ms),
        row(
            "CancelRun on another member: terminal event on the run's stream",
            figures.end_elsewhere_ms,
        ),
    ]
    counts = (
        f"Deltas seen: {figures.deltas_on_owner} through A, {figures.deltas_elsewhere} through B."
    )
    return "\n".join([*lag, "", counts, "", *cancel])


async def measure(args: argparse.Namespace) -> Figures:
    figures = Figures()
    async with procs.scratch_database(args.postgres) as url:
        await delta_lag(url, args.runs, args.concurrent, args.tokens, args.rate, figures)
        await cancels(url, args.cancels, figures)
    if args.postgres:
        await notify_latency(args.postgres, len(figures.delta_lag_ms), figures)
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--postgres", default="", help="a PostgreSQL server URL (else SQLite)")
    parser.add_argument("--runs", type=int, default=100, help="watched runs (default 100)")
    parser.add_argument("--concurrent", type=int, default=20, help="watched runs at once")
    parser.add_argument("--tokens", type=int, default=20, help="deltas a run (default 20)")
    parser.add_argument("--rate", type=float, default=20.0, help="model tokens/s (default 20)")
    parser.add_argument("--cancels", type=int, default=50, help="cancels a path (default 50)")
    args = parser.parse_args(argv)
    figures = asyncio.run(measure(args))
    backend = "PostgreSQL" if args.postgres else "SQLite"
    print(
        f"Two members on {backend}: {args.runs} watched runs ({args.concurrent} at once, "
        f"{args.tokens} deltas at {args.rate:g} tokens/s), {args.cancels} cancels a path:"
    )
    print(tables(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
