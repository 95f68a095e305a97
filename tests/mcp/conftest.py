"""Real MCP servers for the tests: tests/mcp/servers/toolbox.py over stdio (started by the
client) and over Streamable HTTP on 127.0.0.1 (a subprocess on a free port), and the pinned
reference servers of the MCP project (`reference_servers`, tests/mcp/reference.py).

`Toolbox` starts an `McpServer` (engine/mcp.py) against one of them and calls its tools
through the executor, as a run does. The slow tool writes to an events file when the
client's cancellation reaches it; `wait_for` and `eventually` poll (never a fixed sleep)
with a generous deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TypeVar

import pytest

from agio_grpc.domain import ToolCall
from agio_grpc.engine.executor import execute_tool_call
from agio_grpc.engine.mcp import McpServer, McpServers, McpServerSpec
from agio_grpc.engine.tools import ToolContext, ToolRegistry, ToolResult
from tests.mcp.reference import ReferenceServers, install_reference_servers

TOOLBOX = Path(__file__).parent / "servers" / "toolbox.py"
DEADLINE_S = 20.0
T = TypeVar("T")


async def wait_for(
    condition: Callable[[], bool], what: str, deadline_s: float = DEADLINE_S
) -> None:
    """Poll `condition` until it holds; fail naming `what` after `deadline_s`."""
    loop = asyncio.get_running_loop()
    give_up = loop.time() + deadline_s
    while not condition():
        if loop.time() > give_up:
            pytest.fail(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


async def eventually(
    probe: Callable[[], Awaitable[T | None]], what: str, deadline_s: float = DEADLINE_S
) -> T:
    """Ask `probe` until it answers something other than None (a gRPC read, say); fail naming
    `what` after `deadline_s`."""
    loop = asyncio.get_running_loop()
    give_up = loop.time() + deadline_s
    while (answer := await probe()) is None:
        if loop.time() > give_up:
            pytest.fail(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)
    return answer


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@dataclass
class HttpToolbox:
    """The toolbox served over Streamable HTTP by a subprocess."""

    url: str
    events: Path
    process: subprocess.Popen[bytes]


@contextlib.contextmanager
def http_toolbox(events: Path, port: int | None = None) -> Iterator[HttpToolbox]:
    port = port or free_port()
    process = subprocess.Popen(
        [sys.executable, str(TOOLBOX), "--http", str(port), "--events", str(events)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        give_up = time.monotonic() + DEADLINE_S
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                if process.poll() is not None or time.monotonic() > give_up:
                    raise RuntimeError("the HTTP toolbox did not start") from None
                time.sleep(0.05)
        yield HttpToolbox(f"http://127.0.0.1:{port}/mcp", events, process)
    finally:
        process.terminate()
        process.wait(10)


def stdio_spec(events: Path, name: str = "toolbox", **fields: object) -> McpServerSpec:
    spec = McpServerSpec(
        name=name,
        transport="stdio",
        command=sys.executable,
        args=(str(TOOLBOX), "--events", str(events)),
        restart_initial_s=0.05,
    )
    return _with(spec, fields)


def http_spec(url: str, name: str = "toolbox", **fields: object) -> McpServerSpec:
    spec = McpServerSpec(name=name, transport="streamable-http", url=url, restart_initial_s=0.05)
    return _with(spec, fields)


def _with(spec: McpServerSpec, fields: dict[str, object]) -> McpServerSpec:
    return replace(spec, **fields)  # type: ignore[arg-type]


class Toolbox:
    """A connected McpServer and a registry holding its tools."""

    def __init__(self, server: McpServer, events: Path) -> None:
        self.server = server
        self.events = events
        self.registry = ToolRegistry()
        self.registry.attach(server)

    async def call(self, tool: str, arguments: str = "{}", timeout_s: float = 10.0) -> ToolResult:
        name = f"{self.server.spec.name}__{tool}"
        call = ToolCall(id=f"call-{tool}", name=name, arguments=arguments)
        return await execute_tool_call(
            call,
            self.registry,
            offered=list(self.server.tools()),
            context=ToolContext("run", "session", call.id, name),
            timeout_s=timeout_s,
        )

    def events_seen(self) -> list[str]:
        return self.events.read_text().splitlines() if self.events.exists() else []


@contextlib.asynccontextmanager
async def connected(spec: McpServerSpec, events: Path) -> AsyncIterator[Toolbox]:
    server = McpServer(spec)
    servers = McpServers([server])
    await servers.start()
    try:
        await wait_for(lambda: server.connected, f"{spec.name} to connect")
        yield Toolbox(server, events)
    finally:
        await servers.stop()


@pytest.fixture(scope="session")
def reference_servers() -> ReferenceServers:
    """The pinned MCP reference servers (tests/mcp/reference.py), installed when missing."""
    return install_reference_servers()
