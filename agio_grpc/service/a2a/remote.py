"""The remote A2A agents of the config (`a2a_agents:`), as the engine's tool source.

Resolves what the config leaves to start-up (`${NAME}` in a header) and refuses, before
anything starts, a tool name another tool has, or one name for two different agents.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from agio_grpc.config import Settings
from agio_grpc.engine.a2a_tools import RemoteAgents, RemoteAgentSpec, TraceHeaders
from agio_grpc.engine.tools import ToolRegistry
from agio_grpc.service.startup import StartupError, substitute

SETTING = "agents[].a2a_agents in AGIO_CONFIG"


def remote_agents_of(
    settings: Settings,
    registry: ToolRegistry,
    trace_headers: TraceHeaders,
    environ: Mapping[str, str] | None = None,
) -> RemoteAgents | None:
    """Every agent's `a2a_agents:` entries as one tool source attached to `registry` (not
    started: `start` reads the cards); None when no agent has any."""
    environ = os.environ if environ is None else environ
    specs: dict[str, RemoteAgentSpec] = {}
    for agent in settings.agents:
        for entry in agent.a2a_agents:
            where = f"agent {agent.name!r}: a2a_agents {entry.name!r}"
            if entry.name in registry:
                raise StartupError(
                    f"{where} has the name of another tool", SETTING, "give it another name"
                )
            spec = RemoteAgentSpec(
                entry.name,
                entry.url,
                {
                    k: substitute(v, environ, f"{where}: header {k}")
                    for k, v in entry.headers.items()
                },
                entry.timeout_s,
            )
            known = specs.setdefault(entry.name, spec)
            if known != spec:
                raise StartupError(
                    f"{where} names another agent than an entry of the same name",
                    SETTING,
                    "give each remote agent one name",
                )
    if not specs:
        return None
    remote = RemoteAgents(specs.values(), trace_headers)
    registry.attach(remote)
    return remote
