"""An MCP server for the tests (the SDK's MCPServer, FastMCP before mcp 2), over stdio
(default) or Streamable HTTP on 127.0.0.1 (`--http PORT`). With `--start-once MARKER` it
starts only when the file MARKER does not exist (and creates it); a second start writes a
line to stderr and exits with code 4, before any message: a server that cannot come back.

Tools: `hello` (no arguments), `add` (structured result), `fail` (an `isError` result),
`slow` (waits until cancelled; writes `cancelled <marker>` to the file named by `--events`
when the client's cancellation reaches it), `crash` (the process exits mid-call),
`environment` (the names of the process's environment variables), `pid`, `picture` (an image),
`grow` (adds the tool `extra` and sends notifications/tools/list_changed), `extra` (only
after `grow`), `header` (the value of a request header, over HTTP).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ImageContent

server = MCPServer("toolbox")
events: Path | None = None


def record(line: str) -> None:
    if events is not None:
        with events.open("a") as file:
            file.write(line + "\n")


@server.tool()
def hello() -> str:
    """Say hello."""
    return "hello from the toolbox"


@server.tool()
def header(name: str, ctx: Context) -> str:
    """The value of request header `name` ("" when absent)."""
    return (ctx.headers or {}).get(name.lower(), "")


@server.tool()
def add(a: int, b: int) -> dict[str, int]:
    """Add two integers."""
    return {"sum": a + b}


@server.tool()
def fail(reason: str) -> str:
    """Always fails with `reason`."""
    raise ToolError(reason)


@server.tool()
async def slow(marker: str = "run") -> str:
    """Wait until cancelled."""
    record(f"started {marker}")
    try:
        await asyncio.sleep(3600)
    except asyncio.CancelledError:
        record(f"cancelled {marker}")
        raise
    return "never"


@server.tool()
def crash() -> str:
    """Exit the process in the middle of the call."""
    os._exit(3)


@server.tool()
def environment() -> list[str]:
    """The names of this process's environment variables."""
    return sorted(os.environ)


@server.tool()
def pid() -> int:
    """This process's id."""
    return os.getpid()


@server.tool()
def picture() -> list[object]:
    """A caption and a small image."""
    return ["a red dot", ImageContent(data="iVBORw0KGgo=", mime_type="image/png")]


def extra() -> str:
    """Only listed after `grow`."""
    return "extra"


@server.tool()
async def grow(ctx: Context) -> str:
    """Add the `extra` tool and tell the client the tool list changed."""
    if "extra" not in {tool.name for tool in await server.list_tools()}:
        server.add_tool(extra)
    await ctx.session.send_tool_list_changed()
    return "grown"


def main() -> None:
    global events
    parser = argparse.ArgumentParser()
    parser.add_argument("--http", type=int, default=None)
    parser.add_argument("--events", type=Path, default=None)
    parser.add_argument("--start-once", type=Path, default=None)
    options = parser.parse_args()
    events = options.events
    if options.start_once is not None:
        try:
            options.start_once.touch(exist_ok=False)
        except FileExistsError:
            print("toolbox: starting", file=sys.stderr)
            print(f"toolbox: {options.start_once} exists: started once already", file=sys.stderr)
            raise SystemExit(4) from None
    if options.http is None:
        server.run()
    else:
        server.run("streamable-http", host="127.0.0.1", port=options.http)


if __name__ == "__main__":
    main()
