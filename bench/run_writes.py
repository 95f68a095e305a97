"""What a short run's store writes cost on SQLite, in one process, and what they leave on disk.

Each run is what a short run stores: its start on a new session with the question, then
its end with a 20-word reply (`RunLedger.start_run`, `end_run`: two brief writes). After
`--warmup` unmeasured runs, `--runs` runs one after another; printed: the process's CPU per
run, the WAL frames written per run (counted in a second file, where a read kept open holds
the checkpoints back), and the largest the WAL file grew while the runs went on with the
checkpoints as `serve` runs them. Compare two trees by running it in each in turn
(`cd TREE && PYTHONPATH=TREE python -m bench.run_writes`).

With `--postgresql`, the same runs' CPU on a fresh PostgreSQL database over TLS (as B6's
PostgreSQL rows: AGIO_TEST_POSTGRES_URL's server, else a throwaway cluster), a round trip
a write, and no WAL figures.

    python -m bench.run_writes [--runs 3000] [--warmup 200] [--postgresql]
"""

from __future__ import annotations

import argparse
import asyncio
import sqlite3
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from agio_grpc.domain import Role, Run, Session, Step, StopReason, StopSignal
from agio_grpc.store.sql import SqlStore, open_store
from bench import procs

FRAME_BYTES = 4096 + 24
"""A WAL frame: one page (SQLite's default size) and its header."""


@dataclass(slots=True)
class RunWritesResult:
    cpu_ms_per_run: float
    frames_per_run: float
    largest_wal_bytes: int


async def _short_run(store: SqlStore) -> None:
    session = Session()
    run = Run(session_id=session.id, agent="bench")
    question = Step(session.id, run.id, Role.USER, content="What is two and two?")
    await store.ledger.start_run(run, [question], new_session=session)
    reply = Step(session.id, run.id, Role.ASSISTANT, content="four " * 20, sequence=2)
    ended = run.ended(StopSignal(StopReason.COMPLETED, "", "loop"))
    await store.ledger.end_run(ended, steps=[reply])
    # A server's loop turns many times a run (its model call, its gRPC writes); brief
    # writes alone never wait, and the store's own tasks (checkpoints) need the turns.
    await asyncio.sleep(0)


def _wal_bytes(path: Path) -> int:
    wal = path.with_name(path.name + "-wal")
    return wal.stat().st_size if wal.exists() else 0


async def _cpu_and_largest_wal(path: Path, runs: int, warmup: int) -> tuple[float, int]:
    store = await open_store(f"sqlite:///{path}")
    try:
        for _ in range(warmup):
            await _short_run(store)
        largest = 0
        began = time.process_time()
        for index in range(runs):
            await _short_run(store)
            if index % 50 == 0:
                largest = max(largest, _wal_bytes(path))
        cpu_ms = (time.process_time() - began) * 1000 / runs
        return cpu_ms, max(largest, _wal_bytes(path))
    finally:
        await store.close()


async def measure_postgresql(runs: int, warmup: int) -> float:
    """The CPU of a short run's writes on PostgreSQL over TLS, ms a run."""
    async with procs.postgres_databases(tls=True) as databases, databases() as url:
        store = await open_store(url)
        try:
            for _ in range(warmup):
                await _short_run(store)
            began = time.process_time()
            for _ in range(runs):
                await _short_run(store)
            return (time.process_time() - began) * 1000 / runs
        finally:
            await store.close()


async def _frames_per_run(path: Path, runs: int, warmup: int) -> float:
    store = await open_store(f"sqlite:///{path}")
    reader = sqlite3.connect(path, isolation_level=None)
    try:
        for _ in range(warmup):
            await _short_run(store)
        # A read kept open: no checkpoint copies past it, so the log only grows, by a
        # frame for each page each commit wrote.
        reader.execute("BEGIN")
        reader.execute("SELECT count(*) FROM sessions").fetchone()
        before = _wal_bytes(path)
        for _ in range(runs):
            await _short_run(store)
        return (_wal_bytes(path) - before) / FRAME_BYTES / runs
    finally:
        reader.close()
        await store.close()


async def measure(runs: int, warmup: int) -> RunWritesResult:
    with tempfile.TemporaryDirectory() as scratch:
        cpu_ms, largest = await _cpu_and_largest_wal(Path(scratch) / "cpu.db", runs, warmup)
        frames = await _frames_per_run(Path(scratch) / "frames.db", min(runs, 500), warmup)
    return RunWritesResult(cpu_ms, frames, largest)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.run_writes", description=__doc__)
    parser.add_argument("--runs", type=int, default=3000)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--postgresql", action="store_true")
    args = parser.parse_args()
    import agio_grpc.service.app as app  # the modules and the collector `serve` runs with

    app.tune_collector()
    if args.postgresql:
        cpu_ms = asyncio.run(measure_postgresql(args.runs, args.warmup))
        print(f"{args.runs} short runs' writes on PostgreSQL (TLS): {cpu_ms:.3f} ms of CPU a run")
        return
    result = asyncio.run(measure(args.runs, args.warmup))
    print(
        f"{args.runs} short runs' writes: "
        f"{result.cpu_ms_per_run:.3f} ms of CPU a run, {result.frames_per_run:.1f} WAL frames "
        f"a run, the WAL file at most {result.largest_wal_bytes / 2**20:.1f} MiB"
    )


if __name__ == "__main__":
    main()
