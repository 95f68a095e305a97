"""What a run is asked to do: agent definitions, per-run overrides and the run's inputs.

`AgentSpec` is an agent from the server config; `RunInput` is one `Run` request;
`resolve_settings` merges the two into `RunSettings`, the effective settings of one run,
stored in the run row (`Run.options`) so a continuation runs with exactly the same ones.
`AgentCatalog` holds the server's agents with the tools they may offer: what a run started
without a request (a queued one, a retry) takes its settings from. Plain typed dataclasses;
never imports grpc or the store.
"""

from __future__ import annotations

import json
import re
from collections.abc import Container, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from pydantic import TypeAdapter

from agio_grpc.domain import DEFAULT_TENANT, BusyPolicy, Run, StopReason, StopSignal
from agio_grpc.engine.errors import AgentNotFoundError, InvalidInputError
from agio_grpc.engine.output import FINAL_OUTPUT_TOOL, OutputSpec
from agio_grpc.engine.tools import ToolRegistry, mcp_server_of

_TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


@dataclass(frozen=True, slots=True)
class Limits:
    """Limits of one agent's runs."""

    max_steps: int = 10
    """The maximum model calls in a run (counted over all its segments)."""
    token_budget: int | None = None
    """The maximum tokens (input + output over all model calls) a run may use; None: no cap."""
    run_timeout_s: float = 300.0
    """Wall time one run segment may take; a shorter caller deadline wins."""
    tool_timeout_s: float = 30.0
    """Hard timeout of one tool call."""
    max_parallel_tools: int = 4
    """How many tool calls of one step run at once."""
    max_history_messages: int | None = None
    """Cap on history messages sent to the model (besides the system prompt); None: no cap."""
    max_step_bytes: int = 4 * 1024 * 1024
    """The largest step a run stores from a model reply or a server tool's result (UTF-8
    bytes of its texts): a larger one is cut to it and ends the run (MAX_TOKENS for a reply,
    TOOL_ERROR for a tool result), so that every step fits in a gRPC message."""

    def reached(self, model_calls: int, used_tokens: int) -> list[StopSignal]:
        """The limits that forbid another model call after `model_calls` calls that used
        `used_tokens` tokens."""
        signals = self.budget_reached(used_tokens)
        if model_calls >= self.max_steps:
            message = f"reached max_steps ({self.max_steps})"
            signals.append(StopSignal(StopReason.MAX_STEPS, message, "loop"))
        return signals

    def budget_reached(self, used_tokens: int) -> list[StopSignal]:
        """TOKEN_BUDGET once `used_tokens` reached the budget."""
        budget = self.token_budget
        if budget is None or used_tokens < budget:
            return []
        return [
            StopSignal(
                StopReason.TOKEN_BUDGET,
                f"used {used_tokens} tokens of a budget of {budget}",
                "loop",
                context={"used_tokens": used_tokens, "token_budget": budget},
            )
        ]


@dataclass(frozen=True, slots=True)
class Compaction:
    """How an agent's runs keep the context under the model's window (engine/compaction.py)."""

    context_window_tokens: int = 128_000
    """The model's context window, in tokens (a smaller one its provider states in a refusal
    replaces it, engine/context_window.py)."""
    enabled: bool = True
    """Whether the oldest steps are summarized above the trigger (and on an overflow)."""
    trigger_ratio: float = 0.8
    """Compact when the estimated prompt passes this share of the window."""
    keep_recent_steps: int = 20
    """Steps kept as they are after the summary (the cut never splits a tool call)."""
    model: str | None = None
    """The model that writes summaries; None: the run's model."""
    instructions: str | None = None
    """The summary call's system prompt; None: the built-in one."""


@dataclass(slots=True)
class AgentSpec:
    """A named agent from the server config."""

    name: str
    model: str
    """The model name sent to the endpoint."""
    instructions: str = ""
    """The system prompt."""
    description: str = ""
    """What the agent does, for those choosing one (its A2A card)."""
    agents: list[str] = field(default_factory=list)
    """Other agents of the server it may call as tools (engine/agent_tools.py); their tools
    are in `tools` too."""
    tools: list[str] = field(default_factory=list)
    """Names of registered server tools the agent offers (an MCP tool as `server__tool`)."""
    mcp_servers: list[str] = field(default_factory=list)
    """MCP servers whose every tool the agent offers, as listed at each run's start."""
    limits: Limits = field(default_factory=Limits)
    temperature: float | None = None
    max_tokens: int | None = None
    """Completion token cap per model call."""
    stop_on_error_tools: list[str] = field(default_factory=list)
    """The agent's tools whose error result ends the run with TOOL_ERROR (`on_error: stop`);
    an error of any other tool is a result the model sees and acts on."""
    compaction: Compaction = field(default_factory=Compaction)
    output: OutputSpec | None = None
    """What its runs' final answer must be (engine/output.py); None: text."""
    approval_tools: list[str] = field(default_factory=list)
    """Tools (by the name the model calls them) whose calls wait for approval: the agent's
    `needs_approval` tools and its MCP servers' listed ones."""
    approval_servers: list[str] = field(default_factory=list)
    """MCP servers every tool of which waits for approval (`needs_approval: true`)."""
    approval_timeout_s: float | None = None
    """How long a call waits for approval before the server rejects it; None: no limit."""

    def needs_approval(self, tool: str) -> bool:
        """Whether the agent's calls of `tool` wait for a decision."""
        return tool in self.approval_tools or mcp_server_of(tool) in self.approval_servers

    def __post_init__(self) -> None:
        strangers = [name for name in self.stop_on_error_tools if name not in self.tools]
        if strangers:
            raise ValueError(
                f"agent {self.name!r}: stop_on_error_tools {strangers} are not among its tools"
            )


@dataclass(slots=True)
class RunOverrides:
    """Per-run replacements of agent settings; None keeps the agent's value."""

    model: str | None = None
    instructions: str | None = None
    temperature: float | None = None
    max_tokens: int | None = None
    max_steps: int | None = None
    timeout_s: float | None = None
    tools: list[str] | None = None
    """Which of the agent's server tools to offer; None offers all of them."""
    token_budget: int | None = None


@dataclass(frozen=True, slots=True)
class ClientTool:
    """A tool the caller executes itself; a call to it ends the run with REQUIRES_ACTION."""

    name: str
    description: str = ""
    parameters_json: str = ""
    """The JSON schema of the arguments as JSON text; empty means no parameters."""

    def to_openai(self) -> dict[str, Any]:
        """The OpenAI `tools` entry offering this tool."""
        parameters = (
            json.loads(self.parameters_json)
            if self.parameters_json
            else {"type": "object", "properties": {}}
        )
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": parameters,
            },
        }


@dataclass(slots=True)
class RunInput:
    """One `Run` request as the engine sees it."""

    input: str
    """The user message text."""
    session_id: str = ""
    """The session to continue; empty creates a new session."""
    agent: str = ""
    """The agent to run; empty runs the default agent."""
    overrides: RunOverrides = field(default_factory=RunOverrides)
    client_tools: list[ClientTool] = field(default_factory=list)
    request_id: str = ""
    """Idempotency key: a second run with the same key on the same session is refused."""
    metadata: dict[str, str] = field(default_factory=dict)
    deadline_at: float | None = None
    """The caller's deadline as the event loop's time (`loop.time()`): the run times out by
    then at the latest, however long it took to start."""
    on_busy: BusyPolicy = BusyPolicy.REJECT
    """What to do when the session is busy (domain.BusyPolicy)."""
    followed: bool = False
    """The caller's stream owns the run: its end cancels the run (a `Run` call that did not
    ask the run to go on without it). Stored with a queued run, so that the run ends as the
    caller's end would when the server holding the stream is gone."""
    tenant: str = DEFAULT_TENANT
    """The caller's tenant: the new session's, or the one `session_id` must belong to (another
    tenant's session is unknown to the caller)."""
    output_schema: dict[str, Any] | None = None
    """The run's output schema (checked, engine/output.py), replacing the agent's; None keeps
    the agent's."""
    require_approval: list[str] = field(default_factory=list)
    """Server tools whose calls wait for approval in this run besides the agent's; `*`: all."""


@dataclass(frozen=True, slots=True)
class ToolOutput:
    """The caller's result of one client tool call."""

    tool_call_id: str
    output: str
    is_error: bool = False


@dataclass(slots=True)
class RunSettings:
    """The effective settings of one run: the agent's, with the run's overrides applied."""

    model: str
    instructions: str
    tools: list[str]
    """The server tools offered."""
    limits: Limits
    temperature: float | None = None
    max_tokens: int | None = None
    client_tools: list[ClientTool] = field(default_factory=list)
    stop_on_error_tools: list[str] = field(default_factory=list)
    """The offered tools whose error result ends the run (`AgentSpec.stop_on_error_tools`)."""
    compaction: Compaction = field(default_factory=Compaction)
    output: OutputSpec | None = None
    """What the final answer must be: the run's schema, else the agent's; None: text."""
    approval_tools: list[str] = field(default_factory=list)
    """The offered server tools whose calls wait for approval (engine/approvals.py)."""
    approval_timeout_s: float | None = None
    """How long a call waits for approval before the server rejects it; None: no limit."""

    def to_options(self) -> dict[str, Any]:
        """JSON-ready data for `Run.options`."""
        options: dict[str, Any] = _SETTINGS_ADAPTER.dump_python(self, mode="json")
        return options

    @classmethod
    def from_options(cls, options: dict[str, Any]) -> RunSettings:
        """The settings stored by `to_options`."""
        return _SETTINGS_ADAPTER.validate_python(options)

    def client_tool_names(self) -> set[str]:
        return {tool.name for tool in self.client_tools}


_SETTINGS_ADAPTER: TypeAdapter[RunSettings] = TypeAdapter(RunSettings)


def check_agents(
    agents: Mapping[str, AgentSpec], default_agent: str, tools: Container[str]
) -> None:
    """ValueError unless `default_agent` is one of `agents` and every tool an agent names is
    one of `tools`."""
    if default_agent not in agents:
        raise ValueError(f"default agent {default_agent!r} is not among the agents")
    for agent in agents.values():
        missing = [name for name in agent.tools if name not in tools]
        if missing:
            raise ValueError(f"agent {agent.name!r} names unknown tools: {missing}")


@dataclass(frozen=True, slots=True)
class AgentCatalog:
    """The server's agents, and the registry of the tools they may offer."""

    agents: Mapping[str, AgentSpec]
    default_agent: str
    registry: ToolRegistry

    def agent(self, name: str = "") -> AgentSpec:
        """The named agent ("" = the default). Raises AgentNotFoundError."""
        spec = self.agents.get(name or self.default_agent)
        if spec is None:
            raise AgentNotFoundError(name, list(self.agents))
        return spec

    def tools_of(self, agent: AgentSpec) -> list[str]:
        """The server tools the agent offers now (its MCP servers' as they list them)."""
        return self.registry.agent_tools(agent.tools, agent.mcp_servers)

    def default_settings(self, agent: AgentSpec) -> RunSettings:
        """The settings of a run of `agent` with no overrides and no client tools."""
        return resolve_settings(agent, RunOverrides(), [], self.tools_of(agent))

    def settings_of(self, run: Run) -> RunSettings:
        """The run's stored settings; its agent's (else the default's) when the store kept
        none."""
        if run.options:
            return RunSettings.from_options(run.options)
        return self.default_settings(self.agents.get(run.agent) or self.agent())


def resolve_settings(
    agent: AgentSpec,
    overrides: RunOverrides,
    client_tools: list[ClientTool],
    agent_tools: list[str] | None = None,
    output_schema: dict[str, Any] | None = None,
    require_approval: list[str] | None = None,
) -> RunSettings:
    """Apply `overrides` and the run's `output_schema` to `agent`, whose server tools are
    `agent_tools` (default: its `tools`; the runtime adds its MCP servers' tools);
    `require_approval` adds tools whose calls wait for approval. Raises InvalidInputError
    naming the first bad field."""
    _check_positive("overrides.max_steps", overrides.max_steps)
    _check_positive("overrides.max_tokens", overrides.max_tokens)
    _check_positive("overrides.timeout", overrides.timeout_s)
    _check_positive("overrides.token_budget", overrides.token_budget)
    if overrides.temperature is not None and not 0 <= overrides.temperature <= 2:
        raise InvalidInputError("overrides.temperature", "must be between 0 and 2")
    if overrides.model is not None and not overrides.model.strip():
        raise InvalidInputError("overrides.model", "must not be empty when set")
    offered = list(agent.tools) if agent_tools is None else agent_tools
    tools = list(offered)
    if overrides.tools is not None:
        unknown = [name for name in overrides.tools if name not in offered]
        if unknown:
            raise InvalidInputError(
                "overrides.tools",
                f"not tools of agent {agent.name!r}: {', '.join(unknown)}; "
                f"its tools: {', '.join(offered) or '(none)'}",
            )
        tools = list(dict.fromkeys(overrides.tools))
    _check_client_tools(client_tools, server_tools=set(tools))
    output = _output_of(agent, output_schema)
    if output is not None and output.mode == "tool":
        clashing = {FINAL_OUTPUT_TOOL} & {*tools, *(tool.name for tool in client_tools)}
        if clashing:
            raise InvalidInputError(
                "client_tools",
                f"{FINAL_OUTPUT_TOOL!r} is the tool that takes the answer of agent "
                f"{agent.name!r} (output_mode tool): no other tool may have its name",
            )
    limits = replace(
        agent.limits,
        max_steps=overrides.max_steps or agent.limits.max_steps,
        run_timeout_s=overrides.timeout_s or agent.limits.run_timeout_s,
        token_budget=overrides.token_budget or agent.limits.token_budget,
    )
    return RunSettings(
        model=overrides.model or agent.model,
        instructions=(
            overrides.instructions if overrides.instructions is not None else agent.instructions
        ),
        tools=tools,
        limits=limits,
        temperature=(
            overrides.temperature if overrides.temperature is not None else agent.temperature
        ),
        max_tokens=overrides.max_tokens or agent.max_tokens,
        client_tools=list(client_tools),
        stop_on_error_tools=[name for name in agent.stop_on_error_tools if name in tools],
        compaction=agent.compaction,
        output=output,
        approval_tools=_approval_tools(agent, tools, require_approval or []),
        approval_timeout_s=agent.approval_timeout_s,
    )


def _output_of(agent: AgentSpec, schema: dict[str, Any] | None) -> OutputSpec | None:
    """The run's schema, asked the agent's way (mode, retries); else the agent's own."""
    if schema is None:
        return agent.output
    if agent.output is None:
        return OutputSpec(schema)
    return replace(agent.output, schema=schema)


def _approval_tools(agent: AgentSpec, tools: list[str], required: list[str]) -> list[str]:
    """The run's server tools whose calls wait for approval: the agent's, and `required`."""
    for index, name in enumerate(required):
        if name != "*" and name not in tools:
            raise InvalidInputError(
                f"require_approval[{index}]",
                f"{name!r} is not a server tool of this run; its server tools: "
                f"{', '.join(tools) or '(none)'} (client tools need no approval)",
            )
    if "*" in required:
        return list(tools)
    return [name for name in tools if agent.needs_approval(name) or name in required]


def _check_positive(name: str, value: float | None) -> None:
    if value is not None and value <= 0:
        raise InvalidInputError(name, "must be positive")


def _check_client_tools(client_tools: list[ClientTool], server_tools: set[str]) -> None:
    seen: set[str] = set()
    for index, tool in enumerate(client_tools):
        where = f"client_tools[{index}]"
        if not _TOOL_NAME.match(tool.name):
            raise InvalidInputError(
                f"{where}.name", f"{tool.name!r} must match {_TOOL_NAME.pattern}"
            )
        if tool.name in seen:
            raise InvalidInputError(f"{where}.name", f"duplicate client tool {tool.name!r}")
        if tool.name in server_tools:
            raise InvalidInputError(
                f"{where}.name", f"{tool.name!r} is also a server tool of this agent"
            )
        seen.add(tool.name)
        if tool.parameters_json:
            try:
                schema = json.loads(tool.parameters_json)
            except json.JSONDecodeError as error:
                raise InvalidInputError(
                    f"{where}.parameters_json", f"is not valid JSON: {error}"
                ) from None
            if not isinstance(schema, dict):
                raise InvalidInputError(
                    f"{where}.parameters_json", "must be a JSON object (a JSON schema)"
                )
