"""B5: context build time by session length, and step write throughput under concurrency.

Context build = what a run does before its first model call can start: read the session's
conversation (`StepStore.get_history`, the engine's read: message fields only) and turn it
into messages (`build_context`). Alongside, the full read of the same steps
(`StepStore.get_steps`: every column, what ListSteps serves), and a whole run start
(`StepStore.start_run`: take the session, store the input and the run, read the history,
then build the context) two ways: reading the whole history, and with the history the
server kept from the session's previous run (engine/history.py: only the steps after it
are read). Sessions of 100, 1,000 and 10,000 steps (a user / assistant-with-tool-call /
tool / assistant pattern); median and p99 of repeated builds. Write throughput = steps/s
when C tasks each append one step per transaction to their own session, as C concurrent
runs do.

Each backend is measured in a process of its own shaped like `agio-grpc serve`: the
service's modules loaded and its garbage collector tuned the way `serve` tunes it, not
this process with the Agents SDK and the other benchmarks' leftovers, whose extra objects
every garbage collection would walk.

On SQLite (a temporary file) and PostgreSQL (a throwaway cluster from tests/postgres.py,
or AGIO_TEST_POSTGRES_URL); PostgreSQL is skipped, with the reason, when neither is there.

    python -m bench.store --url URL --sizes N ...   # one process's timings, JSON on stdout
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import sqlite3
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy import make_url

from agio_grpc.domain import Role, Run, Step
from agio_grpc.engine.context import build_context
from agio_grpc.engine.history import CachedHistory, HistoryCache
from agio_grpc.store.sql import SqlStore, open_store
from bench import procs
from bench.sessions import stored_session, tool_rounds
from bench.stats import median, percentile


@dataclass(slots=True)
class StoreResult:
    backend: str
    context_ms: dict[int, tuple[float, float]] = field(default_factory=dict)
    """Steps in the session -> (median, p99) ms of one context build."""
    full_read_ms: dict[int, float] = field(default_factory=dict)
    """Steps in the session -> median ms of one `get_steps` of all of them."""
    run_start_ms: dict[int, tuple[float, float]] = field(default_factory=dict)
    """Steps in the session -> median ms of `start_run` + `build_context`, reading the whole
    history and after a held one."""
    writes_per_s: dict[int, float] = field(default_factory=dict)
    """Concurrent writers -> steps stored per second."""
    floor_ms: dict[int, float] = field(default_factory=dict)
    """Steps in the session -> median ms of the context build's floor (`floor_messages`;
    SQLite only)."""
    processes: int = 0
    """How many processes' timings are pooled in the figures."""
    skipped: str = ""


@dataclass(slots=True)
class StoreSamples:
    """Raw B5 timings in ms, by steps in the session (writes: rates, by writers)."""

    context: dict[int, list[float]] = field(default_factory=dict)
    full_read: dict[int, list[float]] = field(default_factory=dict)
    start_whole: dict[int, list[float]] = field(default_factory=dict)
    start_held: dict[int, list[float]] = field(default_factory=dict)
    writes_per_s: dict[int, list[float]] = field(default_factory=dict)
    floor: dict[int, list[float]] = field(default_factory=dict)
    processes: int = 1

    def merge(self, other: StoreSamples) -> None:
        """Pool `other`'s timings into these."""
        for name in ("context", "full_read", "start_whole", "start_held", "writes_per_s", "floor"):
            mine: dict[int, list[float]] = getattr(self, name)
            for key, values in getattr(other, name).items():
                mine.setdefault(key, []).extend(values)
        self.processes += other.processes

    def summary(self, backend: str) -> StoreResult:
        return StoreResult(
            backend,
            context_ms={n: (median(v), percentile(v, 99)) for n, v in self.context.items()},
            full_read_ms={n: median(v) for n, v in self.full_read.items()},
            run_start_ms={
                n: (median(v), median(self.start_held[n])) for n, v in self.start_whole.items()
            },
            writes_per_s={n: median(v) for n, v in self.writes_per_s.items()},
            floor_ms={n: median(v) for n, v in self.floor.items()},
            processes=self.processes,
        )

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str | bytes) -> StoreSamples:
        data = json.loads(text)
        processes = data.pop("processes")
        # JSON object keys are strings.
        by_size = {
            name: {int(key): list(values) for key, values in mapping.items()}
            for name, mapping in data.items()
        }
        return cls(**by_size, processes=processes)


INSTRUCTIONS = "You are a helpful assistant."


async def _context_build(
    store: SqlStore, session_id: str, repeats: int, floor: sqlite3.Connection | None
) -> tuple[list[float], list[float], list[float]]:
    """ms of each context build, of each full read and, given a connection to the SQLite
    file, of each of the build's floor (`floor_messages`), of the session, taken in turn."""
    timings: list[float] = []
    full_reads: list[float] = []
    floors: list[float] = []
    for _ in range(repeats + 2):
        started = time.perf_counter()
        history = await store.log.get_history(session_id)
        build_context(INSTRUCTIONS, history, None)
        timings.append((time.perf_counter() - started) * 1000)
        started = time.perf_counter()
        await store.log.get_steps(session_id)
        full_reads.append((time.perf_counter() - started) * 1000)
        if floor is not None:
            started = time.perf_counter()
            floor_messages(floor, session_id)
            floors.append((time.perf_counter() - started) * 1000)
    return timings[2:], full_reads[2:], floors[2:]  # warm caches first


def floor_messages(conn: sqlite3.Connection, session_id: str) -> list[dict[str, object]]:
    """The context build's floor: a session's messages straight from SQLite, through stdlib
    sqlite3 on this thread, the columns a message needs, one dict per row; no step objects,
    no repair, no thread or store around it. What the build costs here before the store's
    and the engine's parts."""
    rows = conn.execute(FLOOR_QUERY, (session_id,)).fetchall()
    messages: list[dict[str, object]] = [{"role": "system", "content": INSTRUCTIONS}]
    for role, content, tool_calls, tool_call_id in rows:
        message: dict[str, object] = {"role": role, "content": content}
        if tool_call_id:
            message["tool_call_id"] = tool_call_id
        elif tool_calls != "[]":
            message["tool_calls"] = [
                {"id": c["id"], "type": "function", "function": function_of(c)}
                for c in json.loads(tool_calls)
            ]
            message["content"] = content or None
        messages.append(message)
    return messages


def function_of(call: dict[str, str]) -> dict[str, str]:
    return {"name": call["name"], "arguments": call["arguments"]}


FLOOR_QUERY = (
    "SELECT role, content, tool_calls, tool_call_id FROM steps WHERE session_id = ? "
    "AND sequence >= 1 ORDER BY sequence"
)


async def _run_start(
    store: SqlStore, session_id: str, repeats: int
) -> tuple[list[float], list[float]]:
    """ms of each run start + context build on the session: reading the whole history, and
    with the history held (as the runtime does it, engine/runtime.py `start_run`). Each
    start's input step is deleted again after it, outside the timing."""
    histories = HistoryCache(1_000_000_000)
    histories.remember(session_id, await store.log.get_history(session_id))
    last = (await store.log.get_session(session_id)).step_count + 1
    whole: list[float] = []
    held: list[float] = []
    for index in range(2 * (repeats + 2)):
        hold = index % 2 == 1
        run = Run(session_id=session_id, agent="bench")
        user = Step(session_id, run.id, Role.USER, content="one more question")
        began = time.perf_counter()
        kept = histories.cached(session_id) if hold else CachedHistory()
        started = await store.ledger.start_run(run, [user], since=kept.mark)
        history = kept.join(started.history_start, started.history)
        build_context(INSTRUCTIONS, history, None)
        (held if hold else whole).append((time.perf_counter() - began) * 1000)
        await store.ledger.release_session(session_id, run.id)
        await store.log.delete_steps_from(session_id, last)
    return whole[2:], held[2:]


async def _write_throughput(store: SqlStore, writers: int, duration_s: float) -> float:
    sessions = [
        await stored_session(store, lambda id: [Step(id, "run_b", Role.USER, content="hi")])
        for _ in range(writers)
    ]
    stored = 0
    deadline = time.perf_counter() + duration_s

    async def writer(session_id: str) -> None:
        nonlocal stored
        while time.perf_counter() < deadline:
            step = Step(session_id, "run_b", Role.ASSISTANT, content="ok " * 50)
            await store.log.append_steps([step])
            stored += 1

    started = time.perf_counter()
    await asyncio.gather(*(writer(session_id) for session_id in sessions))
    return stored / (time.perf_counter() - started)


async def measure_store(
    url: str,
    sizes: list[int],
    writers: list[int],
    repeats: int,
    write_s: float,
    *,
    like_serve: bool = False,
) -> StoreSamples:
    """B5 on one database, in this process; `like_serve`: with the garbage collector tuned
    as `serve` tunes it (its start-up heap frozen, its thresholds set)."""
    samples = StoreSamples()
    store = await open_store(url)
    if like_serve:
        from agio_grpc.service.app import tune_collector

        tune_collector()
    try:
        for size in sizes:
            session_id = await stored_session(store, lambda id: tool_rounds(id, size))  # noqa: B023
            path = make_url(url).database if store.backend == "sqlite" else None
            floor = sqlite3.connect(path) if path else None  # the build's floor: SQLite only
            try:
                built = await _context_build(store, session_id, repeats, floor)
            finally:
                if floor is not None:
                    floor.close()
            samples.context[size], samples.full_read[size], floors = built
            if floors:
                samples.floor[size] = floors
            started = await _run_start(store, session_id, repeats)
            samples.start_whole[size], samples.start_held[size] = started
        for count in writers:
            samples.writes_per_s[count] = [await _write_throughput(store, count, write_s)]
    finally:
        await store.close()
    return samples


REPO_ROOT = Path(__file__).resolve().parent.parent
# Timings vary more between processes than within one on a small shared VM (where the
# store's threads land against the event loop's): several processes are pooled.
PROCESSES = 3


async def _measure_in_children(
    new_database: Callable[[], AbstractAsyncContextManager[str]],
    backend: str,
    sizes: list[int],
    writers: list[int],
    repeats: int,
    write_s: float,
) -> StoreResult:
    """`measure_store` in fresh processes shaped like the server (see the module docstring),
    one after another, each on an empty database of its own, their timings pooled; the
    write rates come from the first process only."""
    pooled: StoreSamples | None = None
    for index in range(PROCESSES):
        async with new_database() as url:
            args = ["--url", url, "--repeats", str(repeats), "--sizes", *map(str, sizes)]
            if index == 0 and writers:
                args += ["--writers", *map(str, writers), "--write-s", str(write_s)]
            child = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "bench.store",
                *args,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                cwd=REPO_ROOT,
            )
            out, err = await child.communicate()
        if child.returncode != 0:
            last = err.decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
            raise RuntimeError(f"bench.store exited with {child.returncode}: {last[0]}")
        samples = StoreSamples.from_json(out)
        if pooled is None:
            pooled = samples
        else:
            pooled.merge(samples)
    assert pooled is not None
    return pooled.summary(backend)


@contextlib.asynccontextmanager
async def _sqlite_database() -> AsyncIterator[str]:
    """An empty SQLite file for one process's measurements."""
    with tempfile.TemporaryDirectory() as scratch:
        yield f"sqlite+aiosqlite:///{Path(scratch) / 'b5.db'}"


async def measure(
    sizes: list[int], writers: list[int], repeats: int, write_s: float, postgres: bool
) -> list[StoreResult]:
    results = [
        await _measure_in_children(_sqlite_database, "sqlite", sizes, writers, repeats, write_s)
    ]
    if not postgres:
        return results
    try:
        async with procs.postgres_databases() as new_database:
            results.append(
                await _measure_in_children(
                    new_database, "postgresql", sizes, writers, repeats, write_s
                )
            )
    except Exception as error:
        results.append(StoreResult("postgresql", skipped=f"{type(error).__name__}: {error}"))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.store", description=__doc__)
    parser.add_argument("--url", required=True)
    parser.add_argument("--sizes", type=int, nargs="+", required=True)
    parser.add_argument("--writers", type=int, nargs="*", default=[])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--write-s", type=float, default=3.0)
    args = parser.parse_args()
    import agio_grpc.cli
    import agio_grpc.service.app  # noqa: F401 - the modules `agio-grpc serve` runs with

    samples = asyncio.run(
        measure_store(
            args.url, args.sizes, args.writers, args.repeats, args.write_s, like_serve=True
        )
    )
    print(samples.to_json())


if __name__ == "__main__":
    main()
