"""The gRPC floor for B4: a bare `grpc.aio` AgentService that only streams paced deltas.

    python -m bench.floor --tokens 100 --tokens-per-second 10

`Run` answers with `run_started`, then `tokens` one-word `step_delta` events at the model's
pace, then `run_completed`: the messages an agio-grpc run streams to its caller, with no
model call, no tools, no store and no tracing behind them. Driven by the same load generator
at the same concurrency, it shows what Python gRPC alone costs on this machine, so the
service's figures can be read against it. Each call starts at a random phase of the pace, as
independent runs would, and keeps a fixed schedule from there (no drift under load).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys

import grpc

from agio_grpc.v1 import agent_service_pb2, agent_service_pb2_grpc, events_pb2, resources_pb2


class FloorServicer(agent_service_pb2_grpc.AgentServiceServicer):
    def __init__(self, tokens: int, tokens_per_second: float) -> None:
        self._tokens = tokens
        self._pace_s = 1 / tokens_per_second

    async def Run(  # type: ignore[override]
        self, request: agent_service_pb2.RunRequest, context: grpc.aio.ServicerContext
    ) -> None:
        run = resources_pb2.Run(id="run_floor", status="RUN_STATUS_RUNNING")
        started = events_pb2.RunStartedEvent(run=run)
        await context.write(events_pb2.StepEvent(seq=1, run_started=started))
        loop = asyncio.get_running_loop()
        due = loop.time() + random.random() * self._pace_s
        for index in range(self._tokens):
            await asyncio.sleep(max(0.0, due - loop.time()))
            delta = events_pb2.StepDeltaEvent(step_id="step_floor", content="word ")
            await context.write(events_pb2.StepEvent(seq=index + 2, step_delta=delta))
            due += self._pace_s
        run.status = resources_pb2.RUN_STATUS_COMPLETED
        completed = events_pb2.RunCompletedEvent(run=run)
        await context.write(events_pb2.StepEvent(seq=self._tokens + 2, run_completed=completed))


async def serve(tokens: int, tokens_per_second: float) -> None:
    server = grpc.aio.server()
    # Only Run is served; the other methods keep the generated UNIMPLEMENTED answers.
    servicer = FloorServicer(tokens, tokens_per_second)  # type: ignore[abstract]
    agent_service_pb2_grpc.add_AgentServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    # The line bench/procs.py waits for, as `agio-grpc serve` logs it.
    print(f"agio-grpc listening on 127.0.0.1:{port}", file=sys.stderr, flush=True)
    await server.wait_for_termination()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.floor")
    parser.add_argument("--tokens", type=int, required=True)
    parser.add_argument("--tokens-per-second", type=float, required=True)
    args = parser.parse_args(argv)
    asyncio.run(serve(args.tokens, args.tokens_per_second))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
