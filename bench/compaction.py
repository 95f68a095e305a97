"""Compaction's cost and what it saves: `python -m bench.compaction [--sizes N ...]`.

For sessions of N steps (B5's shape: user, assistant calling a tool, the result, a reply,
with texts of ~400 characters), on a SQLite file:

- the context build as B5 times it (read the history, build the messages) on the plain
  session (the baseline, same run) and on the same session once a summary step covers all
  but the last 20 steps;
- the messages and the estimated prompt tokens (engine/compaction.py) the next model call
  gets, without and with the summary.

The summary's text is a fixed ~1,200 characters (what the built-in instructions ask a model
for); its model call is not timed here (it is one model call, as long as the provider takes).
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

from agio_grpc.domain import Role, Step, ToolCall
from agio_grpc.engine.compaction import ESTIMATE, plan_compaction
from agio_grpc.engine.context import build_context, context_steps
from agio_grpc.store.sql import SqlStore, open_store
from bench.sessions import stored_session
from bench.stats import median, percentile

INSTRUCTIONS = "You are a helpful assistant."
TEXT = "The order shipped on Tuesday from the Leeds warehouse and should arrive soon. " * 5
SUMMARY = "The user asked about orders; each was looked up and answered. " * 20
REPEATS = 50
KEEP = 20


def _steps(session_id: str, count: int) -> list[Step]:
    steps: list[Step] = []
    for index in range(count):
        match index % 4:
            case 0:
                steps.append(Step(session_id, "run_b", Role.USER, content=f"{index}: {TEXT}"))
            case 1:
                call = ToolCall(f"call_{index}", "lookup", f'{{"order": "{index}"}}')
                steps.append(Step(session_id, "run_b", Role.ASSISTANT, tool_calls=[call]))
            case 2:
                steps.append(
                    Step(session_id, "run_b", Role.TOOL, content=TEXT,
                         tool_call_id=f"call_{index - 1}", name="lookup")
                )  # fmt: skip
            case _:
                steps.append(Step(session_id, "run_b", Role.ASSISTANT, content=TEXT))
    return steps


async def _build_ms(store: SqlStore, session_id: str) -> list[float]:
    timings: list[float] = []
    for _ in range(REPEATS + 2):
        started = time.perf_counter()
        history = await store.log.get_history(session_id)
        build_context(INSTRUCTIONS, history, None)
        timings.append((time.perf_counter() - started) * 1000)
    return timings[2:]  # warm caches first


async def measure(size: int, store: SqlStore) -> list[str]:
    session_id = await stored_session(store, lambda id: _steps(id, size))
    plain = await _build_ms(store, session_id)
    history = await store.log.get_history(session_id)
    before = context_steps(INSTRUCTIONS, history)
    plan = plan_compaction(history, KEEP)
    assert plan is not None
    await store.log.append_steps([
        Step(session_id, "run_b", Role.SUMMARY, content=SUMMARY,
             summary_first_sequence=plan.first_sequence,
             summary_last_sequence=plan.last_sequence)
    ])  # fmt: skip
    summarized = await _build_ms(store, session_id)
    after = context_steps(INSTRUCTIONS, await store.log.get_history(session_id))
    tokens_before = ESTIMATE.prompt(before, [])
    tokens_after = ESTIMATE.prompt(after, [])
    return [
        f"| {size:,} | {median(plain):.2f} ({percentile(plain, 99):.2f}) "
        f"| {median(summarized):.2f} ({percentile(summarized, 99):.2f}) "
        f"| {len(before):,} -> {len(after):,} | {tokens_before:,} -> {tokens_after:,} "
        f"({100 * (1 - tokens_after / tokens_before):.1f}% saved) |"
    ]


async def main(sizes: list[int]) -> None:
    with tempfile.TemporaryDirectory() as folder:
        store = await open_store(f"sqlite+aiosqlite:///{Path(folder) / 'bench.db'}")
        try:
            print("| steps | context build ms, plain: median (p99) | with a summary | "
                  "messages | estimated prompt tokens |")  # fmt: skip
            print("|---|---|---|---|---|")
            for size in sizes:
                for line in await measure(size, store):
                    print(line, flush=True)
        finally:
            await store.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 1_000, 2_000])
    asyncio.run(main(parser.parse_args().sizes))
