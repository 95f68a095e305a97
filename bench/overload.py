"""A burst past the server's capacity: how every `Run` of it ends, with and without admission.

    python -m bench.overload                     # 2,000 Runs, 12 s deadline, instant model
    python -m bench.overload --runs 1000 --deadline 8 --limits none 128 512

For each limit (`server.max_running_runs`; `none` is 0, no limit: the baseline): a fresh
server on a fresh SQLite file and a fresh fake model in processes of their own (an instant
reply of `--tokens` words), then every run started at once from this process, each `Run`
with the same gRPC deadline. Each call is counted by how it ended: the run's terminal event
(OK), a status with an ErrorInfo (typed: SERVER_BUSY, ...), or a bare status with no
details (what the caller cannot act on). The target: no bare status at the default limit.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import grpc
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

from agio_grpc.v1 import agent_service_pb2, agent_service_pb2_grpc
from bench import procs


async def one_run(
    stub: agent_service_pb2_grpc.AgentServiceStub, n: int, deadline_s: float, seen: Counter[str]
) -> None:
    try:
        last = ""
        async for event in stub.Run(
            agent_service_pb2.RunRequest(input=f"hello {n}"), timeout=deadline_s
        ):
            last = str(event.WhichOneof("event"))
        seen["OK " + last] += 1
    except grpc.aio.AioRpcError as error:
        status = rpc_status.from_call(error)
        reason = _reason(status) if status is not None and status.details else "bare"
        seen[f"{error.code().name} {reason}"] += 1


def _reason(status: status_pb2.Status) -> str:
    for detail in status.details:
        info = error_details_pb2.ErrorInfo()
        if detail.Unpack(info):
            return str(info.reason)
    return "details"


async def burst(
    limit: str, runs: int, deadline_s: float, tokens: int
) -> tuple[Counter[str], float]:
    async with procs.fake_model(tokens) as model:
        with tempfile.TemporaryDirectory() as scratch:
            database = f"sqlite+aiosqlite:///{Path(scratch) / 'burst.db'}"
            env = {"AGIO_SERVER__MAX_RUNNING_RUNS": "0" if limit == "none" else limit}
            async with procs.agio_server(model.ready, database, env) as server:
                options = [("grpc.max_concurrent_streams", 2 * runs)]
                async with grpc.aio.insecure_channel(server.ready, options=options) as channel:
                    stub = agent_service_pb2_grpc.AgentServiceStub(channel)
                    seen: Counter[str] = Counter()
                    started = time.monotonic()
                    await asyncio.gather(*(one_run(stub, n, deadline_s, seen) for n in range(runs)))
                    return seen, time.monotonic() - started


async def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.overload", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--deadline", type=float, default=12.0, help="each Run's deadline, s")
    parser.add_argument("--tokens", type=int, default=3, help="words in each reply")
    parser.add_argument("--limits", nargs="+", default=["none", "512"])
    args = parser.parse_args(argv)
    print(f"{args.runs} Runs at once, {args.deadline:g} s deadline, {args.tokens}-word replies")
    print(f"| max_running_runs | wall s | {'outcome':<40} | calls |")
    print("|---|---:|---|---:|")
    bare = 0
    for limit in args.limits:
        seen, wall = await burst(limit, args.runs, args.deadline, args.tokens)
        for outcome, count in seen.most_common():
            print(f"| {limit} | {wall:.1f} | {outcome:<40} | {count} |")
            if outcome.endswith(" bare") and limit != "none":
                bare += count
    return 1 if bare else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1:])))
