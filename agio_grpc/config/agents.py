"""Agents in the configuration file: their model, instructions, tools, limits, compaction,
output schema and approvals; MCP servers; hooks. Never imports grpc; the engine only for
checking an output schema."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    Field,
    field_validator,
    model_validator,
)

from agio_grpc.config.base import DEFAULT_INSTRUCTIONS, KIB, MAX_STEPS_LIMIT, MIB, Strict


class LimitsConfig(Strict):
    """Limits of one agent's runs."""

    max_steps: int = Field(10, ge=1, le=MAX_STEPS_LIMIT)
    """The maximum model calls in a run."""
    token_budget: int | None = Field(None, ge=1)
    """The maximum tokens (input + output over all model calls) a run may use."""
    run_timeout_s: float = Field(300.0, gt=0)
    """Wall time a run may take; a shorter gRPC deadline wins."""
    tool_timeout_s: float = Field(30.0, gt=0)
    """Hard timeout of one tool call."""
    max_parallel_tools: int = Field(4, ge=1, le=64)
    """How many tool calls of one step run at once."""
    max_history_messages: int | None = Field(None, ge=1)
    """Cap on history messages sent to the model (a tool call is never split from its result)."""
    max_step_bytes: int = Field(4 * MIB, ge=KIB)
    """The largest model reply or server tool result a run stores (UTF-8 bytes of its texts):
    a larger one is cut to it and ends the run (MAX_TOKENS, TOOL_ERROR). At most half of
    `server.max_message_bytes`, so that every step and event fits in a message."""


class ToolOptionsConfig(Strict):
    """How an agent runs one of its tools."""

    on_error: Literal["continue", "stop"] = "continue"
    """What an error result of the tool (an exception, a timeout, arguments that are not
    valid) does. `continue`: the model gets it as the call's result and acts on it. `stop`:
    it is stored as the call's result all the same, then the run ends with
    STOP_REASON_TOOL_ERROR (the step's other calls still run to their results)."""
    needs_approval: bool = False
    """A call waits for a person's decision before it runs: the run ends its segment in
    REQUIRES_ACTION with the call in `Run.required_action.approvals` (docs/approvals.md)."""


class CompactionConfig(Strict):
    """When and how an agent's long sessions are compacted (docs/compaction.md)."""

    enabled: bool = True
    """Summarize the oldest steps above the trigger, and once on a provider's
    context_length_exceeded; false leaves only `limits.max_history_messages`."""
    trigger_ratio: float = Field(0.8, gt=0, le=1)
    """Compact when the estimated prompt passes this share of `context_window_tokens`."""
    keep_recent_steps: int = Field(20, ge=0, le=100_000)
    """Steps kept as they are after the summary (a tool call never split from its result)."""
    model: str | None = Field(None, min_length=1)
    """The model that writes summaries; unset: the agent's model."""
    instructions: str | None = Field(None, min_length=1)
    """The summary call's system prompt; unset: the built-in one."""


class A2AAgentConfig(Strict):
    """A remote A2A agent an agent may call, as one tool (docs/a2a.md)."""

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    """The tool's name, as the model calls it."""
    url: str = Field(min_length=1, max_length=2_000, pattern=r"^https?://")
    """The agent's base URL (its card is at `/.well-known/agent-card.json` under it), or the
    URL of its card (ending in `.json`)."""
    headers: dict[str, str] = Field(default_factory=dict)
    """Headers of every request to it (its card's too); a value may hold `${NAME}`,
    replaced at start-up by the service's variable NAME (a secret stays out of the file)."""
    timeout_s: float = Field(300.0, gt=0, le=86_400)
    """The longest one call (one task) may take; the run's tool timeout applies too."""


class AgentConfig(Strict):
    """A named agent: model, instructions, tools and limits."""

    name: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:-]*$")
    model: str = "fake-model"
    """The model name sent to the endpoint."""
    description: str = Field("", max_length=2_000)
    """What the agent does, for those choosing an agent: its A2A card shows this (never its
    instructions), and so does its tool for the agents that call it (`agents`)."""
    a2a_agents: list[A2AAgentConfig] = Field(default_factory=list, max_length=64)
    """Remote A2A agents it may call, each a tool whose description is its card's."""
    agents: list[str] = Field(default_factory=list, max_length=64)
    """Other agents of this server it may call, each as a tool named after it taking
    `{"input": string}` (docs/a2a.md). Cycles are refused at start-up."""
    instructions: str = DEFAULT_INSTRUCTIONS
    """The system prompt."""
    tools: list[str] = Field(default_factory=lambda: ["current_time", "calculate"])
    """Names of registered tools the agent offers; `server.tool` names one tool of the MCP
    server `server` (of `mcp_servers`)."""
    mcp: list[str] = Field(default_factory=list)
    """MCP servers (of `mcp_servers`, by name) whose every tool the agent offers, as the
    server lists them at the time of each run."""
    tool_options: dict[str, ToolOptionsConfig] = Field(default_factory=dict)
    """Per tool of `tools` (by name): how the agent runs it. A tool not named here gets the
    defaults (`on_error: continue`)."""
    temperature: float | None = Field(None, ge=0, le=2)
    max_tokens: int | None = Field(None, ge=1)
    """Completion token cap per model call."""
    limits: LimitsConfig = Field(default_factory=LimitsConfig)
    context_window_tokens: int | None = Field(None, ge=1_000, le=100_000_000)
    """The model's context window in tokens; unset: from the model's family (gpt-4o 128,000,
    claude 200,000, ...; engine/compaction.py), else 128,000."""
    compaction: CompactionConfig = Field(default_factory=CompactionConfig)
    output_schema: dict[str, Any] | Path | None = None
    """A JSON Schema the final answer of the agent's runs must satisfy (docs/structured-output.md):
    the schema itself, or the path of a JSON file holding it. A run's `output_schema_json`
    replaces it."""
    output_mode: Literal["json_schema", "json_object", "tool"] = "json_schema"
    """How the model is asked for the schema: `response_format: json_schema` (strict), or
    `json_object` with the schema in a system message, or `tool` (a `final_output` tool whose
    parameters are the schema), for servers that do not know the first."""
    output_retries: int = Field(1, ge=0, le=10)
    """Repair calls after an answer that is not valid against the schema, before the run
    stops with OUTPUT_INVALID."""

    @field_validator("output_schema")
    @classmethod
    def _output_schema_is_usable(
        cls, value: dict[str, Any] | Path | None
    ) -> dict[str, Any] | Path | None:
        if value is None:
            return None
        # Imported here: the engine is more than reading the configuration needs.
        from agio_grpc.engine.output import OutputSchemaError, checked_schema, schema_from_text

        try:
            if isinstance(value, Path):
                return schema_from_text(value.read_text(encoding="utf-8"))
            return checked_schema(value)
        except OSError as error:
            raise ValueError(f"cannot read {value}: {error.strerror or error}") from None
        except OutputSchemaError as error:
            raise ValueError(f"output_schema {error}") from None

    approval_timeout_s: float | None = Field(None, gt=0)
    """How long a call waits for approval: past it the server rejects the pending calls
    with reason "timed out" and the run goes on. Unset: a call waits until decided or the
    run is cancelled."""

    @model_validator(mode="after")
    def _options_name_its_tools(self) -> AgentConfig:
        strangers = [name for name in self.tool_options if name not in self.tools]
        if strangers:
            raise ValueError(
                f"tool_options names {', '.join(map(repr, strangers))}, not among the "
                f"agent's tools ({', '.join(self.tools) or 'none'})"
            )
        return self

    def approval_tools(self) -> list[str]:
        """The tools whose calls wait for approval (`needs_approval: true`), in `tools` order."""
        return self._tools_with(lambda options: options.needs_approval)

    def stop_on_error_tools(self) -> list[str]:
        """The tools whose error result ends the run (`on_error: stop`), in `tools` order."""
        return self._tools_with(lambda options: options.on_error == "stop")

    def _tools_with(self, wanted: Callable[[ToolOptionsConfig], bool]) -> list[str]:
        return [
            name
            for name in self.tools
            if name in self.tool_options and wanted(self.tool_options[name])
        ]


MCP_SERVER_NAME = r"^[A-Za-z][A-Za-z0-9-]{0,31}$"
"""An MCP server's name: no `_` or `.`, so `server__tool` and `server.tool` split one way."""


class McpServerConfig(Strict):
    """An MCP server whose tools agents may offer: a command run over stdio (`command`), or a
    Streamable HTTP endpoint (`url`). docs/tools.md tells the whole story."""

    name: str = Field(pattern=MCP_SERVER_NAME)
    """How agents name it (`mcp: [name]`, `name.tool`); its tools reach the model as
    `name__tool`."""
    command: str | None = None
    """stdio: the program to run (an absolute path, or a name looked up on the service's
    PATH at start-up)."""
    args: list[str] = Field(default_factory=list)
    """stdio: its arguments."""
    env: dict[str, str] = Field(default_factory=dict)
    """stdio: its environment besides PATH, HOME and LANG, which it gets from the service's
    (those set there; an entry here wins). Nothing else of the service's environment is
    passed on unless named here; a value `${NAME}` is the service's variable NAME."""
    cwd: Path | None = None
    """stdio: its working directory (default: the service's)."""
    url: str | None = None
    """Streamable HTTP: the endpoint, e.g. `https://tools.example.com/mcp`."""
    headers: dict[str, str] = Field(default_factory=dict)
    """Streamable HTTP: headers of every request; a value may hold `${NAME}`, replaced at
    start-up by the service's variable NAME (a secret stays out of the config file)."""
    tool_timeout_s: float | None = Field(None, gt=0)
    """Hard timeout of one call to a tool of this server; the agent's
    `limits.tool_timeout_s` when it is shorter or this is unset. A call cut off by it is
    cancelled on the server (notifications/cancelled)."""
    allowed_tools: list[str] | None = None
    """Only these of the server's tools are used (by their MCP name); unset: all."""
    blocked_tools: list[str] = Field(default_factory=list)
    """These of the server's tools are never used."""
    needs_approval: bool | list[str] = False
    """Calls of the server's tools wait for a person's decision before they run: true for
    every tool, or a list of its tools (by their MCP name). Whichever agent offers them."""
    connect_timeout_s: float = Field(10.0, gt=0)
    """How long one attempt to connect (start, initialize, list the tools) may take; start-up
    waits at most this long for every server before serving without those not yet up."""
    ping_interval_s: float = Field(15.0, gt=0)
    """How often an idle connection is checked with an MCP ping: how soon a Streamable HTTP
    server that went away, or a stdio server that hangs, loses its tools. (A stdio server
    whose process exits loses them at once.)"""

    @model_validator(mode="after")
    def _one_transport(self) -> McpServerConfig:
        if (self.command is None) == (self.url is None):
            raise ValueError(f"mcp server {self.name!r}: set exactly one of command and url")
        if self.url is None and self.headers:
            raise ValueError(f"mcp server {self.name!r}: headers are for a url server")
        if self.command is None and (self.args or self.env or self.cwd):
            raise ValueError(f"mcp server {self.name!r}: args, env and cwd are for a command")
        if self.url is not None and not self.url.startswith(("http://", "https://")):
            raise ValueError(f"mcp server {self.name!r}: url must be http:// or https://")
        return self

    @property
    def transport(self) -> Literal["stdio", "streamable-http"]:
        return "stdio" if self.command is not None else "streamable-http"


def approval_tools(agent: AgentConfig, servers: list[McpServerConfig]) -> list[str]:
    """The tools (config names: `server.tool` for an MCP one) whose calls wait for approval
    in `agent`'s runs: its `needs_approval` tools, and the tools MCP servers list in theirs
    (a server's `needs_approval: true` covers all of its tools: `AgentSpec.approval_servers`)."""
    listed = [
        f"{server.name}.{tool}"
        for server in servers
        if isinstance(server.needs_approval, list)
        for tool in server.needs_approval
    ]
    return agent.approval_tools() + listed


class HooksConfig(Strict):
    """Python callables (`package.module:function`) called at points of every run."""

    on_run_start: list[str] = Field(default_factory=list)
    before_model_call: list[str] = Field(default_factory=list)
    after_step: list[str] = Field(default_factory=list)
    on_run_end: list[str] = Field(default_factory=list)
