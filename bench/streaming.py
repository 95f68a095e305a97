"""B1 time to first token, B2 CPU per token, B3 tokens per second: one run at a time.

Processes: the fake model (`agio-grpc fake-model`, N one-word chunks as fast as it can), the
service (`agio-grpc serve` on a fresh SQLite file), and this process, the client. Paths:

- direct: `openai.AsyncOpenAI` streaming from the fake model (the baseline);
- agents-sdk: `Runner.run_streamed` of the OpenAI Agents SDK, in this process;
- agio-grpc: a `Run` over gRPC; first token = the first `step_delta` with content, done at
  the terminal event (every step stored). Measured with tracing off, and with tracing on
  (a second server exporting OTLP to an in-memory receiver in this process);
- grpc relay floor: a `Run` on `bench.floor --relay`, a bare grpc.aio server relaying the
  plain openai client's stream (no store, no engine): the cost of the gRPC hop alone;
- run floor: a `Run` on `bench.run_floor`, what an agio-grpc run writes, the model read with
  agio-grpc's own driver, nothing stored and no engine.

B1 and B3 alternate direct, agio-grpc, relay floor and run floor runs so drift in the
machine's load hits all four, the three servers' runs in turn after the direct client's (a
server's run is slower right after another process's run than right after its own: `python
-m bench.warmth`); the traced server's runs, taken after the others, each follow a direct
client's run too. B2 is CPU time over the tokens streamed: this process's for direct and the
SDK (both run here), the server process's for agio-grpc and the floors; the fake model's CPU
is in none of them.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import openai

from agio_grpc.client import AgioClient
from bench import procs


@dataclass(slots=True)
class Samples:
    """Per-run measurements of one path."""

    ttft_ms: list[float] = field(default_factory=list)
    tokens_per_s: list[float] = field(default_factory=list)
    cpu_s: float = 0.0
    tokens: int = 0

    @property
    def cpu_us_per_token(self) -> float:
        return self.cpu_s / self.tokens * 1e6 if self.tokens else 0.0


@dataclass(slots=True)
class StreamingResult:
    """Everything B1-B3 measured, by path name."""

    runs: int
    tokens: int
    paths: dict[str, Samples]
    spans_exported: int | None
    """Spans the tracing-on server exported (None: the OTLP receiver is not available)."""


async def direct_run(model: openai.AsyncOpenAI, samples: Samples) -> None:
    cpu = time.process_time()
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
    samples.cpu_s += time.process_time() - cpu
    samples.tokens += tokens
    samples.ttft_ms.append((first - started) * 1000)
    samples.tokens_per_s.append(tokens / (ended - started))


async def service_run(client: AgioClient, samples: Samples, tokens: int) -> None:
    started = time.perf_counter()
    first = 0.0
    async for event in client.run("stream please"):
        kind = event.WhichOneof("event")
        if kind == "step_delta" and event.step_delta.content and not first:
            first = time.perf_counter()
        elif kind == "run_failed":
            raise RuntimeError(f"run failed: {event.run_failed.run.stop_signal.message}")
        elif kind == "run_completed":
            break
    ended = time.perf_counter()
    samples.tokens += tokens
    samples.ttft_ms.append((first - started) * 1000)
    samples.tokens_per_s.append(tokens / (ended - started))


async def sdk_runs(model_url: str, runs: int, warmup: int) -> Samples:
    # Imported here: the SDK takes over a second to import, and the report and its tests
    # read this module's results without it.
    from bench import sdk

    samples = Samples()
    client = openai.AsyncOpenAI(base_url=model_url, api_key="bench", max_retries=0)
    agent = sdk.make_agent(client, tools=False)
    for index in range(warmup + runs):
        cpu = time.process_time()
        run = await sdk.sdk_run(agent)
        if index < warmup:
            continue
        samples.cpu_s += time.process_time() - cpu
        samples.tokens += run.text_deltas
        samples.ttft_ms.append(run.ttft_s * 1000)
        samples.tokens_per_s.append(run.text_deltas / run.duration_s)
    await client.close()
    return samples


@asynccontextmanager
async def b1_servers(
    model_url: str,
) -> AsyncIterator[tuple[procs.Child, procs.Child, procs.Child]]:
    """B1's three servers on the fake model at `model_url`: `agio-grpc serve` (untraced, on
    a fresh SQLite file), the relay floor and the run floor; stopped after."""
    with tempfile.TemporaryDirectory() as scratch:
        database = f"sqlite+aiosqlite:///{Path(scratch) / 'off.db'}"
        async with (
            procs.agio_server(model_url, database) as server,
            procs.grpc_floor(relay=model_url) as floor,
            procs.run_floor(model_url) as run_floor,
        ):
            yield server, floor, run_floor


async def measure(runs: int, tokens: int, warmup: int) -> StreamingResult:
    paths: dict[str, Samples] = {}
    async with procs.fake_model(tokens) as model_proc:
        model_url = model_proc.ready
        direct, service, relay, minimal = Samples(), Samples(), Samples(), Samples()
        async with (
            b1_servers(model_url) as (server, floor, run_floor),
            openai.AsyncOpenAI(base_url=model_url, api_key="bench", max_retries=0) as model,
            AgioClient(server.ready) as client,
            AgioClient(floor.ready) as bare,
            AgioClient(run_floor.ready) as unstored,
        ):
            for _ in range(warmup):
                await direct_run(model, Samples())
                for warmed in (client, bare, unstored):
                    await service_run(warmed, Samples(), tokens)
            # Each server idles while the others run: its CPU over the loop is its own.
            processes = [(server, service), (floor, relay), (run_floor, minimal)]
            started = [process.cpu_s() for process, _ in processes]
            servers = [(client, service), (bare, relay), (unstored, minimal)]
            for _ in range(runs):
                await direct_run(model, direct)
                for server_client, samples in servers:
                    await service_run(server_client, samples, tokens)
                servers = servers[1:] + servers[:1]  # each takes every place as often
            for (process, samples), cpu in zip(processes, started, strict=True):
                samples.cpu_s = process.cpu_s() - cpu
        paths["direct"] = direct
        paths["grpc relay floor"] = relay
        paths["run floor"] = minimal
        paths["agio-grpc"] = service
        paths["agents-sdk"] = await sdk_runs(model_url, runs, warmup)
        traced, spans = await traced_runs(model_url, runs, tokens, warmup)
        paths["agio-grpc traced"] = traced
    return StreamingResult(runs, tokens, paths, spans)


async def traced_runs(
    model_url: str, runs: int, tokens: int, warmup: int
) -> tuple[Samples, int | None]:
    """agio-grpc with tracing on: OTLP/gRPC to an in-memory receiver in this process."""
    try:
        from agio_grpc.testing.otlp import OtlpReceiver
    except ImportError:
        receiver = None
    else:
        receiver = OtlpReceiver()
        receiver.start()
    endpoint = receiver.endpoint if receiver is not None else "http://127.0.0.1:4317"
    otel = {
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_METRICS_EXPORTER": "none",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
        "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
        "OTEL_SERVICE_NAME": "agio-grpc-bench",
    }
    samples = Samples()
    try:
        with tempfile.TemporaryDirectory() as scratch:
            database = f"sqlite+aiosqlite:///{Path(scratch) / 'on.db'}"
            async with (
                procs.agio_server(model_url, database, otel) as server,
                AgioClient(server.ready) as client,
                openai.AsyncOpenAI(base_url=model_url, api_key="bench", max_retries=0) as model,
            ):
                for _ in range(warmup):
                    await service_run(client, Samples(), tokens)
                cpu = server.cpu_s()
                for _ in range(runs):
                    # As the untraced server's, each run follows another process's run.
                    await direct_run(model, Samples())
                    await service_run(client, samples, tokens)
                samples.cpu_s = server.cpu_s() - cpu
        return samples, len(receiver.spans()) if receiver is not None else None
    finally:
        if receiver is not None:
            receiver.stop()


def machine_cpus() -> int:
    return os.cpu_count() or 1


def ttft_main(
    description: str,
    measure: Callable[[int, int, int], Coroutine[Any, Any, dict[str, Samples]]],
    table: Callable[[dict[str, Samples]], str],
    argv: list[str] | None,
) -> int:
    """The command line of a B1 comparison of paths (`bench.auth`, `bench.connect`): runs,
    tokens and warm-up runs a path; the table of what `measure` sampled."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--runs", type=int, default=300, help="runs a path (default 300)")
    parser.add_argument("--tokens", type=int, default=50, help="chunks a run (default 50)")
    parser.add_argument("--warmup", type=int, default=20, help="unmeasured runs a path")
    args = parser.parse_args(argv)
    samples = asyncio.run(measure(args.runs, args.tokens, args.warmup))
    print(f"B1 time to first token, {args.runs} runs a path, {args.tokens} tokens a run:")
    print(table(samples))
    return 0
