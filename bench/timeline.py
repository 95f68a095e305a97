"""Where B1's time to first token goes inside the server: a run's phases, timed.

    python -m bench.timeline --runs 200      # the table: ms from the call's arrival

Serves `agio-grpc serve` on a fresh SQLite file with its phases timed (`--serve`: the
server this starts, instrumented by wrapping the functions each phase ends in), then
makes B1's runs one at a time, each after a run of the direct openai client as in B1
(bench/streaming.py), the fake model answering 200 tokens as fast as it can. Prints, for
each mark, the ms from the call's arrival at the servicer to the mark's first passing in
that run (p50 and p90 over the runs), in the order of their medians. The wrapping costs a
few µs a mark; the figures are for reading one phase against another, not for B1.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import procs
from bench.stats import median, percentile

TOKENS = 200
WARMUP = 30

Marks = list[dict[str, float]]
"""Per run (in arrival order): mark -> perf_counter seconds of its first passing."""


def _none(_result: object) -> str:
    return ""


def instrument(marks: Marks) -> None:
    """Wrap the server's functions so each run's phases are marked into `marks` (one run
    at a time: a mark goes to the newest run)."""
    from agio_grpc.engine import lifecycle, loop, model_call, queues, runtime, segments
    from agio_grpc.engine.models import openai_chat
    from agio_grpc.service import agent_service
    from agio_grpc.store import database

    def mark(name: str) -> None:
        if marks and name not in marks[-1]:
            marks[-1][name] = time.perf_counter()

    def timed_async(
        owner: Any, name: str, before: str, after: str, *, begins_run: bool = False
    ) -> None:
        inner = getattr(owner, name)

        async def wrapper(*args: Any, **kwargs: Any) -> Any:
            if begins_run:
                marks.append({})
            mark(before)
            result = await inner(*args, **kwargs)
            mark(after)
            return result

        setattr(owner, name, wrapper)

    def timed(
        owner: Any, name: str, before: str, after: str, suffix: Callable[[Any], str] = _none
    ) -> None:
        inner = getattr(owner, name)

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            mark(before)
            result = inner(*args, **kwargs)
            mark(after + suffix(result))
            return result

        setattr(owner, name, wrapper)

    servicer = agent_service.AgentServicer
    timed_async(servicer, "Run", "arrived", "ended", begins_run=True)
    timed_async(servicer, "run_input", "request checked: start", "request checked")
    timed_async(runtime.Runtime, "start_run", "start_run: start", "start_run: done")
    timed_async(segments.Segments, "admit", "admitted: start", "admitted")
    timed_async(queues.RunQueues, "begin", "start transaction: called", "start transaction: done")
    timed_async(lifecycle.Lifecycle, "_commit", "journaled write: start", "journaled write: done")
    # A short run on a new session reads nothing: its transactions on the loop's thread are
    # brief writes.
    on_loop = database._LoopConnection
    timed(on_loop, "transaction", "brief transaction: start", "brief transaction: done")
    timed_async(segments.Segments, "spawn_started", "loop spawned: start", "loop spawned")
    timed_async(loop.RunLoop, "run", "loop: start", "loop: done")
    timed_async(loop.RunLoop, "_compact", "compaction check: start", "compaction check: done")
    timed(loop, "model_request", "request built: start", "request built")
    timed_async(model_call.ModelCall, "reply", "model call: start", "model call: done")
    driver = openai_chat.OpenAIModelDriver
    timed_async(driver, "_stream", "model request: start", "model reply: done")
    timed(openai_chat, "chunk_of", "model: first chunk read", "model: first chunk parsed")

    def kind(encoded: tuple[Any, bool]) -> str:
        return f": {encoded[0].WhichOneof('event')}"

    timed(agent_service, "_encoded", "encoding", "encoded", kind)


def serve(out: Path) -> int:
    """`agio-grpc serve`, instrumented; its marks written to `out` once it has stopped
    (SIGTERM: it drains and returns)."""
    from agio_grpc.cli import main

    marks: Marks = []
    instrument(marks)
    try:
        return main(["serve"])
    finally:
        out.write_text(json.dumps(marks))


async def measure(runs: int, warmup: int = WARMUP) -> tuple[Marks, list[float], list[float]]:
    """The marks of `runs` agio-grpc runs after `warmup` ones, and the TTFT ms of the direct
    client's and agio-grpc's runs, as the client saw them."""
    import openai

    from agio_grpc.client import AgioClient
    from bench.streaming import Samples, direct_run, service_run

    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "marks.json"
        async with procs.fake_model(TOKENS) as model:
            env = procs.clean_env() | {
                "OPENAI_BASE_URL": model.ready,
                "OPENAI_API_KEY": "bench",
                "AGIO_LISTEN_ADDRESS": "127.0.0.1:0",
                "AGIO_DATABASE_URL": f"sqlite+aiosqlite:///{Path(scratch) / 'timeline.db'}",
                "AGIO_LOG_LEVEL": "INFO",
            }
            command = [sys.executable, "-m", "bench.timeline", "--serve", str(out)]
            direct, agio = Samples(), Samples()
            async with (
                procs.child(command, procs.LISTEN_LINE, env, "stderr") as server,
                openai.AsyncOpenAI(base_url=model.ready, api_key="bench", max_retries=0) as plain,
                AgioClient(server.ready) as client,
            ):
                for index in range(warmup + runs):
                    measured = index >= warmup
                    await direct_run(plain, direct if measured else Samples())
                    await service_run(client, agio if measured else Samples(), TOKENS)
        marks: Marks = json.loads(out.read_text())
    return marks[warmup:], direct.ttft_ms, agio.ttft_ms


def table(marks: Marks) -> str:
    """Each mark's ms after `arrived`, p50 and p90 over the runs, by median."""
    after: dict[str, list[float]] = {}
    for run in marks:
        for name, at in run.items():
            after.setdefault(name, []).append((at - run["arrived"]) * 1000)
    lines = ["| mark | ms after arrival, p50 | p90 | runs |", "|---|---|---|---|"]
    for name, values in sorted(after.items(), key=lambda item: median(item[1])):
        lines.append(
            f"| {name} | {median(values):.2f} | {percentile(values, 90):.2f} | {len(values)} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.timeline", description=__doc__)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--serve", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve is not None:
        return serve(args.serve)
    marks, direct, agio = asyncio.run(measure(args.runs))
    print(
        f"TTFT p50 as the client saw it: direct {median(direct):.2f} ms, "
        f"agio-grpc {median(agio):.2f} ms ({median(agio) - median(direct):+.2f})"
    )
    print(table(marks))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
