"""What calling a tool of an MCP server over stdio costs against an in-process tool.

    python -m bench.mcp                 # 2,000 calls a path
    python -m bench.mcp --calls 10000

Both paths call an `echo` tool through the executor as a run does (`execute_tool_call`:
arguments parsed and checked against the schema, the call under its timeout, the result
rendered): the built-in in-process `echo`, and the same tool served by an MCP server
(bench/mcp_echo_server.py, the SDK's MCPServer) over stdio, through one long-lived
`McpServer` connection. Calls alternate between the paths, one at a time, so drift in the
machine's load hits both. No tracing, no store: the tool call alone.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

from agio_grpc.domain import ToolCall
from agio_grpc.engine import BUILTIN_TOOLS
from agio_grpc.engine.executor import execute_tool_call
from agio_grpc.engine.mcp import McpServer, McpServers, McpServerSpec
from agio_grpc.engine.tools import ToolContext, ToolRegistry
from bench.stats import median, percentile

ROOT = Path(__file__).resolve().parent.parent
"""The server runs as `python -m bench.mcp_echo_server` from here (run as a file, its folder
would come first on the path, and this module would shadow the `mcp` package)."""
PATHS = {"in-process echo": "echo", "MCP stdio echo": "bench__echo"}


async def measure(calls: int, warmup: int) -> dict[str, list[float]]:
    server = McpServer(
        McpServerSpec(
            name="bench",
            transport="stdio",
            command=sys.executable,
            args=("-m", "bench.mcp_echo_server"),
            cwd=ROOT,
        )
    )
    registry = ToolRegistry(BUILTIN_TOOLS)
    registry.attach(server)
    servers = McpServers([server])
    await servers.start()
    if not server.connected:
        raise SystemExit("the MCP server did not start")
    samples: dict[str, list[float]] = {path: [] for path in PATHS}
    arguments = json.dumps({"text": "hello"})
    try:
        for index in range(warmup + calls):
            for path, name in PATHS.items():
                call = ToolCall(id=f"call_{index}", name=name, arguments=arguments)
                context = ToolContext("run", "session", call.id, name)
                started = time.perf_counter()
                result = await execute_tool_call(
                    call, registry, offered=[name], context=context, timeout_s=30
                )
                elapsed_ms = (time.perf_counter() - started) * 1000
                if result.is_error:
                    raise SystemExit(f"{path}: {result.content}")
                if index >= warmup:
                    samples[path].append(elapsed_ms)
    finally:
        await servers.stop()
    return samples


def table(samples: dict[str, list[float]]) -> str:
    base = samples["in-process echo"]
    lines = [
        "| path | p50 (ms) | p99 (ms) | p50 over in-process (ms) | p99 over in-process (ms) |",
        "|---|---|---|---|---|",
    ]
    for path, measured in samples.items():
        p50, p99 = median(measured), percentile(measured, 99)
        lines.append(
            f"| {path} | {p50:.3f} | {p99:.3f} | {p50 - median(base):+.3f} | "
            f"{p99 - percentile(base, 99):+.3f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000, help="calls a path (default 2000)")
    parser.add_argument("--warmup", type=int, default=100, help="unmeasured calls a path")
    args = parser.parse_args(argv)
    samples = asyncio.run(measure(args.calls, args.warmup))
    print(f"One tool call through the executor, {args.calls} calls a path, alternated:")
    print(table(samples))
    return 0


if __name__ == "__main__":
    sys.exit(main())
