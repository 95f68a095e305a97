"""Which calls wait for approval: an agent's `tool_options`, an MCP server's `needs_approval`
(every tool, or the ones it lists) and a run's `require_approval`, from the config as the
server reads it to the settings a run stores."""

from __future__ import annotations

import pytest

from agio_grpc.config import AgentConfig, McpServerConfig, Settings, ToolOptionsConfig
from agio_grpc.engine.agents import RunOverrides, resolve_settings
from agio_grpc.engine.errors import InvalidInputError
from agio_grpc.service.app import build_agents

MCP_TOOLS = ["files__read_file", "files__write_file", "mail__send", "mail__list"]


def settings(**agent: object) -> Settings:
    return Settings(
        database_url="sqlite+aiosqlite:///unused.db",
        agents=[
            AgentConfig(
                name="assistant",
                tools=["calculate", "echo", "files.read_file"],
                mcp=["files", "mail"],
                **agent,
            )
        ],
        mcp_servers=[
            McpServerConfig(name="files", command="files-server", needs_approval=["write_file"]),
            McpServerConfig(name="mail", url="https://mail.example/mcp", needs_approval=True),
        ],
    )


def test_the_agent_the_mcp_servers_and_the_run_each_add_tools_needing_approval() -> None:
    config = settings(
        tool_options={"echo": ToolOptionsConfig(needs_approval=True)}, approval_timeout_s=60
    )
    agent = build_agents(config)["assistant"]
    offered = ["calculate", "echo", *MCP_TOOLS]
    run = resolve_settings(agent, RunOverrides(), [], offered)
    assert run.approval_tools == ["echo", "files__write_file", "mail__send", "mail__list"]
    assert run.approval_timeout_s == 60
    more = resolve_settings(agent, RunOverrides(), [], offered, require_approval=["calculate"])
    assert more.approval_tools == ["calculate", *run.approval_tools]
    every = resolve_settings(agent, RunOverrides(), [], offered, require_approval=["*"])
    assert every.approval_tools == offered


def test_a_tool_the_run_does_not_offer_needs_no_approval_there() -> None:
    agent = build_agents(settings(tool_options={"echo": ToolOptionsConfig(needs_approval=True)}))[
        "assistant"
    ]
    only_calculate = resolve_settings(agent, RunOverrides(tools=["calculate"]), [], ["calculate"])
    assert only_calculate.approval_tools == []


@pytest.mark.parametrize("name", ["lookup", "send_mail", ""])
def test_require_approval_names_only_server_tools_of_the_run(name: str) -> None:
    agent = build_agents(settings())["assistant"]
    with pytest.raises(InvalidInputError) as refused:
        resolve_settings(
            agent, RunOverrides(), [], ["calculate", "echo"], require_approval=["echo", name]
        )
    assert refused.value.field == "require_approval[1]"


def test_approval_timeout_must_be_positive() -> None:
    with pytest.raises(ValueError, match="approval_timeout_s"):
        settings(approval_timeout_s=0)
