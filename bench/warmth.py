"""B1's time to first token by how warm the server is, and a run start's transaction the same
way: what B1's agio-grpc figure is made of (docs/benchmarks/NOTES.md, "What is left").

B1 runs one run at a time, each path's run after the others' (the direct client's, the relay
floor's), so a server meets every run after a pause in which the other processes ran on the
same cores. Here each server's runs follow each other with nothing between them, then after
a pause of a few milliseconds, then as B1 orders them (after the direct client's run and the
other server's). Then, in this process, a new session's start transaction (`start_run` of
the store, what the service runs before its first model call) the same three ways, the
pause or the other processes replaced by touching more memory than the caches hold.

    python -m bench.warmth [--runs 40] [--pause-ms 30]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import openai

from agio_grpc.client import AgioClient
from agio_grpc.domain import Role, Run, Session, Step
from agio_grpc.engine.channel import RunChannel
from agio_grpc.engine.lifecycle import opened
from agio_grpc.store.sql import open_store
from bench import procs
from bench.stats import percentile
from bench.streaming import Samples, b1_servers, direct_run, service_run

TOKENS = 200
CACHE_SPILL_BYTES = 32 << 20
"""Memory touched between two starts for "caches overwritten": more than this machine's
caches hold, as the other processes' work between two of B1's runs does."""


async def measure_ttft(runs: int, pause_s: float) -> dict[str, dict[str, tuple[float, float]]]:
    """TTFT (p50, p99) ms by path (B1's "direct", "agio-grpc", "grpc relay floor") and by
    what came before each run: nothing, a pause, the other paths' runs (as in B1)."""
    figures: dict[str, dict[str, tuple[float, float]]] = {}
    async with procs.fake_model(TOKENS) as model_proc:
        model_url = model_proc.ready
        async with (
            b1_servers(model_url) as (server, floor, _),
            openai.AsyncOpenAI(base_url=model_url, api_key="bench", max_retries=0) as model,
            AgioClient(server.ready) as agio,
            AgioClient(floor.ready) as bare,
        ):

            async def through(client: AgioClient) -> float:
                samples = Samples()
                await service_run(client, samples, TOKENS)
                return samples.ttft_ms[0]

            async def direct() -> float:
                samples = Samples()
                await direct_run(model, samples)
                return samples.ttft_ms[0]

            paths: dict[str, Callable[[], Awaitable[float]]] = {
                "direct": direct,
                "agio-grpc": lambda: through(agio),
                "grpc relay floor": lambda: through(bare),
            }
            for _ in range(10):  # warm-up: connections made, code loaded
                for path in paths.values():
                    await path()

            async def the_others(name: str) -> None:  # B1's order: every other path's run
                for other, run in paths.items():
                    if other != name:
                        await run()

            for name, path in paths.items():
                figures[name] = {}
                before: dict[str, Callable[[], Awaitable[object]]] = {
                    "back to back": _nothing,
                    _idle_label(pause_s): functools.partial(asyncio.sleep, pause_s),
                    "in B1's order": functools.partial(the_others, name),
                }
                for label, prepare in before.items():
                    samples = []
                    for _ in range(runs):
                        await prepare()
                        samples.append(await path())
                    figures[name][label] = (statistics.median(samples), percentile(samples, 99))
    return figures


async def measure_start(runs: int, pause_s: float) -> dict[str, float]:
    """p50 ms of a new session's start transaction on SQLite: back to back, after a pause,
    after touching CACHE_SPILL_BYTES."""
    spill = bytearray(CACHE_SPILL_BYTES)
    figures: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as scratch:
        store = await open_store(f"sqlite+aiosqlite:///{Path(scratch) / 'start.db'}")
        try:

            async def start() -> float:
                session = Session()
                run = Run(session_id=session.id, agent="assistant")
                step = Step(session.id, run.id, Role.USER, content="stream please")
                journal = RunChannel(run.id, session.id).journal_for(opened)
                began = time.perf_counter()
                await store.ledger.start_run(run, [step], new_session=session, journal=journal)
                return (time.perf_counter() - began) * 1000

            async def overwrite_caches() -> None:
                for index in range(0, CACHE_SPILL_BYTES, 64):
                    spill[index] ^= 1

            for _ in range(200):
                await start()
            before: dict[str, Callable[[], Awaitable[object]]] = {
                "back to back": _nothing,
                _idle_label(pause_s): functools.partial(asyncio.sleep, pause_s),
                "caches overwritten": overwrite_caches,
            }
            for label, prepare in before.items():
                samples = []
                for _ in range(runs * 5):
                    await prepare()
                    samples.append(await start())
                figures[label] = statistics.median(samples)
        finally:
            await store.close()
    return figures


async def _nothing() -> None:
    return None


def _idle_label(pause_s: float) -> str:
    return f"after {pause_s * 1000:.0f} ms idle"


def table(ttft: dict[str, dict[str, tuple[float, float]]], start: dict[str, float]) -> str:
    conditions = list(next(iter(ttft.values())))
    lines = [
        "| TTFT p50 / p99 ms | " + " | ".join(conditions) + " |",
        "|---|" + "---|" * len(conditions),
    ]
    lines += [
        f"| {path} | "
        + " | ".join("{:.2f} / {:.2f}".format(*figures[c]) for c in conditions)
        + " |"
        for path, figures in ttft.items()
    ]
    lines += [
        "",
        "| a new session's start transaction, SQLite, p50 ms | " + " | ".join(start) + " |",
        "|---|" + "---|" * len(start),
        "| `start_run` | " + " | ".join(f"{ms:.3f}" for ms in start.values()) + " |",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.warmth", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--runs", type=int, default=40, help="runs per path and condition")
    parser.add_argument("--pause-ms", type=float, default=30.0, help="the idle pause")
    args = parser.parse_args()
    pause_s = args.pause_ms / 1000
    ttft = asyncio.run(measure_ttft(args.runs, pause_s))
    start = asyncio.run(measure_start(args.runs, pause_s))
    print(table(ttft, start))


if __name__ == "__main__":
    main()
