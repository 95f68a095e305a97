"""Agent cards: how an A2A client finds an agent, what it offers and how to reach it.

A card is built per request from the address the client used (its `Host`, already checked
by the HTTP listener's host policy), so it names URLs that client can reach: the JSON-RPC
endpoint `/a2a/AGENT/`, the HTTP+JSON one under it, and the gRPC port with the agent's name
as the A2A tenant. Skills: the agent itself, then one per server tool. The card never shows
an agent's instructions (its system prompt): its description is the agent's `description`.
"""

from __future__ import annotations

from importlib import metadata

from a2a.types import a2a_pb2 as a2a
from a2a.utils.constants import PROTOCOL_VERSION_CURRENT, TransportProtocol

from agio_grpc.config import AuthMode
from agio_grpc.engine.agents import AgentSpec
from agio_grpc.engine.tools import ToolRegistry

MEDIA_TYPES = ["text/plain", "application/json"]
SCHEME = "agio"
"""The name of the card's security scheme."""


def _version() -> str:
    try:
        return metadata.version("agio-grpc")
    except metadata.PackageNotFoundError:
        return "0"


VERSION = _version()


def agent_path(agent: str) -> str:
    """The path of an agent's endpoints on the HTTP listener (with its trailing slash)."""
    return f"/a2a/{agent}/"


def _security(card: a2a.AgentCard, mode: AuthMode) -> None:
    if mode in ("api_key", "jwt"):
        card.security_schemes[SCHEME].http_auth_security_scheme.CopyFrom(
            a2a.HTTPAuthSecurityScheme(
                scheme="Bearer",
                bearer_format="JWT" if mode == "jwt" else "agio API key",
                description="Authorization: Bearer <credential>, as for agio.v1",
            )
        )
    elif mode == "mtls":
        card.security_schemes[SCHEME].mtls_security_scheme.CopyFrom(
            a2a.MutualTlsSecurityScheme(description="a client certificate, on the gRPC port")
        )
    else:
        return
    requirement = card.security_requirements.add()
    requirement.schemes[SCHEME].CopyFrom(a2a.StringList())


def agent_card(
    agent: AgentSpec,
    registry: ToolRegistry,
    *,
    http_base: str,
    grpc_target: str,
    auth_mode: AuthMode,
) -> a2a.AgentCard:
    """The card of `agent` as served at `http_base` (`scheme://host:port`), its gRPC binding
    at `grpc_target` (`host:port`)."""
    url = http_base + agent_path(agent.name)
    description = agent.description or f"The agio-grpc agent {agent.name}."
    card = a2a.AgentCard(
        name=agent.name,
        description=description,
        version=VERSION,
        supported_interfaces=[
            a2a.AgentInterface(
                url=url,
                protocol_binding=TransportProtocol.JSONRPC.value,
                protocol_version=PROTOCOL_VERSION_CURRENT,
            ),
            a2a.AgentInterface(
                url=url.rstrip("/"),
                protocol_binding=TransportProtocol.HTTP_JSON.value,
                protocol_version=PROTOCOL_VERSION_CURRENT,
            ),
            a2a.AgentInterface(
                url=grpc_target,
                protocol_binding=TransportProtocol.GRPC.value,
                protocol_version=PROTOCOL_VERSION_CURRENT,
                tenant=agent.name,
            ),
        ],
        capabilities=a2a.AgentCapabilities(streaming=True, push_notifications=True),
        default_input_modes=MEDIA_TYPES,
        default_output_modes=MEDIA_TYPES,
        skills=[
            a2a.AgentSkill(id=agent.name, name=agent.name, description=description, tags=["agent"])
        ],
    )
    for name in registry.agent_tools(agent.tools, agent.mcp_servers):
        tool = registry.get(name)
        if tool is None or tool.unavailable_reason:
            continue
        card.skills.append(
            a2a.AgentSkill(
                id=tool.name,
                name=tool.name,
                description=tool.description or tool.name,
                tags=["tool", tool.source],
            )
        )
    _security(card, auth_mode)
    return card
