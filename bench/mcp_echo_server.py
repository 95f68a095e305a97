"""The MCP server `python -m bench.mcp` calls over stdio: one `echo` tool, like the built-in
in-process `echo` it is compared with."""

from __future__ import annotations

from mcp.server.mcpserver import MCPServer

server = MCPServer("bench")


@server.tool()
def echo(text: str) -> str:
    """Return the text unchanged."""
    return text


if __name__ == "__main__":
    server.run()
