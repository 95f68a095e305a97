"""What the HTTP listener costs a run: B1 time to first token over Connect and gRPC-Web against
gRPC, in one run.

    python -m bench.connect              # 300 runs a path, 50 one-word chunks each
    python -m bench.connect --runs 1000

One `agio-grpc serve` (a fresh SQLite file) with its HTTP listener (`AGIO_HTTP_ADDRESS`), on
one fake model, so every path reaches the same handlers; each a `Run` to its terminal event:

- gRPC: `AgioClient` on the gRPC port (the baseline);
- Connect, JSON: the streaming request a browser's connect-web sends by default, read as
  JSON envelopes;
- Connect, binary: the same in protobuf;
- gRPC-Web, binary.

The HTTP paths go over one kept-alive HTTP/1.1 connection (httpx2), as a page's fetch does;
their first token is the first `step_delta` with content decoded on arrival. Runs alternate
between the paths, so drift in the machine's load hits all of them.
"""

from __future__ import annotations

import json
import re
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx2
from google.protobuf import json_format

from agio_grpc.client import AgioClient
from agio_grpc.testing.envelopes import END_STREAM, TRAILERS, envelope, read_envelopes
from agio_grpc.v1 import agent_service_pb2, events_pb2
from bench import procs
from bench.stats import median, percentile
from bench.streaming import Samples, service_run, ttft_main

RUN = "/agio.v1.AgentService/Run"
LISTENING = re.compile(r"agio-grpc listening on (\S+) .*HTTP \(Connect, gRPC-Web\) on (\S+)")
PATHS = ("gRPC", "Connect, JSON", "Connect, binary", "gRPC-Web, binary")

Decode = Callable[[bytes], tuple[bool, str]]
"""An envelope's payload -> (whether it is a delta with content, its event kind)."""


def _json_event(payload: bytes) -> tuple[bool, str]:
    event = json.loads(payload)
    delta = event.get("stepDelta")
    kind = next((key for key in event if key in _KINDS), "")
    return bool(delta and delta.get("content")), kind


def _binary_event(payload: bytes) -> tuple[bool, str]:
    event = events_pb2.StepEvent.FromString(payload)
    kind = event.WhichOneof("event") or ""
    return kind == "step_delta" and bool(event.step_delta.content), _CAMEL.get(kind, kind)


_KINDS = {"runCompleted", "runFailed", "stepDelta"}
_CAMEL = {"run_completed": "runCompleted", "run_failed": "runFailed"}


class HttpPath:
    """One HTTP path: how its request is written and its events read."""

    def __init__(self, content_type: str, *, binary: bool, grpc_web: bool = False) -> None:
        request = agent_service_pb2.RunRequest(input="stream please")
        payload = (
            request.SerializeToString()
            if binary
            else json_format.MessageToJson(request, indent=None).encode()
        )
        self.body = envelope(payload)
        self.headers = {"content-type": content_type}
        if grpc_web:
            self.headers["x-grpc-web"] = "1"
        self.decode: Decode = _binary_event if binary else _json_event

    async def run(self, http: httpx2.AsyncClient, samples: Samples, tokens: int) -> None:
        started = time.perf_counter()
        first = 0.0
        async with http.stream("POST", RUN, content=self.body, headers=self.headers) as response:
            async for flags, payload in read_envelopes(response.aiter_bytes()):
                if flags & (END_STREAM | TRAILERS):
                    break
                has_content, kind = self.decode(payload)
                if has_content and not first:
                    first = time.perf_counter()
                elif kind == "runFailed":
                    raise RuntimeError("run failed")
        ended = time.perf_counter()
        samples.tokens += tokens
        samples.ttft_ms.append((first - started) * 1000)
        samples.tokens_per_s.append(tokens / (ended - started))


HTTP_PATHS = {
    "Connect, JSON": HttpPath("application/connect+json", binary=False),
    "Connect, binary": HttpPath("application/connect+proto", binary=True),
    "gRPC-Web, binary": HttpPath("application/grpc-web+proto", binary=True, grpc_web=True),
}


async def measure(runs: int, tokens: int, warmup: int) -> dict[str, Samples]:
    samples = {path: Samples() for path in PATHS}
    with tempfile.TemporaryDirectory() as scratch:
        database = f"sqlite+aiosqlite:///{Path(scratch) / 'bench.db'}"
        env = procs.clean_env() | {
            "AGIO_LISTEN_ADDRESS": "127.0.0.1:0",
            "AGIO_HTTP_ADDRESS": "127.0.0.1:0",
            "AGIO_DATABASE_URL": database,
            "OPENAI_API_KEY": "bench",
        }
        async with procs.fake_model(tokens) as model:
            env["OPENAI_BASE_URL"] = model.ready
            async with procs.child([*procs.CLI, "serve"], LISTENING, env, "stderr") as server:
                found = LISTENING.search(server.line)
                assert found is not None
                grpc_address, http_address = found.groups()
                async with (
                    AgioClient(grpc_address) as client,
                    httpx2.AsyncClient(base_url=f"http://{http_address}", timeout=60) as http,
                ):
                    for index in range(warmup + runs):
                        measured = index >= warmup
                        target = samples["gRPC"] if measured else Samples()
                        await service_run(client, target, tokens)
                        for name, path in HTTP_PATHS.items():
                            await path.run(http, samples[name] if measured else Samples(), tokens)
    return samples


def table(samples: dict[str, Samples]) -> str:
    base = median(samples[PATHS[0]].ttft_ms)
    lines = [
        "| path | TTFT p50 (ms) | p90 (ms) | p99 (ms) | p50 over gRPC (ms) | tokens/s p50 |",
        "|---|---|---|---|---|---|",
    ]
    for path, measured in samples.items():
        p50 = median(measured.ttft_ms)
        lines.append(
            f"| {path} | {p50:.2f} | {percentile(measured.ttft_ms, 90):.2f} | "
            f"{percentile(measured.ttft_ms, 99):.2f} | {p50 - base:+.2f} | "
            f"{median(measured.tokens_per_s):.0f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    return ttft_main(__doc__.splitlines()[0], measure, table, argv)


if __name__ == "__main__":
    sys.exit(main())
