"""Runs starting on a long session while other runs write: what each side waits.

A run on a session whose history this server does not hold (another member ran it, or
the server restarted) reads that whole history as it starts. Here `--starts` runs start one
after another on a session of `--steps` steps (each let go of and its input deleted again
after it), on a SQLite file, while `--writers` runs append a step each to sessions of their
own every 2 ms, as concurrent runs store their replies. Printed: the appends per second
while the starts went on, their p50 / p99 / max latency, and the starts' median. A store
that reads the history inside its start's write transaction holds SQLite's write lock
through the read, and every append waits for it.

    python -m bench.long_start [--steps 10000] [--writers 20] [--starts 15]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from agio_grpc.domain import Role, Run, Session, Step
from agio_grpc.store.sql import SqlStore, open_store
from bench.sessions import stored_session, tool_rounds
from bench.stats import median, percentile

APPEND_EVERY_S = 0.002


@dataclass(slots=True)
class LongStartResult:
    appends: int
    appends_per_s: float
    append_p50_ms: float
    append_p99_ms: float
    append_max_ms: float
    start_p50_ms: float


async def _writing_runs(store: SqlStore, count: int) -> list[Run]:
    runs: list[Run] = []
    for _ in range(count):
        session = Session()
        run = Run(session_id=session.id, agent="bench")
        first = Step(session.id, run.id, Role.USER, content="hi")
        started = await store.ledger.start_run(run, [first], new_session=session)
        runs.append(started.run)
    return runs


async def measure(steps: int, writers: int, starts: int) -> LongStartResult:
    with tempfile.TemporaryDirectory() as scratch:
        store = await open_store(f"sqlite:///{Path(scratch) / 'long.db'}")
        try:
            return await _measure(store, steps, writers, starts)
        finally:
            await store.close()


async def _measure(store: SqlStore, steps: int, writers: int, starts: int) -> LongStartResult:
    long_id = await stored_session(store, lambda session_id: tool_rounds(session_id, steps))
    after = (await store.log.get_session(long_id)).step_count + 1
    appends: list[float] = []
    start_ms: list[float] = []
    done = asyncio.Event()

    async def write(run: Run) -> None:
        while not done.is_set():
            began = time.perf_counter()
            reply = Step(run.session_id, run.id, Role.ASSISTANT, content="x")
            await store.log.append_steps([reply], held_by=run.id)
            appends.append((time.perf_counter() - began) * 1000)
            await asyncio.sleep(APPEND_EVERY_S)

    tasks = [asyncio.create_task(write(run)) for run in await _writing_runs(store, writers)]
    await asyncio.sleep(0.3)  # the writers under way
    appends.clear()
    began_starts = time.perf_counter()
    for _ in range(starts):
        run = Run(session_id=long_id, agent="bench")
        began = time.perf_counter()
        await store.ledger.start_run(run, [Step(long_id, run.id, Role.USER, content="q")])
        start_ms.append((time.perf_counter() - began) * 1000)
        await store.ledger.release_session(long_id, run.id)
        await store.log.delete_steps_from(long_id, after)
    done.set()
    wall_s = time.perf_counter() - began_starts
    await asyncio.gather(*tasks)
    return LongStartResult(
        appends=len(appends),
        appends_per_s=len(appends) / wall_s,
        append_p50_ms=percentile(appends, 50),
        append_p99_ms=percentile(appends, 99),
        append_max_ms=max(appends, default=0.0),
        start_p50_ms=median(start_ms),
    )


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.long_start", description=__doc__)
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--writers", type=int, default=20)
    parser.add_argument("--starts", type=int, default=15)
    args = parser.parse_args()
    result = asyncio.run(measure(args.steps, args.writers, args.starts))
    print(
        f"{args.starts} starts on a {args.steps}-step session, {args.writers} runs appending: "
        f"{result.appends_per_s:.0f} appends/s, p50 {result.append_p50_ms:.2f} / p99 "
        f"{result.append_p99_ms:.2f} / max {result.append_max_ms:.2f} ms; "
        f"a start {result.start_p50_ms:.1f} ms (median)"
    )


if __name__ == "__main__":
    main()
