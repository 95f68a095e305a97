"""Remote A2A agents as tools: an agent's `a2a_agents:` entries, through the official
`a2a-sdk` client.

Each entry is one tool (source `a2a`), named by the entry, taking `{"input": string}`. Its
description is the remote agent's card's, read at start-up and retried with capped
backoff until it is read (the tool is unavailable meanwhile, with the reason). A call sends
one message over the binding the card prefers (of JSON-RPC, HTTP+JSON and gRPC), streaming
when the card offers it, with the entry's headers and the current trace context
(`traceparent`: the remote agent's spans join the caller's trace). Each status the task
streams (its state and status message, with the task's ids) is the call's `tool_progress`
event. The answer is the text
of the task's artifacts (or of the agent's message), as JSON with the remote task and
context ids.

- A conversation continues: a call sends the remote context id of the session's last
  answer from the same agent (its tool step's `context_id`). The steps are the only record,
  so it holds across restarts and members; a compaction that summarized that answer starts
  a new remote context.
- A remote task that fails, is cancelled or rejected, or stops for input or
  authentication (INPUT_REQUIRED, AUTH_REQUIRED: a tool call cannot give them) is an error
  result the model sees; so is an unreachable agent or an A2A error.
- The call ending early (the run cancelled, its tool timeout, the entry's `timeout_s`)
  cancels the remote task (`CancelTask`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
from a2a.client import Client, ClientCallContext, ClientConfig, ClientFactory
from a2a.client.card_resolver import A2ACardResolver
from a2a.types import a2a_pb2 as a2a
from a2a.utils.constants import AGENT_CARD_WELL_KNOWN_PATH
from google.protobuf import json_format

from agio_grpc.domain import Role, Step
from agio_grpc.engine.agent_tools import ARGUMENTS_SCHEMA, checked_input
from agio_grpc.engine.tls import client_tls_context
from agio_grpc.engine.tools import ToolContext, ToolError, ToolOrigin, function_definition

log = logging.getLogger(__name__)

SOURCE = "a2a"
RETRY_FIRST_S = 0.5
RETRY_MAX_S = 30.0
_FAILED = {
    a2a.TASK_STATE_FAILED: "failed",
    a2a.TASK_STATE_CANCELED: "was cancelled",
    a2a.TASK_STATE_REJECTED: "rejected the task",
    a2a.TASK_STATE_INPUT_REQUIRED: "stopped to wait for input, which a tool call cannot give",
    a2a.TASK_STATE_AUTH_REQUIRED: "stopped to ask for authentication",
}

TraceHeaders = Callable[[], Iterable[tuple[str, str]]]


@dataclass(frozen=True, slots=True)
class RemoteAgentSpec:
    """One `a2a_agents:` entry, its `${VAR}`s resolved."""

    name: str
    url: str
    headers: Mapping[str, str] = field(default_factory=dict)
    timeout_s: float = 300.0


def _no_trace() -> Iterable[tuple[str, str]]:
    return ()


class RemoteAgentTool:
    """One remote A2A agent, offered as a tool once its card is read."""

    source = SOURCE

    def __init__(self, spec: RemoteAgentSpec, trace_headers: TraceHeaders) -> None:
        self.spec = spec
        self.name = spec.name
        self.parameters = ARGUMENTS_SCHEMA
        self.timeout_s: float | None = spec.timeout_s
        self._trace_headers = trace_headers
        self._http = httpx.AsyncClient(
            headers=dict(spec.headers), timeout=spec.timeout_s, verify=client_tls_context()
        )
        self.card: a2a.AgentCard | None = None
        self._client: Client | None = None
        self._problem = "its agent card was not read yet"

    @property
    def description(self) -> str:
        card = self.card
        if card is None:
            return ""
        skills = "; ".join(f"{s.name}: {s.description}" for s in card.skills[:16])
        return f"{card.description} (skills: {skills})" if skills else card.description

    @property
    def available(self) -> bool:
        return self._client is not None

    @property
    def unavailable_reason(self) -> str:
        return "" if self.available else self._problem

    def definition(self) -> dict[str, Any]:
        return function_definition(self)

    def origin(self) -> ToolOrigin | None:
        return None  # an origin is an MCP server's (its span's `mcp.*` attributes)

    def validate(self, arguments: object) -> dict[str, Any]:
        return {"input": checked_input(arguments)}

    async def resolve(self) -> None:
        """Read the card (retrying with backoff until it is read) and make the client."""
        url = self.spec.url
        card_url = url if url.endswith(".json") else url.rstrip("/") + AGENT_CARD_WELL_KNOWN_PATH
        wait = RETRY_FIRST_S
        while True:
            try:
                card = await A2ACardResolver(self._http, card_url, "").get_agent_card()
                config = ClientConfig(streaming=True, httpx_client=self._http)
                self._client = ClientFactory(config).create(card)
                self.card = card
                return
            except asyncio.CancelledError:
                raise
            except Exception as error:
                self._problem = f"its agent card at {self.spec.url} could not be read: {error}"
                log.warning("A2A agent %s: %s; retrying", self.spec.name, self._problem)
            await asyncio.sleep(wait)
            wait = min(wait * 2, RETRY_MAX_S)

    async def close(self) -> None:
        if self._client is not None:
            with contextlib.suppress(Exception):
                await self._client.close()
        await self._http.aclose()

    async def invoke(self, arguments: dict[str, Any], context: ToolContext) -> str:
        client = self._client
        if client is None:
            raise ToolError(f"Error: A2A agent {self.name!r} is unavailable: {self._problem}.")
        message = a2a.Message(
            message_id=f"{context.run_id}-{context.tool_call_id}-{uuid.uuid4().hex[:8]}",
            role=a2a.ROLE_USER,
            parts=[a2a.Part(text=arguments["input"])],
            context_id=remote_context(context.history, self.name),
        )
        call = ClientCallContext(
            timeout=self.spec.timeout_s,
            service_parameters={**self.spec.headers, **dict(self._trace_headers())},
        )
        outcome = _Outcome()
        try:
            async for event in client.send_message(
                a2a.SendMessageRequest(message=message), context=call
            ):
                if outcome.add(event):
                    context.report_progress(
                        outcome.status_text,
                        state=_state_name(outcome.state),
                        remote_task_id=outcome.task_id,
                        remote_context_id=outcome.context_id,
                    )
        except asyncio.CancelledError:
            if outcome.task_id:
                cancel = client.cancel_task(a2a.CancelTaskRequest(id=outcome.task_id), context=call)
                with contextlib.suppress(Exception):
                    await asyncio.shield(asyncio.wait_for(cancel, 5.0))
            raise
        except ToolError:
            raise
        except Exception as error:
            raise ToolError(f"Error: A2A agent {self.name!r} failed: {error}") from None
        return outcome.result(self.name)


def remote_context(history: Sequence[Step], tool_name: str) -> str:
    """The remote context of the session's last answer from the tool (its result's
    `context_id`), or "" (a new one)."""
    for step in reversed(history):
        if step.role is Role.TOOL and step.name == tool_name and not step.is_error:
            try:
                context_id = json.loads(step.content).get("context_id")
            except (ValueError, AttributeError):
                return ""
            return context_id if isinstance(context_id, str) else ""
    return ""


@dataclass(slots=True)
class _Outcome:
    """What a remote task came to, from its stream."""

    task_id: str = ""
    context_id: str = ""
    state: a2a.TaskState = a2a.TASK_STATE_UNSPECIFIED
    status_text: str = ""
    artifacts: dict[str, str] = field(default_factory=dict)
    message_text: str = ""

    def add(self, event: a2a.StreamResponse) -> bool:
        """Take in one event; True when it told the task's status (progress to report)."""
        kind = event.WhichOneof("payload")
        if kind == "task":
            task = event.task
            self.task_id, self.context_id = task.id, task.context_id
            self._status(task.status)
            for artifact in task.artifacts:
                self.artifacts[artifact.artifact_id] = _text(artifact.parts)
            return True
        if kind == "status_update":
            self.task_id = self.task_id or event.status_update.task_id
            self.context_id = self.context_id or event.status_update.context_id
            self._status(event.status_update.status)
            return True
        if kind == "artifact_update":
            update = event.artifact_update
            before = self.artifacts.get(update.artifact.artifact_id, "") if update.append else ""
            self.artifacts[update.artifact.artifact_id] = before + _text(update.artifact.parts)
        elif kind == "message":
            self.context_id = self.context_id or event.message.context_id
            self.message_text = _text(event.message.parts)
            self.state = a2a.TASK_STATE_COMPLETED
        return False

    def _status(self, status: a2a.TaskStatus) -> None:
        self.state = status.state
        self.status_text = _text(status.message.parts) if status.HasField("message") else ""

    def result(self, name: str) -> str:
        if self.state in _FAILED:
            detail = f": {self.status_text}" if self.status_text else ""
            raise ToolError(f"Error: A2A agent {name!r} {_FAILED[self.state]}{detail}")
        if self.state != a2a.TASK_STATE_COMPLETED:
            state = _state_name(self.state)
            raise ToolError(f"Error: A2A agent {name!r}'s task ended {state}, not completed.")
        answer = self.message_text or "\n".join(t for t in self.artifacts.values() if t)
        return json.dumps(
            {"answer": answer, "task_id": self.task_id, "context_id": self.context_id},
            ensure_ascii=False,
        )


def _state_name(state: int) -> str:
    """A task state's name; a number no version of A2A defines is named by its number."""
    try:
        return a2a.TaskState.Name(state)
    except ValueError:
        return f"TASK_STATE_{state}"


def _text(parts: Iterable[a2a.Part]) -> str:
    texts = []
    for part in parts:
        kind = part.WhichOneof("content")
        if kind == "text":
            texts.append(part.text)
        elif kind == "data":
            texts.append(json.dumps(json_format.MessageToDict(part.data), ensure_ascii=False))
    return "".join(texts)


@dataclass(slots=True)
class RemoteAgents:
    """The tool source of every `a2a_agents:` entry (source `a2a`)."""

    specs: Iterable[RemoteAgentSpec]
    trace_headers: TraceHeaders = _no_trace
    _tools: dict[str, RemoteAgentTool] = field(default_factory=dict)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def __post_init__(self) -> None:
        for spec in self.specs:
            self._tools[spec.name] = RemoteAgentTool(spec, self.trace_headers)

    @property
    def source(self) -> str:
        return SOURCE

    def tools(self) -> Mapping[str, RemoteAgentTool]:
        return self._tools

    def start(self) -> None:
        """Read every card in the background (each tool is offered once its card is read)."""
        self._tasks = [
            asyncio.create_task(tool.resolve(), name=f"a2a agent {name}")
            for name, tool in self._tools.items()
        ]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for tool in self._tools.values():
            await tool.close()
