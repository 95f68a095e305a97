"""Local agents as tools: `agents: [OTHER]` offers another agent of this server as a tool.

The tool is named after the agent (characters a function name cannot hold become `_`) and
takes `{"input": string}`. A call runs a child run of that agent in a new session of its
own, in the caller's tenant, and answers with the child's final answer as JSON:
`{"answer": ..., "agent": ..., "run_id": ..., "session_id": ...}` (the ids link the
parent's tool step to the child; the child run's metadata links back: `agio.parent_run_id`,
`agio.parent_session_id`, `agio.parent_tool_call_id`). The child is a run like any other:
WatchRun follows it, GetRun reads it, its spans nest under the tool call's span. Its
start is the call's `tool_progress` event (with the child's ids), so a client can watch it
live.

- **Cancel cascades**: the call ending early (the parent cancelled, timed out, or its
  server stopping) stops the child CANCELLED.
- **Budget roll-up**: the child's tokens are the tool step's, so they count toward the
  parent's `token_budget` (and its usage).
- **Depth**: a run started by a tool call is one deeper than its parent; a call from a run
  at `max_depth` is an error result the model sees. Cycles (A calls B calls A) are refused
  at start-up (`check_agent_calls`).
- A child that fails, is cancelled or waits for input (approvals, client tools: a tool call
  cannot give them) is an error result naming why; a waiting child is cancelled.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field

from agio_grpc.domain import Role, Run, RunStatus, StopSignal
from agio_grpc.engine.agents import AgentSpec, RunInput
from agio_grpc.engine.events import RunCompleted, RunFailed, StepCompleted
from agio_grpc.engine.lifecycle import cancelled
from agio_grpc.engine.remote import FollowedEvent
from agio_grpc.engine.segments import RunHandle
from agio_grpc.engine.tools import (
    ArgumentsError,
    ToolContext,
    ToolError,
    ToolOrigin,
    function_definition,
    function_name,
)

SOURCE = "agent"
DEFAULT_MAX_DEPTH = 3
PARENT_RUN = "agio.parent_run_id"
PARENT_SESSION = "agio.parent_session_id"
PARENT_CALL = "agio.parent_tool_call_id"


def agent_tool_name(agent: str) -> str:
    """The name the model calls agent `agent` by."""
    return function_name(agent)[:64]


class ChildRuns(Protocol):
    """What starting and stopping a child run takes (the runtime)."""

    async def start_run(self, request: RunInput) -> RunHandle: ...

    async def stop(self, run_id: str, signal: StopSignal, *, tenant: str | None = None) -> Run: ...


class _Arguments(BaseModel):
    model_config = ConfigDict(extra="forbid")
    input: str = Field(min_length=1, description="What to ask the agent, in full.")


ARGUMENTS_SCHEMA: dict[str, Any] = _Arguments.model_json_schema()
"""The parameters of an agent offered as a tool (a local one, or a remote A2A one)."""
ARGUMENTS_SCHEMA.pop("title", None)


def checked_input(arguments: object) -> str:
    """The `input` of an agent tool's arguments; raises pydantic.ValidationError or
    ArgumentsError."""
    if not isinstance(arguments, dict):
        raise ArgumentsError("must be a JSON object")
    return _Arguments.model_validate(arguments).input


@dataclass(slots=True)
class AgentTools:
    """The tool source of every agent (source `agent`); `bind` gives it the runtime."""

    agents: Mapping[str, AgentSpec]
    max_depth: int = DEFAULT_MAX_DEPTH
    runs: ChildRuns | None = None
    depths: dict[str, int] = field(default_factory=dict)
    """The depth of each live child run started here (a run not here is a top-level one)."""
    _tools: dict[str, AgentTool] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._tools = {
            agent_tool_name(agent.name): AgentTool(agent, self) for agent in self.agents.values()
        }

    @property
    def source(self) -> str:
        return SOURCE

    def bind(self, runs: ChildRuns) -> None:
        self.runs = runs

    def tools(self) -> Mapping[str, AgentTool]:
        return self._tools


class AgentTool:
    """One agent, offered as a tool."""

    source = SOURCE
    timeout_s: float | None = None

    def __init__(self, agent: AgentSpec, tools: AgentTools) -> None:
        self.agent = agent
        self._tools = tools
        self.name = agent_tool_name(agent.name)
        self.description = agent.description or f"Ask the agent {agent.name!r}; it answers in text."
        self.parameters = ARGUMENTS_SCHEMA

    @property
    def available(self) -> bool:
        return self._tools.runs is not None

    @property
    def unavailable_reason(self) -> str:
        return "" if self.available else "the server is starting"

    def definition(self) -> dict[str, Any]:
        return function_definition(self)

    def origin(self) -> ToolOrigin | None:
        return None

    def validate(self, arguments: object) -> dict[str, Any]:
        return {"input": checked_input(arguments)}

    async def invoke(self, arguments: dict[str, Any], context: ToolContext) -> str:
        runs = self._tools.runs
        if runs is None:
            raise ToolError(f"Error: agent {self.agent.name!r} is not available yet.")
        depths = self._tools.depths
        depth = depths.get(context.run_id, 0) + 1
        if depth > self._tools.max_depth:
            raise ToolError(
                f"Error: agent {self.agent.name!r} was not called: agent calls nest at most "
                f"{self._tools.max_depth} deep."
            )
        child = await runs.start_run(
            RunInput(
                input=arguments["input"],
                agent=self.agent.name,
                tenant=context.tenant,
                metadata={
                    PARENT_RUN: context.run_id,
                    PARENT_SESSION: context.session_id,
                    PARENT_CALL: context.tool_call_id,
                },
                followed=True,
            )
        )
        depths[child.run_id] = depth
        context.report_progress(
            f"agent {self.agent.name!r} is working on it in run {child.run_id}",
            state=f"RUN_STATUS_{child.run.status.value}",
            child_run_id=child.run_id,
            child_session_id=child.session_id,
        )
        try:
            ended, answer = await _followed(child)
        except asyncio.CancelledError:
            stop = runs.stop(
                child.run_id, cancelled("the calling run stopped", "parent"), tenant=context.tenant
            )
            await asyncio.shield(asyncio.ensure_future(stop))
            raise
        finally:
            depths.pop(child.run_id, None)
        context.usage.add(ended.usage)
        if ended.status is RunStatus.REQUIRES_ACTION:
            await runs.stop(
                child.run_id, cancelled("it waited for input", "parent"), tenant=context.tenant
            )
            raise ToolError(
                f"Error: agent {self.agent.name!r} stopped to wait for input (approvals or "
                "client tools), which a tool call cannot give; its run was cancelled."
            )
        if ended.status is not RunStatus.COMPLETED:
            signal = ended.stop_signal
            why = f"{signal.reason.value}: {signal.message}" if signal else ended.status.value
            raise ToolError(f"Error: agent {self.agent.name!r} failed ({why}).")
        return json.dumps(
            {
                "answer": answer,
                "agent": self.agent.name,
                "run_id": child.run_id,
                "session_id": child.session_id,
            },
            ensure_ascii=False,
        )


async def _followed(child: RunHandle) -> tuple[Run, str]:
    """The child run as it ended, and its last assistant text."""
    answer = ""
    async for event in child.events():
        inner = _inner(event)
        if isinstance(inner, StepCompleted) and inner.step.role is Role.ASSISTANT:
            answer = inner.step.content or answer
        elif isinstance(inner, RunCompleted | RunFailed):
            return inner.run, answer
    raise ToolError("Error: the agent's run ended without its end being seen.")


def _inner(event: FollowedEvent) -> object:
    return getattr(event, "event", None)


def check_agent_calls(agents: Mapping[str, AgentSpec]) -> None:
    """ValueError for an `agents:` entry naming no agent, the agent itself, or a cycle."""
    for agent in agents.values():
        for callee in agent.agents:
            if callee not in agents:
                raise ValueError(f"agent {agent.name!r} calls unknown agent {callee!r}")
    done: set[str] = set()

    def visit(name: str, path: list[str]) -> None:
        if name in path:
            cycle = " -> ".join([*path[path.index(name) :], name])
            raise ValueError(f"agents call each other in a cycle: {cycle}")
        if name in done:
            return
        for callee in agents[name].agents:
            visit(callee, [*path, name])
        done.add(name)

    for name in agents:
        visit(name, [])
