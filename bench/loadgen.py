"""A load generator process for B4 and B6: runs, one JSON line of results on stdout.

    python -m bench.loadgen agio ADDRESS --runs 500
    python -m bench.loadgen sdk MODEL_URL --runs 500
    python -m bench.loadgen sdk MODEL_URL --runs 1000 --concurrency 25 --warmup 50

Every run starts at once, or with `--concurrency`, at most that many at a time (each run
that ends starts the next). `--warmup` runs first, unmeasured: the CPU and wall time
reported are the measured runs' alone (the SDK's imports and first calls excluded).

`agio` drives `AgentService.Run` over a lean `grpc.aio` stub (no client-side conversion);
`sdk` runs the OpenAI Agents SDK in this process, the same agent shape (one tool, then the
reply), so this process's CPU and memory are the SDK's cost. For each run it records the
gaps between consecutive text deltas as the caller sees them, and whether it failed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field

RUN_TIMEOUT_S = 120.0


@dataclass(slots=True)
class LoadResult:
    runs: int = 0
    errors: int = 0
    error_samples: list[str] = field(default_factory=list)
    gaps_ms: list[float] = field(default_factory=list)
    ttft_ms: list[float] = field(default_factory=list)
    wall_s: float = 0.0
    cpu_s: float = 0.0
    peak_rss_mb: float = 0.0

    def failed(self, why: str) -> None:
        self.errors += 1
        if len(self.error_samples) < 5:
            self.error_samples.append(why[:300])


async def bounded(runs: int, concurrency: int, one: Callable[[int], Awaitable[None]]) -> None:
    """`one(0)` ... `one(runs - 1)`, at most `concurrency` at a time (0: all at once)."""
    if concurrency <= 0 or concurrency >= runs:
        await asyncio.gather(*(one(index) for index in range(runs)))
        return
    indexes = iter(range(runs))

    async def worker() -> None:
        for index in indexes:
            await one(index)

    await asyncio.gather(*(worker() for _ in range(concurrency)))


async def measured(
    result: LoadResult,
    warmup: int,
    concurrency: int,
    one: Callable[[int, LoadResult], Awaitable[None]],
) -> None:
    """`warmup` runs into a throwaway result, then `result.runs` measured ones into it."""
    throwaway = LoadResult()
    await bounded(warmup, concurrency, lambda index: one(index, throwaway))
    cpu = time.process_time()
    started = time.perf_counter()
    await bounded(result.runs, concurrency, lambda index: one(index, result))
    result.wall_s = time.perf_counter() - started
    result.cpu_s = time.process_time() - cpu


async def agio_load(
    address: str,
    result: LoadResult,
    per_channel: int = 100,
    concurrency: int = 0,
    warmup: int = 0,
) -> None:
    import grpc

    from agio_grpc.v1 import agent_service_pb2, agent_service_pb2_grpc

    # Several channels: one HTTP/2 connection per `per_channel` streams, as a fleet of
    # callers would. A local subchannel pool per channel: otherwise channels to one target
    # share a single connection in this process.
    options = [("grpc.use_local_subchannel_pool", 1)]
    count = max(1, (concurrency or result.runs) // per_channel)
    channels = [grpc.aio.insecure_channel(address, options=options) for _ in range(count)]
    stubs = [agent_service_pb2_grpc.AgentServiceStub(channel) for channel in channels]

    async def one(index: int, into: LoadResult) -> None:
        started = time.perf_counter()
        last = 0.0
        try:
            call = stubs[index % len(stubs)].Run(
                agent_service_pb2.RunRequest(input="what is 2 + 2?"), timeout=RUN_TIMEOUT_S
            )
            async for event in call:
                kind = event.WhichOneof("event")
                if kind == "step_delta" and event.step_delta.content:
                    now = time.perf_counter()
                    if last:
                        into.gaps_ms.append(round((now - last) * 1000, 2))
                    else:
                        into.ttft_ms.append(round((now - started) * 1000, 2))
                    last = now
                elif kind == "run_failed":
                    into.failed(event.run_failed.run.stop_signal.message)
                    return
                elif kind == "run_completed":
                    return
            into.failed("the stream ended without a terminal event")
        except grpc.aio.AioRpcError as error:
            into.failed(f"{error.code().name}: {error.details()} ({error.debug_error_string()})")

    try:
        await measured(result, warmup, concurrency, one)
    finally:
        for channel in channels:
            await channel.close()


async def sdk_load(
    model_url: str, result: LoadResult, concurrency: int = 0, warmup: int = 0
) -> None:
    import openai

    from bench import sdk

    client = openai.AsyncOpenAI(base_url=model_url, api_key="bench", max_retries=0)
    agent = sdk.make_agent(client, tools=True)

    async def one(_index: int, into: LoadResult) -> None:
        try:
            run = await asyncio.wait_for(sdk.sdk_run(agent, "what is 2 + 2?"), RUN_TIMEOUT_S)
        except Exception as error:
            into.failed(f"{type(error).__name__}: {error}")
            return
        if not run.text_deltas:
            into.failed("no text streamed")
            return
        into.ttft_ms.append(round(run.ttft_s * 1000, 2))
        into.gaps_ms.extend(round(gap * 1000, 2) for gap in run.gaps_s)

    try:
        await measured(result, warmup, concurrency, one)
    finally:
        await client.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.loadgen")
    parser.add_argument("kind", choices=["agio", "sdk"])
    parser.add_argument("target", help="agio: host:port of the server; sdk: the model URL")
    parser.add_argument("--runs", type=int, required=True)
    parser.add_argument(
        "--runs-per-channel", type=int, default=100, help="agio: streams per connection"
    )
    parser.add_argument("--concurrency", type=int, default=0, help="runs at a time (0: all)")
    parser.add_argument("--warmup", type=int, default=0, help="unmeasured runs first")
    args = parser.parse_args(argv)
    result = LoadResult(runs=args.runs)
    if args.kind == "agio":
        load = agio_load(args.target, result, args.runs_per_channel, args.concurrency, args.warmup)
    else:
        load = sdk_load(args.target, result, args.concurrency, args.warmup)
    asyncio.run(load)
    result.peak_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    sys.stdout.write(json.dumps(asdict(result)) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
