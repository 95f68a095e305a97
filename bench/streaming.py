"""Time to first token and tokens per second: through agio-grpc vs the openai client direct.

Three processes, so no side's CPU hides another's: the fake model (`agio-grpc fake-model`,
streaming N one-word chunks as fast as it can), the service (`agio-grpc serve` on a fresh
SQLite file, pointed at the fake model), and this process, which measures both paths in one
run, alternating them so drift in the machine's load hits both alike:

- direct: `openai.AsyncOpenAI` streaming from the fake model (the baseline);
- agio-grpc: a `Run` over gRPC; first token = the first `step_delta` with content, and the
  run is done at its terminal event (every step stored).

    python -m bench --runs 50 --tokens 200
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import openai

from agio_grpc.client import AgioClient

URL_LINE = re.compile(r"(http://\S+/v1)")
LISTEN_LINE = re.compile(r"agio-grpc listening on (\S+)")


@dataclass(slots=True)
class Samples:
    """Per-run measurements of one path."""

    ttft_ms: list[float] = field(default_factory=list)
    tokens_per_s: list[float] = field(default_factory=list)


def percentile(values: list[float], pct: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(pct / 100 * (len(ordered) - 1))))
    return ordered[index]


@asynccontextmanager
async def process(
    args: list[str], pattern: re.Pattern[str], env: dict[str, str], stream: str
) -> AsyncIterator[str]:
    """Start a child, wait for `pattern` on its stdout/stderr, yield the match, stop it."""
    child = await asyncio.create_subprocess_exec(
        *args,
        env=env,
        stdout=asyncio.subprocess.PIPE if stream == "stdout" else asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE if stream == "stderr" else asyncio.subprocess.DEVNULL,
    )
    reader = child.stdout if stream == "stdout" else child.stderr
    assert reader is not None
    try:
        async with asyncio.timeout(60):
            while True:
                line = (await reader.readline()).decode()
                if not line:
                    raise RuntimeError(f"{args[2:4]} exited before it was ready")
                found = pattern.search(line)
                if found:
                    break
        drain = asyncio.create_task(_drain(reader))
        yield found.group(1)
        drain.cancel()
    finally:
        if child.returncode is None:
            child.terminate()
            await child.wait()


async def _drain(reader: asyncio.StreamReader) -> None:
    while await reader.readline():
        pass


async def direct_run(model: openai.AsyncOpenAI, samples: Samples) -> None:
    started = time.perf_counter()
    first = 0.0
    tokens = 0
    stream = await model.chat.completions.create(
        model="fake-model",
        messages=[{"role": "user", "content": "stream please"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            if not first:
                first = time.perf_counter()
            tokens += 1
    ended = time.perf_counter()
    samples.ttft_ms.append((first - started) * 1000)
    samples.tokens_per_s.append(tokens / (ended - started))


async def service_run(client: AgioClient, samples: Samples, tokens_expected: int) -> None:
    started = time.perf_counter()
    first = 0.0
    async for event in client.run("stream please"):
        kind = event.WhichOneof("event")
        if kind == "step_delta" and event.step_delta.content and not first:
            first = time.perf_counter()
        elif kind in ("run_completed", "run_failed"):
            break
    ended = time.perf_counter()
    samples.ttft_ms.append((first - started) * 1000)
    samples.tokens_per_s.append(tokens_expected / (ended - started))


def table(direct: Samples, service: Samples, runs: int, tokens: int) -> str:
    rows = [
        ("TTFT p50 (ms)", percentile(direct.ttft_ms, 50), percentile(service.ttft_ms, 50)),
        ("TTFT p99 (ms)", percentile(direct.ttft_ms, 99), percentile(service.ttft_ms, 99)),
        (
            "tokens/s (median)",
            statistics.median(direct.tokens_per_s),
            statistics.median(service.tokens_per_s),
        ),
    ]
    lines = [
        f"streaming: {runs} runs x {tokens} tokens, fake model as fast as it can, SQLite",
        f"{'metric':<20}{'direct openai':>16}{'agio-grpc':>14}{'added / ratio':>16}",
    ]
    for name, base, ours in rows:
        delta = f"{ours / base:.2f}x" if "tokens" in name else f"+{ours - base:.2f}"
        lines.append(f"{name:<20}{base:>16.2f}{ours:>14.2f}{delta:>16}")
    return "\n".join(lines)


async def measure(runs: int, tokens: int, warmup: int) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGIO_", "OPENAI_"))}
    exe = [sys.executable, "-m", "agio_grpc.cli"]
    fake_args = [*exe, "fake-model", "--port", "0", "--tokens", str(tokens), "--no-tool-first"]
    with tempfile.TemporaryDirectory() as scratch:
        async with process(fake_args, URL_LINE, env, "stdout") as model_url:
            server_env = env | {
                "OPENAI_BASE_URL": model_url,
                "OPENAI_API_KEY": "bench",
                "AGIO_LISTEN_ADDRESS": "127.0.0.1:0",
                "AGIO_DATABASE_URL": f"sqlite+aiosqlite:///{Path(scratch) / 'bench.db'}",
                "AGIO_LOG_LEVEL": "WARNING",
            }
            async with process(
                [*exe, "serve"], LISTEN_LINE, server_env | {"AGIO_LOG_LEVEL": "INFO"}, "stderr"
            ) as address:
                model = openai.AsyncOpenAI(base_url=model_url, api_key="bench", max_retries=0)
                direct, service = Samples(), Samples()
                async with AgioClient(address) as client:
                    for _ in range(warmup):
                        await direct_run(model, Samples())
                        await service_run(client, Samples(), tokens)
                    for _ in range(runs):
                        await direct_run(model, direct)
                        await service_run(client, service, tokens)
                await model.close()
    return table(direct, service, runs, tokens)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--tokens", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=5)
    args = parser.parse_args(argv)
    print(asyncio.run(measure(args.runs, args.tokens, args.warmup)))
    return 0
