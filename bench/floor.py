"""The gRPC floors: bare `grpc.aio` AgentServices with nothing behind them.

    python -m bench.floor --tokens 100 --tokens-per-second 10     # B4: paced deltas
    python -m bench.floor --relay MODEL_URL                       # B1-B3: relay the model

`Run` answers with `run_started`, then `tokens` one-word `step_delta` events at the model's
pace, then `run_completed`: the messages an agio-grpc run streams to its caller, with no
model call, no tools, no store and no tracing behind them. Driven by the same load generator
at the same concurrency, it shows what Python gRPC alone costs on this machine, so the
service's figures can be read against it. Each call starts at a random phase of the pace, as
independent runs would, and keeps a fixed schedule from there (no drift under load).

With `--relay`, `Run` instead streams a chat completion from the model with the plain openai
client (as B1's direct path does) and relays each content delta as a `step_delta`: what
putting a Python gRPC hop between a caller and the model costs, with no store, engine or
tracing. B1 reads agio-grpc's added time to first token against it.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
from collections.abc import AsyncIterator

import grpc
import openai

from agio_grpc.v1 import agent_service_pb2, agent_service_pb2_grpc, events_pb2, resources_pb2


class _BareRun(agent_service_pb2_grpc.AgentServiceServicer):
    """`Run` as the minimum a caller sees: `run_started`, a `step_delta` per piece of text from
    `deltas`, then `run_completed`."""

    def deltas(self, request: agent_service_pb2.RunRequest) -> AsyncIterator[str]:
        raise NotImplementedError

    async def Run(  # type: ignore[override]
        self, request: agent_service_pb2.RunRequest, context: grpc.aio.ServicerContext
    ) -> None:
        run = resources_pb2.Run(id="run_floor", status="RUN_STATUS_RUNNING")
        started = events_pb2.RunStartedEvent(run=run)
        await context.write(events_pb2.StepEvent(seq=1, run_started=started))
        seq = 1
        async for text in self.deltas(request):
            seq += 1
            delta = events_pb2.StepDeltaEvent(step_id="step_floor", content=text)
            await context.write(events_pb2.StepEvent(seq=seq, step_delta=delta))
        run.status = resources_pb2.RUN_STATUS_COMPLETED
        completed = events_pb2.RunCompletedEvent(run=run)
        await context.write(events_pb2.StepEvent(seq=seq + 1, run_completed=completed))


class FloorServicer(_BareRun):
    def __init__(self, tokens: int, tokens_per_second: float) -> None:
        self._tokens = tokens
        self._pace_s = 1 / tokens_per_second if tokens_per_second else 0.0  # 0: no pace

    async def deltas(self, request: agent_service_pb2.RunRequest) -> AsyncIterator[str]:
        loop = asyncio.get_running_loop()
        due = loop.time() + random.random() * self._pace_s
        for _ in range(self._tokens):
            await asyncio.sleep(max(0.0, due - loop.time()))
            yield "word "
            due += self._pace_s


class RelayServicer(_BareRun):
    def __init__(self, model_url: str) -> None:
        self._model = openai.AsyncOpenAI(base_url=model_url, api_key="bench", max_retries=0)

    async def deltas(self, request: agent_service_pb2.RunRequest) -> AsyncIterator[str]:
        stream = await self._model.chat.completions.create(
            model="fake-model",
            messages=[{"role": "user", "content": request.input}],
            stream=True,
            stream_options={"include_usage": True},
        )
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                yield chunk.choices[0].delta.content


async def serve(servicer: agent_service_pb2_grpc.AgentServiceServicer) -> None:
    server = grpc.aio.server()
    agent_service_pb2_grpc.add_AgentServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    # The line bench/procs.py waits for, as `agio-grpc serve` logs it.
    print(f"agio-grpc listening on 127.0.0.1:{port}", file=sys.stderr, flush=True)
    await server.wait_for_termination()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.floor")
    parser.add_argument("--tokens", type=int, default=100)
    parser.add_argument("--tokens-per-second", type=float, default=10.0)
    parser.add_argument("--relay", metavar="MODEL_URL", help="relay this model instead")
    args = parser.parse_args(argv)
    # Only Run is served; the other methods keep the generated UNIMPLEMENTED answers.
    servicer = (
        RelayServicer(args.relay)  # type: ignore[abstract]
        if args.relay
        else FloorServicer(args.tokens, args.tokens_per_second)  # type: ignore[abstract]
    )
    asyncio.run(serve(servicer))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
