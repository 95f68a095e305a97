"""A session's history read while the event loop is busy, on SQLite: where the read runs.

The store reads on the event loop's thread (store/database.py, `SqliteDatabase`; a read
of more than `LOOP_READ_ROWS` steps on a reader thread: `--steps 10000` times that). The
baseline, measured in the same process in turn with it, is the same transaction on a
reader thread, as the store ran every read before (`_transact` in the database's reader
pool). The loop is kept busy by tasks that each compute for `--slice-us` and yield, as a
server's loop is under load: its runs' callbacks one after another. On a thread, the read
hands the GIL back around each row SQLite steps to, and takes it again only once the busy
loop lets it go. Printed: median and p90 ms of each way, by busy tasks (0: an idle loop).

    python -m bench.busy_reads [--steps 1000] [--reads 20] [--slice-us 200] [--busy 0 1 2]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from agio_grpc.store import database
from agio_grpc.store.sql import SqlStore, open_store
from agio_grpc.store.sql.steps import read_history
from bench.sessions import stored_session, tool_rounds
from bench.stats import median, percentile


@dataclass(slots=True)
class BusyReads:
    busy_tasks: int
    loop_ms: list[float]
    """ms of each read as the store runs it (on the event loop's thread, up to
    LOOP_READ_ROWS steps)."""
    thread_ms: list[float]
    """ms of each read on a reader thread (the baseline)."""


async def _busy(slice_us: float, stop: asyncio.Event) -> None:
    while not stop.is_set():
        until = time.perf_counter() + slice_us / 1e6
        while time.perf_counter() < until:
            pass
        await asyncio.sleep(0)


async def _reads(store: SqlStore, session_id: str, reads: int) -> tuple[list[float], list[float]]:
    sqlite = store.log._database  # type: ignore[attr-defined]
    assert isinstance(sqlite, database.SqliteDatabase)
    loop = asyncio.get_running_loop()
    on_loop: list[float] = []
    on_thread: list[float] = []
    for _ in range(reads):
        began = time.perf_counter()
        await store.log.get_history(session_id)
        on_loop.append((time.perf_counter() - began) * 1000)
        began = time.perf_counter()
        await loop.run_in_executor(
            sqlite._readers,
            database._transact,
            sqlite._engine,
            lambda conn: read_history(conn, session_id, 1, None),
            False,
        )
        on_thread.append((time.perf_counter() - began) * 1000)
    return on_loop, on_thread


async def measure(steps: int, reads: int, slice_us: float, busy: list[int]) -> list[BusyReads]:
    results: list[BusyReads] = []
    with tempfile.TemporaryDirectory() as scratch:
        store = await open_store(f"sqlite:///{Path(scratch) / 'reads.db'}")
        try:
            session_id = await stored_session(store, lambda id: tool_rounds(id, steps))
            await _reads(store, session_id, 2)  # warm both connections
            for tasks in busy:
                stop = asyncio.Event()
                running = [asyncio.create_task(_busy(slice_us, stop)) for _ in range(tasks)]
                try:
                    on_loop, on_thread = await _reads(store, session_id, reads)
                finally:
                    stop.set()
                    await asyncio.gather(*running)
                results.append(BusyReads(tasks, on_loop, on_thread))
        finally:
            await store.close()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.busy_reads", description=__doc__)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--reads", type=int, default=20)
    parser.add_argument("--slice-us", type=float, default=200.0)
    parser.add_argument("--busy", type=int, nargs="+", default=[0, 1, 2])
    args = parser.parse_args()
    import agio_grpc.service.app as app  # the modules and the collector `serve` runs with

    app.tune_collector()
    results = asyncio.run(measure(args.steps, args.reads, args.slice_us, args.busy))
    print(f"A {args.steps}-step history read, {args.reads} times each way, ms:\n")
    print("| busy tasks | as the store reads, median / p90 | on a reader thread, median / p90 |")
    print("|---|---|---|")
    for result in results:
        loop_ms, thread_ms = result.loop_ms, result.thread_ms
        print(
            f"| {result.busy_tasks} | {median(loop_ms):.2f} / {percentile(loop_ms, 90):.2f} "
            f"| {median(thread_ms):.2f} / {percentile(thread_ms, 90):.2f} |"
        )


if __name__ == "__main__":
    main()
