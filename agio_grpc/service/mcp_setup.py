"""The configured MCP servers (`mcp_servers`) made ready to start, or a one-line StartupError.

Resolves what the config leaves to start-up: `${NAME}` in a header or environment value
(the service's variable NAME; a missing one names the variable, never a value), a stdio
server's environment (PATH, HOME and LANG from the service's, then its entry's `env`), a
stdio command given as a bare name (looked up on the service's PATH), and the tools agents
name one by one (`server.tool`), which must be neither blocked nor named like an in-process
tool.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from dataclasses import replace

from agio_grpc.config import McpServerConfig, Settings
from agio_grpc.engine.mcp import McpServer, McpServers, McpServerSpec
from agio_grpc.engine.tools import ToolRegistry, config_tool_name
from agio_grpc.service.startup import StartupError, substitute

INHERITED_VARIABLES = ("PATH", "HOME", "LANG")
"""What every stdio server gets of the service's environment, besides its entry's `env`:
without PATH a launcher finds nothing to run (`npx` ends with `sh: 1: mcp-server-everything:
not found`, exit code 127), without HOME npm has no cache, and LANG sets the locale a
server reads and writes text in. None of them is a secret."""


def build_mcp_servers(
    settings: Settings,
    registry: ToolRegistry,
    environ: Mapping[str, str] | None = None,
) -> McpServers:
    """The servers of `settings.mcp_servers`, attached to `registry` (not started)."""
    environ = os.environ if environ is None else environ
    reserved = frozenset(registry.names())
    servers: dict[str, McpServer] = {}
    for config in settings.mcp_servers:
        server = McpServer(mcp_server_spec(config, environ), reserved)
        servers[config.name] = server
        registry.attach(server)
    for agent in settings.agents:
        for name in agent.tools:
            server_name, dot, tool = name.partition(".")
            if not dot:
                continue
            spec = servers[server_name].spec  # config.py checked the server exists
            setting = f"agents[{agent.name}].tools in AGIO_CONFIG"
            if not spec.admits(tool):
                raise StartupError(
                    f"agent {agent.name!r} names tool {name!r}, which mcp server "
                    f"{server_name!r} blocks (allowed_tools / blocked_tools)",
                    setting,
                    "remove it from the agent's tools or from the server's blocked_tools",
                )
            if config_tool_name(name) in reserved:
                raise StartupError(
                    f"agent {agent.name!r}: MCP tool {name!r} would be called "
                    f"{config_tool_name(name)!r}, the name of an in-process tool",
                    setting,
                    "rename the in-process tool or the MCP server",
                )
            servers[server_name].pin(tool)
    return McpServers(list(servers.values()))


def mcp_server_spec(config: McpServerConfig, environ: Mapping[str, str]) -> McpServerSpec:
    """What the engine needs to reach the server `config` describes."""
    where = f"mcp_servers[{config.name}] in AGIO_CONFIG"
    allowed = frozenset(config.allowed_tools) if config.allowed_tools is not None else None
    base = McpServerSpec(
        name=config.name,
        transport=config.transport,
        tool_timeout_s=config.tool_timeout_s,
        allowed_tools=allowed,
        blocked_tools=frozenset(config.blocked_tools),
        connect_timeout_s=config.connect_timeout_s,
        ping_interval_s=config.ping_interval_s,
    )
    if config.command is None:
        headers = {
            key: substitute(value, environ, f"{where}: header {key}")
            for key, value in config.headers.items()
        }
        return replace(base, url=config.url or "", headers=headers)
    env = {name: environ[name] for name in INHERITED_VARIABLES if name in environ}
    env |= {
        key: substitute(value, environ, f"{where}: env {key}") for key, value in config.env.items()
    }
    command = find_command(config.command, where)
    return replace(base, command=command, args=tuple(config.args), env=env, cwd=config.cwd)


def find_command(command: str, setting: str) -> str:
    """`command` as an absolute path: a bare name is looked up on the service's PATH."""
    found = shutil.which(command)
    if found is None:
        raise StartupError(
            f"mcp server command {command!r} is not an executable file or on PATH",
            setting,
            "give the program's absolute path, or install it on the service's PATH",
        )
    return os.path.abspath(found)
